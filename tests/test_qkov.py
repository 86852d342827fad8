"""attnflow.qkov: protocol (Setup/solve/train), reduced ODEs, first integrals, reference values, full-matrix
flow, metrics, bad input."""

import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow import qkov
from attnflow.qkov import (
    DTAP_EDGES,
    OBSERVABLES,
    PAPER_HORIZON_TAU,
    REFERENCE_R001,
    TRAIN_TOLERANCE,
    CodeGenerator,
    EpsIdentity,
    Setup,
    TheoryTask,
    TorchDefault,
    Zeros,
    alpha,
    attention_concentration,
    authors_rk4,
    balanced_factorise,
    circuit_labels,
    code_model,
    comprehensiveness_sufficiency,
    confident_concentration,
    dtap,
    factor_conserved,
    first_integral,
    from_tau,
    invariant,
    large_t_asymptotics,
    loss,
    make_aligned,
    make_model,
    paper_setup,
    reduced_field,
    relevant_mass,
    separability,
    solve,
    state_at_loss,
    to_tau,
    train,
    upper_bounds,
)

RATIOS = [0.01, 0.1, 1.0, 10.0, 100.0]
T_REF = qkov.REFERENCE_T  # horizon of the protocol test (TRAIN_TOLERANCE holds for t1 <= 3000)


def horizon(s):
    return from_tau(PAPER_HORIZON_TAU, s)


# ----------------------------------------------------------------------------- the protocol
def test_protocol_defaults_only():
    s = Setup()
    th = solve(s, T_REF)
    sim = train(s, T_REF, key=0)
    assert set(th.names) == set(sim.names) == set(OBSERVABLES)
    np.testing.assert_allclose(th.ts, sim.ts, rtol=1e-12)  # same clock, same save times
    gap = af.compare(th, sim)
    for name, tol in TRAIN_TOLERANCE.items():
        assert gap[name] < tol, (name, gap)
    # the run is not trivial: the attention sharpens from m/(m+n) to ~0.9 and the loss falls 300-fold
    assert float(sim["alpha"][0]) == pytest.approx(5 / 55) and float(sim["alpha"][-1]) > 0.85
    assert float(sim["loss"][-1]) < float(sim["loss"][0]) / 300
    # the gap is the common-score effect: with the correction in the theory it vanishes
    exact = solve(s.replace(common_correction=True), T_REF)
    assert max(af.compare(exact, sim).values()) < 1e-5


def test_new_learning_rate_compiles_nothing():
    s = Setup()
    solve(s, 500.0)
    train(s, 500.0)
    with af.count_compilations() as c:
        th = solve(s.replace(eta_qk=2.5), 500.0)
        sim = train(s.replace(eta_qk=2.5, eta_ov=1.5), 500.0)
        solve(Setup(eta_qk=4.0), 500.0)
    assert c.n == 0, c
    assert af.compare(th, solve(s, 500.0))["mu_qk"] > 1e-3  # the new rate took effect
    assert float(sim["mu_ov"][-1]) > float(th["mu_ov"][-1])  # a faster OV circuit


@pytest.mark.slow  # test_protocol_defaults_only compares solve and train in the default run
def test_gradient_descent_and_sgd_follow_the_flow():
    s = Setup()
    exact = s.replace(common_correction=True)  # the exact reduction of the full matrices
    errs = []
    for dt in (1.0, 0.5):
        gd = train(s, 400.0, dt=dt, save=af.LinearGrid(9))
        th = solve(exact, 400.0, save=af.TimeGrid(gd.ts))
        errs.append(max(af.compare(th, gd, ["mu_ov", "mu_qk"]).values()))
    assert errs[0] / errs[1] == pytest.approx(2.0, rel=0.1)  # Euler: first order in dt
    assert errs[1] < 0.02
    th = solve(s, 400.0)
    # online SGD over two seeds in one compiled call (key traced)
    res = af.sweep(
        lambda seed: train(s, 400.0, dt=0.5, batch=32, key=seed, save=af.LinearGrid(5)).final(),
        {"seed": np.arange(2)},
        progress=False,
    )
    mu = np.asarray(res.values["mu_ov"])
    assert np.all(np.abs(mu - float(th.final()["mu_ov"])) < 0.15) and abs(mu[0] - mu[1]) > 1e-6


# ----------------------------------------------------------------------------- reduced ODE
def test_closed_forms_of_alpha_and_loss():
    p = paper_setup(1.0)
    mu = jnp.array([0.0, 1.0, 5.0])
    np.testing.assert_allclose(alpha(mu, p), 5 * jnp.exp(mu) / (5 * jnp.exp(mu) + 50), rtol=1e-14)
    st = {"mu_ov": jnp.array(3.0), "mu_qk": jnp.array(1.0)}
    a = 5 * np.e / (5 * np.e + 50)
    assert float(loss(st, p)) == pytest.approx(np.log(1 + 19 * np.exp(-a * 3.0)), rel=1e-14)
    z = {"mu_ov": jnp.array(0.0), "mu_qk": jnp.array(0.0)}
    assert float(loss(z, p)) == pytest.approx(np.log(20), rel=1e-14)
    d = reduced_field(0.0, z, p)
    assert float(d["mu_ov"]) == pytest.approx(1.0 * (5 / 55) / (50 * 20), rel=1e-14) and float(d["mu_qk"]) == 0.0


@pytest.mark.parametrize("r", RATIOS)
def test_first_integral_along_caco_for_every_ratio(r):
    s = paper_setup(r)
    tr = solve(s, horizon(s), loss_target=1e-4)
    st = {"mu_ov": tr["mu_ov"], "mu_qk": tr["mu_qk"]}
    scale = 1.0 + jnp.max(st["mu_qk"] + 0.1 * jnp.exp(st["mu_qk"]))  # size of the terms of Phi (= K Psi)
    assert float(jnp.max(jnp.abs(first_integral(st, s))) / scale) < 1e-9
    assert float(tr["loss"][-1]) == pytest.approx(1e-4, rel=1e-8)
    assert np.isfinite(float(tr.t_event)) and float(tr.ts[-1]) == pytest.approx(float(tr.t_event))


@pytest.mark.parametrize("par", ["FACO", "CAFO", "FAFO"])
def test_first_integral_factorised(par):
    s = paper_setup(3.0, par, mu0=0.01)
    tr = solve(s, 3e4, save=af.LogGrid(60))
    res = first_integral({"mu_ov": tr["mu_ov"], "mu_qk": tr["mu_qk"]}, s)  # relative to the setup's start
    assert float(jnp.max(jnp.abs(res))) < 1e-9
    assert float(tr["mu_ov"][-1]) > 10 * 0.01 + 0.1  # it actually moved


def test_reference_values_r001():
    """The authors' printout at r = 0.01: tau_end = 2.55e6, mu_OV = 81.669, mu_QK = 0.559, alpha = 0.149."""
    s = paper_setup(0.01)
    ad = solve(s, horizon(s), loss_target=1e-4)
    rk = authors_rk4(s)
    fl = state_at_loss(s, 1e-4)
    for state, t_end in ((ad.final(), ad.t_event), (rk.final(), rk.t_event), (fl, None)):
        if t_end is not None:
            assert float(f"{float(to_tau(t_end, s)):.3g}") == REFERENCE_R001["tau_end"]
            assert float(t_end) == pytest.approx(100 * 2.55e6, rel=0.01)  # the clock t is tau / min(eta)
        for k in ("mu_ov", "mu_qk", "alpha"):
            assert round(float(state[k]), 3) == REFERENCE_R001[k]


def test_no_event_unless_asked():
    s = paper_setup(1.0)
    assert solve(s, 1e4).t_event is None
    tr = solve(s, 1e4, loss_target=1e-4)  # not reached by t = 1e4
    assert np.isnan(float(tr.t_event)) and float(tr.ts[-1]) == 1e4


