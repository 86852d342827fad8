"""attnflow.heads: priors, Bayes risk, activations, oracle identity, ODE drift forms, invariances, escape times,
pruning, ODE vs SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import attnflow as af
from jax.test_util import check_grads

from attnflow.heads import (AnisotropicGaussian, BayesSoftmax, Discrete, FieldBank, FlippedSpike, HeadsDynamics, MultiHead,
                            PointMass, SingleLocationTask, Softmax, Softmax1, bayes_posterior, bayes_risk, from_finite_D,
                            keys_from_overlaps, online_sgd, oracle_config, order_parameter_field, overlaps, predicted_escape_time, prune, risk,
                            sample_loss, softmax_floor, solve_order_parameters, specialisation, specialisation_spectrum,
                            symmetric_seed, unspecialised_point)


def test_bayes_softmax_at_oracle_equals_bayes_posterior():
    prior = Discrete([[2.0, 0.0], [0.0, 3.0], [-1.0, 1.0]], [0.5, 0.3, 0.2])
    M, Q, b = oracle_config(prior)
    bank = FieldBank(prior, 4, 3, n=20000, key=1, permutations="none")
    chi, chi_star = bank.fields(M, Q)
    a = jax.vmap(BayesSoftmax(b))(chi)
    np.testing.assert_allclose(a, bayes_posterior(prior, chi_star), atol=1e-13)
    e_bank = float(2 * risk(M, Q, BayesSoftmax(b), bank))
    e_bayes, se = bayes_risk(prior, 4, key=2, n=200_000)
    assert abs(e_bank - float(e_bayes)) < 4 * (float(se) + 0.5 / np.sqrt(20000)), (e_bank, float(e_bayes))


def test_bayes_risk_closed_cases():
    # no signal: the posterior is uniform, E = 1 - 1/L
    e, _ = bayes_risk(PointMass([0.0]), 5, n=1000)
    assert float(e) == pytest.approx(0.8, abs=1e-12)
    # huge signal: location found almost surely
    e, _ = bayes_risk(FlippedSpike(12.0, 0.5), 4, n=20000)
    assert float(e) < 1e-3
    # Gaussian log Z against quadrature of E exp(theta u - theta^2/2)
    pr = AnisotropicGaussian([0.5], [2.0])
    u = 0.7
    val = af.gauss_hermite(lambda th: jnp.exp(th[0] * u - 0.5 * th[0] ** 2), 60, jnp.array([0.5]), jnp.array([[2.0]]))
    assert float(pr.log_Z(jnp.array([u]))) == pytest.approx(float(jnp.log(val)), rel=1e-10)


def test_activations():
    chi = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    np.testing.assert_allclose(Softmax()(chi), jnp.mean(jax.nn.softmax(chi, -1), 0), rtol=1e-14)
    np.testing.assert_allclose(BayesSoftmax(jnp.zeros(1))(chi[:1]), jax.nn.softmax(chi[0]), rtol=1e-14)  # H = 1
    assert float(jnp.sum(BayesSoftmax(jnp.zeros(3))(chi))) == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(Softmax1(b=-60.0, c=1.0)(chi), Softmax()(chi), rtol=1e-12)  # b -> -inf is softmax
    off = Softmax1(b=40.0, c=1.0)(chi)
    assert float(jnp.sum(off)) < 1e-15  # all heads switched off


def test_softmax_floor_formula():
    assert softmax_floor(4) == pytest.approx(0.25 + 1 / 12)
    assert softmax_floor(4, 0.5, n_plus=2, H=4) == pytest.approx(softmax_floor(4))
    # large signal, even split of two heads aligned with +-s: the softmax error approaches the floor from above
    prior = FlippedSpike(30.0, 0.5)
    bank = FieldBank(prior, 4, 2, n=4000)
    errs = [float(2 * risk(jnp.array([[sc], [-sc]]), jnp.array([[sc], [-sc]]) @ jnp.array([[sc, -sc]]), Softmax(), bank))
            for sc in (0.3, 1.0, 4.0)]
    # best scale close to the floor, never below it; larger key norms are worse (norms must grow slower than s)
    assert softmax_floor(4) - 1e-6 <= min(errs) < softmax_floor(4) + 0.01
    assert errs[0] < errs[1] < errs[2]


def test_drift_forms_agree():
    """Expectation form (5.1) = autodiff form (5.2) exactly in M (both are the reparameterised gradient of the
    same Monte Carlo risk), within MC error in Q; the Stein form within MC error; learned-parameter drift
    = -eta_b dR/db; and dR/dM passes check_grads."""
    prior = AnisotropicGaussian([0.8, 0.0], [1.0, 0.5])
    bank = FieldBank(prior, 3, 2, n=30_000, key=3, permutations="none")
    M = jnp.array([[0.4, 0.1], [0.2, -0.3]])
    Q = M @ M.T + jnp.array([[0.5, 0.1], [0.1, 0.4]])
    for act in (Softmax(), Softmax1(0.3, 1.2), BayesSoftmax(jnp.array([0.1, -0.2]))):
        out = {}
        for form in ("expectation", "stein", "autodiff"):
            dyn = HeadsDynamics(act, bank, 0.7, eta_b=0.3, form=form)
            out[form] = order_parameter_field(0.0, dyn.state(M, Q), dyn)
        scale = float(jnp.max(jnp.abs(out["expectation"]["M"])))
        np.testing.assert_allclose(out["autodiff"]["M"], out["expectation"]["M"], atol=1e-13)
        assert float(jnp.max(jnp.abs(out["autodiff"]["Q"] - out["expectation"]["Q"]))) < 0.03 * scale
        for k in ("M", "Q"):
            assert float(jnp.max(jnp.abs(out["stein"][k] - out["expectation"][k]))) < 0.05 * scale, (type(act), k)
        for name in act.learned:
            g = jax.grad(lambda v: risk(M, Q, act.with_params({**act.params(), name: v}), bank))(getattr(act, name))
            np.testing.assert_allclose(out["expectation"]["act"][name], -0.3 * g, rtol=1e-10, atol=1e-15)
    check_grads(lambda m: risk(m, Q, Softmax(), bank), (M,), order=1, modes=("fwd", "rev"))


def test_symmetries_of_the_monte_carlo_field():
    """Antithetic copies keep M = 0 invariant; cyclic head copies keep the equal-rows manifold invariant."""
    prior = FlippedSpike(2.0, 0.5)
    bank = FieldBank(prior, 4, 3, n=512, key=1)
    dyn = HeadsDynamics(Softmax(), bank, 1.0)
    f = order_parameter_field(0.0, dyn.state(jnp.zeros((3, 1)), 0.3 * jnp.eye(3) + 0.05), dyn)
    assert float(jnp.max(jnp.abs(f["M"]))) < 1e-15
    M = jnp.full((3, 1), 0.4)
    f = order_parameter_field(0.0, dyn.state(M, M @ M.T + 0.2 * jnp.eye(3)), dyn)
    assert float(jnp.max(jnp.abs(f["M"] - f["M"][0]))) < 1e-13
    assert float(jnp.max(jnp.abs(jnp.diag(f["Q"]) - f["Q"][0, 0]))) < 1e-13
    with pytest.raises(ValueError, match="sign-symmetric"):
        FieldBank(FlippedSpike(1.0, 0.3), 4, 2, n=16, antithetic=True)


def test_escape_time_linear_in_log_D_with_jacobian_slope():
    """Seeds kappa / sqrt(D) at the unspecialised fixed point: t_spec = t0 + ln D / (2 lambda) (section 9)."""
    prior = FlippedSpike(3.0, 0.5)
    bank = FieldBank(prior, 4, 2, n=512, key=7)
    dyn = HeadsDynamics(Softmax(), bank, 1.0)
    y = unspecialised_point(dyn, dyn.state(jnp.zeros((2, 1)), 0.2 * jnp.eye(2)))
    f = order_parameter_field(0.0, y, dyn)
    assert max(float(jnp.max(jnp.abs(v))) for v in (f["M"], f["Q"])) < 1e-10
    lam = float(specialisation_spectrum(dyn, y).rate)
    assert lam > 0
    Ds = [1e4, 1e6, 1e8]
    ts = []
    for D in Ds:
        M0, Q0 = symmetric_seed(y["M"], y["Q"], 1.0, int(D))
        tr = solve_order_parameters(M0, Q0, Softmax(), bank, 1.0, 200.0, escape=0.3, rtol=1e-8, atol=1e-11)
        ts.append(tr.meta["escape_time"])
    slope = np.polyfit(np.log(Ds), ts, 1)[0]
    assert slope == pytest.approx(1 / (2 * lam), rel=0.03), (slope, 1 / (2 * lam))
    assert np.allclose(np.diff(ts), np.diff(predicted_escape_time(lam, np.array(Ds))), rtol=0.05)


def test_from_finite_D_statistics_and_seed():
    D, sigma0 = 4000, 0.5
    Ms, Qs = zip(*[from_finite_D(D, 3, 2, sigma0, key=k) for k in range(200)])
    Ms, Qs = np.stack(Ms), np.stack(Qs)
    assert np.var(Ms) * D / sigma0**2 == pytest.approx(1.0, rel=0.1)
    assert np.mean(Qs[:, 0, 0]) == pytest.approx(sigma0**2, rel=0.01)
    assert np.var(Qs[:, 0, 1]) * D / sigma0**4 == pytest.approx(1.0, rel=0.15)
    M, Q = symmetric_seed(jnp.full((2, 1), 0.3), 0.2 * jnp.eye(2) + 0.09, 2.0, 400)
    assert float(specialisation(M)) == pytest.approx(2.0 / 20.0, rel=1e-12)
    assert np.linalg.eigvalsh(np.asarray(Q - M @ M.T)).min() > 0


def test_keys_from_overlaps_is_exact():
    task = SingleLocationTask(300, 4, AnisotropicGaussian([0.0, 0.0], [1.0, 2.0]), key=1)
    M = jnp.array([[0.3, 0.1], [-0.2, 0.4], [0.0, 0.1]])
    Q = M @ M.T + jnp.array([[0.2, 0.05, 0.0], [0.05, 0.3, 0.0], [0.0, 0.0, 0.1]])
    ov = overlaps(keys_from_overlaps(M, Q, task.spikes, key=3), task.spikes)
    np.testing.assert_allclose(ov["M"], M, atol=1e-14)
    np.testing.assert_allclose(ov["Q"], Q, atol=1e-14)
    with pytest.raises(ValueError, match="positive semidefinite"):
        keys_from_overlaps(M, 0.01 * jnp.eye(3), task.spikes)


def test_pruning_rules():
    """Duplicated oracle heads of B-softmax prune for free down to |supp|; the softmax-1 mask rule keeps 1/H."""
    prior = Discrete(3.0 * np.eye(2))
    M, Q, b = oracle_config(prior)
    M2, b2 = jnp.concatenate([M, M]), jnp.concatenate([b, b]) - jnp.log(2.0)
    bank = FieldBank(prior, 4, 4, n=2000, key=2)
    res = prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank)
    e = res["error"]
    assert abs(e[2] - e[0]) < 0.01 and e[3] - e[2] > 0.1, e
    assert sorted(res["removed"][:2]) in ([0, 1], [0, 3], [1, 2], [2, 3])  # one copy of each support point kept
    act = Softmax1(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 1.5, 2.0]), per_head=3)
    chi = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    keep = np.array([0, 2])
    np.testing.assert_allclose(act.restrict(keep, 3, "mask")(chi[keep]), jnp.sum(act.head_weights(chi)[keep], 0), rtol=1e-12)
    np.testing.assert_allclose(act.restrict(keep, 3, "renormalise")(chi[keep]), 1.5 * jnp.sum(act.head_weights(chi)[keep], 0),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="order must list distinct"):
        prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, order=[0, 0])


def test_sgd_held_out_error_matches_theory_error():
    """The held-out SGD error at finite D equals E(M, Q) of the same keys within sampling error."""
    prior, D = FlippedSpike(2.5, 0.5), 1000
    task = SingleLocationTask(D, 4, prior, key=1)
    M = jnp.array([[1.0], [-0.8]])
    Q = M @ M.T + 0.1 * jnp.eye(2)
    K = keys_from_overlaps(M, Q, task.spikes, key=2)
    tr = online_sgd(task, MultiHead(K, Softmax()), 0.1, 0.01, key=0, n_save=2, eval_samples=2000)
    e_theory = float(2 * risk(M, Q, Softmax(), FieldBank(prior, 4, 2, n=20000, key=5)))
    assert abs(float(tr["error"][0]) - e_theory) < 0.03, (float(tr["error"][0]), e_theory)
    assert 0.25 < float(tr["a_signal"][0]) < 1.0


def test_scalar_target_noise_term_matches_sgd():
    """Scalar target with label noise (spec 5.3): same drift, different eta^2 term. SGD's Q follows the
    scalar-target ODE and not the token-target one."""
    prior, D = FlippedSpike(2.0, 0.5), 1000
    task = SingleLocationTask(D, 4, prior, key=1, target="scalar", Delta=0.5)
    model = MultiHead.init(100, 2, D, Softmax(), sigma0=0.5)
    ov = overlaps(model.K, task.spikes)
    sim = online_sgd(task, model, 1.0, 4.0, key=0, n_save=5, eval_samples=1000)
    bank = FieldBank(prior, 4, 2, n=1024, key=7)
    gap = {}
    for target, Delta in (("scalar", 0.5), ("token", 0.0)):
        ode = solve_order_parameters(ov["M"], ov["Q"], Softmax(), bank, 1.0, 4.0, ts=sim.ts, target=target, Delta=Delta)
        gap[target] = float(jnp.max(jnp.abs(sim["Q"] - ode["Q"])))
        if target == "scalar":
            # E + Delta against 1000 held-out samples: (y - y_hat)^2 is ~ E chi^2_1, standard error E sqrt(2/1000)
            se = float(jnp.max(ode["error"])) * np.sqrt(2 / 1000)
            assert float(jnp.max(jnp.abs(sim["error"] - ode["error"]))) < 4 * se < 0.5
    assert gap["scalar"] < 0.06 < 0.15 < gap["token"], gap
    with pytest.raises(ValueError, match="Delta"):
        SingleLocationTask(D, 4, prior, Delta=0.5)


def test_sgd_learns_only_learned_parameters():
    task = SingleLocationTask(300, 4, FlippedSpike(2.0), key=1)
    model = MultiHead.init(2, 2, 300, Softmax1(0.0, 1.0, learn_b=True, learn_c=False, per_head=2))
    tr = online_sgd(task, model, 0.5, 3.0, key=3, n_save=4)
    assert float(jnp.max(jnp.abs(tr["b"][-1]))) > 1e-4
    assert "c" not in tr.ys


def test_ode_tracks_sgd_and_gap_shrinks_with_D():
    prior = FlippedSpike(2.0, 0.5)
    gaps = []
    for D in (400, 1600):
        task = SingleLocationTask(D, 4, prior, key=1)
        model = MultiHead.init(2, 2, D, Softmax(), sigma0=0.5)
        ov = overlaps(model.K, task.spikes)
        sim = af.simulate(sample_loss, model, optax.sgd(0.5), 4 * D, mode=af.OnlineSGD(task.sample, 1), key=3, clock=1.0 / D,
                          observe=lambda m: overlaps(m.K, task.spikes), n_save=9, spacing="linear")
        ode = solve_order_parameters(ov["M"], ov["Q"], Softmax(), FieldBank(prior, 4, 2, n=2048), 0.5, 4.0, ts=sim.ts)
        gaps.append(max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q")))
    assert gaps[1] < gaps[0] and gaps[1] < 0.03, gaps


def test_float32_sgd_tracks_ode():
    """float32 online SGD (tokens from `attnflow.rng.normal`, Box-Muller) against the float64 ODE at D = 1600.

    Max gap over M, Q for SGD keys 0-3: 0.0046 to 0.0064; with the token noise scaled by 1.1 (a sampler
    10 % too wide) 0.0099 to 0.0119. The bound 0.009 separates them."""
    prior, D = FlippedSpike(2.0, 0.5), 1600
    task = SingleLocationTask(D, 4, prior, key=1, dtype=jnp.float32)
    model = MultiHead(MultiHead.init(2, 2, D, Softmax(), sigma0=0.5).K.astype(jnp.float32), Softmax())
    ov = overlaps(model.K.astype(float), task.spikes.astype(float))
    sim = online_sgd(task, model, 0.5, 4.0, key=3, n_save=9)
    assert sim["M"].dtype == jnp.float32
    ode = solve_order_parameters(ov["M"], ov["Q"], Softmax(), FieldBank(prior, 4, 2, n=2048), 0.5, 4.0, ts=sim.ts)
    gap = max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q"))
    assert gap < 0.009, gap


def test_bad_input():
    with pytest.raises(ValueError, match="p must be a probability"):
        FlippedSpike(1.0, 1.5)
    with pytest.raises(ValueError, match="weights must sum"):
        Discrete([[1.0], [2.0]], [0.5, 0.6])
    with pytest.raises(ValueError, match="weight 1 is"):
        Discrete([[1.0], [2.0]], [1.5, -0.5])
    with pytest.raises(ValueError, match="variances"):
        AnisotropicGaussian([0.0, 0.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="H"):
        MultiHead.init(0, 0, 10, Softmax())
    with pytest.raises(ValueError, match="positive semidefinite"):
        solve_order_parameters(jnp.array([[1.0]]), jnp.array([[0.5]]), Softmax(), FieldBank(FlippedSpike(1.0), 3, 1, n=16), 0.5, 1.0)
    with pytest.raises(ValueError, match="Q must be symmetric"):
        solve_order_parameters(jnp.zeros((2, 1)), jnp.array([[1.0, 0.2], [0.0, 1.0]]), Softmax(),
                               FieldBank(FlippedSpike(1.0), 3, 2, n=16), 0.5, 1.0)
    with pytest.raises(ValueError, match="form"):
        HeadsDynamics(Softmax(), FieldBank(FlippedSpike(1.0), 3, 1, n=16), 0.5, form="euler")
    with pytest.raises(ValueError, match="c"):
        Softmax1(0.0, -1.0)
    with pytest.raises(ValueError, match="finite support"):
        oracle_config(AnisotropicGaussian([0.0], [1.0]))
    with pytest.raises(ValueError, match="p must be a probability"):
        softmax_floor(4, 1.5)


@pytest.mark.slow
def test_ode_vs_sgd_at_D_2000_within_finite_size_error():
    """Four SGD seeds at D = 2000 against their seeded ODEs: max gap over M, Q below 3 / sqrt(D)."""
    prior, D = FlippedSpike(2.0, 0.5), 2000
    task = SingleLocationTask(D, 4, prior, key=1)
    bank = FieldBank(prior, 4, 2, n=4096, key=7)
    for seed in range(4):
        model = MultiHead.init(100 + seed, 2, D, Softmax(), sigma0=0.5)
        ov = overlaps(model.K, task.spikes)
        sim = online_sgd(task, model, 0.5, 8.0, key=seed, n_save=9)
        ode = solve_order_parameters(ov["M"], ov["Q"], Softmax(), bank, 0.5, 8.0, ts=sim.ts)
        gap = max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q"))
        assert gap < 3 / np.sqrt(D), (seed, gap)


@pytest.mark.slow
def test_sgd_specialisation_time_grows_with_log_D():
    """SGD started from the seed 2 / sqrt(D) at the unspecialised point (2 seeds at D = 500 and 4000): the mean
    escape times differ by ln 8 / (2 lambda) within 15 %, and each is within 1 of the identically seeded ODE."""
    prior = FlippedSpike(3.0, 0.5)
    bank = FieldBank(prior, 4, 2, n=2048, key=7)
    dyn = HeadsDynamics(Softmax(), bank, 1.0)
    y = unspecialised_point(dyn, dyn.state(jnp.zeros((2, 1)), 0.2 * jnp.eye(2)))
    lam = float(specialisation_spectrum(dyn, y).rate)
    means = []
    for D in (500, 4000):
        M0, Q0 = symmetric_seed(y["M"], y["Q"], 2.0, D)
        t_ode = solve_order_parameters(M0, Q0, Softmax(), bank, 1.0, 30.0, escape=0.5).meta["escape_time"]
        task = SingleLocationTask(D, 4, prior, key=1)
        ts = []
        for seed in range(2):
            K = keys_from_overlaps(M0, Q0, task.spikes, key=seed)
            tr = online_sgd(task, MultiHead(K, Softmax()), 1.0, 12.0, key=seed + 10, n_save=241)
            ts.append(float(tr.ts[np.flatnonzero(np.asarray(tr["specialisation"]) >= 0.5)[0]]))
        assert max(abs(t - t_ode) for t in ts) < 1.0, (D, ts, t_ode)
        means.append(np.mean(ts))
    assert means[1] - means[0] == pytest.approx(np.log(8) / (2 * lam), rel=0.15), (means, lam)
