"""attnflow.focus: protocol (Setup / solve / train / OBSERVABLES), reference values, gradients,
flows, reduced ODE, Stage IV, corpus estimation, bad input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import focus

PI = focus.SYNTHETIC_PI
SMALL = {"m": 4, "mk": 4}  # widths of the quick flows


@pytest.fixture(scope="module")
def chain():
    return focus.MarkovChain.lazy(PI, 0.5)


# ----------------------------------------------------------------------------- protocol
def test_protocol_defaults_solve_and_train_agree():
    """Defaults only: the population flow and finite-context SGD from the same draw agree to the
    documented tolerance on loss, entropy and the spectrum of W0."""
    s = focus.Setup()
    T = focus.REFERENCE_T
    th = focus.solve(s, T)
    sim = focus.train(s, T, key=0)
    assert set(th.names) == set(sim.names) == set(focus.OBSERVABLES)
    # the same initial draw theta0
    for k in ("loss", "norm_M", "sv_W0", "A"):
        np.testing.assert_allclose(th[k][0], sim[k][0], rtol=1e-12, atol=1e-15)
    gaps = af.compare(th, sim)
    for name, tol in focus.TRAIN_TOLERANCE.items():
        assert gaps[name] < tol, (name, gaps[name], tol)
    # docs/focus.md: compare interpolates the theory between its log-spaced saves (0.0011 of the
    # 0.0116 loss gap); solved on train's own times the gap is the model's alone (0.0105)
    at_sim = focus.solve(s, T, save=af.TimeGrid(sim.ts))
    np.testing.assert_allclose(at_sim.ts, sim.ts, rtol=0, atol=0)
    assert round(af.compare(th, at_sim)["loss"], 4) == 0.0011
    assert round(gaps["loss"], 4) == 0.0116 and round(af.compare(at_sim, sim)["loss"], 4) == 0.0105
    # the run went somewhere: Stage I is over, the loss sits near H(pi) in both
    H = float(s.chain.entropy())
    assert abs(float(th["loss"][-1]) - H) < 0.01 and abs(float(sim["loss"][-1]) - H) < 0.02


def test_without_x64_the_setup_builds_and_solve_asks_for_x64():
    """In float32 the default chain's rows sum to 1 only to float32 rounding: Setup() builds, and
    solve names the missing 64-bit mode instead of a chain error."""
    with jax.enable_x64(False):
        s = focus.Setup()
        assert s.chain.pi.dtype == jnp.float32
        with pytest.raises(RuntimeError, match=r"64-bit mode is off\. Call attnflow\.enable_x64\(\)"):
            focus.solve(s, 1.0)
        # theory without integrating asks too (authors_rk4 missed its reference in float32: 81.636 vs 81.669)
        from attnflow import qkov

        for theory in (
            lambda: focus.stage_predictions(s),
            lambda: qkov.state_at_loss(qkov.Setup(), 0.1),
            lambda: qkov.authors_rk4(qkov.paper_setup(1.0)),
        ):
            with pytest.raises(RuntimeError, match="64-bit mode is off"):
                theory()
        with pytest.raises(ValueError, match="pi must sum to 1"):
            focus.MarkovChain.lazy([0.5, 0.6], 0.5)  # a real error is still one


def test_new_numbers_compile_nothing():
    """A new tau, eta, eps or chain (lam) reuses the compiled solve and train."""
    s = focus.Setup(**SMALL)
    focus.solve(s, 20.0)
    focus.train(s, 1.0, key=0, context=16, batch=8, save=af.LinearGrid(3))
    with af.count_compilations() as c:
        a = focus.solve(s.replace(tau=1.3), 20.0)
        b = focus.solve(s.replace(eta=0.5, eps=2e-3), 20.0)
        lam = focus.solve(focus.Setup(chain=focus.MarkovChain.lazy(PI, 0.7), **SMALL), 20.0)
        focus.train(s.replace(eta=0.7, tau=1.2), 1.0, key=3, context=16, batch=8, save=af.LinearGrid(3))
    assert c.n == 0
    assert float(a["loss"][-1]) != float(b["loss"][-1]) != float(lam["loss"][-1])
    # eta rescales the clock: the flow with eta = 0.5 at t = 20 is the flow with eta = 1 at t = 10
    ref = focus.solve(s.replace(eps=2e-3), 10.0, save=af.LinearGrid(2))
    assert float(b["loss"][-1]) == pytest.approx(float(ref["loss"][-1]), abs=1e-7)


def test_setup_and_key_are_sweepable():
    """lam inside a sweep (traced chain), and seeds of train inside a sweep (traced key)."""

    def final_loss(lam):
        s = focus.Setup(chain=focus.MarkovChain.lazy(PI, lam), **SMALL)
        return focus.solve(s, 30.0, save=af.LinearGrid(2)).final()["loss"]

    res = af.sweep(final_loss, {"lam": np.array([0.3, 0.9])}, progress=False)
    for lam, v in zip((0.3, 0.9), np.asarray(res.values), strict=True):
        one = focus.solve(focus.Setup(chain=focus.MarkovChain.lazy(PI, lam), **SMALL), 30.0, save=af.LinearGrid(2))
        assert float(v) == pytest.approx(float(one["loss"][-1]), rel=1e-9)
    s = focus.Setup(**SMALL)
    sims = af.sweep(
        lambda seed: focus.train(s, 1.0, key=seed, context=16, batch=8, save=af.LinearGrid(3))["loss"],
        {"seed": np.arange(2)},
        progress=False,
    ).values
    np.testing.assert_allclose(sims[:, 0], sims[0, 0])  # same theta0
    assert float(jnp.abs(sims[0, -1] - sims[1, -1])) > 0  # different draws
    np.testing.assert_allclose(
        sims[1], focus.train(s, 1.0, key=1, context=16, batch=8, save=af.LinearGrid(3))["loss"], rtol=1e-10
    )


def test_nested_observe_on_solve_and_train():
    """A user observe returning nested dicts is flattened to dotted names, on both verbs."""

    def extra(theta, setup):
        return {"conserved": focus.conserved(theta), "rank": {"W0": focus.effective_rank(theta["W0"])}}

    s = focus.Setup(**SMALL)
    th = focus.solve(s, 5.0, observe=extra, save=af.LinearGrid(5))
    sim = focus.train(s, 5.0, key=0, context=16, batch=8, observe=extra, save=af.LinearGrid(5))
    for tr in (th, sim):
        assert {"conserved.C_m", "conserved.C_k", "rank.W0"} <= set(tr.names)
        assert tr["conserved.C_m"].shape == (5, 4, 4)
    np.testing.assert_allclose(th["conserved.C_m"][0], sim["conserved.C_m"][0], atol=1e-18)
    with pytest.raises(ValueError, match="already recorded"):
        focus.solve(s, 5.0, observe=lambda theta, setup: {"loss": theta["W0"]})


# ----------------------------------------------------------------------------- reference values and gradients
def test_reference_values(chain):
    th = focus.init_theta(0, 4, eps=1e-6)
    assert float(focus.population_loss(th, chain)) == pytest.approx(np.log(4), abs=1e-9)
    assert round(float(chain.entropy()), 4) == 0.7271
    assert round(2 * float(focus.sigma(chain.pi)), 4) == 0.9190
    c1 = focus.critical_point_c1(chain.pi, jnp.eye(16)[0])
    assert round(float(c1["a2"]), 3) == 4.124
    assert round(float(focus.attention_rate_lazy(chain.pi, 0.5, 1.0)), 4) == 0.0798
    theta_c1 = {k: c1[k] for k in focus.PARAMETERS}
    assert float(focus.population_loss(theta_c1, chain)) == pytest.approx(float(chain.entropy()), abs=1e-12)
    A0 = focus.attention(th, chain.pi)
    assert float(focus.token_entropy(A0, chain.pi)) == pytest.approx(float(chain.entropy()), abs=1e-9)
    g = focus.population_grads(theta_c1, chain)
    assert max(float(jnp.max(jnp.abs(v))) for v in g.values()) < 1e-12
    pred = focus.stage_predictions(focus.Setup())
    assert float(pred["c"]) == pytest.approx(0.0798, abs=5e-5) and float(pred["sigma"]) == pytest.approx(
        0.4595, abs=1e-4
    )
    assert float(pred["T_I"]) == pytest.approx(np.log(1e3) / float(pred["sigma"]), rel=1e-12)


@pytest.mark.parametrize("lam", [0.5, 0.9, -0.005])
def test_general_rate_equals_lazy_closed_form(lam):
    ch = focus.MarkovChain.lazy(PI, lam)
    c1 = focus.critical_point_c1(ch.pi, jnp.ones(3))
    general = focus.attention_rate(ch.pi, ch.P, 2.0, c1["gamma"], c1["beta"])
    assert float(general) == pytest.approx(float(focus.attention_rate_lazy(ch.pi, lam, 2.0)), rel=1e-12, abs=1e-15)


def test_closed_form_gradients_equal_autodiff(chain):
    for scale in (1.0, 300.0):
        th = jax.tree_util.tree_map(lambda x: scale * x, focus.init_theta(1, 4, m=5, mk=3))
        g1, g2 = focus.population_grads(th, chain, 1.3), jax.grad(focus.population_loss)(th, chain, 1.3)
        for k in g1:
            np.testing.assert_allclose(g1[k], g2[k], rtol=1e-10, atol=1e-14)
    from jax.test_util import check_grads

    check_grads(
        lambda W0: focus.population_loss({**th, "W0": W0}, chain), (th["W0"] / 300,), order=2, atol=1e-5, rtol=1e-5
    )


# ----------------------------------------------------------------------------- flows
def _stage_one_extras(theta, setup):
    return {**focus.conserved(theta), "cos": focus.condensation(theta, setup.chain.pi)["cos_W0_pi"]}


def test_flow_loss_monotone_conserved_and_condenses():
    s = focus.Setup(m=6, mk=6, init_seed=2)
    tr = focus.solve(s, 60.0, observe=_stage_one_extras, save=af.LinearGrid(120))
    L = np.asarray(tr["loss"])
    assert np.all(np.diff(L) <= 1e-12)
    for k in ("C_m", "C_k"):
        assert float(jnp.max(jnp.abs(tr[k] - tr[k][0]))) < 1e-9
    # Stage I: |M| grows at 2 sigma; W0 condenses on pi; the loss reaches H(pi)
    assert focus.stage_one_rate(tr) == pytest.approx(2 * float(focus.sigma(s.chain.pi)), rel=0.03)
    H = float(s.chain.entropy())
    assert float(np.min(np.abs(L - H))) < 2e-3
    assert float(tr["cos"][int(np.argmin(np.abs(L - H)))]) > 0.999


def _rank_one_coords(theta, setup):
    return {
        "gamma": theta["W0"][:, 0],
        "beta": theta["W1"][0],
        "lam_q": theta["WQ"][0, 0],
        "rest": jnp.linalg.norm(theta["W0"][:, 1:]),
    }


def test_reduced_ode_conserves_and_matches_full_flow_on_rank_one_manifold():
    key = jax.random.PRNGKey(3)
    y0 = {
        "gamma": 0.01 * jax.random.normal(key, (4,)),
        "beta": 0.01 * jax.random.normal(jax.random.PRNGKey(4), (4,)),
        "lam_q": jnp.array(0.02),
        "lam_k": jnp.array(0.015),
    }
    s = focus.Setup(m=3, mk=3)
    grid, tight = af.LinearGrid(31), af.SolverOptions(rtol=1e-11, atol=1e-13)
    red = af.integrate(
        focus.reduced_field,
        y0,
        150.0,
        args=s,
        save=grid,
        solver=tight,
        observe=lambda t, y, a: {**focus.reduced_conserved(y), **y},
    )
    for k in ("qk", "norms"):
        assert float(jnp.max(jnp.abs(red[k] - red[k][0]))) < 1e-11
    # the full flow started on the rank-one manifold (m = mk = 3, embedded along e_1) stays on it
    e = jnp.eye(3)[0]
    th0 = {
        "W0": jnp.outer(y0["gamma"], e),
        "W1": jnp.outer(e, y0["beta"]),
        "WQ": y0["lam_q"] * jnp.outer(e, e),
        "WK": y0["lam_k"] * jnp.outer(e, e),
    }
    full = focus.solve(s, 150.0, initial=th0, save=grid, solver=tight, observe=_rank_one_coords)
    for k in ("gamma", "beta", "lam_q"):
        np.testing.assert_allclose(full[k], red[k], rtol=1e-7, atol=1e-10)
    assert float(jnp.max(full["rest"])) == 0.0
    assert abs(float(red["lam_q"][-1]) - float(y0["lam_q"])) > 1e-4  # it moved
    back = focus.reduced_from_theta(focus.theta_from_reduced(y0))
    assert all(bool(jnp.all(back[k] == y0[k])) for k in y0)


def test_stage_two_rate_from_critical_point(chain):
    """Started on theta_c^1 with O(eps) attention weights, q+ grows at c (R3, R4)."""
    c1 = focus.critical_point_c1(chain.pi, jnp.eye(4)[0])
    s = focus.Setup(**SMALL)
    th0 = s.theta0()
    theta = {"W0": c1["W0"], "W1": c1["W1"], "WQ": th0["WQ"], "WK": th0["WK"]}
    tr = focus.solve(s, 60.0, initial=theta, save=af.LinearGrid(121))
    q = np.asarray(tr["q_plus"])
    assert af.growth_rate(tr.ts, q, 10 * q[0], 0.05) == pytest.approx(
        float(focus.attention_rate_lazy(chain.pi, 0.5)), rel=0.01
    )


def test_population_loss_vs_finite_context_monte_carlo(chain):
    th = jax.tree_util.tree_map(lambda x: 400 * x, focus.init_theta(5, 4, m=4, mk=4))
    model = focus.OneLayerAttention.from_theta(th, 1.0)
    seqs = chain.sample(jax.random.PRNGKey(0), 4096, 2049, start="pi")
    per = jax.vmap(lambda s: focus.next_token_loss(model, s[None]))(seqs)
    mc, se = float(jnp.mean(per)), float(jnp.std(per) / np.sqrt(per.size))
    pop = float(focus.population_loss(th, chain))
    assert abs(mc - pop) < 4 * se + 5e-3, (mc, pop, se)  # sampling error plus the O(1/s) finite-context bias
    A_emp = focus.empirical_attention(model, seqs[:256])
    np.testing.assert_allclose(A_emp.sum(1), 1.0, atol=1e-12)


# ----------------------------------------------------------------------------- data
def test_markov_sampling_statistics(chain):
    x = np.asarray(chain.sample(jax.random.PRNGKey(1), 512, 400, start="pi"))
    np.testing.assert_allclose(np.bincount(x.ravel(), minlength=4) / x.size, PI, atol=0.01)
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (x[:, :-1].ravel(), x[:, 1:].ravel()), 1)
    np.testing.assert_allclose(pairs / pairs.sum(1, keepdims=True), chain.P, atol=0.02)
    first = np.asarray(chain.sample(jax.random.PRNGKey(2), 4000, 2))[:, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=4) / first.size, 0.25, atol=0.03)  # uniform start


def test_reversible_chain_and_perturbation():
    ch = focus.MarkovChain.reversible(PI, key=3)
    J = ch.pi[:, None] * ch.P
    np.testing.assert_allclose(J, J.T, atol=1e-10)
    np.testing.assert_allclose(ch.pi @ ch.P, ch.pi, atol=1e-10)
    # traceable: a vmap over keys gives the same chains
    Ps = jax.vmap(lambda k: focus.MarkovChain.reversible(PI, key=k).P)(jnp.arange(2, 4))
    np.testing.assert_allclose(Ps[1], ch.P, rtol=1e-12)
    np.testing.assert_allclose(
        focus.perturbed_pi(0.75, 4, 0.01), [0.75, 0.25 / 3 + 0.01, 0.25 / 3, 0.25 / 3 - 0.01], atol=1e-15
    )
    traced = jax.jit(lambda dl: focus.perturbed_pi(0.75, 4, dl))(0.01)
    np.testing.assert_allclose(traced, focus.perturbed_pi(0.75, 4, 0.01), atol=1e-15)


def test_corpus_chain_exact_counts():
    cc = focus.CorpusChain.from_text("abab\n\nbba", tokenizer=focus.Characters(), top_k=2, alpha=0.5)
    assert cc.vocab == ["b", "a", "<other>"]  # b: 4, a: 3 (ties by first appearance)
    want = np.zeros((3, 3))  # bigrams within documents: ab, ba, ab | bb, ba
    want[1, 0] = 2
    want[0, 1] = 2
    want[0, 0] = 1
    np.testing.assert_array_equal(cc.bigram_counts, want)
    np.testing.assert_allclose(cc.chain.P, (want + 0.5) / (want.sum(1, keepdims=True) + 1.5), rtol=1e-12)
    np.testing.assert_array_equal(cc.unigram, [4 / 7, 3 / 7, 0.0])
    with pytest.raises(ValueError, match="never has a successor"):
        focus.CorpusChain.from_text("ab ab", tokenizer=focus.Words(), top_k=1, alpha=0.0)
    cc = focus.CorpusChain.from_text("the cat the dog\n\nthe end", tokenizer=focus.Words(), top_k=2)
    assert cc.vocab[0] == "the" and cc.chain.d == 3 and cc.diagnostics["tokens"] == 6
    np.testing.assert_allclose(cc.chain.pi @ cc.chain.P, cc.chain.pi, atol=1e-12)


def test_corpus_from_data_dir(shared_data):
    cc = focus.CorpusChain.from_file("tinyshakespeare.txt", data_dir=shared_data, max_chars=200_000, top_k=16)
    assert cc.chain.d == 17 and cc.vocab[0] == " "
    assert cc.diagnostics["l1_pi_vs_unigram"] < 0.05
    w = cc.windows(jax.random.PRNGKey(0), 3, 9)
    assert w.shape == (3, 9) and int(w.max()) <= 16


def test_corpus_missing_file_names_both_places(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNFLOW_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match=r"data_dir = .*ATTNFLOW_DATA"):
        focus.CorpusChain.from_file("no_such_corpus.txt", data_dir=tmp_path)


def test_train_on_a_token_stream():
    """train with tokens= uses random windows of the stream (here a chain's own sample)."""
    s = focus.Setup(**SMALL)
    tokens = np.asarray(s.chain.sample(jax.random.PRNGKey(0), 1, 5000)[0])
    sim = focus.train(s, 2.0, key=0, tokens=tokens, context=16, batch=8, save=af.LinearGrid(3))
    assert sim.meta["data"] == "token stream" and np.all(np.isfinite(sim["loss"]))


# ----------------------------------------------------------------------------- metrics
def test_metrics():
    pi = jnp.array(PI)
    A = jnp.tile(pi, (4, 1))
    H = float(-(pi * jnp.log(pi)).sum())
    assert float(focus.token_entropy(A, pi)) == pytest.approx(H)
    np.testing.assert_allclose(focus.token_entropy(A), H)  # per query
    np.testing.assert_allclose(focus.kl_to_pi(A, pi), 0.0, atol=1e-15)
    W = jnp.diag(jnp.array([2.0, 1.0, 1.0]))
    assert float(focus.participation_ratio(W)) == pytest.approx(16 / 6)
    p = np.array([0.5, 0.25, 0.25])
    assert float(focus.effective_rank(W)) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    # the spec's alternatives: participation ratio and a threshold count
    assert float(focus.effective_rank(W, "participation")) == pytest.approx(16 / 6)
    assert float(focus.effective_rank(jnp.diag(jnp.array([2.0, 1.0, 1e-3])), "threshold")) == 2.0
    assert float(focus.effective_rank(jnp.diag(jnp.array([2.0, 1.0, 1e-3])), "threshold", rtol=1e-4)) == 3.0
    with pytest.raises(ValueError, match="unknown kind 'nuclear'"):
        focus.effective_rank(W, "nuclear")
    # D is the sum of the per-token coordinates rho gamma_1 - pi_1 gamma_i (d - 1 times each when symmetric)
    gamma = jnp.array([1.0, -0.2, -0.2, -0.2])
    red = focus.redistribution(
        {"W0": gamma[:, None], "W1": jnp.ones((1, 4)), "WQ": jnp.ones((1, 1)), "WK": jnp.ones((1, 1))}, pi
    )
    rho = 0.25 / 3
    np.testing.assert_allclose(red["D_token"], rho * 1.0 - 0.75 * -0.2, rtol=1e-12)
    assert float(red["D"]) == pytest.approx(3 * float(red["D_token"][0]), rel=1e-12)
    assert float(red["D"]) == pytest.approx(0.25 * 1.0 - 0.75 * -0.6, rel=1e-12)


def test_stage_sequence_alternates_transitions_and_plateaus():
    rows = focus.stage_sequence(
        [{"t_start": 1.0, "t_end": 3.0, "level": 0.9}, {"t_start": 5.0, "t_end": 8.0, "level": 0.5}],
        10.0,
        {0: (1.0, 1.1), 1: (2.0, 2.1)},
    )
    assert [r[0] for r in rows] == ["transition 1", "plateau 1", "transition 2", "plateau 2", "transition 3"]
    assert rows[2][1:3] == [3.0, 5.0] and rows[2][4:] == [None, None]
    assert rows[1][4:] == [1.0, 1.1] and rows[3][3:] == [0.5, 2.0, 2.1]


# ----------------------------------------------------------------------------- critical points
def _weights(theta, setup):
    return theta


@pytest.mark.parametrize("delta", [0.0, 0.02])
def test_degenerate_point_and_transverse_rate(delta):
    """At delta = 0, G_M = G_Phi = 0 on the Stage IV plateau; at delta != 0 a full jax.hessian
    reproduces mu_perp = s_max(G_M(theta_delta)). A repeated call compiles nothing."""
    from jax.flatten_util import ravel_pytree

    s = focus.Setup(chain=focus.MarkovChain.lazy(focus.perturbed_pi(0.75, 4, delta), 0.5), **SMALL)
    final = focus.solve(s, 600.0, save=af.LinearGrid(2), observe=_weights)
    theta = {k: final[k][-1] for k in focus.PARAMETERS}
    warm = focus.rank_one_part(theta)
    y = focus.degenerate_point(warm, s)
    with af.count_compilations() as c:
        y2 = focus.degenerate_point(warm, s)
    assert c.n == 0
    np.testing.assert_allclose(y2["gamma"], y["gamma"], rtol=1e-12)
    G_M, G_Phi = focus.gradient_blocks(focus.theta_from_reduced(y), s.chain, 1.0)
    assert float(jnp.max(jnp.abs(G_Phi))) < 1e-12
    mu = float(focus.transverse_rate(G_M))
    if delta == 0.0:
        assert mu < 1e-12
        # a warm start without attention sits at theta_c^1, a root of the reduced gradient too
        with pytest.raises(RuntimeError, match="reached the Stage II point theta_c\\^1"):
            focus.degenerate_point({**warm, "lam_q": 0.0 * warm["lam_q"], "lam_k": 0.0 * warm["lam_k"]}, s)
        return
    assert mu > 1e-3
    e = jnp.eye(2)[0]
    full = {
        "W0": jnp.outer(y["gamma"], e),
        "W1": jnp.outer(e, y["beta"]),
        "WQ": y["lam_q"] * jnp.outer(e, e),
        "WK": y["lam_k"] * jnp.outer(e, e),
    }
    flat, unravel = ravel_pytree(full)
    ev = np.linalg.eigvalsh(np.asarray(jax.hessian(lambda x: focus.population_loss(unravel(x), s.chain))(flat)))
    assert -ev[0] == pytest.approx(mu, rel=1e-8)


def test_jacobian_blocks_at_critical_point(chain):
    """At theta_c^1 the Jacobian is block-diagonal; the attention block has eigenvalues +-c
    (multiplicity mk) and the outer block is negative semidefinite."""
    m = mk = 3
    s = focus.Setup(m=m, mk=mk)
    c1 = focus.critical_point_c1(chain.pi, jnp.eye(m)[0])
    theta = {k: c1[k] for k in focus.PARAMETERS}
    refined = focus.refine_critical_point(theta, s)
    for k in theta:
        np.testing.assert_allclose(refined[k], theta[k], atol=1e-10)  # the closed form is already critical
    B = focus.jacobian_blocks(theta, s)
    assert float(jnp.max(jnp.abs(B["coupling"]))) < 1e-12
    att = np.sort(np.linalg.eigvals(np.asarray(B["attention"])).real)
    c = float(focus.attention_rate_lazy(chain.pi, 0.5, 1.0))
    np.testing.assert_allclose(att[-mk:], c, rtol=1e-8)
    np.testing.assert_allclose(att[:mk], -c, rtol=1e-8)
    assert np.linalg.eigvalsh(0.5 * np.asarray(B["outer"] + B["outer"].T)).max() < 1e-10


# ----------------------------------------------------------------------------- bad input and the CLI
def test_bad_input():
    M = focus.MarkovChain
    with pytest.raises(ValueError, match="row 1 sums"):
        M([0.5, 0.5], [[0.5, 0.5], [0.7, 0.4]])
    with pytest.raises(ValueError, match=r"entry \(0, 1\)"):
        M([0.5, 0.5], [[1.2, -0.2], [0.5, 0.5]])
    with pytest.raises(ValueError, match="not stationary"):
        M([0.6, 0.4], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="entry 1 is"):
        M([1.0, 0.0], [[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="lam must lie"):
        M.lazy(PI, -0.5)
    with pytest.raises(ValueError, match="tokenizer"):
        focus.CorpusChain.from_text("abc", tokenizer="char")
    with pytest.raises(ValueError, match="non-empty"):
        focus.CorpusChain.from_text("   ")
    with pytest.raises(ValueError, match="non-positive"):
        focus.perturbed_pi(0.75, 4, 0.2)
    with pytest.raises(ValueError, match=r"tau \(score scale\) must be finite and positive, got .*-1"):
        focus.Setup(tau=-1.0)
    with pytest.raises(ValueError, match=r"eps \(initial scale\).*0\.0"):
        focus.Setup().replace(eps=0.0)
    with pytest.raises(ValueError, match=r"m \(embedding width\).*0"):
        focus.Setup(m=0)
    with pytest.raises(ValueError, match="chain must be"):
        focus.Setup(chain=np.eye(4))
    with pytest.raises(ValueError, match="no field"):
        focus.Setup().replace(lam=0.3)
    with pytest.raises(ValueError, match=r"init_seed must be a Python integer >= 0 .*got an array 1: pass int"):
        focus.Setup().replace(init_seed=jnp.array(1))  # a static field: an array cannot select the draw
    s = focus.Setup(**SMALL)
    with pytest.raises(ValueError, match="unknown start 'stationary'"):
        focus.train(s, 1.0, start="stationary")
    with pytest.raises(ValueError, match="context must be an integer >= 1, got 0"):
        focus.train(s, 1.0, context=0)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 4\)"):
        focus.train(s, 1.0, tokens=np.arange(100) % 7, context=8)
    for verb in (focus.solve, focus.train):
        with pytest.raises(ValueError, match=r"initial\['W0'\] must have shape \(4, m\)"):
            verb(s, 1.0, initial=focus.init_theta(0, 3))
        with pytest.raises(ValueError, match="initial must be a dict with keys"):
            verb(s, 1.0, initial={"W0": 1.0})
    with pytest.raises(ValueError, match="warm_start must be"):
        focus.degenerate_point({"gamma": jnp.ones(4)}, s)


@pytest.mark.slow  # test_once_focus runs focus-rates with the same rate checks; test_cli covers `run --set`
def test_focus_cli_experiment_runs(tmp_path):
    from attnflow.cli import main

    rc = main(
        [
            "run",
            "focus-rates",
            "--set",
            "lams=[0.5]",
            "--set",
            "taus=[1.0]",
            "--set",
            "m=4",
            "--set",
            "mk=4",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 0
    summary = json.loads((tmp_path / "focus-rates" / "summary.json").read_text())
    assert summary["passed"]
    row = summary["summary"][
        "rows: lambda, tau, 2sigma predicted, 2sigma measured, c predicted (closed form), c measured from theta_c^1"
    ][0]
    assert abs(row[5] / row[4] - 1) < 0.01


def test_a_sweep_point_that_is_no_chain_fails_by_name():
    """Traced lam, delta and pi are checked as concrete ones are: the point fails with the message
    and costs nothing (it goes on with a stand-in chain)."""
    pi = (0.6, 0.25, 0.1, 0.05)
    with pytest.warns(RuntimeWarning, match="1 of 2 grid points failed"):
        res = af.sweep(
            lambda lam: focus.MarkovChain.lazy(pi, lam).P[0, 0], {"lam": np.array([0.5, 1.5])}, progress=False
        )
    np.testing.assert_allclose(res.values, [0.5 + 0.5 * 0.6, np.nan])
    assert [m for _, m in res.failures()] == ["lam must lie in [-min_k pi_k / (1 - pi_k), 1] (a lazy chain on pi)"]
    with pytest.warns(RuntimeWarning):
        res = af.sweep(
            lambda delta: focus.perturbed_pi(0.75, 4, delta)[3], {"delta": np.array([0.0, 0.2])}, progress=False
        )
    np.testing.assert_allclose(res.values, [0.25 / 3, np.nan])
    assert "delta must keep every entry of pi positive" in res.failures()[0][1]
    with pytest.warns(RuntimeWarning):
        res = af.sweep(
            lambda a: focus.MarkovChain(jnp.array([a, 1 - a]), jnp.array([[a, 1 - a], [a, 1 - a]])).pi[0],
            {"a": np.array([0.3, 1.2])},
            progress=False,
        )
    assert np.isnan(res.values[1]) and res.failures()[0][1] == "pi must be strictly positive and finite"
    # outside a sweep (the user's own jit) a traced chain is let through as given
    P0 = jax.jit(lambda lam: focus.MarkovChain.lazy(pi, lam).P[0])(-0.5)
    np.testing.assert_allclose(P0, -0.5 * np.eye(4)[0] + 1.5 * np.array(pi))
    # the closed forms refuse a concrete pi that is no law
    with pytest.raises(ValueError, match=r"pi must sum to 1 within 1e-12, got sum 1\.1 "):
        focus.attention_rate_lazy([0.5, 0.6], 0.5)
    with pytest.raises(ValueError, match="pi must be strictly positive; entry 2 is -0.1"):
        focus.sigma([0.5, 0.6, -0.1])


def test_local_attention_rate_is_on_the_flows_clock():
    """At ``theta_c^1`` the local rate (R3) with the setup's ``eta`` is `stage_predictions`' ``c``
    (both on the clock of the flow ``d theta/dt = -eta grad L``); without ``eta`` it is the rate at
    ``eta = 1``."""
    s = focus.Setup(eta=0.5)
    c1 = focus.critical_point_c1(s.chain.pi, jnp.ones(4))
    theta = {k: c1[k] for k in ("W0", "W1", "WQ", "WK")}
    c = float(focus.stage_predictions(s)["c"])
    assert float(focus.local_attention_rate(theta, s.chain, s.tau, s.eta)) == pytest.approx(c, rel=1e-12)
    assert float(focus.local_attention_rate(theta, s.chain, s.tau)) == pytest.approx(c / 0.5, rel=1e-12)


def test_stage_one_rate_window():
    """`stage_one_rate` measures ``2 sigma`` in its default window at ``eps = 1e-3`` and refuses an
    empty window (``eps = 1e-2``: ``30 |M(0)|`` above ``1e-2``; it returned NaN) naming the values;
    a wider window measures it there."""
    for eps, kw, rel in ((1e-3, {}, 0.01), (1e-2, {"start": 3.0, "stop": 0.1}, 0.05)):
        s = focus.Setup(m=4, mk=4, eps=eps)
        traj = focus.solve(s, 40.0, save=af.LinearGrid(400))
        two_sigma = 2 * float(focus.stage_predictions(s)["sigma"])
        assert focus.stage_one_rate(traj, **kw) == pytest.approx(two_sigma, rel=rel)
    with pytest.raises(ValueError, match=r"stage_one_rate: the window from start \|M\(0\)\| = 30 x .* is empty"):
        focus.stage_one_rate(traj)


def test_train_warns_when_the_chain_mixes_slowly_against_the_context():
    """A lazy chain with lam near 1 keeps sequences off pi (loss gap to solve 0.27 at lam = 0.99,
    0.62 at lam = 1, against 0.013 at 0.5): train says so; lam = 0.5 and 0.9 are quiet."""
    import warnings

    pi = focus.Setup().chain.pi
    for lam, slow in ((0.5, False), (0.9, False), (0.99, True), (1.0, True)):
        s = focus.Setup(chain=focus.MarkovChain.lazy(pi, lam))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            focus.train(s, 0.1, dt=0.05, save=af.LinearGrid(2))
        said = [str(w.message) for w in caught if "autocorrelation time is about" in str(w.message)]
        assert bool(said) == slow, (lam, said)
    # the autocorrelation time (1 + lam) / (1 - lam): anti-correlated and periodic chains keep
    # a sequence's counts closer to pi than i.i.d. draws, and are quiet
    assert focus.autocorrelation_time(focus.MarkovChain.lazy(np.array([0.5, 0.5]), 0.9).P) == pytest.approx(19.0)
    assert focus.autocorrelation_time(focus.MarkovChain.lazy(np.array([0.5, 0.5]), 0.0).P) == pytest.approx(1.0)
    assert focus.autocorrelation_time(focus.MarkovChain.lazy(np.array([0.5, 0.5]), -0.95).P) == pytest.approx(
        0.05 / 1.95
    )
    cycle = focus.MarkovChain(np.full(4, 0.25), np.roll(np.eye(4), 1, axis=1))
    assert focus.autocorrelation_time(cycle.P) == pytest.approx(0.0, abs=1e-12)
    assert focus.autocorrelation_time(np.eye(2)) == float("inf")  # reducible: two stationary laws
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        focus.train(focus.Setup(chain=cycle), 0.1, dt=0.05, save=af.LinearGrid(2))
    assert not [w for w in caught if "autocorrelation" in str(w.message)]


def test_burn_in_drops_the_first_steps_of_the_chain():
    """Spec (sampler): burn-in, default 0. A uniform start is pi's after a burn-in of the lazy chain."""
    chain = focus.Setup().chain  # pi = (0.75, 0.19, 0.05, 0.01), lam = 0.5
    key = jax.random.PRNGKey(0)
    plain = np.asarray(chain.sample(key, 20000, 3))
    burnt = np.asarray(chain.sample(key, 20000, 3, burn_in=30))
    assert burnt.shape == plain.shape == (20000, 3)
    np.testing.assert_allclose(np.bincount(plain[:, 0], minlength=4) / 20000, 0.25, atol=0.015)
    np.testing.assert_allclose(np.bincount(burnt[:, 0], minlength=4) / 20000, chain.pi, atol=0.015)
    tr = focus.train(focus.Setup(), 0.1, dt=0.05, burn_in=5, save=af.LinearGrid(2))
    assert tr.meta["burn_in"] == 5 and np.all(np.isfinite(np.asarray(tr["loss"])))
    with pytest.raises(ValueError, match="burn_in"):
        focus.train(focus.Setup(), 0.1, dt=0.05, burn_in=-1)


def test_positional_entropy_tends_to_log_s_minus_kl():
    """Spec (KL form): at finite s the direct positional entropy tends to log s - KL(A_q || pi)."""
    s = focus.Setup()
    keys = jax.random.split(jax.random.PRNGKey(0), 4)  # weights of order 1: a focused attention
    theta = {k: 0.7 * jax.random.normal(kk, v.shape) for kk, (k, v) in zip(keys, s.theta0().items(), strict=True)}
    model = focus.OneLayerAttention.from_theta(theta, s.tau)
    seqs = s.chain.sample(jax.random.PRNGKey(1), 400, 2049)
    H = np.asarray(focus.positional_entropy(model, seqs))
    A = focus.empirical_attention(model, seqs)
    kl = np.asarray(focus.kl_to_pi(A / A.sum(1, keepdims=True), s.chain.pi))
    assert float(np.max(np.log(2048) - H)) > 3.0  # the attention is far from uniform
    # within 0.05 at s = 2048 (the attention is sharp: a finite-s effect); up to 3.6 from log s
    np.testing.assert_allclose(H, np.log(2048) - kl, atol=0.06)
    # a query type no context ends with has no mean: NaN, not a zero entropy (a focused query)
    few = s.chain.sample(jax.random.PRNGKey(0), 64, 33)
    unseen = np.bincount(np.asarray(few)[:, -2], minlength=s.d) == 0
    assert unseen.any()
    H_few, A_few = np.asarray(focus.positional_entropy(model, few)), np.asarray(focus.empirical_attention(model, few))
    assert np.all(np.isnan(H_few[unseen])) and np.all(np.isfinite(H_few[~unseen]))
    assert np.all(np.isnan(A_few[unseen])) and np.allclose(A_few[~unseen].sum(1), 1.0)


def test_train_refuses_a_model_that_does_not_fit_the_setup():
    """`train` builds its network at ``setup.tau`` and the setup's widths: a model with another
    ``tau`` or width, or non-finite weights, is refused by name before anything runs."""
    s = focus.Setup(m=3, mk=2)
    rng = np.random.default_rng(0)
    W = [rng.normal(size=sh) for sh in [(4, 3), (3, 4), (3, 2), (3, 2)]]
    with pytest.raises(ValueError) as e:
        focus.train(s, 0.2, model=focus.OneLayerAttention(*W, tau=5.0))
    assert str(e.value) == (
        "model.tau = 5.0 differs from setup.tau = 1.0: train takes tau from the setup (the network is rebuilt at "
        "setup.tau and tau is not trained); build the Setup with tau=model.tau"
    )
    wide = focus.OneLayerAttention(*[np.zeros(sh) for sh in [(4, 5), (5, 4), (5, 5), (5, 5)]])
    with pytest.raises(ValueError) as e:
        focus.train(s, 0.2, model=wide)
    assert str(e.value) == (
        "model has d = 4, m = 5, mk = 5 (W0 (4, 5), WQ (5, 5)) but the setup has d = 4, m = 3, mk = 2: "
        "build the Setup with m=model.W0.shape[1], mk=model.WQ.shape[1]"
    )
    W[0][0, 0] = np.nan
    with pytest.raises(ValueError) as e:
        focus.train(s, 0.2, model=focus.OneLayerAttention(*W))
    assert str(e.value) == "model.W0 must be finite; entry (0, 0) is nan"
    # a float32 model holds tau = 0.3 rounded to float32: that is the setup's tau
    W[0][0, 0] = 0.0
    net32 = focus.OneLayerAttention(*[w.astype(np.float32) for w in W], tau=0.3)
    tr, out = focus.train(s.replace(tau=0.3), 0.04, model=net32, save=af.LinearGrid(2), return_model=True)
    assert len(tr.ts) == 2 and float(out.tau) == pytest.approx(0.3)


def test_initial_names_the_missing_key_and_the_non_finite_entry():
    s = focus.Setup(**SMALL)
    th = s.theta0()
    for verb in (focus.solve, focus.train):
        with pytest.raises(ValueError) as e:
            verb(s, 1.0, initial={k: v for k, v in th.items() if k != "WK"})
        assert str(e.value) == (
            "initial must be a dict with keys ('W0', 'W1', 'WQ', 'WK') (as setup.theta0()); "
            "got keys ['W0', 'W1', 'WQ'], missing ['WK']"
        )
        with pytest.raises(ValueError) as e:
            verb(s, 1.0, initial={**th, "X": 1.0})
        assert str(e.value).endswith("got keys ['W0', 'W1', 'WQ', 'WK', 'X'], unknown ['X']")
        with pytest.raises(ValueError) as e:
            verb(s, 1.0, initial={**th, "W1": th["W1"].at[2, 1].set(jnp.inf)})
        assert str(e.value) == "initial['W1'] must be finite; entry (2, 1) is inf"


def test_pi_that_misses_one_by_rounding_is_told_the_tolerance():
    pi = [0.75, 0.19, 0.05, 0.01 + 1e-11]
    with pytest.raises(ValueError) as e:
        focus.MarkovChain.lazy(pi, 0.5)
    assert str(e.value) == (
        f"pi must sum to 1 within 1e-12, got sum 1.00000000001 (pi = {pi}); normalise pi first (pi / pi.sum())"
    )
    chain = focus.MarkovChain.lazy(np.asarray(pi) / np.sum(pi), 0.5)
    assert abs(float(chain.pi.sum()) - 1.0) < 1e-15


def test_default_train_save_merges_steps_that_round_together():
    """Log-spaced times near the first step round to the same step and are saved once."""
    for t1, n in [(focus.REFERENCE_T, 51), (150.0, 53), (5000.0, 56)]:
        total, steps = focus.DEFAULT_TRAIN_SAVE.steps_for(t1, focus.DEFAULT_DT)
        assert total == round(t1 / focus.DEFAULT_DT) and len(steps) == n
        assert steps[0] == 0 and steps[-1] == total and np.all(np.diff(steps) > 0)
    # LogGrid's docstring: t_min of one step, 2,000 and 250,000 steps
    assert len(af.LogGrid(60, t_min=0.02).steps_for(40.0, 0.02)[1]) == 51
    assert len(af.LogGrid(60, t_min=0.02).steps_for(5000.0, 0.02)[1]) == 56


def test_tightened_default_solver_keeps_the_stiff_solver_and_step_budget():
    """docs/focus.md asks for ``DEFAULT_SOLVER.replace(rtol=..., atol=...)``, which keeps AutoStiff
    and 1,000,000 steps; a fresh ``af.SolverOptions`` would fall back to Tsit5 and 100,000."""
    tight = focus.DEFAULT_SOLVER.replace(rtol=1e-11, atol=1e-14)
    assert isinstance(tight.solver, af.AutoStiff) and tight.max_steps == 1_000_000
    assert (tight.rtol, tight.atol) == (1e-11, 1e-14)
    fresh = af.SolverOptions(rtol=1e-11, atol=1e-14)
    assert fresh.solver is None and fresh.max_steps == 100_000


# ----------------------------------------------------------------------------- closed forms check their input
def test_closed_forms_refuse_bad_arguments_by_name():
    """The formulas of `theory` name the argument before computing: booleans, NaN, lam outside
    the lazy range, shapes that do not fit pi's d, alpha that cannot be normalised."""
    pi = np.asarray(PI)  # d = 4; lazy_lam_min = -0.01 / 0.99
    ch = focus.MarkovChain.lazy(pi, 0.5)
    c1 = focus.critical_point_c1(pi, np.ones(2))
    th = {k: c1[k] for k in focus.PARAMETERS}  # m = mk = 2
    bad = {
        "lam must be a real number or array of them, got a boolean: True": lambda: focus.attention_rate_lazy(pi, True),
        r"lam must lie in \[-0\.010101, 1\] for this pi \(a lazy chain\), got 5": lambda: focus.attention_rate_lazy(
            pi, 5.0
        ),
        r"lam must lie in \[-0\.010101, 1\] for this pi \(a lazy chain\), got \[0\.5, -0\.5\]": (
            lambda: focus.attention_rate_lazy(pi, np.array([0.5, -0.5]))
        ),
        "lam must be finite, got nan": lambda: focus.attention_rate_lazy(pi, np.nan),
        "tau must be a real number or array of them, got a boolean: True": lambda: focus.attention_rate_lazy(
            pi, 0.5, True
        ),
        "tau must be finite and positive, got nan": lambda: focus.attention_rate_lazy(pi, 0.5, np.nan),
        "tau must be finite and positive, got -1.0": lambda: focus.population_loss(th, ch, -1.0),
        "tau must be a scalar, got shape \\(2,\\)": lambda: focus.population_grads(th, ch, np.ones(2)),
        r"P must have shape \(4, 4\) to match pi \(d = 4\), got shape \(3, 3\)": lambda: focus.attention_rate(
            pi, np.eye(3), 1.0, c1["gamma"], c1["beta"]
        ),
        r"gamma must have shape \(4,\) to match pi \(d = 4\), got shape \(3,\)": lambda: focus.attention_rate(
            pi, ch.P, 1.0, np.ones(3), c1["beta"]
        ),
        r"beta must be finite; entry \(2,\) is nan": lambda: focus.attention_rate(
            pi, ch.P, 1.0, c1["gamma"], np.array([1.0, 0.0, np.nan, 0.0])
        ),
        "P must be a real number or array of them, got a complex number": lambda: focus.attention_rate(
            pi, ch.P + 0j, 1.0, c1["gamma"], c1["beta"]
        ),
        r"alpha must have a nonzero finite norm \(it is normalised to alpha / \|alpha\|\), got \|alpha\| = 0 "
        r"for alpha = \[0\.0, 0\.0, 0\.0\]": lambda: focus.critical_point_c1(pi, np.zeros(3)),
        r"alpha must be finite; entry \(0,\) is nan": lambda: focus.critical_point_c1(pi, np.array([np.nan, 1.0])),
        r"alpha must be a vector of R\^m \(1-D, m >= 1: theta_c\^1 has width m = alpha\.size\), got shape \(2, 2\)": (
            lambda: focus.critical_point_c1(pi, np.eye(2))
        ),
        r"theta\['W0'\] must have shape \(4, m\) for this chain, got \(3, 2\)": lambda: focus.population_loss(
            {**th, "W0": np.zeros((3, 2))}, ch
        ),
        r"theta\['W1'\] must have shape \(2, 4\) for d = 4, m = 2, mk = 2 \(the widths of theta\['W0'\] and "
        r"theta\['WQ'\]\), got \(2, 3\)": lambda: focus.gradient_blocks({**th, "W1": np.zeros((2, 3))}, ch),
        r"theta\['WQ'\] must have shape \(2, mk\) for m = 2": lambda: focus.population_grads(
            {**th, "WQ": np.zeros((3, 2))}, ch
        ),
        r"theta\['WK'\] must be finite; entry \(1, 0\) is inf": lambda: focus.population_loss(
            {**th, "WK": np.array([[0.0, 0.0], [np.inf, 0.0]])}, ch
        ),
        r"theta\['W1'\] must be a real number or array of them, got a boolean": lambda: focus.attention(
            {**th, "W1": np.ones((2, 4), bool)}, pi
        ),
        r"theta must be a dict with keys \('W0', 'W1', 'WQ', 'WK'\) \(as setup.theta0\(\)\); got keys \['W0'\], "
        r"missing \['W1', 'WQ', 'WK'\]": lambda: focus.conserved({"W0": th["W0"]}),
        "chain must be an attnflow.focus.MarkovChain": lambda: focus.population_loss(th, ch.P),
        r"y\['gamma'\] must have shape \(4,\) to match pi \(d = 4\), got shape \(5,\)": lambda: focus.reduced_loss(
            {"gamma": np.ones(5), "beta": np.ones(4), "lam_q": 0.0, "lam_k": 0.0}, ch
        ),
        r"G_M must be finite; entry \(0, 1\) is nan": lambda: focus.transverse_rate(np.array([[1.0, np.nan], [0, 1]])),
    }
    for message, call in bad.items():
        with pytest.raises(ValueError, match=f"^{message}"):
            call()
    # the edges of the lazy range are valid, and the reference numbers unchanged
    lo = focus.lazy_lam_min(pi)
    assert float(focus.attention_rate_lazy(pi, 1.0)) == pytest.approx(2 * 0.0797847014315081, rel=1e-12)
    assert float(focus.attention_rate_lazy(pi, lo)) == pytest.approx(lo * 2 * 0.0797847014315081, rel=1e-12)
    assert float(focus.attention_rate_lazy(pi, 0.5, 1.0)) == pytest.approx(0.0797847014315081, rel=1e-12)
    assert float(focus.population_loss(th, ch)) == pytest.approx(float(ch.entropy()), abs=1e-12)


def test_closed_forms_stay_traceable_and_fail_a_bad_sweep_point_by_name():
    """Traced lam, tau and alpha pass jit, vmap and sweeps; at a sweep point a bad value fails the
    point with the message (as in Setup and MarkovChain.lazy), the good points keep their values."""
    pi = jnp.asarray(PI)
    c = 0.0797847014315081  # (R4) at lam = 0.5, tau = 1
    assert float(jax.jit(focus.attention_rate_lazy)(pi, 0.5, 1.0)) == pytest.approx(c, rel=1e-12)
    lams, taus = jnp.array([0.5, 1.0]), jnp.array([1.0, 3.0])
    np.testing.assert_allclose(
        jax.vmap(focus.attention_rate_lazy, (None, 0, 0))(pi, lams, taus), [c, 6 * c], rtol=1e-12
    )
    grid = af.sweep(
        lambda lam, tau: focus.attention_rate_lazy(pi, lam, tau), {"lam": lams, "tau": taus}, progress=False
    )
    np.testing.assert_allclose(grid.values, [[c, 3 * c], [2 * c, 6 * c]], rtol=1e-12)
    with pytest.warns(RuntimeWarning):
        res = af.sweep(lambda lam: focus.attention_rate_lazy(pi, lam), {"lam": np.array([0.5, 5.0])}, progress=False)
    assert float(res.values[0]) == pytest.approx(c, rel=1e-12) and np.isnan(res.values[1])
    assert res.failures() == [({"lam": 5.0}, "lam must lie in [-min_k pi_k / (1 - pi_k), 1] (a lazy chain on pi)")]
    with pytest.warns(RuntimeWarning):
        res = af.sweep(
            lambda tau: focus.attention_rate_lazy(pi, 0.5, tau), {"tau": np.array([1.0, -1.0])}, progress=False
        )
    assert res.failures() == [({"tau": -1.0}, "tau must be finite and positive")]
    with pytest.warns(RuntimeWarning):
        res = af.sweep(
            lambda a: focus.critical_point_c1(pi, jnp.stack([a, 0.0 * a]))["a2"],
            {"a": np.array([1.0, 0.0])},
            progress=False,
        )
    assert float(res.values[0]) == pytest.approx(4.124, abs=5e-4) and np.isnan(res.values[1])
    assert res.failures()[0][1] == "alpha must be a finite nonzero vector (it is normalised to alpha / |alpha|)"
    # traced weights: shapes are still checked, and gradients still flow
    s = focus.Setup(**SMALL)
    with pytest.raises(ValueError, match=r"^theta\['W0'\] must have shape \(4, m\) for this chain, got \(5, 4\)"):
        jax.jit(focus.population_loss)({**s.theta0(), "W0": jnp.zeros((5, 4))}, s.chain)
    g = jax.jit(jax.grad(focus.population_loss))(s.theta0(), s.chain, 1.3)
    ref = focus.population_grads(s.theta0(), s.chain, 1.3)
    for k in focus.PARAMETERS:
        np.testing.assert_allclose(g[k], ref[k], rtol=1e-10, atol=1e-14)


def test_setup_static_sizes_become_python_ints():
    """NumPy integers (and whole floats) for m, mk and init_seed are stored as Python ints, with
    no Equinox warning about an array set as static, and give the same setup as plain ints."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = focus.Setup(m=np.int64(3), mk=np.int32(2), init_seed=np.uint8(1))
        r = focus.Setup().replace(m=np.int64(3), mk=2.0)
    assert (type(s.m), type(s.mk), type(s.init_seed)) == (int, int, int) and (s.m, s.mk, s.init_seed) == (3, 2, 1)
    assert (type(r.m), type(r.mk)) == (int, int) and (r.m, r.mk) == (3, 2)
    assert jax.tree_util.tree_structure(s) == jax.tree_util.tree_structure(focus.Setup(m=3, mk=2, init_seed=1))
    with pytest.raises(ValueError, match=r"^mk \(query-key width\) must be a Python integer >= 1 .*got an array 3"):
        focus.Setup(mk=np.array(3))
    with pytest.raises(ValueError, match=r"^m \(embedding width\) must be an integer >= 1, got True$"):
        focus.Setup(m=np.bool_(True))


def test_docs_give_the_escape_time_signatures_of_the_code():
    """docs/focus.md writes escape_time and escape_time_sensitivity with every keyword the code has."""
    import inspect
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "focus.md").read_text()
    for fn in (focus.escape_time, focus.escape_time_sensitivity):
        parts, star = [], False
        for p in inspect.signature(fn).parameters.values():
            if p.kind is p.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            default = p.default
            shown = "" if default is p.empty else "=" + (f'"{default}"' if isinstance(default, str) else repr(default))
            parts.append(p.name + shown)
        sig = f"`{fn.__name__}({', '.join(parts)})`"
        assert sig in text, sig