def test_fixed_loss_solver_matches_event_and_is_monotone_in_r():
    for r in (0.1, 10.0):
        s = paper_setup(r)
        for L in (0.5, 1e-2):
            ev = solve(s, horizon(s), loss_target=L, save=af.LinearGrid(2)).final()
            fl = state_at_loss(s, L)
            for k in ("mu_ov", "mu_qk", "alpha"):
                assert float(fl[k]) == pytest.approx(float(ev[k]), rel=1e-7)
    rs = jnp.geomspace(0.01, 100, 30)
    st = jax.vmap(lambda r: state_at_loss(paper_setup(r), 1e-2))(rs)
    assert bool(jnp.all(jnp.diff(st["alpha"]) > 0)) and bool(jnp.all(jnp.diff(st["mu_qk"]) > 0))
    assert bool(jnp.all(jnp.diff(st["mu_ov"]) < 0))


def test_with_ratio_keeps_eta_ov_and_sweeps():
    s = Setup(eta_ov=0.5)
    assert float(s.with_ratio(4.0).eta_qk) == 2.0 and float(s.with_ratio(4.0).ratio) == 4.0
    res = af.sweep(lambda r: state_at_loss(s.with_ratio(r), 0.1)["alpha"], {"r": np.array([0.5, 2.0])}, progress=False)
    assert float(res.values[1]) > float(res.values[0])  # a faster QK circuit: sharper attention at the same loss
    with pytest.raises(ValueError, match="ratio"):
        s.with_ratio(-1.0)


def test_state_at_loss_is_differentiable_and_refuses_unreachable_targets():
    """jax.grad through the bisection of state_at_loss (its Newton step carries the implicit
    function theorem) passes check_grads in the learning rates, the start and the target; a
    target at or above the initial loss raises when concrete and gives NaN when traced."""
    base = Setup()

    def at(eta_qk, eta_ov, mu_ov0, L):
        st = state_at_loss(base.replace(eta_qk=eta_qk, eta_ov=eta_ov), L, initial={"mu_ov": mu_ov0, "mu_qk": 0.1})
        return jnp.stack([st["alpha"], st["mu_qk"], st["mu_ov"]])

    args = (3.0, 1.0, 0.2, 0.05)
    check_grads(at, args, order=1, modes=("fwd", "rev"), eps=1e-6, atol=1e-6, rtol=1e-6)
    # a faster QK circuit reaches the same loss with sharper attention (eq. (5)): d alpha / d eta_QK
    # > 0 (0.0511 here, as the event solve's derivative through qkov.reach_loss)
    g = jax.grad(lambda e: state_at_loss(base.replace(eta_qk=e), 0.05)["alpha"])(3.0)
    assert float(g) > 0.01
    L0 = float(qkov.loss(base.initial_state(), base))
    with pytest.raises(ValueError, match="must lie below the initial loss"):
        state_at_loss(base, L0 + 0.1)
    traced = jax.vmap(lambda L: state_at_loss(base, L)["alpha"])(jnp.array([0.05, L0 + 0.1]))
    assert np.isfinite(float(traced[0])) and np.isnan(float(traced[1]))


def test_growth_laws_and_large_t_asymptotics():
    s = paper_setup(100.0)
    tr = solve(s, horizon(s), loss_target=1e-4)
    ub = upper_bounds(tr.ts[1:], s)
    assert bool(jnp.all(tr["mu_ov"][1:] <= ub["mu_ov"] * (1 + 1e-9)))
    assert bool(jnp.all(tr["mu_qk"][1:] <= 100 * 19 / (2 * 20 * 50) * tr["mu_ov"][1:] ** 2 * (1 + 1e-9)))
    asy = large_t_asymptotics(tr.t_event, s)
    f = tr.final()
    assert abs(float(f["mu_ov"] - asy["mu_ov"])) < 0.1
    assert float(f["loss"]) == pytest.approx(float(asy["loss"]), rel=0.1)
    assert float(1 - f["alpha"]) == pytest.approx(float(asy["one_minus_alpha"]), rel=0.25)
    # eqs. (6)-(7) are CACO's: another parametrisation (whose mu_OV exceeds the "bound") is refused
    for other in (s.replace(parametrisation="CAFO"), s.replace(common_correction=True)):
        with pytest.raises(ValueError, match="holds for CACO with kappa = c = 1"):
            upper_bounds(1.0, other)
        with pytest.raises(ValueError, match="large_t_asymptotics holds for CACO"):
            large_t_asymptotics(1.0, other)


def test_authors_rk4_agrees_with_adaptive():
    for r in (1.0, 100.0):
        s = paper_setup(r)
        rk, ad = authors_rk4(s), solve(s, horizon(s), loss_target=1e-4)
        assert float(rk.final()["mu_ov"]) == pytest.approx(float(ad.final()["mu_ov"]), rel=1e-4)
        assert float(rk.t_event) == pytest.approx(float(ad.t_event), rel=1e-4)


def test_reduced_gradients_check_grads():
    s = paper_setup(3.0)

    def f(x):
        st = {"mu_ov": x[0], "mu_qk": x[1]}
        d = reduced_field(0.0, st, s)
        return jnp.stack([d["mu_ov"], d["mu_qk"], loss(st, s), invariant(st, s)])

    check_grads(f, (jnp.array([2.0, 0.7]),), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    sf = paper_setup(3.0, "FAFO")
    check_grads(
        lambda x: invariant({"mu_ov": x[0], "mu_qk": x[1]}, sf),
        (jnp.array([2.0, 0.7]),),
        order=1,
        modes=("rev",),
        atol=1e-6,
        rtol=1e-6,
    )


# ----------------------------------------------------------------------------- full matrices
# By default: CACO (exact), FAFO (both circuits factorised) and FACO at score scale 0.5; FACO and
# CAFO at scale 1 (one factorised circuit each, covered by FAFO) compile a program each (12-16 s)
# and run with -m slow.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "par,c",
    [
        ("CACO", 1.0),
        pytest.param("FACO", 1.0, marks=_SLOW),
        pytest.param("CAFO", 1.0, marks=_SLOW),
        ("FAFO", 1.0),
        ("FACO", 0.5),
    ],
)
def test_full_matrix_flow_equals_reduced(par, c):
    # factorised QK is exact only for |C| >> b (its common columns move through one factor): |C| = 300 b there
    s = Setup(
        m=5,
        n=50,
        b=3,
        M=3,
        n_common=300 if par[:2] == "CA" else 900,
        eta_qk=3.0,
        eta_ov=1.0,
        parametrisation=par,
        common_correction=True,
        score_scale=c,
    )
    grid = af.LogGrid(25, t_min=1.0)
    red = solve(s, 600.0, save=grid)
    full = train(s, 600.0, save=grid, conserved=True, solver=qkov.FLOW_SOLVER.replace(rtol=1e-10, atol=1e-12))
    assert float(full["alpha"][-1]) > float(full["alpha"][0]) + 0.2  # attention really sharpens during the run
    err = af.compare(red, full, ["mu_ov", "mu_qk"], relative=True, floor=1e-3)
    assert max(err.values()) < (1e-6 if par[:2] == "CA" else 0.02), err
    factorised = {k for k, f in (("conserved_qk", s.factorised_qk), ("conserved_ov", s.factorised_ov)) if f}
    assert {k for k in full.names if k.startswith("conserved")} == factorised
    for k in factorised:
        assert float(jnp.max(jnp.abs(full[k] - full[k][0]))) < 1e-8


def _per_factor_field(t, model, args):
    task, rates = args["task"], args["rates"]
    g = jax.grad(task.population_loss)(model)
    return jax.tree_util.tree_map(lambda x, lab: -rates[lab] * x, g, circuit_labels(g, per_factor=True))


