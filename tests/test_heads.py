"""attnflow.heads (partial): priors, Bayes risk, activations, oracle identity, ODE drift forms, ODE vs SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import attnflow as af
from attnflow.heads import (AnisotropicGaussian, BayesSoftmax, Discrete, FieldBank, FlippedSpike, MultiHead, PointMass,
                            SingleLocationTask, Softmax, Softmax1, bayes_posterior, bayes_risk, oracle_config,
                            order_parameter_field, overlaps, risk, sample_loss, softmax_floor, solve_order_parameters)


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


def test_drift_forms_agree_within_monte_carlo_error():
    """Autodiff form (5.2) vs the direct form E[sum_l G chi*] (5.1) on a large bank."""
    prior = AnisotropicGaussian([0.8, 0.0], [1.0, 0.5])
    bank = FieldBank(prior, 3, 2, n=100_000, key=3, permutations="none")
    M = jnp.array([[0.4, 0.1], [0.2, -0.3]])
    Q = M @ M.T + jnp.array([[0.5, 0.1], [0.1, 0.4]])
    act = Softmax()
    field = order_parameter_field(0.0, {"M": M, "Q": Q}, {"activation": act, "bank": bank, "eta": 1.0, "noise": 0.0})
    chi, chi_star = bank.fields(M, Q)
    from attnflow.heads.theory import _half_loss

    G = jax.vmap(jax.grad(lambda c: _half_loss(act, c)))(chi)
    direct = -jnp.einsum("bhl,blf->bhf", G, chi_star)
    mean, se = jnp.mean(direct, 0), jnp.std(direct, 0) / np.sqrt(direct.shape[0])
    assert float(jnp.max(jnp.abs(field["M"] - mean) / se)) < 5.0


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
