"""attnflow.focus: reference values, gradients, flows, reduced ODE, corpus estimation, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.focus.data import MarkovChain, perturbed_pi
from attnflow.focus.metrics import detect_plateaus, growth_rate, kl_to_pi, token_entropy
from attnflow.focus.model import OneLayerAttention, next_token_loss
from attnflow.focus.theory import (attention, attention_rate, attention_rate_lazy, conserved, critical_point_c1, init_theta,
                                   population_flow, population_grads, population_loss, reduced_conserved, reduced_field,
                                   reduced_from_theta, sigma, theta_from_reduced)

PI = (0.75, 0.19, 0.05, 0.01)


@pytest.fixture(scope="module")
def chain():
    return MarkovChain.lazy(PI, 0.5)


def test_reference_values(chain):
    """Spec section 10."""
    th = init_theta(0, 4, eps=1e-6)
    assert float(population_loss(th, chain)) == pytest.approx(np.log(4), abs=1e-9)
    assert round(float(chain.entropy()), 4) == 0.7271
    assert round(2 * float(sigma(chain.pi)), 4) == 0.9190
    c1 = critical_point_c1(chain.pi, jnp.eye(16)[0])
    assert round(float(c1["a2"]), 3) == 4.124
    assert round(float(attention_rate_lazy(chain.pi, 0.5, 1.0)), 4) == 0.0798
    # the loss on the condensation plateau is H(pi); pi-weighted entropy at init is H(pi)
    theta_c1 = {k: c1[k] for k in ("W0", "W1", "WQ", "WK")}
    assert float(population_loss(theta_c1, chain)) == pytest.approx(float(chain.entropy()), abs=1e-12)
    assert float(token_entropy(attention(th, chain.pi), chain.pi)) == pytest.approx(float(chain.entropy()), abs=1e-9)
    # at theta_c^1 the output is the unigram: G_M = 0
    g = population_grads(theta_c1, chain)
    assert max(float(jnp.max(jnp.abs(v))) for v in g.values()) < 1e-12


@pytest.mark.parametrize("lam", [0.5, 0.9, -0.005])
def test_general_rate_equals_lazy_closed_form(lam):
    ch = MarkovChain.lazy(PI, lam)
    c1 = critical_point_c1(ch.pi, jnp.ones(3))
    general = attention_rate(ch.pi, ch.P, 2.0, c1["gamma"], c1["beta"])
    assert float(general) == pytest.approx(float(attention_rate_lazy(ch.pi, lam, 2.0)), rel=1e-12, abs=1e-15)


def test_closed_form_gradients_equal_autodiff(chain):
    for scale in (1.0, 300.0):
        th = jax.tree_util.tree_map(lambda x: scale * x, init_theta(1, 4, m=5, mk=3))
        g1, g2 = population_grads(th, chain, 1.3), jax.grad(population_loss)(th, chain, 1.3)
        for k in g1:
            np.testing.assert_allclose(g1[k], g2[k], rtol=1e-10, atol=1e-14)
    from jax.test_util import check_grads

    check_grads(lambda W0: population_loss({**th, "W0": W0}, chain), (th["W0"] / 300,), order=2, atol=1e-5, rtol=1e-5)


def test_flow_loss_monotone_conserved_and_condenses(chain):
    th = init_theta(2, 4, m=6, mk=6, eps=1e-3)
    obs = lambda t, th, a: {"loss": population_loss(th, chain), **conserved(th), "M": jnp.linalg.norm(th["W0"] @ th["W1"]),
                            "cos": jnp.abs(jnp.linalg.svd(th["W0"])[0][:, 0] @ chain.pi) / jnp.linalg.norm(chain.pi)}
    tr = population_flow(th, chain, 60.0, observe=obs, n_save=120, spacing="linear")
    L = np.asarray(tr["loss"])
    assert np.all(np.diff(L) <= 1e-12)
    for k in ("C_m", "C_k"):
        assert float(jnp.max(jnp.abs(tr[k] - tr[k][0]))) < 1e-9  # solver tolerance (rtol 1e-9)
    # Stage I: |M| grows at 2 sigma; W0 condenses on pi; the loss reaches H(pi)
    rate = growth_rate(tr.ts, tr["M"], 30 * float(tr["M"][0]), 1e-2)
    assert rate == pytest.approx(2 * float(sigma(chain.pi)), rel=0.03)
    assert float(np.min(np.abs(L - float(chain.entropy())))) < 2e-3
    i = int(np.argmin(np.abs(L - float(chain.entropy()))))
    assert float(tr["cos"][i]) > 0.999


def test_reduced_ode_conserves_and_matches_full_flow_on_rank_one_manifold(chain):
    key = jax.random.PRNGKey(3)
    y0 = {"gamma": 0.01 * jax.random.normal(key, (4,)), "beta": 0.01 * jax.random.normal(jax.random.PRNGKey(4), (4,)),
          "lam_q": jnp.array(0.02), "lam_k": jnp.array(0.015)}
    args = {"chain": chain, "tau": 1.0}
    ts = jnp.linspace(0, 150, 31)
    red = af.integrate(reduced_field, y0, 150.0, args=args, ts=ts, rtol=1e-11, atol=1e-13,
                       observe=lambda t, y, a: {**reduced_conserved(y), **y})
    for k in ("qk", "norms"):
        assert float(jnp.max(jnp.abs(red[k] - red[k][0]))) < 1e-11
    # the full flow started on the rank-one manifold (m = mk = 3, embedded along e_1) stays on it
    e = jnp.eye(3)[0]
    th0 = {"W0": jnp.outer(y0["gamma"], e), "W1": jnp.outer(e, y0["beta"]), "WQ": y0["lam_q"] * jnp.outer(e, e),
           "WK": y0["lam_k"] * jnp.outer(e, e)}
    full = population_flow(th0, chain, 150.0, ts=ts, rtol=1e-11, atol=1e-13,
                           observe=lambda t, th, a: {"gamma": th["W0"][:, 0], "beta": th["W1"][0], "lam_q": th["WQ"][0, 0],
                                                     "rest": jnp.linalg.norm(th["W0"][:, 1:])})
    for k in ("gamma", "beta", "lam_q"):
        np.testing.assert_allclose(full[k], red[k], rtol=1e-7, atol=1e-10)
    assert float(jnp.max(full["rest"])) == 0.0
    assert float(red["loss" if "loss" in red else "lam_q"][-1]) != float(y0["lam_q"])  # it moved
    # helpers round-trip
    back = reduced_from_theta(theta_from_reduced(y0))
    assert all(bool(jnp.all(back[k] == y0[k])) for k in y0)


def test_population_loss_vs_finite_context_monte_carlo(chain):
    th = jax.tree_util.tree_map(lambda x: 400 * x, init_theta(5, 4, m=4, mk=4))
    model = OneLayerAttention(th["W0"], th["W1"], th["WQ"], th["WK"], 1.0)
    seqs = chain.sample(jax.random.PRNGKey(0), 4096, 2049, init="pi")
    per = jax.vmap(lambda s: next_token_loss(model, s[None]))(seqs)
    mc, se = float(jnp.mean(per)), float(jnp.std(per) / np.sqrt(per.size))
    pop = float(population_loss(th, chain))
    assert abs(mc - pop) < 4 * se + 5e-3, (mc, pop, se)  # sampling error plus the O(1/s) finite-context bias


def test_markov_sampling_statistics(chain):
    seqs = chain.sample(jax.random.PRNGKey(1), 512, 400, init="pi")
    x = np.asarray(seqs)
    freq = np.bincount(x.ravel(), minlength=4) / x.size
    np.testing.assert_allclose(freq, PI, atol=0.01)
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (x[:, :-1].ravel(), x[:, 1:].ravel()), 1)
    np.testing.assert_allclose(pairs / pairs.sum(1, keepdims=True), chain.P, atol=0.02)


def test_reversible_chain_and_perturbation():
    ch = MarkovChain.reversible(PI, key=3)
    J = ch.pi[:, None] * ch.P
    np.testing.assert_allclose(J, J.T, atol=1e-10)
    np.testing.assert_allclose(ch.pi @ ch.P, ch.pi, atol=1e-10)
    p = perturbed_pi(0.75, 4, 0.01)
    np.testing.assert_allclose(p, [0.75, 0.25 / 3 + 0.01, 0.25 / 3, 0.25 / 3 - 0.01], atol=1e-15)


def test_from_corpus_exact_counts():
    text = "abab\n\nbba"
    cc = MarkovChain.from_corpus(text, tokenizer="char", top_k=2, alpha=0.5)
    assert cc.vocab == ["b", "a", "<other>"]  # b: 4, a: 3 (ties by first appearance)
    # bigrams within documents: "abab" -> ab, ba, ab ; "bba" -> bb, ba
    want = np.zeros((3, 3))
    want[1, 0] = 2  # a->b
    want[0, 1] = 2  # b->a
    want[0, 0] = 1  # b->b
    np.testing.assert_array_equal(cc.bigram_counts, want)
    np.testing.assert_allclose(cc.chain.P, (want + 0.5) / (want.sum(1, keepdims=True) + 1.5), rtol=1e-12)
    np.testing.assert_array_equal(cc.unigram, [4 / 7, 3 / 7, 0.0])
    with pytest.raises(ValueError, match="never has a successor"):
        MarkovChain.from_corpus("ab ab", tokenizer="word", top_k=1, alpha=0.0)
    cc = MarkovChain.from_corpus("the cat the dog\n\nthe end", tokenizer="word", top_k=2, alpha=0.5)
    assert cc.vocab[0] == "the" and cc.chain.d == 3
    np.testing.assert_allclose(cc.chain.pi @ cc.chain.P, cc.chain.pi, atol=1e-12)
    assert cc.diagnostics["tokens"] == 6


def test_from_shared_corpus(shared_data):
    text = (shared_data / "tinyshakespeare.txt").read_text()[:200_000]
    cc = MarkovChain.from_corpus(text, tokenizer="char", top_k=16)
    assert cc.chain.d == 17 and cc.vocab[0] == " "
    assert cc.diagnostics["l1_pi_vs_unigram"] < 0.05


def test_metrics_and_stage_tools():
    pi = jnp.array(PI)
    A = jnp.tile(pi, (4, 1))
    assert float(token_entropy(A, pi)) == pytest.approx(float(-(pi * jnp.log(pi)).sum()))
    np.testing.assert_allclose(kl_to_pi(A, pi), 0.0, atol=1e-15)
    t = np.linspace(0, 10, 101)
    assert growth_rate(t, 1e-4 * np.exp(0.7 * t), 1e-3, 1e-1) == pytest.approx(0.7, rel=1e-9)
    ts = np.geomspace(1e-2, 1e3, 200)
    loss = 1.0 + 0.5 * np.tanh(-(np.log(ts) - np.log(10)) * 3)
    pl = detect_plateaus(ts, loss, rel_tol=1e-3)
    assert len(pl) == 2 and pl[0]["level"] == pytest.approx(1.5, abs=1e-3) and pl[1]["level"] == pytest.approx(0.5, abs=1e-3)


def test_bad_input():
    with pytest.raises(ValueError, match="row 1 sums"):
        MarkovChain([0.5, 0.5], [[0.5, 0.5], [0.7, 0.4]])
    with pytest.raises(ValueError, match=r"entry \(0, 1\)"):
        MarkovChain([0.5, 0.5], [[1.2, -0.2], [0.5, 0.5]])
    with pytest.raises(ValueError, match="not stationary"):
        MarkovChain([0.6, 0.4], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="entry 1 is"):
        MarkovChain([1.0, 0.0], [[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="lam must lie"):
        MarkovChain.lazy(PI, -0.5)
    with pytest.raises(ValueError, match="tokenizer"):
        MarkovChain.from_corpus("abc", tokenizer="bpe")
    with pytest.raises(ValueError, match="non-empty"):
        MarkovChain.from_corpus("   ")
    with pytest.raises(ValueError, match="non-positive"):
        perturbed_pi(0.75, 4, 0.2)


def test_stage_two_rate_from_critical_point(chain):
    """Started on theta_c^1 with O(eps) attention weights, q+ = |a1^T (WQ + WK)|/sqrt2 grows at c (spec 5.2)."""
    from attnflow.focus.metrics import redistribution

    c1 = critical_point_c1(chain.pi, jnp.eye(4)[0])
    th0 = init_theta(0, 4, m=4, mk=4)
    theta = {"W0": c1["W0"], "W1": c1["W1"], "WQ": th0["WQ"], "WK": th0["WK"]}
    ts = jnp.linspace(0, 60, 121)
    tr = population_flow(theta, chain, 60.0, ts=ts, observe=lambda t, th, a: redistribution(th, chain.pi))
    q = np.asarray(tr["q_plus"])
    rate = growth_rate(tr.ts, q, 10 * q[0], 0.05)
    assert rate == pytest.approx(float(attention_rate_lazy(chain.pi, 0.5, 1.0)), rel=0.01)
    # the stable partner decays
    assert float(tr["q_minus"][20]) < float(tr["q_minus"][0])


def test_focus_cli_experiment_runs(tmp_path):
    from attnflow.cli import main

    rc = main(["run", "focus-rates", "--set", "lams=[0.5]", "--set", "taus=[1.0]", "--set", "m=4", "--set", "mk=4",
               "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    import json

    summary = json.loads((tmp_path / "focus-rates" / "summary.json").read_text())
    assert summary["passed"]
    row = summary["summary"]["rows: lambda, tau, 2sigma predicted, 2sigma measured, c predicted (closed form), c measured from theta_c^1"][0]
    assert abs(row[5] / row[4] - 1) < 0.01


@pytest.mark.parametrize("delta", [0.0, 0.02])
def test_degenerate_point_and_transverse_rate(delta):
    """Spec 5.4: at delta = 0, G_M = G_Phi = 0 on the Stage IV plateau; at delta != 0, a full
    jax.hessian reproduces mu_perp = s_max(G_M(theta_delta))."""
    from jax.flatten_util import ravel_pytree

    from attnflow.focus.theory import degenerate_point, gradient_blocks, rank_one_part, transverse_rate

    ch = MarkovChain.lazy(perturbed_pi(0.75, 4, delta), 0.5)
    tr = population_flow(init_theta(0, 4, 4, 4), ch, 600.0, ts=jnp.array([0.0, 600.0]), observe=lambda t, th, a: th)
    y = degenerate_point(ch, warm_start=rank_one_part(jax.tree_util.tree_map(lambda x: x[-1], tr.ys)))
    G_M, G_Phi = gradient_blocks(theta_from_reduced(y), ch, 1.0)
    assert float(jnp.max(jnp.abs(G_Phi))) < 1e-12
    mu = float(transverse_rate(G_M))
    if delta == 0.0:
        assert mu < 1e-12
        return
    assert mu > 1e-3
    e = jnp.eye(2)[0]
    full = {"W0": jnp.outer(y["gamma"], e), "W1": jnp.outer(e, y["beta"]), "WQ": y["lam_q"] * jnp.outer(e, e),
            "WK": y["lam_k"] * jnp.outer(e, e)}
    flat, unravel = ravel_pytree(full)
    ev = np.linalg.eigvalsh(np.asarray(jax.hessian(lambda x: population_loss(unravel(x), ch))(flat)))
    assert -ev[0] == pytest.approx(mu, rel=1e-8)


def test_jacobian_blocks_at_critical_point(chain):
    """At theta_c^1 the Jacobian is block-diagonal; the attention block has eigenvalues +-c
    (multiplicity mk) and the outer block is negative semidefinite (spec 5.2)."""
    from attnflow.focus.theory import jacobian_blocks, refine_critical_point

    m = mk = 3
    c1 = critical_point_c1(chain.pi, jnp.eye(m)[0])
    theta = {"W0": c1["W0"], "W1": c1["W1"], "WQ": jnp.zeros((m, mk)), "WK": jnp.zeros((m, mk))}
    refined = refine_critical_point(theta, chain)
    for k in theta:
        np.testing.assert_allclose(refined[k], theta[k], atol=1e-10)  # the closed form is already critical
    B = jacobian_blocks(theta, chain)
    assert float(jnp.max(jnp.abs(B["coupling"]))) < 1e-12
    att = np.sort(np.linalg.eigvals(np.asarray(B["attention"])).real)
    c = float(attention_rate_lazy(chain.pi, 0.5, 1.0))
    np.testing.assert_allclose(att[-mk:], c, rtol=1e-8)
    np.testing.assert_allclose(att[:mk], -c, rtol=1e-8)
    outer = np.linalg.eigvalsh(0.5 * np.asarray(B["outer"] + B["outer"].T))
    assert outer.max() < 1e-10


def test_stage_sequence_alternates_transitions_and_plateaus():
    from attnflow.focus.metrics import stage_sequence

    rows = stage_sequence([{"t_start": 1.0, "t_end": 3.0, "level": 0.9}, {"t_start": 5.0, "t_end": 8.0, "level": 0.5}], 10.0,
                          {0: (1.0, 1.1), 1: (2.0, 2.1)})
    assert [r[0] for r in rows] == ["transition 1", "plateau 1", "transition 2", "plateau 2", "transition 3"]
    assert rows[2][1:3] == [3.0, 5.0] and rows[2][4:] == [None, None]
    assert rows[1][4:] == [1.0, 1.1] and rows[3][3:] == [0.5, 2.0, 2.1]