def _weighted(t, model, args):
    return {"C": factor_conserved(model.W_o, model.W_v, 3.0, 0.5), "C_wrong": factor_conserved(model.W_o, model.W_v)}


def test_unequal_factor_rates_conserve_weighted_form():
    task = TheoryTask(m=5, n=50, b=3, M=3, n_common=300)
    model = make_aligned(task, "CAFO", 0.1, 0.0)
    rates = {"qk": 2.0, "o": 3.0, "v": 0.5}
    tr = af.integrate(
        _per_factor_field,
        model,
        200.0,
        args={"task": task, "rates": rates},
        save=af.LinearGrid(20),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-12),
        observe=_weighted,
    )
    assert float(jnp.max(jnp.abs(tr["C"] - tr["C"][0]))) < 1e-8  # |C| ~ 0.4
    assert float(jnp.max(jnp.abs(tr["C_wrong"] - tr["C_wrong"][0]))) > 1e-4  # the unweighted form is not conserved


def test_aligned_factors_are_balanced_and_on_the_manifold():
    task = TheoryTask(m=5, n=50, b=3, M=3, n_common=20)
    for mode in ("distinct_uniform", "dedicated"):
        t = TheoryTask(m=5, n=50, b=3, M=3, n_common=20, query_mode=mode)
        fafo, caco = make_aligned(t, "FAFO", 0.7, 0.4), make_aligned(t, "CACO", 0.7, 0.4)
        np.testing.assert_allclose(fafo.W_QK(), caco.W_QK(), atol=1e-14)
        np.testing.assert_allclose(fafo.W_OV(), caco.W_OV(), atol=1e-14)
        for A, B in fafo.factors().values():
            np.testing.assert_allclose(A.T @ A, B @ B.T, atol=1e-14)
    obs = qkov.model_observables(make_aligned(task, "FACO", 1.3, 0.6), task)
    assert float(obs["mu_ov"]) == pytest.approx(1.3) and float(obs["mu_qk"]) == pytest.approx(0.6)
    assert make_aligned(task, "CACO", 1.0, 1.0).factors() == {}


def test_balanced_factorise():
    W = jax.random.normal(jax.random.PRNGKey(0), (6, 9))
    A, B = balanced_factorise(W, 4.0, 0.25)
    np.testing.assert_allclose(A @ B, W, atol=1e-12)
    np.testing.assert_allclose(A.T @ A / 4.0, B @ B.T / 0.25, atol=1e-12)


def test_population_loss_mean_embedding_vs_monte_carlo():
    # on the invariant manifold every sequence has the same loss: Monte Carlo equals the mean-embedding value
    task = TheoryTask(m=5, n=50, b=3, M=3, n_common=300)
    model = make_aligned(task, "CACO", 1.3, 0.7)
    me = task.population_loss(model)
    mc = task.monte_carlo_loss(model, jax.random.PRNGKey(0), 512)
    assert float(mc) == pytest.approx(float(me), rel=1e-12)
    s = Setup(m=5, n=50, b=3, M=3, n_common=300)
    assert float(me) == pytest.approx(float(loss({"mu_ov": jnp.array(1.3), "mu_qk": jnp.array(0.7)}, s)), rel=1e-12)
    check_grads(
        lambda W: task.mean_embedding_loss(W, model.W_ov), (model.W_qk,), order=1, modes=("rev",), atol=1e-6, rtol=1e-5
    )


def test_dedicated_query_mode_rate():
    t2 = TheoryTask(m=5, n=50, b=3, M=3, n_common=300, query_mode="dedicated")
    s = Setup(m=5, n=50, b=3, M=3, n_common=300, query_mode="dedicated", eta_qk=3.0, common_correction=True)
    model = make_aligned(t2, "CACO", 0.5, 0.2)
    g = jax.grad(t2.population_loss)(model)
    # the gap readout's rate under the flow equals the reduced field with p = 1
    d_qk = qkov.mu_qk_gap(-3.0 * g.W_qk, t2)
    want = reduced_field(0.0, {"mu_ov": jnp.array(0.5), "mu_qk": jnp.array(0.2)}, s)["mu_qk"]
    assert float(d_qk) == pytest.approx(float(want), rel=1e-10)
    assert s.query_power == 1 and Setup().query_power == 2


def test_readouts_agree_on_the_manifold():
    task = TheoryTask(m=5, n=50, b=3, M=3, n_common=30)
    m = make_aligned(task, "CACO", 1.7, 0.9)
    assert float(qkov.mu_ov_difference(m.W_ov, task)) == pytest.approx(float(qkov.mu_ov_projection(m.W_ov, task)))
    assert float(qkov.mu_qk_distinct(m.W_qk, task)) == pytest.approx(float(qkov.mu_qk_gap(m.W_qk, task)))
    a = float(alpha(0.9, Setup(m=5, n=50)))
    assert float(qkov.mu_qk_from_attention(a, 5, 50)) == pytest.approx(0.9)


# ----------------------------------------------------------------------------- models, data and metrics
def test_model_defaults_are_the_theorys_and_the_code_preset_is_explicit():
    m = make_model("CACO", 20, 4)
    assert m.score_scale == 1.0 and m.W_qk.dtype == jnp.float64 and not m.attend_to_query
    c = code_model("FAFO")
    assert c.score_scale == pytest.approx(1 / np.sqrt(50)) and c.W_q.dtype == jnp.float32 and c.attend_to_query
    assert c.W_q.shape == (50, 50) and c.W_OV().shape == (50, 50)
    eps = make_model("FACO", 10, init={"W_q": EpsIdentity(1e-3), "W_ov": Zeros()})
    np.testing.assert_allclose(eps.W_q, 1e-3 * np.eye(10))
    assert float(jnp.max(jnp.abs(eps.W_ov))) == 0.0 and float(jnp.max(jnp.abs(eps.W_k))) <= 1 / np.sqrt(10)


def test_code_generator_statistics():
    gen = CodeGenerator(64)
    tokens, y, rel = gen.sample(jax.random.PRNGKey(0), 4000)
    assert tokens.shape == (4000, 63) and rel.shape == (4000, 63)
    k = y - 1
    np.testing.assert_array_equal(tokens[:, -1], 5 + k)  # query id 5 + k
    ctx = tokens[:, :-1]
    assert float(jnp.mean(ctx > 9)) == pytest.approx(5.5 / 15.5, abs=0.005)
    own = (ctx >= 10 * (k[:, None] + 1)) & (ctx < 10 * (k[:, None] + 2))
    assert bool(jnp.all(jnp.where(ctx > 9, own, True)))
    i = (ctx - 10 * (k[:, None] + 1))[ctx > 9]
    counts = np.bincount(np.asarray(i), minlength=10) / i.size
    np.testing.assert_allclose(counts, 0.1 * np.arange(1, 11) / 5.5, atol=0.01)


def test_train_on_generator_and_ramp():
    ev = CodeGenerator(16).sample(jax.random.PRNGKey(3), 64)
    kw = dict(generator=CodeGenerator(16), eval_set=ev, save=af.LinearGrid(3))
    tr, _ = qkov.train_on_generator("CACO", 0.5, 0.5, 60, key=1, **kw)
    assert set(tr.names) == set(qkov.GENERATOR_OBSERVABLES) and float(tr.ts[-1]) == 60
    assert float(tr["loss"][-1]) < float(tr["loss"][0])
    with af.count_compilations() as c:
        tr2, _ = qkov.train_on_generator("CACO", 0.3, 0.5, 60, key=1, **kw)
    assert c.n == 0 and float(tr2["loss"][-1]) != float(tr["loss"][-1])
    # a new length with as many save points compiles nothing; its first 60 steps are the same
    with af.count_compilations() as c:
        tr4, _ = qkov.train_on_generator("CACO", 0.5, 0.5, 120, key=1, **kw)
    assert c.n == 0, c
    assert tr4.meta["steps"] == 120 and float(tr4.ts[1]) == 60
    np.testing.assert_allclose(tr4["loss"][1], tr["loss"][-1], rtol=1e-6)
    ramp = qkov.linear_ramp(0.01, 10.0, 100)
    assert float(ramp(0)) == pytest.approx(0.01) and float(ramp(100)) == pytest.approx(0.1)
    assert float(ramp(50)) == pytest.approx(0.055)
    tr3, _ = qkov.train_on_generator("CACO", 0.5, 0.5, 60, key=1, qk_ramp=3.0, **kw)
    assert float(tr3["loss"][-1]) != float(tr["loss"][-1])


