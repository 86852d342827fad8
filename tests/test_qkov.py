"""attnflow.qkov: reduced ODEs, first integrals, reference values, full-matrix flow, metrics, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow.qkov import (QKOVParams, alpha, asymptotics, authors_rk4, balanced_factorise, factor_conserved, first_integral,
                           invariant, loss, reduced_field, solve_reduced, state_at_loss, upper_bounds)
from attnflow.qkov.data import CodeGenerator, TheoryTask
from attnflow.qkov.metrics import (attention_concentration, comprehensiveness_sufficiency, confident_concentration, dtap,
                                   relevant_mass, separability)
from attnflow.qkov.model import circuit_labels, make_aligned, make_model
from attnflow.qkov.observe import flow_readouts, readouts

PAPER = dict(m=5, n=50, b=50, M=20, eta_ov=1.0)
RATIOS = [0.01, 0.1, 1.0, 10.0, 100.0]


def paper(r, **kw):
    return QKOVParams.create(**PAPER, ratio=r, **kw)


# ----------------------------------------------------------------------------- reduced ODE
def test_closed_forms_of_alpha_and_loss():
    p = paper(1.0)
    mu = jnp.array([0.0, 1.0, 5.0])
    np.testing.assert_allclose(alpha(mu, p), 5 * jnp.exp(mu) / (5 * jnp.exp(mu) + 50), rtol=1e-14)
    st = {"mu_ov": jnp.array(3.0), "mu_qk": jnp.array(1.0)}
    a = 5 * np.e / (5 * np.e + 50)
    assert float(loss(st, p)) == pytest.approx(np.log(1 + 19 * np.exp(-a * 3.0)), rel=1e-14)
    # at the origin: loss log M, field (eta_OV alpha / (b M), 0)
    z = {"mu_ov": jnp.array(0.0), "mu_qk": jnp.array(0.0)}
    assert float(loss(z, p)) == pytest.approx(np.log(20), rel=1e-14)
    d = reduced_field(0.0, z, p)
    assert float(d["mu_ov"]) == pytest.approx(1.0 * (5 / 55) / (50 * 20), rel=1e-14) and float(d["mu_qk"]) == 0.0


@pytest.mark.parametrize("r", RATIOS)
def test_first_integral_along_caco_for_every_ratio(r):
    tr = solve_reduced(paper(r), loss_target=1e-4, rtol=1e-10, atol=1e-12)
    st = {"mu_ov": tr["mu_ov"], "mu_qk": tr["mu_qk"]}
    res = first_integral(st, paper(r))
    scale = 1.0 + jnp.max(st["mu_qk"] + 0.1 * jnp.exp(st["mu_qk"]))  # size of the terms of Phi (= K Psi)
    assert float(jnp.max(jnp.abs(res)) / scale) < 1e-9
    assert float(tr["loss"][-1]) == pytest.approx(1e-4, rel=1e-8)


@pytest.mark.parametrize("par", ["FACO", "CAFO", "FAFO"])
def test_first_integral_factorised(par):
    init = {"mu_ov": 0.01 if par[2:] == "FO" else 0.0, "mu_qk": 0.01 if par[:2] == "FA" else 0.0}
    p = QKOVParams.create(**PAPER, ratio=3.0, parametrisation=par)
    tr = af.integrate(reduced_field, init, 3e4, args=p, n_save=60, rtol=1e-11, atol=1e-13)
    res = first_integral({"mu_ov": tr["mu_ov"], "mu_qk": tr["mu_qk"]}, p, initial=init)
    assert float(jnp.max(jnp.abs(res))) < 1e-9
    assert float(tr["mu_ov"][-1]) > 10 * init["mu_ov"] + 0.1  # it actually moved


def test_reference_values_r001():
    """Spec 14.1: tau_end = 2.55e6, mu_OV = 81.669, mu_QK = 0.559, alpha = 0.149 (printed digits)."""
    p = paper(0.01)
    ad = solve_reduced(p)
    rk = authors_rk4(p)
    fl = state_at_loss(1e-4, p)
    for state, tau in ((ad.final(), float(ad.ts[-1])), (rk.final(), float(rk.ts[-1])), (fl, None)):
        if tau is not None:
            assert float(f"{tau:.3g}") == 2.55e6
        assert round(float(state["mu_ov"]), 3) == 81.669
        assert round(float(state["mu_qk"]), 3) == 0.559
        assert round(float(state["alpha"]), 3) == 0.149


def test_fixed_loss_solver_matches_event_and_is_monotone_in_r():
    for r in (0.1, 10.0):
        for L in (0.5, 1e-2):
            ev = solve_reduced(paper(r), loss_target=L).final()
            fl = state_at_loss(L, paper(r))
            for k in ("mu_ov", "mu_qk", "alpha"):
                assert float(fl[k]) == pytest.approx(float(ev[k]), rel=1e-7)
    rs = jnp.geomspace(0.01, 100, 30)
    st = jax.vmap(lambda r: state_at_loss(1e-2, paper(r)))(rs)
    assert bool(jnp.all(jnp.diff(st["alpha"]) > 0)) and bool(jnp.all(jnp.diff(st["mu_qk"]) > 0))
    assert bool(jnp.all(jnp.diff(st["mu_ov"]) < 0))


def test_growth_laws_and_asymptotics():
    p = paper(100.0)
    tr = solve_reduced(p, loss_target=1e-4)
    ub = upper_bounds(tr.ts[1:], p)
    assert bool(jnp.all(tr["mu_ov"][1:] <= ub["mu_ov"] * (1 + 1e-9)))
    assert bool(jnp.all(tr["mu_qk"][1:] <= p.ratio * 19 / (2 * 20 * 50) * tr["mu_ov"][1:] ** 2 * (1 + 1e-9)))
    t = tr.ts[-1]
    asy = asymptotics(t, p)
    f = tr.final()
    assert abs(float(f["mu_ov"] - asy["mu_ov"])) < 0.1
    assert float(f["loss"]) == pytest.approx(float(asy["loss"]), rel=0.1)
    assert float(1 - f["alpha"]) == pytest.approx(float(asy["one_minus_alpha"]), rel=0.25)


def test_authors_rk4_agrees_with_adaptive():
    for r in (1.0, 100.0):
        rk, ad = authors_rk4(paper(r)), solve_reduced(paper(r))
        assert float(rk.final()["mu_ov"]) == pytest.approx(float(ad.final()["mu_ov"]), rel=1e-4)
        assert float(rk.ts[-1]) == pytest.approx(float(ad.ts[-1]), rel=1e-4)


def test_reduced_gradients_check_grads():
    p = paper(3.0)

    def f(x):
        st = {"mu_ov": x[0], "mu_qk": x[1]}
        d = reduced_field(0.0, st, p)
        return jnp.stack([d["mu_ov"], d["mu_qk"], loss(st, p), invariant(st, p)])

    check_grads(f, (jnp.array([2.0, 0.7]),), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    pf = QKOVParams.create(**PAPER, ratio=3.0, parametrisation="FAFO")
    check_grads(lambda x: invariant({"mu_ov": x[0], "mu_qk": x[1]}, pf), (jnp.array([2.0, 0.7]),), order=1, modes=("rev",),
                atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------- full matrices
@pytest.fixture(scope="module")
def task():
    return TheoryTask(m=5, n=50, b=3, M=3, n_common=300)


@pytest.mark.parametrize("par", ["CACO", "FACO", "CAFO", "FAFO"])
def test_full_matrix_flow_equals_reduced(par):
    # factorised QK is exact only for |C| >> b (its common columns move through one factor): |C| = 300 b there
    n_common = 300 if par[:2] == "CA" else 900
    task = TheoryTask(m=5, n=50, b=3, M=3, n_common=n_common)
    eta_ov, eta_qk = 1.0, 3.0
    mu0 = {"mu_ov": 0.05 if par[2:] == "FO" else 0.0, "mu_qk": 0.05 if par[:2] == "FA" else 0.0}
    p = QKOVParams.create(m=5, n=50, b=3, M=3, eta_ov=eta_ov, eta_qk=eta_qk, parametrisation=par,
                          common_correction=par[:2] == "CA", n_common=n_common)
    ts = af.save_times(0.0, 600.0, 25, "log", t_min=1.0)
    red = af.integrate(reduced_field, mu0, 600.0, args=p, ts=ts, rtol=1e-11, atol=1e-13)
    model = make_aligned(task, par, mu0["mu_ov"], mu0["mu_qk"], eta_qk=eta_qk, eta_ov=eta_ov)

    def observe(m):
        return flow_readouts(m, task, eta_qk, eta_ov)

    full = af.gradient_flow(task.population_loss, model, 600.0, labels=circuit_labels(model), rates={"qk": eta_qk, "ov": eta_ov},
                            ts=ts, rtol=1e-10, atol=1e-12, observe=observe)
    assert float(full["alpha"][-1]) > float(full["alpha"][0]) + 0.2  # attention really sharpens during the run
    err = af.compare(red, full, ["mu_ov", "mu_qk"], relative=True, floor=1e-3)
    assert max(err.values()) < (1e-6 if par[:2] == "CA" else 0.02), err
    for k in ("conserved_qk", "conserved_ov"):
        if k in full:
            assert float(jnp.max(jnp.abs(full[k] - full[k][0]))) < 1e-8


def test_unequal_factor_rates_conserve_weighted_form(task):
    model = make_aligned(task, "CAFO", 0.1, 0.0, eta_ov=1.0)
    labels = circuit_labels(model, per_factor=True)
    rates = {"qk": 2.0, "o": 3.0, "v": 0.5}
    tr = af.gradient_flow(task.population_loss, model, 200.0, labels=labels, rates=rates, n_save=20, rtol=1e-10, atol=1e-12,
                          observe=lambda m: {"C": factor_conserved(m.W_o, m.W_v, 3.0, 0.5), "C_wrong": factor_conserved(m.W_o, m.W_v, 1.0, 1.0)})
    assert float(jnp.max(jnp.abs(tr["C"] - tr["C"][0]))) < 1e-8  # |C| ~ 0.4
    assert float(jnp.max(jnp.abs(tr["C_wrong"] - tr["C_wrong"][0]))) > 1e-4  # the unweighted form is not conserved


def test_balanced_factorise():
    W = jax.random.normal(jax.random.PRNGKey(0), (6, 9))
    A, B = balanced_factorise(W, 4.0, 0.25)
    np.testing.assert_allclose(A @ B, W, atol=1e-12)
    np.testing.assert_allclose(A.T @ A / 4.0, B @ B.T / 0.25, atol=1e-12)


def test_population_loss_mean_embedding_vs_monte_carlo(task):
    # on the invariant manifold every sequence has the same loss: Monte Carlo equals the mean-embedding value
    model = make_aligned(task, "CACO", 1.3, 0.7)
    me = task.population_loss(model)
    mc = task.monte_carlo_loss(model, jax.random.PRNGKey(0), 512)
    assert float(mc) == pytest.approx(float(me), rel=1e-12)
    st = {"mu_ov": jnp.array(1.3), "mu_qk": jnp.array(0.7)}
    p = QKOVParams.create(m=5, n=50, b=3, M=3)
    assert float(me) == pytest.approx(float(loss(st, p)), rel=1e-12)
    check_grads(lambda W: task.mean_embedding_loss(W, model.W_ov), (model.W_qk,), order=1, modes=("rev",), atol=1e-6, rtol=1e-5)


def test_dedicated_query_mode_rate(task):
    t2 = TheoryTask(m=5, n=50, b=3, M=3, n_common=300, query_mode="dedicated")
    p = QKOVParams.create(m=5, n=50, b=3, M=3, eta_qk=3.0, common_correction=True, n_common=300, query_mode="dedicated")
    model = make_aligned(t2, "CACO", 0.5, 0.2)
    g = jax.grad(t2.population_loss)(model)
    # the gap readout's rate under the flow equals the reduced field with p = 1
    d_qk = readouts(-3.0 * g.W_qk, -1.0 * g.W_ov, t2)["mu_qk"]
    want = reduced_field(0.0, {"mu_ov": jnp.array(0.5), "mu_qk": jnp.array(0.2)}, p)["mu_qk"]
    assert float(d_qk) == pytest.approx(float(want), rel=1e-10)


# ----------------------------------------------------------------------------- data and metrics
def test_code_generator_statistics():
    gen = CodeGenerator(64)
    tokens, y, rel = gen.sample(jax.random.PRNGKey(0), 4000)
    assert tokens.shape == (4000, 63) and rel.shape == (4000, 63)
    k = y - 1
    np.testing.assert_array_equal(tokens[:, -1], 5 + k)  # query id 5 + k
    ctx = tokens[:, :-1]
    frac = float(jnp.mean(ctx > 9))
    assert frac == pytest.approx(5.5 / 15.5, abs=0.005)
    # distinct tokens belong to the sequence's class, with weights 0.1 (i + 1)
    own = (ctx >= 10 * (k[:, None] + 1)) & (ctx < 10 * (k[:, None] + 2))
    assert bool(jnp.all(jnp.where(ctx > 9, own, True)))
    i = (ctx - 10 * (k[:, None] + 1))[ctx > 9]
    counts = np.bincount(np.asarray(i), minlength=10) / i.size
    np.testing.assert_allclose(counts, 0.1 * np.arange(1, 11) / 5.5, atol=0.01)


def test_dtap_binning_rules():
    a = jnp.array([0.0, 0.2, 0.9999, 1.0, 1.2, -0.1])
    p = jnp.array([0.5, 0.5, 0.5, 1.0, 0.5, 0.5])
    H = dtap(a, p, "synthetic")
    assert H.shape == (5, 5)
    # left-closed: 0.2 -> bin 1; last bin closed: 1.0 -> bin 4; out-of-range dropped, denominators unchanged
    assert float(H[0, 2]) == pytest.approx(100 / 6) and float(H[1, 2]) == pytest.approx(100 / 6)
    assert float(H[4, 2]) == pytest.approx(100 / 6) and float(H[4, 4]) == pytest.approx(100 / 6)
    assert float(jnp.sum(H)) == pytest.approx(400 / 6)
    Hs = dtap(jnp.stack([a, a]), jnp.stack([p, p]), [0.0, 0.5, 1.0], [0.0, 1.0])
    assert Hs.shape == (2, 1) and float(Hs[1, 0]) == pytest.approx(200 / 6)
    with pytest.raises(ValueError, match="increasing"):
        dtap(a, p, [0.0, 0.5, 0.4])


def test_attention_metrics():
    a = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    rel = jnp.array([[True, False, False], [False, False, True]])
    np.testing.assert_allclose(relevant_mass(a, rel), [0.7, 0.8])
    assert float(separability(a, rel)) == pytest.approx(((0.7 - 0.1) + (0.8 - 0.1)) / 2)
    assert float(attention_concentration(jnp.array([0.05, 0.1, 0.5]), 0.1)) == pytest.approx(2 / 3)
    assert float(attention_concentration(jnp.array([0.05, 0.1, 0.5]), 0.1, strict=True)) == pytest.approx(1 / 3)
    assert float(confident_concentration(jnp.array([0.05, 0.2, 0.5]), jnp.array([0.9, 0.05, 0.5]), 0.1, 0.1)) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="tau_a"):
        attention_concentration(jnp.array([0.5]), 1.5)


def test_comprehensiveness_sufficiency_on_a_model():
    gen = CodeGenerator(64)
    tokens, y, rel = gen.sample(jax.random.PRNGKey(1), 256)
    # a hand-built model that attends to distinct tokens and reads the class from them
    m = make_model("CACO", 50, init="zeros", score_scale=1.0, dtype=jnp.float64)
    W_qk = m.W_qk.at[:, 10:].set(5.0)
    W_ov = jnp.zeros((50, 50))
    for k in range(4):
        W_ov = W_ov.at[1 + k, 10 * (k + 1): 10 * (k + 2)].set(20.0)
    import equinox as eqx

    m = eqx.tree_at(lambda x: (x.W_qk, x.W_ov), m, (W_qk, W_ov))
    assert float(jnp.mean(jnp.argmax(m(tokens)[0], -1) == y)) == 1.0
    cs = comprehensiveness_sufficiency(m, tokens, top_percent=5.0)
    assert float(cs["comprehensiveness"]) > 0 and float(cs["sufficiency"]) < float(cs["comprehensiveness"])
    with pytest.raises(ValueError, match="top_percent"):
        comprehensiveness_sufficiency(m, tokens, top_percent=0.0)


def test_models_parametrisations_agree_on_products():
    for par in ("CACO", "FACO", "CAFO", "FAFO"):
        m = make_model(par, 50, key=3, dtype=jnp.float64)
        tokens = CodeGenerator(16).sample(jax.random.PRNGKey(2), 8)[0]
        z, a = m(tokens)
        W = m.W_QK()
        s = W[tokens[:, -1][:, None], tokens] * m.score_scale
        np.testing.assert_allclose(a, jax.nn.softmax(s, -1), rtol=1e-12)
        h = jnp.einsum("bl,blv->bv", a, jax.nn.one_hot(tokens, 50))
        np.testing.assert_allclose(z, h @ m.W_OV().T, rtol=1e-10, atol=1e-14)
        labels = circuit_labels(m)
        assert set(jax.tree_util.tree_leaves(labels)) == {"qk", "ov"}


# ----------------------------------------------------------------------------- bad input
def test_bad_input():
    with pytest.raises(ValueError, match="eta_ov.*-1"):
        QKOVParams.create(eta_ov=-1.0)
    with pytest.raises(ValueError, match="ratio.*0"):
        QKOVParams.create(ratio=0.0)
    with pytest.raises(ValueError, match="m must"):
        QKOVParams.create(m=0.0)
    with pytest.raises(ValueError, match="n must"):
        QKOVParams.create(n=-5.0)
    with pytest.raises(ValueError, match="unknown parametrisation 'FOCA'"):
        QKOVParams.create(parametrisation="FOCA")
    with pytest.raises(ValueError, match="unknown parametrisation"):
        make_model("XYZ", 50)
    with pytest.raises(ValueError, match="n_common"):
        QKOVParams.create(common_correction=True)
    with pytest.raises(ValueError, match="query_mode"):
        TheoryTask(query_mode="random")
    with pytest.raises(ValueError, match="m must"):
        TheoryTask(m=0)
    with pytest.raises(ValueError, match="tau_p"):
        confident_concentration(jnp.array([0.5]), jnp.array([0.5]), 0.1, -0.2)
    with pytest.raises(ValueError, match="mu_qk0 > 0"):
        make_aligned(TheoryTask(b=2, M=3, n_common=4), "FACO", 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown init"):
        make_model("CACO", 50, init="xavier")


# ----------------------------------------------------------------------------- SGD (slow)
@pytest.mark.slow
def test_sgd_faco_concentrates_fafo_does_not():
    """Spec 14.3 protocol (r = 1, SGD 1e-2, batch 32, eps-identity inits): FACO puts most examples in
    A_rel [0.8, 1] (paper 94.6%); FAFO stays diffuse (paper: 64.1% in [0.2, 0.4), 35.7% in [0.4, 0.6))."""
    from attnflow.qkov.experiments import _EPS_INIT, _per_example, _train

    gen = CodeGenerator(64)
    ev = gen.sample(jax.random.PRNGKey(7), 500)
    ev_big = gen.sample(jax.random.PRNGKey(8), 6400)
    out = {}
    for par, steps in (("FACO", 625_000), ("FAFO", 275_000)):
        _, m = _train(par, _EPS_INIT[par], {"qk": 1e-2, "ov": 1e-2}, steps, gen, 1234, ev, n_save=5)
        per = _per_example(m, ev_big)
        out[par] = dtap(per["a_rel"], per["p_true"], "synthetic")
    tol = 10.0  # percentage points
    assert float(out["FACO"][4].sum()) > 94.6 - tol
    assert float(out["FAFO"][1].sum() + out["FAFO"][2].sum()) > 99.8 - tol
    assert float(out["FAFO"][4].sum()) < tol