def test_train_on_generator_per_factor_rates():
    """Per-factor rates (Setup.qk_factor_ratio / ov_factor_ratio) in train_on_generator: after one
    SGD step from the same draw on the same batch, each factor has moved by its rate:
    sqrt(rho) and 1/sqrt(rho) times the equal-rate step (rho_qk = 4, rho_ov = 9)."""
    gen = CodeGenerator(16)
    kw = dict(generator=gen, eval_set=gen.sample(jax.random.PRNGKey(3), 64), save=af.LinearGrid(2), key=1)
    start = code_model("FAFO", key=jax.random.PRNGKey(1), vocab=gen.vocab)
    _, equal = qkov.train_on_generator("FAFO", 20.0, 2.0, 1, **kw)
    _, split = qkov.train_on_generator("FAFO", 20.0, 2.0, 1, qk_factor_ratio=4.0, ov_factor_ratio=9.0, **kw)
    for name, factor in (("W_q", 2.0), ("W_k", 0.5), ("W_o", 3.0), ("W_v", 1 / 3)):
        step_equal = getattr(equal, name) - getattr(start, name)
        step_split = getattr(split, name) - getattr(start, name)
        assert float(jnp.max(jnp.abs(step_equal))) > 1e-3, name
        np.testing.assert_allclose(step_split, factor * step_equal, rtol=1e-4, atol=1e-6, err_msg=name)
    with pytest.raises(
        ValueError, match=r"qk_factor_ratio \(eta_Q / eta_K\) = 4 needs a factorised circuit; CACO collapses it"
    ):
        qkov.train_on_generator("CACO", 0.5, 0.2, 1, qk_factor_ratio=4.0, **kw)
    with pytest.raises(ValueError, match=r"ov_factor_ratio \(eta_O / eta_V\) = 2 needs a factorised circuit; FACO"):
        qkov.train_on_generator("FACO", 0.5, 0.2, 1, ov_factor_ratio=2.0, **kw)
    with pytest.raises(ValueError, match=r"qk_factor_ratio \(eta_Q / eta_K\) must be finite and positive"):
        qkov.train_on_generator("FAFO", 0.5, 0.2, 1, qk_factor_ratio=-1.0, **kw)


def test_a_traced_factor_ratio_on_a_collapsed_circuit_fails_its_sweep_point():
    """A sweep over qk_factor_ratio on CACO: the ratio is traced, so Setup cannot refuse it at
    once; the points other than 1 are marked failed with the concrete refusal's reason."""
    msg = "qk_factor_ratio (eta_Q / eta_K) other than 1 needs a factorised circuit; CACO collapses it"
    with pytest.warns(RuntimeWarning, match="2 of 3 grid points failed"):
        res = af.sweep(
            lambda rho: solve(Setup(parametrisation="CACO", qk_factor_ratio=rho), 10.0)["mu_qk"][-1],
            {"rho": np.array([1.0, 4.0, 9.0])},
            progress=False,
        )
    assert list(np.asarray(res.status) > 0) == [False, True, True]
    assert float(res.values[0]) == pytest.approx(float(solve(Setup(), 10.0)["mu_qk"][-1]), rel=1e-12)
    assert [m for _, m in res.failures()] == [msg + " (one matrix, one rate)"] * 2
    # on a factorised circuit every ratio runs
    fa = af.sweep(
        lambda rho: solve(Setup(parametrisation="FACO", qk_factor_ratio=rho), 10.0)["mu_qk"][-1],
        {"rho": np.array([1.0, 4.0])},
        progress=False,
    )
    assert list(np.asarray(fa.status)) == [0, 0]


def test_fixed_attention_training_runs():
    tr, final = qkov.train_fixed_attention(
        0.6, factorised_ov=True, steps=50, batch=16, key=3, generator=CodeGenerator(16), eval_batches=4
    )
    assert float(tr["loss"][-1]) < float(tr["loss"][0]) and np.isfinite(float(final))
    kw = dict(factorised_ov=True, batch=16, key=3, generator=CodeGenerator(16), eval_batches=4, save=af.LinearGrid(3))
    short, _ = qkov.train_fixed_attention(0.6, steps=40, **kw)
    with af.count_compilations() as c:
        long, _ = qkov.train_fixed_attention(0.6, steps=80, **kw)
    assert c.n == 0, c
    # the same draws: the longer run passes through the shorter one's end at step 40
    assert long.meta["steps"] == 80 and float(long.ts[1]) == 40
    np.testing.assert_allclose(long["loss"][1], short["loss"][-1], rtol=1e-6)


def test_dtap_binning_rules():
    a = jnp.array([0.0, 0.2, 0.9999, 1.0, 1.2, -0.1])
    p = jnp.array([0.5, 0.5, 0.5, 1.0, 0.5, 0.5])
    H = dtap(a, p, DTAP_EDGES["synthetic"])
    assert H.shape == (5, 5)
    # left-closed: 0.2 -> bin 1; last bin closed: 1.0 -> bin 4; out-of-range dropped, denominators unchanged
    assert float(H[0, 2]) == pytest.approx(100 / 6) and float(H[1, 2]) == pytest.approx(100 / 6)
    assert float(H[4, 2]) == pytest.approx(100 / 6) and float(H[4, 4]) == pytest.approx(100 / 6)
    assert float(jnp.sum(H)) == pytest.approx(400 / 6)
    Hs = dtap(jnp.stack([a, a]), jnp.stack([p, p]), [0.0, 0.5, 1.0], [0.0, 1.0])
    assert Hs.shape == (2, 1) and float(Hs[1, 0]) == pytest.approx(200 / 6)
    with pytest.raises(ValueError, match="increasing"):
        dtap(a, p, [0.0, 0.5, 0.4])
    with pytest.raises(ValueError, match="DTAP_EDGES"):
        dtap(a, p, "synthetic")


def test_attention_metrics():
    a = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    rel = jnp.array([[True, False, False], [False, False, True]])
    np.testing.assert_allclose(relevant_mass(a, rel), [0.7, 0.8])
    assert float(separability(a, rel)) == pytest.approx(((0.7 - 0.1) + (0.8 - 0.1)) / 2)
    assert float(attention_concentration(jnp.array([0.05, 0.1, 0.5]), 0.1)) == pytest.approx(2 / 3)
    assert float(attention_concentration(jnp.array([0.05, 0.1, 0.5]), 0.1, strict=True)) == pytest.approx(1 / 3)
    assert float(
        confident_concentration(jnp.array([0.05, 0.2, 0.5]), jnp.array([0.9, 0.05, 0.5]), 0.1, 0.1)
    ) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="tau_a"):
        attention_concentration(jnp.array([0.5]), 1.5)


def test_acmc_confidence_options_on_a_hand_made_case():
    """Spec section 10.6: ACMC's confidence is the true class's probability (default), the
    predicted class's, or correctness; tau_a = tau_p = 0.1 by default."""
    a_rel = jnp.array([0.05, 0.2, 0.5, 0.9, 0.3])  # the first is below tau_a = 0.1: never counted
    probs = jnp.array(
        [
            [0.7, 0.2, 0.1],  # label 0: true 0.7, predicted 0.7, correct
            [0.05, 0.9, 0.05],  # label 0: true 0.05, predicted 0.9, wrong
            [0.45, 0.15, 0.4],  # label 0: true 0.45, predicted 0.45, correct
            [0.08, 0.02, 0.9],  # label 2: true 0.9, predicted 0.9, correct
            [0.6, 0.3, 0.1],  # label 1: true 0.3, predicted 0.6, wrong
        ]
    )
    labels = jnp.array([0, 0, 0, 2, 1])
    at_half = {"true_prob": 1 / 5, "pred_prob": 3 / 5, "correct": 2 / 5}  # tau_p = 0.5
    for confidence, want in at_half.items():
        got = confident_concentration(a_rel, probs, 0.1, 0.5, confidence=confidence, labels=labels)
        assert float(got) == pytest.approx(want), confidence
    # defaults tau_a = tau_p = 0.1: true_prob drops only the example with p_true = 0.05
    assert float(confident_concentration(a_rel, probs, labels=labels)) == pytest.approx(3 / 5)
    # per-example confidences are used as given; strict makes both comparisons strict
    p_true = jnp.array([0.7, 0.05, 0.45, 0.9, 0.3])
    assert float(confident_concentration(a_rel, p_true, 0.2, 0.45)) == pytest.approx(2 / 5)
    assert float(confident_concentration(a_rel, p_true, 0.2, 0.45, strict=True)) == pytest.approx(1 / 5)
    assert qkov.CONFIDENCES == ("true_prob", "pred_prob", "correct")
    with pytest.raises(ValueError, match="unknown confidence 'p_max'; expected one of 'true_prob', 'pred_prob'"):
        confident_concentration(a_rel, probs, confidence="p_max")
    with pytest.raises(ValueError, match="confidence='correct' from class probabilities needs labels"):
        confident_concentration(a_rel, probs, confidence="correct")
    with pytest.raises(ValueError, match=r"tau_p = 0 with confidence='correct' counts every example as confident"):
        confident_concentration(a_rel, probs, 0.1, 0.0, confidence="correct", labels=labels)
    with pytest.raises(ValueError, match=r"probs must have the shape of a_rel \(5,\).*got \(4, 3\)"):
        confident_concentration(a_rel, probs[:4])


def test_comprehensiveness_sufficiency_on_a_model():
    gen = CodeGenerator(64)
    tokens, y, _ = gen.sample(jax.random.PRNGKey(1), 256)
    # a hand-built model that attends to distinct tokens and reads the class from them
    m = make_model("CACO", 50, init=Zeros(), attend_to_query=True)
    W_qk = m.W_qk.at[:, 10:].set(5.0)
    W_ov = jnp.zeros((50, 50))
    for k in range(4):
        W_ov = W_ov.at[1 + k, 10 * (k + 1) : 10 * (k + 2)].set(20.0)
    m = eqx.tree_at(lambda x: (x.W_qk, x.W_ov), m, (W_qk, W_ov))
    assert float(jnp.mean(jnp.argmax(m(tokens)[0], -1) == y)) == 1.0
    cs = comprehensiveness_sufficiency(m, tokens, top_percent=5.0)
    assert float(cs["comprehensiveness"]) > 0 and float(cs["sufficiency"]) < float(cs["comprehensiveness"])
    with pytest.raises(ValueError, match="top_percent"):
        comprehensiveness_sufficiency(m, tokens, top_percent=0.0)


def test_models_parametrisations_agree_on_products():
    tokens = CodeGenerator(16).sample(jax.random.PRNGKey(2), 8)[0]
    for par in ("CACO", "FACO", "CAFO", "FAFO"):
        m = code_model(par, key=3, dtype=jnp.float64)
        z, a = m(tokens)
        s = m.W_QK()[tokens[:, -1][:, None], tokens] * m.score_scale
        np.testing.assert_allclose(a, jax.nn.softmax(s, -1), rtol=1e-12)
        h = jnp.einsum("bl,blv->bv", a, jax.nn.one_hot(tokens, 50))
        np.testing.assert_allclose(z, h @ m.W_OV().T, rtol=1e-10, atol=1e-14)
        assert set(jax.tree_util.tree_leaves(circuit_labels(m))) == {"qk", "ov"}
        assert set(m.factors()) == {"FACO": {"qk"}, "CAFO": {"ov"}, "FAFO": {"qk", "ov"}}.get(par, set())


# ----------------------------------------------------------------------------- bad input
def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match=r"eta_ov.*-1"):
        Setup(eta_ov=-1.0)
    with pytest.raises(ValueError, match=r"eta_qk.*0"):
        Setup().replace(eta_qk=0.0)
    with pytest.raises(ValueError, match=r"mu0.*0"):
        Setup(parametrisation="FAFO", mu0=0.0)
    with pytest.raises(ValueError, match=r"m \(distinct positions\).*0"):
        Setup(m=0)
    with pytest.raises(ValueError, match=r"M \(classes\).*1"):
        Setup(M=1)
    with pytest.raises(ValueError, match="unknown parametrisation 'FOCA'"):
        Setup(parametrisation="FOCA")
    with pytest.raises(ValueError, match="query_mode 'random'"):
        Setup(query_mode="random")
    with pytest.raises(ValueError, match=r"score_scale.*-1"):
        Setup(score_scale=-1.0)
    with pytest.raises(ValueError, match=r"no field \['ratio'\]"):
        Setup().replace(ratio=2.0)
    with pytest.raises(ValueError, match=r"setup must be an attnflow.qkov.Setup"):
        solve({"eta_qk": 1.0}, 10.0)
    with pytest.raises(ValueError, match=r"loss_target.*-0.1"):
        solve(Setup(), 10.0, loss_target=-0.1)
    # a target the flow cannot reach is refused, as state_at_loss refuses it (a NaN t_event would
    # read as "not reached by t1")
    with pytest.raises(ValueError, match=r"loss_target = 2.0 must lie below the initial loss L\(0\) = 1.386"):
        solve(Setup(), 10.0, loss_target=2.0)
    with pytest.raises(
        ValueError, match=r"initial must be a dict with the keys \['mu_ov', 'mu_qk'\], got \['mu_ov', 'muqk'\]"
    ):
        solve(Setup(), 1.0, initial={"mu_ov": 0.1, "muqk": 0.0})
    with pytest.raises(ValueError, match=r"got \['beta', 'mu_ov', 'mu_qk'\]"):
        train(Setup(), 1.0, initial={"mu_ov": 0.1, "mu_qk": 0.1, "beta": 1.0})
    for verb in (solve, train):  # solve failed on the field's shapes, train inside a broadcast
        with pytest.raises(ValueError, match=r"initial\['mu_ov'\] must have the shape of mu0, \(\) .*got shape \(2,\)"):
            verb(Setup(), 1.0, initial={"mu_ov": np.full(2, 0.1), "mu_qk": 0.1})
    # a factorised circuit's mu is a singular value: solve refuses what train refuses (a negative
    # start ran a flow whose loss rose above log M)
    for bad in (-0.1, 0.0):
        with pytest.raises(
            ValueError, match=rf"initial\['mu_ov'\] must be > 0 on the factorised circuit of FAFO.*got {bad}"
        ):
            solve(Setup(parametrisation="FAFO"), 1.0, initial={"mu_ov": bad, "mu_qk": 0.05})
    assert float(Setup().initial_state({"mu_ov": -0.1, "mu_qk": 0.0})["mu_ov"]) == -0.1  # collapsed: any sign
    with pytest.raises(ValueError, match="needs a time step dt"):
        train(Setup(), 10.0, batch=8)
    with pytest.raises(ValueError, match="unknown parametrisation 'XYZ'"):
        make_model("XYZ", 50)
    with pytest.raises(ValueError, match=r"Init object.*'torch_default'"):
        make_model("CACO", 50, init="torch_default")
    with pytest.raises(ValueError, match=r"has no matrix \['W_q'\]"):
        make_model("CACO", 50, init={"W_q": TorchDefault()})
    with pytest.raises(ValueError, match="query_mode"):
        TheoryTask(query_mode="random")
    with pytest.raises(ValueError, match="m must"):
        TheoryTask(m=0)
    with pytest.raises(ValueError, match="tau_p"):
        confident_concentration(jnp.array([0.5]), jnp.array([0.5]), 0.1, -0.2)
    with pytest.raises(ValueError, match=r"mu_qk0 > 0.*0.0"):
        make_aligned(TheoryTask(b=2, M=3, n_common=4), "FACO", 0.0, 0.0)
    with pytest.raises(ValueError, match=r"alpha.*1.5"):
        qkov.train_fixed_attention(1.5, factorised_ov=False, steps=10)
    with pytest.raises(ValueError, match="key must be an integer seed"):
        qkov.train_on_generator("CACO", 0.1, 0.1, 10, key=0.5)
    with pytest.raises(ValueError, match=r"shape \(3,\): for several seeds in one compiled call, jax.vmap"):
        qkov.train(qkov.Setup(), 1.0, dt=0.5, key=np.arange(3))


# ----------------------------------------------------------------------------- SGD (slow)
@pytest.mark.slow
def test_sgd_faco_concentrates_fafo_does_not():
    """The paper's protocol (r = 1, SGD 1e-2, batch 32, eps-identity inits): FACO puts most examples in
    A_rel [0.8, 1] (paper 94.6%); FAFO stays diffuse (paper: 64.1% in [0.2, 0.4), 35.7% in [0.4, 0.6))."""
    gen = CodeGenerator(64)
    ev = gen.sample(jax.random.PRNGKey(7), 500)
    tokens, y, rel = gen.sample(jax.random.PRNGKey(8), 6400)
    eps = EpsIdentity(1e-6)
    out = {}
    for par, steps, init in (("FACO", 625_000, eps), ("FAFO", 275_000, {"W_v": eps, "W_o": eps})):
        _, m = qkov.train_on_generator(par, 1e-2, 1e-2, steps, key=1234, init=init, eval_set=ev, save=af.LinearGrid(5))
        z, a = m(tokens)
        p_true = jnp.take_along_axis(jax.nn.softmax(z, -1), y[:, None], 1)[:, 0]
        out[par] = dtap(relevant_mass(a, rel), p_true, DTAP_EDGES["synthetic"])
    tol = 10.0  # percentage points
    assert float(out["FACO"][4].sum()) > 94.6 - tol
    assert float(out["FAFO"][1].sum() + out["FAFO"][2].sum()) > 99.8 - tol
    assert float(out["FAFO"][4].sum()) < tol


def test_optimal_ratio_result_prints_its_numbers_and_certifies_itself():
    """`OptimalRatio` prints its numbers (equinox printed ``f64[]``) and ``converged(tol)`` is the KKT
    test: feasible, stationary, a multiplier only where the budget binds."""
    from attnflow.qkov import OptimalRatio

    def result(g, st, lam):
        a = lambda x: jnp.asarray(x, dtype=float)
        return OptimalRatio(a(15.73), a(np.log(15.73)), a(2e6), a(0.875), a(lam), a(g), a(st), jnp.zeros(300))

    ok = result(-1.7e-4, 2e-4, 1.18)
    assert repr(ok) == (
        "OptimalRatio(ratio=15.73, t=2e+06, alpha=0.875, multiplier=1.18, violation=-0.00017, "
        "stationarity=0.0002, steps=300)"
    )
    assert bool(ok.converged())
    assert not bool(result(-0.026, -0.16, 0.0).converged())  # a probe's 6 x 15 steps: not stationary
    assert not bool(result(-0.05, 0.0, 1.0).converged())  # a multiplier on a budget that does not bind
    assert not bool(result(0.01, 0.0, 1.0).converged())  # over budget
    assert bool(result(0.01, 0.0, 0.05).converged(tol=0.02))
    with pytest.raises(ValueError, match="tol"):
        ok.converged(tol=0.0)


@pytest.mark.slow
def test_optimal_ratio_warns_when_no_ratio_meets_the_budget():
    """A budget shorter than the fastest time to the loss (at r = 1) is unreachable: the
    result is returned with a RuntimeWarning naming the time it takes and the budget."""
    s = Setup()
    fastest = float(qkov.reach_loss(s, 1e-2)["t"])
    with pytest.warns(RuntimeWarning, match=r"reached at t = .* > time_budget = 10(\.0)?\b.*raise it or eta_max"):
        res = qkov.optimal_ratio(s, 1e-2, 10.0, outer=2, inner=3)
    assert float(res.violation) > np.log(fastest / 10.0) - 1e-6 and not bool(res.converged())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a budget met: no warning
        qkov.optimal_ratio(s, 1e-2, 10 * fastest, outer=2, inner=3)


def test_factorised_qk_rate_in_both_query_modes_matches_the_full_matrices():
    """g_QK = 2 s_QK mu_QK / c with s_QK = b (distinct_uniform) or sqrt(b) (dedicated, one query row
    per class): the reduced rate equals the factorised full-matrix flow's (the distinct readout,
    exact on the manifold); it was 3x too fast for dedicated queries at b = 9. The first integral
    with Phi_FA = c (ln mu + (m/n) Ei(mu)) / (2 s_QK) holds along the solve."""
    for mode in ("distinct_uniform", "dedicated"):
        task = TheoryTask(m=3, n=40, b=9, M=4, n_common=400, query_mode=mode)
        for par in ("FACO", "FAFO"):
            for c in (1.0, 0.5):
                model = make_aligned(task, par, 2.0, 0.7, score_scale=c)
                g = jax.grad(task.population_loss)(model)
                dW = -(g.W_q.T @ model.W_k + model.W_q.T @ g.W_k)  # eta_QK = 1
                s = Setup(
                    parametrisation=par, m=3, n=40, b=9, M=4, n_common=400, query_mode=mode, eta_qk=1.0, score_scale=c
                )
                want = reduced_field(0.0, {"mu_ov": jnp.array(2.0), "mu_qk": jnp.array(0.7)}, s)["mu_qk"]
                assert float(want) == pytest.approx(c * float(qkov.mu_qk_distinct(dW, task)), rel=1e-10)
        s = Setup(parametrisation="FACO", m=3, n=40, b=9, M=4, n_common=400, query_mode=mode, mu0=0.05)
        assert s.s_qk == (9.0 if mode == "distinct_uniform" else 3.0)
        tr = qkov.solve(s, 2000.0)
        assert float(jnp.max(jnp.abs(qkov.first_integral(tr.ys, s)))) < 1e-7


@pytest.mark.slow
def test_online_sgd_records_the_networks_own_loss_and_attention():
    """Online SGD leaves the invariant manifold, where the mean-embedding loss is a projection:
    train records loss and alpha on EVAL_SAMPLES held-out sequences of the fixed seed EVAL_SEED
    (whatever the training key, as train_on_generator and heads.train), exactly model_observables
    of the returned network on them."""
    s = Setup()
    tr, model = train(s, 300.0, dt=1.0, batch=16, key=3, save=af.LinearGrid(3), return_model=True)
    assert tr.meta["observed on"] == f"loss and alpha on {qkov.EVAL_SAMPLES} held-out sequences"
    assert qkov.EVAL_SEED == 7
    bank = s.task.sample(jax.random.PRNGKey(qkov.EVAL_SEED), qkov.EVAL_SAMPLES)
    own = qkov.model_observables(model, s, eval_set=bank)
    for name in ("loss", "alpha", "mu_qk"):
        assert float(tr[name][-1]) == pytest.approx(float(own[name]), rel=1e-10), name
    # another training key: other draws, the same held-out sequences
    tr4, other = train(s, 300.0, dt=1.0, batch=16, key=4, save=af.LinearGrid(3), return_model=True)
    own4 = qkov.model_observables(other, s, eval_set=bank)
    assert float(tr4["loss"][-1]) == pytest.approx(float(own4["loss"]), rel=1e-10)
    assert abs(float(own4["loss"]) - float(own["loss"])) > 1e-6
    proj = qkov.model_observables(model, s)  # the manifold forms differ off the manifold
    assert abs(float(own["loss"]) - float(proj["loss"])) > 1e-4
    mc = float(s.task.monte_carlo_loss(model, jax.random.PRNGKey(11), 2**15))
    assert float(own["loss"]) == pytest.approx(mc, rel=0.05)
    # full-batch descent stays on the manifold: the mean-embedding forms, unless asked
    gd = train(s, 300.0, dt=1.0, save=af.LinearGrid(3))
    assert "observed on" not in gd.meta
    with pytest.raises(ValueError, match="eval_samples measures loss and alpha on held-out sequences under descent"):
        train(s, 10.0, eval_samples=100)
    with pytest.raises(ValueError, match="eval_samples"):
        train(s, 10.0, dt=1.0, batch=4, eval_samples=0)


def test_horizons_of_1e15_with_the_step_floor_removed():
    """The default controller stops below 1e-12 (t1 - t0): at t1 = 1e15 that is 1e3, larger than
    the start needs, and the error names SolverOptions(dtmin=0), which reaches the horizon."""
    s = qkov.paper_setup(100.0)
    with pytest.raises(af.MaxStepsError, match=r"SolverOptions\(dtmin=0\) removes it"):
        solve(s, 1e15)
    tr = solve(s, 1e15, solver=af.SolverOptions(rtol=1e-10, atol=1e-12, dtmin=0))
    assert float(tr.ts[-1]) == 1e15 and float(tr.final()["loss"]) < 1e-11
    assert float(jnp.max(jnp.abs(qkov.first_integral(tr.ys, s)))) < 1e-6
    with pytest.raises(ValueError, match="dtmin"):
        af.SolverOptions(dtmin=-1.0)


def test_horizon_of_1e12_needs_the_step_floor_removed():
    """docs/qkov.md: FAFO from mu0 = 0.01 crosses its fast stretch near t = 150 with steps below
    1e-12 t1 = 1 at t1 = 1e12; SolverOptions(dtmin=0) (DEFAULT_SOLVER's tolerances) reaches t1 in
    553 steps, the first integral held to 4e-10."""
    s = Setup(parametrisation="FAFO")
    with pytest.raises(af.MaxStepsError, match=r"dtmin \(default 1e-12 \(t1 - t0\)\) at t = 149\.5"):
        solve(s, 1e12)
    tr = solve(s, 1e12, solver=qkov.DEFAULT_SOLVER.replace(dtmin=0))
    assert float(tr.ts[-1]) == 1e12
    assert float(tr.final()["loss"]) == pytest.approx(9.98e-14, rel=1e-2)
    assert float(jnp.max(jnp.abs(first_integral(tr.ys, s)))) < 1e-8


L0_REF = float(np.log(4.0))  # the initial loss of Setup(): log(1 + (M - 1)) with M = 4


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf"), 5.0, L0_REF])
def test_every_loss_target_verb_refuses_the_same_targets(bad):
    """solve, state_at_loss, escape_time, reach_loss, authors_rk4, train (flow and descent) and
    the ratio tools (optimal_ratio, ratio_sensitivity, fixed_loss_slope, pareto_front) refuse a
    target that is not finite and positive, or not below L(0) = log 4, with one message naming the
    argument (escape_time's is threshold), before computing anything."""
    s = Setup()
    verbs = {
        "solve": lambda L: solve(s, 1e4, loss_target=L),
        "state_at_loss": lambda L: state_at_loss(s, L),
        "escape_time": lambda L: qkov.escape_time(s, L, t1=1e4),
        "reach_loss": lambda L: qkov.reach_loss(s, L),
        "authors_rk4": lambda L: authors_rk4(s, loss_target=L),
        "train": lambda L: train(s, 1e4, loss_target=L),
        "train (descent)": lambda L: train(s, 1e4, dt=1.0, loss_target=L),
        "optimal_ratio": lambda L: qkov.optimal_ratio(s, L, 1e4),
        "ratio_sensitivity": lambda L: qkov.ratio_sensitivity(s, L),
        "fixed_loss_slope": lambda L: qkov.fixed_loss_slope(s, L),
        "pareto_front": lambda L: qkov.pareto_front(s, L, [0.1, 1.0]),
    }
    for verb, run in verbs.items():
        name = "threshold" if verb == "escape_time" else "loss_target"
        if np.isfinite(bad) and bad > 0:
            msg = f"{name} = {bad!r} must lie below the initial loss L(0) = {L0_REF!r}: the flow only decreases"
            msg += " the loss"
        else:
            msg = f"{name} must be finite and positive, got {bad!r}"
        with pytest.raises(ValueError) as err:
            run(bad)
        assert str(err.value) == msg, verb


def test_sweep_over_loss_target_fails_unreachable_points():
    """A traced target (a sweep axis) that solve, state_at_loss or escape_time cannot reach marks
    its point failed with the concrete error's message, not a NaN that reads as "not reached by
    t1"; the reachable point keeps its value (t = 628.736, alpha = 0.79361 at L = 0.05)."""
    s = Setup()
    Ls = {"L": np.array([-0.1, 0.05, 3.0])}
    below = f"must lie below the initial loss L(0) = {L0_REF!r}: the flow only decreases the loss"
    for name, fn, value in [
        ("loss_target", lambda L: solve(s, 1e4, loss_target=L, save=af.LinearGrid(2)).t_event, 628.7359),
        ("loss_target", lambda L: state_at_loss(s, L)["alpha"], 0.793606),
        ("threshold", lambda L: qkov.escape_time(s, L, t1=1e4), 628.7359),
    ]:
        with pytest.warns(RuntimeWarning, match="2 of 3 grid points failed"):
            res = af.sweep(fn, Ls, progress=False)
        assert res.status.tolist() == [1, 0, 2]
        assert res.failures() == [({"L": -0.1}, f"{name} must be finite and positive"), ({"L": 3.0}, f"{name} {below}")]
        assert float(res.values[1]) == pytest.approx(value, rel=1e-5)
        assert np.isnan(float(res.values[0])) and np.isnan(float(res.values[2]))


def test_train_loss_target_is_the_loss_event():
    """train(loss_target=L) stops gradient flow where the recorded loss reaches L, as solve does:
    FAFO at |C| = 100 with factor ratios 4 and 0.25 reaches 0.05 at t = 179.0497 (solve, with the
    open factorised kappa: 179.0993); gradient descent at dt = 0.5 reads 179.716 on its save
    points (O(dt)). A traced target (here a sweep axis) that the flow cannot reach fails its point
    with the concrete error's message; giving loss_target and event is refused, as in solve."""
    s = Setup(common_correction=True, parametrisation="FAFO", qk_factor_ratio=4.0, ov_factor_ratio=0.25, n_common=100)
    th = solve(s, 1e4, loss_target=0.05, save=af.LinearGrid(2))
    assert float(th.t_event) == pytest.approx(179.0993, abs=1e-3)
    with pytest.warns(RuntimeWarning, match="1 of 2 grid points failed"):
        flow = af.sweep(
            lambda L: train(s, 1e4, loss_target=L, save=af.LinearGrid(2)).t_event,
            {"L": np.array([0.05, 3.0])},
            progress=False,
        )
    assert float(flow.values[0]) == pytest.approx(179.0497, abs=1e-3)
    assert abs(float(flow.values[0]) / float(th.t_event) - 1) < 5e-4
    L0 = float(loss(s.initial_state(), s))  # 1.38273: FAFO starts at mu0 = 0.01
    assert flow.status.tolist() == [0, 2] and flow.failures() == [
        ({"L": 3.0}, f"loss_target must lie below the initial loss L(0) = {L0!r}: the flow only decreases the loss")
    ]
    gd = train(s, 400.0, dt=0.5, loss_target=0.05, save=af.LinearGrid(201))
    assert float(gd.t_event) == pytest.approx(179.716, abs=1e-2)
    with pytest.raises(
        ValueError,
        match=re.escape("give loss_target or event, not both (loss_target=L is event=lambda t, o: o['loss'] - L)"),
    ):
        train(s, 10.0, loss_target=0.05, event=lambda t, o: o["loss"] - 0.05)


def test_factorised_qk_common_correction_halves_kappa():
    """FA analogue of kappa (spec: open, default 1): 1 + b / (2|C|) with common_correction. FACO's
    mu_QK against the full-matrix flow at |C| = 100: 3.5e-2 without, 2.0e-3 with (relative)."""
    s = Setup(parametrisation="FACO", n_common=100, mu0=0.05)
    assert s.kappa == 1.0 and s.replace(common_correction=True).kappa == pytest.approx(1 + 4 / 200)
    sim = train(s, 2000.0)
    gaps = []
    for cc in (False, True):
        th = solve(s.replace(common_correction=cc), 2000.0, save=af.TimeGrid(sim.ts))
        gaps.append(float(jnp.max(jnp.abs(th["mu_qk"] - sim["mu_qk"])) / jnp.max(jnp.abs(th["mu_qk"]))))
    assert gaps[0] > 0.03 and gaps[1] < 3e-3, gaps


def test_per_factor_rates_act_with_their_geometric_mean():
    """Spec section 4: per-factor rates eta_Q,K,V,O; weighted-balanced factors act with rate
    sqrt(eta_A eta_B). FAFO with eta_Q / eta_K = 9 and eta_O / eta_V = 4 around the same circuit
    rates follows the equal-rate flow (its reduced ODE) to solver precision; the weighted
    balance eta (A^T A / eta_A - B B^T / eta_B) is conserved."""
    base = Setup(parametrisation="FAFO")
    s = base.replace(qk_factor_ratio=9.0, ov_factor_ratio=4.0)
    rates = s.factor_rates
    assert float(rates["q"]) == pytest.approx(9.0) and float(rates["k"]) == pytest.approx(1.0)
    assert float(rates["o"] * rates["v"]) == pytest.approx(1.0) and float(rates["o"] / rates["v"]) == pytest.approx(4.0)
    for c, (A, B) in s.model().factors().items():  # the start is weighted-balanced
        eta_A, eta_B = (rates["q"], rates["k"]) if c == "qk" else (rates["o"], rates["v"])
        np.testing.assert_allclose(A.T @ A / eta_A, B @ B.T / eta_B, atol=1e-14)
    grid = af.LogGrid(12, t_min=1.0)
    solver = qkov.FLOW_SOLVER.replace(rtol=1e-10, atol=1e-12)
    equal = train(base, 300.0, save=grid, solver=solver)
    per_factor = train(s, 300.0, save=grid, conserved=True, solver=solver)
    for name in ("mu_ov", "mu_qk"):
        np.testing.assert_allclose(per_factor[name], equal[name], rtol=1e-7)
    for name in ("conserved_qk", "conserved_ov"):
        assert float(jnp.max(jnp.abs(per_factor[name] - per_factor[name][0]))) < 1e-9
    # gradient descent starts from the same weighted-balanced factors: its conserved form is 0
    # at t = 0 and it follows the flow to O(dt)
    descent = train(s, 2.0, dt=0.01, conserved=True)
    flow = train(s, 2.0, conserved=True, save=af.TimeGrid(descent.ts))
    for name in ("conserved_qk", "conserved_ov"):
        assert float(jnp.max(jnp.abs(descent[name][0]))) < 1e-14
    np.testing.assert_allclose(descent["mu_ov"], flow["mu_ov"], rtol=1e-3)
    public = qkov.conserved_quantities(s.model({"mu_ov": 0.3, "mu_qk": 0.2}), (9.0, 4.0))
    assert set(public) == {"conserved_qk", "conserved_ov"}
    assert max(float(jnp.max(jnp.abs(v))) for v in public.values()) < 1e-14
    skew = qkov.conserved_quantities(s.model(), (1.0, 1.0))  # the unweighted form is not 0 there
    assert float(jnp.max(jnp.abs(skew["conserved_qk"]))) > 1e-3
    with pytest.raises(ValueError, match=r"qk_factor_ratio \(eta_Q / eta_K\) = 2 needs a factorised circuit; CACO"):
        Setup(qk_factor_ratio=2.0)
    with pytest.raises(ValueError, match="ov_factor_ratio"):
        Setup(parametrisation="FAFO", ov_factor_ratio=-1.0)


def test_train_records_the_readouts_asked_for():
    """Spec section 5.1 readouts as options: mu_OV by projection or difference (equal on the
    manifold), mu_QK by gap, distinct or the measured attention."""
    s = Setup()
    grid = af.LinearGrid(4)
    flow = train(s, 200.0, save=grid)
    other = train(s, 200.0, save=grid, ov_readout="difference", qk_readout="distinct")
    np.testing.assert_allclose(other["mu_ov"], flow["mu_ov"], rtol=1e-9)
    # the common scores fall too (b/|C| of the distinct rate): distinct = gap / (1 + b/|C|)
    np.testing.assert_allclose(other["mu_qk"][1:], flow["mu_qk"][1:] / (1 + 4 / 400), rtol=1e-6)
    sgd = train(s, 100.0, dt=1.0, batch=8, save=grid, qk_readout="attention")
    want = qkov.mu_qk_from_attention(sgd["alpha"], s.m, s.n)
    np.testing.assert_allclose(sgd["mu_qk"], want, rtol=1e-12)
    with pytest.raises(ValueError, match="unknown qk_readout 'gpa'"):
        train(s, 1.0, qk_readout="gpa")
    with pytest.raises(ValueError, match='qk_readout="attention" reads mu_QK from attention measured'):
        train(s, 1.0, qk_readout="attention")


def test_binomial_counts_keep_the_mean_and_lower_the_attention():
    """Spec 3.2 [open]: m, n fixed per sequence (default) or drawn. With counts="binomial" every
    context position is distinct with probability m / (m + n): the count has mean m and
    variance (m + n) p (1 - p); alpha, concave in m, falls below the fixed-count ODE's (Jensen),
    while fixed counts follow it."""
    fixed, drawn = Setup(), Setup(counts="binomial")
    tokens, labels, rel = drawn.task.sample(jax.random.PRNGKey(0), 20000)
    k = np.asarray(rel.sum(1), dtype=float)
    p = 5 / 55
    assert tokens.shape == (20000, 56) and k.mean() == pytest.approx(5.0, abs=4 * np.sqrt(55 * p * (1 - p) / 20000))
    assert k.var() == pytest.approx(55 * p * (1 - p), rel=0.05)
    assert np.all(np.asarray(fixed.task.sample(jax.random.PRNGKey(0), 100)[2].sum(1)) == 5)
    distinct = np.asarray(tokens)[np.asarray(rel)]  # the distinct positions hold the class's tokens
    cls = np.broadcast_to(np.asarray(labels)[:, None], rel.shape)[np.asarray(rel)]
    assert np.all(distinct // 4 == cls)
    grid = af.LinearGrid(3)
    theory = qkov.solve(fixed, 200.0, save=grid)["alpha"][-1]
    alphas = [float(train(s, 200.0, dt=1.0, batch=32, save=grid)["alpha"][-1]) for s in (fixed, drawn)]
    assert abs(alphas[0] - float(theory)) < 1e-3 and alphas[1] < float(theory) - 1e-3, (alphas, float(theory))
    with pytest.raises(ValueError, match="counts"):
        Setup(counts="poisson")
