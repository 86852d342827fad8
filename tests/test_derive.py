"""attnflow.derive: the derived order-parameter ODE against the closed forms of Saad & Solla (1995)
and Goldt et al. (2019), and against online SGD of the same model."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import derive

# ----------------------------------------------------------------------------- closed forms
# Written here independently of attnflow.derive: Saad & Solla (1995) eqs. for g(x) = erf(x / sqrt 2),
# the integrals I2, I3, I4 over the covariance C of all units (students first, then teachers);
# readouts v (student) and v* (teacher) as in Goldt et al. (2019).


def closed_form(R, Q, T, v, v_star, eta, eta_v, sigma=0.0, xp=jnp):
    """``(field, eg)`` of the soft committee ``sum_k v_k g(lambda_k)`` learning ``sum_m v*_m g(nu_m)``
    with squared loss and label noise ``sigma``, in the array library ``xp`` (``jax.numpy`` or
    ``numpy``; `benchmarks/derive_field.py` times both)."""
    K, M = R.shape
    n = K + M
    C = xp.block([[Q, R], [R.T, T]])
    d = xp.diag(C)
    I2 = 2 / xp.pi * xp.arcsin(C / xp.sqrt(xp.outer(1 + d, 1 + d)))
    a, b, c = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
    L3 = (1 + d[a]) * (1 + d[c]) - C[a, c] ** 2
    I3 = 2 / xp.pi / xp.sqrt(L3) * (C[b, c] * (1 + d[a]) - C[a, b] * C[a, c]) / (1 + d[a])
    a, b, c, e = np.meshgrid(*[np.arange(n)] * 4, indexing="ij")
    L4 = (1 + d[a]) * (1 + d[b]) - C[a, b] ** 2
    L0 = (
        L4 * C[c, e]
        - C[b, c] * C[b, e] * (1 + d[a])
        - C[a, c] * C[a, e] * (1 + d[b])
        + C[a, b] * C[a, c] * C[b, e]
        + C[a, b] * C[a, e] * C[b, c]
    )
    L1 = L4 * (1 + d[c]) - C[b, c] ** 2 * (1 + d[a]) - C[a, c] ** 2 * (1 + d[b]) + 2 * C[a, b] * C[a, c] * C[b, c]
    L2 = L4 * (1 + d[e]) - C[b, e] ** 2 * (1 + d[a]) - C[a, e] ** 2 * (1 + d[b]) + 2 * C[a, b] * C[a, e] * C[b, e]
    I4 = 4 / xp.pi**2 / xp.sqrt(L4) * xp.arcsin(L0 / xp.sqrt(L1 * L2))
    v = xp.asarray(v)
    w = xp.concatenate([-v, xp.asarray(v_star)])  # teacher - student = sum_u w_u g(u)
    dR = v[:, None] * xp.einsum("kmu,u->km", I3[:K, K:], w)
    dl = v[:, None] * xp.einsum("klu,u->kl", I3[:K, :K], w)
    dd = xp.outer(v, v) * xp.einsum("klus,u,s->kl", I4[:K, :K], w, w)
    # noise: E[g'(l_k) g'(l_l)] sigma^2 = sigma^2 (2 / pi) / sqrt((1 + Q_kk)(1 + Q_ll) - Q_kl^2)
    qd = xp.diag(Q)
    dd = dd + sigma**2 * xp.outer(v, v) * 2 / xp.pi / xp.sqrt(xp.outer(1 + qd, 1 + qd) - Q**2)
    field = {"R": eta * dR, "Q": eta * (dl + dl.T) + eta**2 * dd, "v": eta_v * (I2[:K] @ w)}
    return field, 0.5 * w @ I2 @ w


def _committee_closed_ode(K, M):
    def f(t, y, args):
        out, _ = closed_form(y["R"], y["Q"], jnp.eye(M), jnp.ones(K), jnp.ones(M), args, 0.0)
        return {"R": out["R"], "Q": out["Q"]}

    def obs(t, y, args):
        return {**y, "error": closed_form(y["R"], y["Q"], jnp.eye(M), jnp.ones(K), jnp.ones(M), args, 0.0)[1]}

    return f, obs


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(a[k] - b[k]))) for k in a)


SS_R0 = jnp.array([[0.011, 0.01], [0.01, 0.01]])  # nearly symmetric: a long plateau, then the escape
SS_Q0 = 0.2 * jnp.eye(2)


# ----------------------------------------------------------------------------- Saad & Solla K = M = 2
def _closed_trajectory(R0, Q0, t1):
    """The closed-form Saad & Solla ODE from ``(R0, Q0)`` to ``t1`` (16 points, rtol 1e-10) and the
    closed-form field along it."""
    K = R0.shape[0]
    f, obs = _committee_closed_ode(K, K)
    ref = af.integrate(
        f,
        {"R": R0, "Q": Q0},
        t1,
        args=1.0,
        save=af.LinearGrid(16),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-12),
        observe=obs,
    )
    closed = jax.vmap(lambda R, Q: closed_form(R, Q, jnp.eye(K), jnp.ones(K), jnp.ones(K), 1.0, 0.0)[0])(
        ref["R"], ref["Q"]
    )
    return ref, {"R": closed["R"], "Q": closed["Q"]}


def _derived_along(ref, quadrature):
    """The derived field along ``ref`` and the max error of its ``eg`` against ``ref["error"]``."""
    R0, Q0 = ref["R"][0], ref["Q"][0]
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=quadrature)
    rl = derive.rule(s)  # an argument, not a constant baked into the program
    field = jax.jit(jax.vmap(lambda R, Q, r: derive.vector_field(s, R, Q, None, r), (0, 0, None)))
    eg = jax.jit(jax.vmap(lambda R, Q, r: derive.generalisation_error(s, R, Q, None, r), (0, 0, None)))
    return field(ref["R"], ref["Q"], rl), float(jnp.max(jnp.abs(eg(ref["R"], ref["Q"], rl) - ref["error"])))


def test_field_matches_saad_solla_closed_form_along_plateau_and_escape():
    ref, closed = _closed_trajectory(SS_R0, SS_Q0, 300.0)
    err = np.asarray(ref["error"])
    # the trajectory goes through the symmetric plateau (eg ~ 0.02 for t in [20, 100]) and escapes
    assert 0.015 < err[2] < 0.025 and 0.015 < err[5] < 0.025 and err[-1] < 1e-6
    derived, eg_err = _derived_along(ref, derive.GaussHermite(24))
    assert set(derived) == {"R", "Q"}
    assert _max_diff(derived, closed) < 1e-8
    assert eg_err < 1e-8


def test_field_with_trained_readout_and_noise_matches_closed_form():
    # Goldt et al. (2019): second layer trained, teacher readout v*, teacher overlaps T not the identity
    R = jnp.array([[0.3, 0.1], [0.05, 0.2]])
    Q = jnp.array([[0.5, 0.1], [0.1, 0.4]])
    T = jnp.array([[1.0, 0.2], [0.2, 0.8]])
    v, v_star = jnp.array([0.8, -0.4]), jnp.array([1.0, 0.6])

    def teacher(nu):
        return v_star @ derive.erf_activation(nu)

    def student(lam, v):
        return v @ derive.erf_activation(lam)

    s = derive.Setup(student, teacher, R, Q, T=T, v0=v, eta=0.7, eta_v=0.3, quadrature=derive.GaussHermite(24))
    out = derive.vector_field(s, R, Q, v)
    ref, eg = closed_form(R, Q, T, v, v_star, 0.7, 0.3)
    assert _max_diff(out, ref) < 1e-8
    assert abs(float(derive.generalisation_error(s, R, Q, v)) - float(eg)) < 1e-8
    # label noise adds a fifth Gaussian variable: Gauss-Hermite 12^5 nodes (4e-6; 14^5: 7e-7)
    s = s.replace(noise=jnp.asarray(0.5), quadrature=derive.GaussHermite(12))
    assert s.dim == 5
    ref, _ = closed_form(R, Q, T, v, v_star, 0.7, 0.3, sigma=0.5)
    assert _max_diff(derive.vector_field(s, R, Q, v), ref) < 1e-5


def test_readout_rate_follows_eta_unless_given():
    R, Q = 0.2 * jnp.eye(2), 0.5 * jnp.eye(2)
    v = jnp.array([0.8, -0.4])

    def student(lam, v):
        return v @ derive.erf_activation(lam)

    s = derive.Setup(student, derive.soft_committee, R, Q, v0=v, eta=0.7, quadrature=derive.GaussHermite(8))
    assert s.eta_v is None and float(s.rate_v) == 0.7
    faster = s.replace(eta=2.1)  # eta_v = None follows eta: the readout's field triples
    assert float(faster.rate_v) == pytest.approx(2.1)
    np.testing.assert_allclose(derive.vector_field(faster, R, Q, v)["v"], 3 * derive.vector_field(s, R, Q, v)["v"])
    fixed = s.replace(eta_v=0.3).replace(eta=2.1)  # a given eta_v stays
    assert float(fixed.rate_v) == pytest.approx(0.3)
    base = derive.vector_field(s, R, Q, v)["v"]
    np.testing.assert_allclose(derive.vector_field(fixed, R, Q, v)["v"], 0.3 / 0.7 * base)


def test_replace_lets_the_defaults_follow_the_sizes():
    f = derive.soft_committee
    s = derive.Setup(f, f, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2))
    assert s.quadrature == derive.default_quadrature(4)
    noisy = s.replace(noise=0.1)  # one more Gaussian variable, with 2 nodes (squared loss): the default of d = 5
    assert noisy.dim == 5 and noisy.quadrature == derive.default_quadrature(5, 2)
    assert noisy.quadrature == derive.GaussHermite(13, noise_points=2)
    # a rule given is kept, also one equal to the default of the setup's dimension
    pinned = derive.Setup(f, f, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2), quadrature=derive.GaussHermite(16))
    assert pinned.quadrature == s.quadrature and pinned.replace(noise=0.1).quadrature == derive.GaussHermite(16)
    assert noisy.replace(noise=None).quadrature == s.quadrature
    three = s.replace(R0=0.1 * jnp.eye(3), Q0=0.5 * jnp.eye(3))  # T stays the identity, of M = 3
    np.testing.assert_array_equal(three.T, jnp.eye(3))
    given = derive.Setup(f, f, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2), T=2 * jnp.eye(2), quadrature=derive.GaussHermite(6))
    kept = given.replace(noise=0.1)  # what was given stays
    assert kept.quadrature == derive.GaussHermite(6)
    np.testing.assert_array_equal(kept.T, 2 * jnp.eye(2))
    with pytest.raises(ValueError, match="no field"):
        s.replace(etta=1.0)
    # T given as the identity is the same setup as T left out: one structure, one compilation
    same = derive.Setup(f, f, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2), T=jnp.eye(2))
    assert jax.tree_util.tree_structure(same) == jax.tree_util.tree_structure(s)


def test_K3_M3_quadrature_cost_bound():
    # K = M = 3: d = 6, so n Gauss-Hermite points per dimension cost n^6 nodes. Measured max errors
    # of the field: n = 6: 6.5e-3, 7: 2.7e-3, 8: 1.4e-3, 10: 3.3e-4 (1e6 nodes); Monte Carlo 2^16:
    # 1.4e-2, 2^18: 3.3e-3; scrambled Sobol 2^16 (the default): 4.6e-5 to 6.8e-5 over three seeds,
    # 2^14: 5.2e-4. The 1e-8 of K = M = 2 (n = 24) would take 24^6 = 1.9e8 nodes per evaluation:
    # quadrature cost is what bounds K = M = 3.
    R = 0.2 * jnp.eye(3) + 0.05
    Q = 0.5 * jnp.eye(3) + 0.1
    ref, eg = closed_form(R, Q, jnp.eye(3), jnp.ones(3), jnp.ones(3), 1.0, 0.0)
    ref = {"R": ref["R"], "Q": ref["Q"]}
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q)
    assert s.quadrature == derive.QuasiMonteCarlo()  # the default in d = 6
    gh = derive.vector_field(s.replace(quadrature=derive.GaussHermite(7)), R, Q)
    qmc = derive.vector_field(s, R, Q)
    mc = derive.vector_field(s.replace(quadrature=derive.MonteCarlo()), R, Q)
    assert _max_diff(gh, ref) < 4e-3
    assert _max_diff(qmc, ref) < 1.5e-4 and abs(float(derive.generalisation_error(s, R, Q)) - float(eg)) < 5e-5
    assert 5e-3 < _max_diff(mc, ref) < 3e-2  # 300 times the Sobol bank's error at as many points


def test_quasi_monte_carlo_rule_and_a_discontinuous_teacher():
    """The scrambled Sobol bank: ``2^k`` equal weights, standard normal moments to ``O(1/n)``, a new
    seed a new bank; a count that is not a power of 2 is refused. A sign teacher (a discontinuity
    across the tensor grid): the linear student with squared loss has ``dR/dt = eta (sqrt(2/pi) - R)``
    and ``dQ/dt = 2 eta (R sqrt(2/pi) - Q) + eta^2 (1 - 2 R sqrt(2/pi) + Q)``; the Sobol bank meets
    them to 2e-4 where the default ``GaussHermite(40)`` of ``d = 2`` is off by more."""
    z, w = derive.QuasiMonteCarlo(2**12).rule(3)
    assert z.shape == (4096, 3) and np.all(w == 1 / 4096)
    np.testing.assert_allclose(w @ z, 0.0, atol=1e-3)
    np.testing.assert_allclose((z * w[:, None]).T @ z, np.eye(3), atol=1e-2)
    assert not np.array_equal(derive.QuasiMonteCarlo(2**12, seed=1).rule(3)[0], z)
    with pytest.raises(ValueError, match="samples must be a power of 2 .*got 1000"):
        derive.QuasiMonteCarlo(1000)
    R, Q, eta = 0.3, 0.5, 0.5
    c = np.sqrt(2 / np.pi)
    exact = {"R": eta * (c - R), "Q": 2 * eta * (R * c - Q) + eta**2 * (1 - 2 * R * c + Q)}
    s = derive.Setup(lambda lam, v: lam[0], lambda nu: jnp.sign(nu[0]), [[R]], [[Q]], eta=eta)
    gaps = {}
    for q in (s.quadrature, derive.QuasiMonteCarlo()):
        f = derive.vector_field(s.replace(quadrature=q), [[R]], [[Q]])
        gaps[q] = max(abs(float(f[k][0, 0]) - exact[k]) for k in exact)
    assert gaps[derive.QuasiMonteCarlo()] < 2e-4 < gaps[derive.GaussHermite(40)]


def test_K3_M3_sparse_grid_beats_the_tensor_grid():
    # Smolyak Gauss-Hermite: measured max field errors level 12: 3.8e-5 (30,869 nodes), 14: 2.0e-6
    # (266,489), 16: 1.4e-7 (1.7e6) -- against 3.3e-4 for the 1e6-node tensor grid
    R = 0.2 * jnp.eye(3) + 0.05
    Q = 0.5 * jnp.eye(3) + 0.1
    ref, _ = closed_form(R, Q, jnp.eye(3), jnp.ones(3), jnp.ones(3), 1.0, 0.0)
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q, quadrature=derive.SparseGaussHermite(12))
    nodes, weights = s.quadrature.rule(6)
    assert nodes.shape == (30869, 6) and float(np.sum(weights)) == pytest.approx(1.0, abs=1e-12)
    # exact for low-degree moments: E z_1^2 z_2^2 = 1, E z_1^4 = 3
    assert float(weights @ (nodes[:, 0] ** 2 * nodes[:, 1] ** 2)) == pytest.approx(1.0, abs=1e-10)
    assert float(weights @ nodes[:, 0] ** 4) == pytest.approx(3.0, abs=1e-10)
    assert _max_diff(derive.vector_field(s, R, Q), {"R": ref["R"], "Q": ref["Q"]}) < 5e-5
    with pytest.raises(ValueError, match="level >= d = 6"):
        derive.SparseGaussHermite(4).rule(6)


# K = M = 3 through the symmetric plateau (eg ~ 0.066 for t in [40, 160]) and its escape
K3_R0 = 0.01 * jnp.ones((3, 3)) + 0.001 * jnp.eye(3) + jnp.zeros((3, 3)).at[0, 1].set(0.0005)
K3_Q0 = 0.2 * jnp.eye(3)


def _k3_closed_trajectory():
    ref, closed = _closed_trajectory(K3_R0, K3_Q0, 600.0)
    err = np.asarray(ref["error"])
    assert 0.06 < err[2] < 0.07 and 0.06 < err[4] < 0.07 and err[-1] < 1e-9  # plateau, then escape
    return ref, closed


def test_K3_M3_compressed_nodes_along_plateau_and_escape():
    # measured max field errors along this trajectory, level 14: 1.4e-5 plain, 1.0e-6 with scale 0.8
    # (level 16: 1.5e-6 / 3.1e-8; level 17 with scale 0.8: 8.2e-9; level 18: 1.9e-7 / 2.3e-9, the slow test)
    ref, closed = _k3_closed_trajectory()
    plain, _ = _derived_along(ref, derive.SparseGaussHermite(14))
    compressed, eg_err = _derived_along(ref, derive.SparseGaussHermite(14, scale=0.8))
    assert _max_diff(compressed, closed) < 2e-6
    assert _max_diff(plain, closed) > 5 * _max_diff(compressed, closed)
    assert eg_err < 5e-6


@pytest.mark.slow
def test_K3_M3_field_to_1e_8_along_plateau_and_escape():
    # level 18 (8.9e6 nodes, summed in chunks of NODE_CHUNK), nodes compressed by 0.8: measured
    # 2.3e-9 for the field and 1.4e-10 for eg at the 16 points (plain nodes: 1.9e-7); about 35 s on 2 cores
    ref, closed = _k3_closed_trajectory()
    field, eg_err = _derived_along(ref, derive.SparseGaussHermite(18, scale=0.8))
    assert _max_diff(field, closed) < 1e-8
    assert eg_err < 1e-8


def test_scaled_rule_integrates_the_standard_normal():
    z, w = derive.GaussHermite(24, scale=0.8).rule(2)
    assert float(np.sum(w)) == pytest.approx(1.0, abs=1e-10)
    assert float(w @ (z[:, 0] ** 2 * z[:, 1] ** 2)) == pytest.approx(1.0, abs=1e-9)
    assert float(w @ z[:, 0] ** 4) == pytest.approx(3.0, abs=1e-8)
    z1, w1 = derive.GaussHermite(24).rule(2)
    assert np.array_equal(z1, derive.scaled_rule(z1, w1, 1.0)[0])
    np.testing.assert_allclose(z, 0.8 * z1)
    for bad in (0.0, 1.5, -0.3, True, "0.8"):
        with pytest.raises(ValueError, match="scale must be a number in"):
            derive.SparseGaussHermite(12, scale=bad)
        with pytest.raises(ValueError, match="scale must be a number in"):
            derive.GaussHermite(12, scale=bad)
    # a grid far past the default budget says what it costs and what costs less
    with pytest.warns(
        UserWarning, match=r"GaussHermite\(points=12\) in d = 5 dimensions makes 248,832 nodes \(12\*\*5\), 3.8 times"
    ):
        derive.GaussHermite(12).rule(5)


def test_rules_above_node_chunk_are_summed_in_chunks(monkeypatch):
    from attnflow.derive import theory

    R, Q = 0.2 * jnp.eye(3) + 0.05, 0.5 * jnp.eye(3) + 0.1
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q, quadrature=derive.SparseGaussHermite(12))
    rl = derive.rule(s)  # 30,869 nodes: one chunk at the default NODE_CHUNK
    whole = jax.jit(lambda R, Q: derive.expectations(s, R, Q, None, rl))(R, Q)
    monkeypatch.setattr(theory, "NODE_CHUNK", 1000)  # 31 chunks, the last padded
    chunked = jax.jit(lambda R, Q: derive.expectations(s, R, Q, None, rl))(R, Q)
    for k in ("delta_nu", "delta_lam", "delta_delta", "error"):
        np.testing.assert_allclose(chunked[k], whole[k], rtol=1e-12, atol=1e-15)
    # the Goldt readout case has grad_v too
    v = jnp.array([0.5, 0.3, 0.2])
    sv = s.replace(student=lambda lam, v: v @ derive.erf_activation(lam), v0=v)
    monkeypatch.setattr(theory, "NODE_CHUNK", 2**16)
    whole = jax.jit(lambda R, Q: derive.expectations(sv, R, Q, v, rl))(R, Q)
    monkeypatch.setattr(theory, "NODE_CHUNK", 4096)
    chunked = jax.jit(lambda R, Q: derive.expectations(sv, R, Q, v, rl))(R, Q)
    np.testing.assert_allclose(chunked["grad_v"], whole["grad_v"], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- protocol, ODE vs SGD
GOLDT = dict(
    R0=jnp.array([[0.2, 0.0], [0.0, 0.1]]),
    Q0=0.3 * jnp.eye(2),
    v0=jnp.array([0.5, 0.3]),
    eta=1.0,
    eta_v=1.0,
)


def _goldt_setup(**kw):
    def student(lam, v):
        return v @ derive.erf_activation(lam)

    return derive.Setup(student, derive.soft_committee, **{**GOLDT, "quadrature": derive.GaussHermite(12), **kw})


def test_goldt_trained_readout_ode_vs_sgd():
    s = _goldt_setup()
    th = derive.solve(s, 10.0, save=af.LinearGrid(21))
    sim = derive.train(s, 10.0, key=0, D=1000, save=af.LinearGrid(11))
    assert set(th.ys) == set(sim.ys) == {"R", "Q", "v", "error"}
    gap = af.compare(th, sim)
    # finite-size error ~ D^{-1/2} = 0.03
    assert gap["error"] < 0.02 and gap["R"] < 0.1 and gap["Q"] < 0.1 and gap["v"] < 0.1, gap
    assert float(th["error"][-1]) < 0.5 * float(th["error"][0])
    np.testing.assert_allclose(sim["R"][0], s.R0, atol=1e-10)  # the SGD starts at the overlaps exactly
    np.testing.assert_allclose(sim["Q"][0], s.Q0, atol=1e-10)


def test_weights_from_overlaps_exact():
    R = jnp.array([[0.3, 0.1], [0.05, 0.2], [0.0, 0.1]])
    Q = 0.5 * jnp.eye(3) + 0.05
    T = jnp.array([[1.0, 0.3], [0.3, 2.0]])
    Ws, W = derive.weights_from_overlaps(R, Q, T, 50, key=3)
    np.testing.assert_allclose(Ws @ Ws.T / 50, T, atol=1e-12)
    np.testing.assert_allclose(W @ Ws.T / 50, R, atol=1e-12)
    np.testing.assert_allclose(W @ W.T / 50, Q, atol=1e-12)


def _tiny_setup(**kw):
    # one tanh neuron learning one tanh neuron: d = 2, 40^2 Gauss-Hermite nodes
    def neuron(f, v=None):
        return jnp.tanh(f[0])

    return derive.Setup(neuron, neuron, jnp.array([[0.1]]), jnp.array([[0.5]]), **kw)


def test_jit_vmap_sweep_and_one_compilation():
    s = _tiny_setup()
    assert s.quadrature == derive.GaussHermite(40)

    def final_error(eta):
        return derive.solve(s.replace(eta=eta), 5.0, save=af.LinearGrid(2)).final()["error"]

    etas = np.array([0.25, 0.5, 1.0])
    res = af.sweep(final_error, {"eta": etas}, progress=False)
    one = [float(final_error(e)) for e in etas]
    np.testing.assert_allclose(res.values, one, rtol=1e-6)
    assert np.all(np.diff(res.values) < 0)  # faster learning at larger rates in this range
    # the field under jit and vmap (rates and overlaps as batch axes)
    f = jax.jit(jax.vmap(lambda eta, r: derive.vector_field(s.replace(eta=eta), r[None, None], s.Q0)["R"]))
    assert f(jnp.array([0.5, 1.0]), jnp.array([0.1, 0.2])).shape == (2, 1, 1)
    # SGD: a vmap over seeds and learning rates at one size D
    sims = af.sweep(
        lambda eta, key: derive.train(s.replace(eta=eta), 2.0, key=key, D=200, save=af.LinearGrid(2)).final()["error"],
        {"eta": np.array([0.5, 1.0]), "key": np.arange(2)},
        progress=False,
    )
    assert sims.values.shape == (2, 2) and np.all(np.isfinite(sims.values))
    # sizes as an axis too: D changes shapes, so af.Static compiles once per D, rates vmapped inside
    by_size = af.sweep(
        lambda D, eta: derive.train(s.replace(eta=eta), 2.0, key=0, D=D, save=af.LinearGrid(2)).final()["error"],
        {"D": af.Static([200, 400]), "eta": np.array([0.5, 1.0])},
        progress=False,
    )
    assert by_size.dims == ("D", "eta") and by_size.values.shape == (2, 2)
    np.testing.assert_allclose(np.asarray(by_size.sel(D=200)), np.asarray(sims.values[:, 0]), rtol=1e-6)
    with af.count_compilations() as n:
        derive.solve(s.replace(eta=0.3, R0=jnp.array([[0.2]])), 5.0, save=af.LinearGrid(2))
        derive.solve(s.replace(eta=0.7, R0=jnp.array([[0.3]])), 5.0, save=af.LinearGrid(2))
    assert n.n <= 1


def test_event_stops_the_solve_at_the_escape():
    """derive.solve(event=...) stops where R_00 first reaches 1/2 (the escape from the symmetric
    plateau): the event time equals the interpolated crossing of a dense save, and a new learning
    rate reuses the compiled solve."""
    R0, Q0 = 0.01 * jnp.array([[0.1, 0.05], [0.05, 0.1]]) * 10, 0.5 * jnp.eye(2)
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=derive.GaussHermite(6))
    dense = derive.solve(s, 200.0, save=af.LinearGrid(2001))
    crossing = float(af.first_crossing(dense.ts, dense["R"][:, 0, 0], 0.5, interpolate=True))

    def escaped(t, y):
        return y["R"][0, 0] - 0.5

    tr = derive.solve(s, 200.0, event=escaped)
    assert 5.0 < float(tr.t_event) < 190.0 and float(tr.t_event) == pytest.approx(crossing, rel=1e-3)
    assert float(tr.final()["R"][0, 0]) == pytest.approx(0.5, abs=1e-8)
    with af.count_compilations() as c:
        slower = derive.solve(s.replace(eta=0.8), 200.0, event=escaped)
    assert c.n == 0 and float(slower.t_event) > float(tr.t_event)
    assert np.isnan(float(derive.solve(s, 1.0, event=escaped).t_event))  # not reached by t = 1
    with pytest.raises(ValueError, match="event must be callable"):
        derive.solve(s, 1.0, event=0.5)


def test_bad_input_names_the_argument():
    f = derive.soft_committee
    R, Q = 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2)
    cases = [
        (dict(student=1.0, teacher=f, R0=R, Q0=Q), "student"),
        (dict(student=f, teacher=f, R0=R, Q0=Q, eta=-1.0), "eta"),
        (dict(student=f, teacher=f, R0=R, Q0=Q, eta_v=0.0), "eta_v"),
        (dict(student=f, teacher=f, R0=jnp.ones(3), Q0=Q), "R0"),
        (dict(student=f, teacher=f, R0=R, Q0=jnp.eye(3)), "Q0"),
        (dict(student=f, teacher=f, R0=R, Q0=Q, T=jnp.eye(3)), "T"),
        (dict(student=f, teacher=f, R0=R, Q0=0.01 * jnp.eye(2)), "Q0 - R0"),
        (dict(student=f, teacher=f, R0=R, Q0=Q, noise=-0.1), "noise"),
        (dict(student=f, teacher=f, R0=R, Q0=Q, quadrature="gh"), "quadrature"),
        (dict(student=f, teacher=f, R0="x", Q0=Q), "R0"),
        # the model is called once on abstract fields: a call that fails, or mismatched outputs
        (
            dict(student=lambda lam: lam[0], teacher=f, R0=R, Q0=Q),
            r"student\(lam, v\) with lam of shape \(2,\).*TypeError",
        ),
        (dict(student=lambda lam, v: v[0] * lam[0], teacher=f, R0=R, Q0=Q), r"v None \(no v0\) failed"),
        (
            dict(student=lambda lam, v: jnp.tanh(lam), teacher=f, R0=R, Q0=Q),
            r"output has shape \(2,\) and the teacher's \(\)",
        ),
        (dict(student=f, teacher=lambda nu, e: nu[0], R0=R, Q0=Q), r"teacher\(nu\) with nu of shape \(2,\) failed"),
        # a model written for more fields than R0 gives: JAX would clamp nu[1] to nu[0]
        (
            dict(student=f, teacher=lambda nu: jnp.tanh(nu[0]) + jnp.tanh(nu[1]), R0=R[:, :1], Q0=Q),
            r"teacher\(nu\) with nu of shape \(1,\) reads past the end .*index 1 on axis 0.* M = 1",
        ),
        (
            dict(student=lambda lam, v: lam[0] + lam[2], teacher=f, R0=R, Q0=Q),
            r"student\(lam, v\) with lam of shape \(2,\).* reads past the end .*K = 2",
        ),
        # an index array (a gather) past the end: clamped (x[jnp.array([0, 1, 2])]) or NaN-filled (jnp.take)
        (
            dict(student=lambda lam, v: jnp.sum(jnp.tanh(lam[jnp.array([0, 1, 2])])), teacher=f, R0=R, Q0=Q),
            r"reads past the end of an array \(index 2 on axis 0 of an array of shape \(2,\)\)",
        ),
        (
            dict(student=lambda lam, v: jnp.tanh(lam[0]) + jnp.tanh(jnp.take(lam, 2)), teacher=f, R0=R, Q0=Q),
            r"reads past the end of an array \(index 2",
        ),
        # a model SGD cannot move: zero gradient almost everywhere (a sign student, a 0-1 loss)
        (
            dict(student=lambda lam, v: jnp.sum(jnp.sign(lam)), teacher=f, R0=R, Q0=Q),
            r"the loss does not change with the student's fields: its gradient is exactly zero",
        ),
        (
            dict(student=f, teacher=f, R0=R, Q0=Q, loss=lambda y_hat, y: (jnp.sign(y_hat) != jnp.sign(y)) * 1.0),
            r"gradient is exactly zero .* smooth surrogate",
        ),
        (
            dict(student=lambda lam, v: jnp.sum(jnp.sign(lam)), teacher=f, R0=R, Q0=Q, v0=jnp.ones(2)),
            r"student's fields or readout: its gradient is exactly zero",
        ),
    ]
    for kw, name in cases:
        with pytest.raises(ValueError, match=name):
            derive.Setup(**kw)
    # clamping the user asks for (mode="clip") is the model, not a size mismatch
    clip = derive.Setup(lambda lam, v: jnp.sum(jnp.tanh(jnp.take(lam, jnp.array([0, 5]), mode="clip"))), f, R, Q)
    assert clip.K == 2
    with pytest.raises(ValueError, match="points"):
        derive.GaussHermite(1)
    with pytest.raises(ValueError, match="samples"):
        derive.MonteCarlo(3)
    # a unit active only far from the origin is trainable: SGD from Q0 = 25 moves it
    far = lambda lam, v=None: jnp.sum(jax.nn.relu(lam - 2.5))
    s_far = derive.Setup(far, far, jnp.full((1, 1), 2.5), jnp.full((1, 1), 25.0))
    assert float(s_far.replace(R0=jnp.full((1, 1), 0.5), Q0=jnp.ones((1, 1))).Q0[0, 0]) == 1.0
    field = derive.vector_field(s_far, s_far.R0, s_far.Q0)
    assert float(field["Q"][0, 0]) < -1.0 and float(field["R"][0, 0]) < -0.1
    # a readout that learns over fixed features (random features) is a model SGD trains
    features = derive.Setup(lambda lam, v: v @ jnp.sign(lam), f, R, Q, v0=jnp.ones(2))
    assert features.replace(eta=0.5).v0.shape == (2,)
    s = derive.Setup(f, f, R, Q)
    with pytest.raises(ValueError, match="D must"):
        derive.train(s, 1.0, D=3)
    with pytest.raises(ValueError, match="t1"):
        derive.train(s, -1.0)
    with pytest.raises(ValueError, match="setup"):
        derive.solve("setup", 1.0)
    with pytest.raises(ValueError, match="R must"):
        derive.vector_field(s, jnp.ones(2), Q)
    with pytest.raises(ValueError, match="Q must"):
        derive.vector_field(s, R, jnp.eye(3))
    with pytest.raises(ValueError, match="v must"):
        derive.generalisation_error(s, R, Q, v=jnp.ones(2))


def test_public_names_have_docstrings():
    for name in derive.__all__:
        obj = getattr(derive, name)
        if callable(obj) or isinstance(obj, type):
            assert (obj.__doc__ or "").strip(), name


# ----------------------------------------------------------------------------- finite-size scaling
@pytest.mark.slow
def test_sgd_gap_shrinks_like_inverse_sqrt_D():
    s = derive.Setup(
        derive.soft_committee,
        derive.soft_committee,
        jnp.array([[0.2, 0.0], [0.0, 0.05]]),
        0.3 * jnp.eye(2),
        quadrature=derive.GaussHermite(12),
    )
    t1 = 8.0
    th = derive.solve(s, t1, save=af.LinearGrid(33))
    # more seeds where they are cheap: the gap of one run is a random variable of relative spread ~ 1.
    # Measured: RMS gaps 3.2e-3, 1.8e-3, 8.5e-4 at D = 500, 2000, 8000, exponent -0.48.
    Ds, seeds, gaps = (500, 2000, 8000), (16, 8, 4), []
    for D, n_seeds in zip(Ds, seeds):
        per_seed = []
        for key in range(n_seeds):
            sim = derive.train(s, t1, key=key, D=D, save=af.LinearGrid(17))
            ref = np.interp(np.asarray(sim.ts), np.asarray(th.ts), np.asarray(th["error"]))
            per_seed.append(np.sqrt(np.mean((np.asarray(sim["error"]) - ref) ** 2)))
        gaps.append(float(np.mean(per_seed)))
    fit = af.fit_power_law(Ds, gaps)
    print("gaps", dict(zip(Ds, gaps)), "exponent", fit.slope)
    assert -0.75 < fit.slope < -0.3, (gaps, fit.slope)


@pytest.mark.slow
def test_experiment_derive_committee_small(tmp_path):
    from attnflow.registry import get_experiment, load_all

    load_all()
    small = {"etas": (1.0, 2.0), "r0s": (1e-5, 1e-4, 1e-3), "t_end": 300.0, "points": 10, "D": 300, "sgd_r0s": (0.1,)}
    rep = get_experiment("derive-committee").run(small, quiet=True)
    assert rep.passed, rep.checks
    assert "plateau" in rep.figures
    assert rep.references and "Saad" in rep.references[0]


# ----------------------------------------------------------------------------- single-location data model
# The heads model of attnflow.heads (FlippedSpike(3, 1/2), L = 4 tokens, H = 2 softmax heads,
# eta = 1: heads.Setup()) written as a derive student: the attention of the K = 2 heads' scores.
# Its derived field must be attnflow.heads' own order-parameter field (heads page, eq. (8)).


def _heads_points(n, seed=0):
    """``n`` random order parameters ``(M (2, 1), Q (2, 2))`` with ``Q - M M^T`` positive definite."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        M = 0.8 * rng.standard_normal((2, 1))
        A = 0.5 * rng.standard_normal((2, 2))
        out.append((M, M @ M.T + A @ A.T + 0.1 * np.eye(2)))
    return out


def _heads_setup(hs, student, M, Q, **kw):
    """The derive setup of the heads model ``hs`` with this student: an `attnflow.heads`
    activation (no learned parameters) or a function ``student(lam, v)``."""
    if isinstance(student, eqx.Module):
        activation = student

        def student(lam, v):
            return activation(lam)

    return derive.Setup(
        student,
        derive.signal_token,
        R0=M,
        Q0=Q,
        eta=hs.eta,
        data=derive.SingleLocation(hs.prior, hs.L),
        **kw,
    )


def _heads_banks(hs, n, B, seed=0):
    """``B`` independent plain Monte Carlo banks of `attnflow.heads` (``n`` base draws each,
    support enumerated, no antithetic or head copies): contiguous chunks of one bank of ``n B``
    draws (one compilation of the bank's draw)."""
    from attnflow.heads.theory import BankOptions, FieldBank, NoCopies

    big = FieldBank(hs.prior, hs.L, hs.H, BankOptions(n=n * B, seed=seed, antithetic=False, copies=NoCopies()))
    c = big.size // B
    chunk = [slice(i * c, (i + 1) * c) for i in range(B)]
    return [
        eqx.tree_at(
            lambda b: (b.theta, b.zeta, b.w, b.weights),
            big,
            (big.theta[sl], big.zeta[sl], big.w[sl], big.weights[sl] * B),
        )
        for sl in chunk
    ]


@eqx.filter_jit
def _heads_field(hs, bank, M, Q, act):
    from attnflow.heads.theory import Dynamics, ExpectationForm, order_parameter_field

    return order_parameter_field(0.0, {"M": M, "Q": Q, "act": act}, Dynamics(hs, bank, ExpectationForm()))


def _flat(R, Q, v=None):
    """``R``, the upper triangle of ``Q`` (symmetric) and ``v`` as one vector."""
    parts = [np.ravel(R), np.asarray(Q)[np.triu_indices(Q.shape[0])]]
    parts += [np.ravel(x) for x in jax.tree_util.tree_leaves(v)]
    return np.concatenate(parts)


def test_single_location_same_draws_give_heads_field_exactly():
    # The same Gaussian draws fed to both: derive's nodes are z = S^{-1} (fields - signal shift)
    # of the heads bank's fields at (M, Q). Then both fields are the same sums, equal to rounding.
    from attnflow import heads

    hs = heads.Setup()
    bank = _heads_banks(hs, 2048, 1)[0]
    M, Q = _heads_points(1, seed=3)[0]
    s = _heads_setup(hs, heads.Softmax(), M, Q)
    chi, chi_star = bank.fields(jnp.asarray(M), jnp.asarray(Q))  # (n, H, L), (n, L, F)
    n, theta = chi.shape[0], bank.theta
    u = jnp.concatenate([jnp.swapaxes(chi, 1, 2), chi_star], axis=2)  # (n, L, H + F): (lambda_l, nu_l)
    u = u.at[:, 0].add(-jnp.concatenate([theta @ M.T, theta], axis=1))  # minus the signal's mean
    S = af.psd_sqrt(derive.covariance(jnp.asarray(M), jnp.asarray(Q), jnp.eye(1)))
    z = jnp.linalg.solve(S, u[..., None])[..., 0]
    rl = (jnp.concatenate([z.reshape(n, -1), theta, jnp.zeros((n, 1))], axis=1), bank.weights)
    f = derive.vector_field(s, M, Q, rule=rl)
    g = _heads_field(hs, bank, jnp.asarray(M), jnp.asarray(Q), {})
    np.testing.assert_allclose(f["R"], g["M"], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(f["Q"], g["Q"], rtol=1e-10, atol=1e-14)
    # derive's error is E[loss] = E|e - a|^2 / 2; the heads page reports E|e - a|^2
    e_heads = heads.generalisation_error(jnp.asarray(M), jnp.asarray(Q), heads.Softmax(), bank)
    np.testing.assert_allclose(2 * derive.generalisation_error(s, M, Q, rule=rl), e_heads, rtol=1e-12)


def _agreement(hs, activation, points, B, n, v=None, act=None, **kw):
    """Max over ``points`` and components of ``|mean derive - mean heads| / SE`` with ``B``
    independent banks of ``n`` base draws on each side; ``v``/``act``: the learned parameters
    as derive readout and as heads ``act``."""
    s = _heads_setup(hs, activation, *points[0], v0=v, quadrature=derive.MonteCarlo(n), **kw)
    rules = [derive.rule(s.replace(quadrature=derive.MonteCarlo(n, seed))) for seed in range(B)]
    banks = _heads_banks(hs, n, B)
    worst, rows = 0.0, []
    for M, Q in points:
        d = np.array([_flat(**derive.vector_field(s, M, Q, v, rule=rl)) for rl in rules])
        h = [_heads_field(hs, b, jnp.asarray(M), jnp.asarray(Q), act or {}) for b in banks]
        h = np.array([_flat(g["M"], g["Q"], g["act"]) for g in h])
        se = np.sqrt(d.var(0, ddof=1) / B + h.var(0, ddof=1) / B)
        z = np.abs(d.mean(0) - h.mean(0)) / se
        worst = max(worst, float(z.max()))
        rows.append((np.abs(d.mean(0) - h.mean(0)).max(), se.max(), np.abs(h.mean(0)).max()))
    return worst, rows


def test_single_location_field_matches_heads_to_monte_carlo_error():
    # Independent banks, B = 6 on each side: derive MonteCarlo(2**14), seeds 0..5 (antithetic;
    # the flipped spike's two amplitudes enumerated: 32768 nodes), heads 2**14 base draws
    # (enumerated: 32768 nodes). The standard error (SE) of the difference of the two bank means
    # is estimated per component from the spread over the banks (10 degrees of freedom).
    # Measured (B = 8, 10 points): max |deviation| / SE = 2.4; SE 1e-4 to 3e-4; max |deviation|
    # 4.7e-4, fields of size up to 0.2. Tolerance k = 5 SE (t_10: P(|t| > 5) = 5e-4 per component).
    from attnflow import heads

    worst, rows = _agreement(heads.Setup(), heads.Softmax(), _heads_points(4), B=6, n=2**14)
    print("max |derive - heads| / SE:", worst, rows)
    assert worst < 5.0, rows


def test_single_location_solve_options_and_errors():
    from attnflow import heads

    hs = heads.Setup()
    M0, Q0 = hs.initial_overlaps()
    s = _heads_setup(hs, heads.Softmax(), M0, Q0, quadrature=derive.MonteCarlo(2**11))
    assert s.dim == hs.L * 3 and s.data.F == 1
    th = derive.solve(s, 1.0, save=af.LinearGrid(3))
    assert set(derive.OBSERVABLES) - {"v"} <= set(th.ys) and th.meta["data"] == "SingleLocation"
    assert np.all(np.isfinite(np.asarray(th["Q"]))) and 0.5 < float(th["error"][0]) * 2 < 1.0
    # every location enumerated (for a positional student) gives the same field for an equivariant one
    f0 = derive.vector_field(s, M0, Q0)
    f1 = derive.vector_field(s.replace(data=derive.SingleLocation(hs.prior, hs.L, exchangeable=False)), M0, Q0)
    assert _max_diff(f0, f1) < 3e-3  # Monte Carlo error of 2 x 2**11 draws (the fields are about 1e-2)
    with pytest.raises(ValueError, match="noise"):
        _heads_setup(hs, heads.Softmax(), M0, Q0, noise=0.1)
    with pytest.raises(ValueError, match="prior.F"):
        _heads_setup(hs, heads.Softmax(), jnp.zeros((2, 2)), Q0)
    with pytest.raises(ValueError, match="prior must be"):
        derive.SingleLocation("spike")
    with pytest.raises(ValueError, match="data must be"):
        derive.Setup(derive.soft_committee, derive.soft_committee, [[0.1]], [[0.5]], data="tokens")
    # a positional student (a fixed position bias) breaks exchangeable=True's signal-at-0 shortcut,
    # which gave dR/dt -0.18 against -0.015 (helper's own Monte Carlo, 2e6 draws): refused by name
    b = jnp.array([1.0, 0.0, -1.0])
    positional = lambda lam, v: jax.nn.softmax(2.0 * lam[0] + b)
    tokens = derive.SingleLocation(heads.FlippedSpike(2.0, 0.5), L=3)
    with pytest.raises(ValueError, match=r"permuted: .*exchangeable=False"):
        derive.Setup(positional, derive.signal_token, [[0.4]], [[0.7]], data=tokens)
    ok = derive.Setup(
        positional,
        derive.signal_token,
        [[0.4]],
        [[0.7]],
        data=derive.SingleLocation(heads.FlippedSpike(2.0, 0.5), L=3, exchangeable=False),
    )
    assert ok.data.exchangeable is False


def test_single_location_train_follows_the_derived_ode():
    # Finite-D online SGD of the same student on the token model (signal at a uniform location)
    # against the derived ODE (MonteCarlo(2**14)): heads' default setup to t = 6, D = 1000, keys
    # 0..3. The escape from the small initial overlap is stochastic (run-to-run spread of R 0.05
    # at t = 6), so the mean of 4 runs is compared in standard errors of that mean. Measured:
    # max |mean - ODE| 0.019 (R, of size 0.17) and 0.0029 (Q): 1.9 and 1.7 SE.
    from attnflow import heads

    hs = heads.Setup()
    M0, Q0 = hs.initial_overlaps()
    s = _heads_setup(hs, heads.Softmax(), M0, Q0, quadrature=derive.MonteCarlo(2**14))
    th = derive.solve(s, 6.0, save=af.LinearGrid(7))
    runs = [derive.train(s, 6.0, D=1000, key=k, save=af.LinearGrid(7)) for k in range(4)]
    assert runs[0].meta["D"] == 1000 and set(derive.OBSERVABLES) - {"v"} <= set(runs[0].ys)
    for name in ("R", "Q"):
        x = np.array([np.asarray(r[name]) for r in runs])
        gap = np.abs(x.mean(0) - np.asarray(th[name]))
        se = x.std(0, ddof=1) / np.sqrt(len(runs))
        assert float(np.max(gap / (se + 1e-6))) < 4.0, (name, gap.max())
        assert float(gap.max()) < 0.04, name
    R = np.asarray(th["R"])
    assert R[-1, 0, 0] > 4 * R[0, 0, 0]  # the overlap grew: a trajectory, not a point


@pytest.mark.slow
@pytest.mark.parametrize("which", ["softmax1", "bayes"])
def test_single_location_learned_activation_parameters_match_heads(which):
    # The activation's learned parameters are derive's readout v: their step eta_v / D is the
    # heads' eta_b / D, so dv/dt = -eta_v E[d l / d v] is the heads' db/dt (eta_b = eta_v = eta).
    # Softmax1 with learned global (b, c), v = (b, c); Bayes-softmax with learned b_h, v = b.
    # Same banks and tolerance as the softmax test (B = 8 here).
    from attnflow import heads

    if which == "softmax1":
        act, v = heads.Softmax1(0.3, 1.2), jnp.array([0.3, 1.2])

        def student(lam, v):
            return act.with_params({"b": v[0], "c": v[1]})(lam)
    else:
        act, v = heads.BayesSoftmax(jnp.array([0.2, -0.1])), jnp.array([0.2, -0.1])

        def student(lam, v):
            return act.with_params({"b": v})(lam)

    hs = heads.Setup(activation=act)
    worst, rows = _agreement(hs, student, _heads_points(4, seed=1), B=8, n=2**14, v=v, act=act.params())
    print(which, "max |derive - heads| / SE:", worst, rows)
    assert worst < 5.0, rows


def test_plateau_is_the_symmetric_fixed_point_and_its_rate_times_the_escape():
    R0, Q0 = 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2)
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=derive.GaussHermite(10))
    p = derive.plateau(s)
    field = derive.ode(derive.symmetrised(s))(0.0, p.state)
    assert max(float(jnp.max(jnp.abs(v))) for v in field.values()) < 1e-9
    np.testing.assert_allclose(p.state["R"], p.state["R"][0, 0], rtol=1e-10)  # no unit singled out
    assert float(p.lambda_max) > 0 and 0 < float(p.error) < float(derive.generalisation_error(s, R0, Q0))
    # the escape from a specialisation r0 takes log(1/r0)/lambda_max plus a constant
    escaped = lambda t, o: o["error"] - 0.5 * p.error
    t_esc = [
        float(derive.solve(s.replace(R0=R0 + r0 * jnp.eye(2)), 2000.0, event=escaped).t_event) for r0 in (1e-4, 1e-6)
    ]
    np.testing.assert_allclose((t_esc[1] - t_esc[0]) * float(p.lambda_max), np.log(100.0), rtol=0.03)
    assert derive.symmetrised(s.replace(R0=R0 + jnp.diag(jnp.array([0.2, 0.0])))).R0[0, 1] == pytest.approx(0.15)
    # teachers of different sizes: each student's overlaps the mean row (the overlaps stay realisable)
    T = jnp.diag(jnp.array([1.0, 0.01]))
    odd = s.replace(R0=jnp.diag(jnp.array([0.9, 0.09])), Q0=jnp.eye(2), T=T)
    np.testing.assert_allclose(derive.symmetrised(odd).R0, [[0.45, 0.045], [0.45, 0.045]], rtol=1e-12)
    # one rate per student: equal ones are the scalar rate, unequal ones have no symmetric plateau
    same = derive.plateau(s.replace(eta=jnp.array([1.0, 1.0])))
    np.testing.assert_allclose(same.lambda_max, p.lambda_max, rtol=1e-9)
    with pytest.raises(ValueError, match=r"one learning rate for all students, got eta = \[0.2, 1.0\]"):
        derive.plateau(s.replace(eta=jnp.array([0.2, 1.0])))


@pytest.mark.slow
def test_plateau_followed_along_the_learning_rate_and_its_derivative():
    """fixed_point_branch follows the plateau (Jacobian singular along Q_01 - Q_10) along eta: plateau's
    states and escape rates at each rate; d Q*/d eta by jax.jacfwd equals central differences."""
    s = derive.Setup(
        derive.soft_committee,
        derive.soft_committee,
        0.1 * jnp.ones((2, 2)),
        0.5 * jnp.eye(2),
        quadrature=derive.GaussHermite(6),
    )
    p, sym = derive.plateau(s), derive.symmetrised(s)
    etas = np.array([1.0, 0.7, 0.4])
    br = af.fixed_point_branch(lambda eta: derive.ode(sym.replace(eta=eta)), etas, p.state)
    assert bool(br.converged().all())
    for i, eta in enumerate(etas):
        q = derive.plateau(s.replace(eta=eta))
        np.testing.assert_allclose(br.states["Q"][i], q.state["Q"], atol=1e-12)
        assert float(br.lambda_max[i]) == pytest.approx(float(q.lambda_max), rel=1e-10)

    def q_star(eta):
        return af.fixed_point(derive.ode(sym.replace(eta=eta)), p.state)["Q"]

    h = 1e-5
    fd = (q_star(1.0 + h) - q_star(1.0 - h)) / (2 * h)
    np.testing.assert_allclose(jax.jacfwd(q_star)(1.0), fd, rtol=1e-6, atol=1e-9)
    # plateau itself is traceable: its escape rate differentiated in eta, and swept
    rate = lambda eta: derive.plateau(s.replace(eta=eta)).lambda_max
    fd_rate = (rate(1.0 + h) - rate(1.0 - h)) / (2 * h)
    assert float(jax.grad(rate)(1.0)) == pytest.approx(float(fd_rate), rel=1e-6)
    swept = af.sweep(rate, {"eta": etas[:2]}, progress=False).values
    np.testing.assert_allclose(swept, br.lambda_max[:2], rtol=1e-10)


def test_plateau_with_trained_readouts_is_symmetric_and_realisable():
    R0, Q0 = jnp.array([[0.02, 0.0], [0.0, 0.01]]), 0.2 * jnp.eye(2)
    s = derive.Setup(
        derive.soft_committee,
        derive.soft_committee,
        R0,
        Q0,
        v0=jnp.array([0.9, 1.1]),
        eta=0.5,
        quadrature=derive.GaussHermite(8),
    )
    np.testing.assert_allclose(derive.symmetrised(s).v0, [1.0, 1.0])  # readouts too: no student singled out
    p = derive.plateau(s)
    Q, R, v = (np.asarray(p.state[k]) for k in ("Q", "R", "v"))
    np.testing.assert_allclose(v, v[0], rtol=1e-9)
    np.testing.assert_allclose(R, R[0, 0], rtol=1e-9)
    assert np.linalg.eigvalsh(Q - R @ R.T).min() > 0  # overlaps some weights have (T = I)
    assert float(p.lambda_max) > 0
    # one student: the symmetric point is the minimum, not a plateau
    one = derive.Setup(
        derive.soft_committee, derive.soft_committee, [[0.1]], [[0.5]], quadrature=derive.GaussHermite(12)
    )
    with pytest.warns(UserWarning, match="the symmetric point is stable"):
        derive.plateau(one)


def test_the_derived_field_refuses_float32():
    """The theory runs in float64: without x64 the field and the error raise, as solve does."""
    s = derive.Setup(derive.soft_committee, derive.soft_committee, 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2))
    with jax.enable_x64(False):
        with pytest.raises(RuntimeError, match="derive.vector_field runs in float64"):
            derive.vector_field(s, s.R0, s.Q0)
        with pytest.raises(RuntimeError, match="derive.generalisation_error runs in float64"):
            derive.generalisation_error(s, s.R0, s.Q0)


def test_state_observables_take_the_state_first_as_qkov():
    """``derive.state_observables(y, setup[, rule])``: the state first, as in qkov; the default rule
    is the setup's; the first row of a solve; the setup in second place is checked."""
    s = _tiny_setup()
    y0 = derive.initial_state(s)
    obs = derive.state_observables(y0, s)
    first = derive.solve(s, 0.1, save=af.LinearGrid(2))
    np.testing.assert_allclose(obs["error"], first["error"][0], rtol=1e-12)
    np.testing.assert_allclose(obs["error"], derive.state_observables(y0, s, derive.rule(s))["error"], rtol=0)
    with pytest.raises(ValueError, match=r"state_observables\(y, setup\)"):
        derive.state_observables(s, y0)
    # weights first too: the observables of weights are those of their overlaps
    W = jax.random.normal(jax.random.PRNGKey(0), (1, 300))
    W_star = jax.random.normal(jax.random.PRNGKey(1), (1, 300))
    by_weights = derive.weight_observables({"W": W}, s, W_star)
    overlaps = {"R": W @ W_star.T / 300, "Q": W @ W.T / 300}
    np.testing.assert_allclose(by_weights["error"], derive.state_observables(overlaps, s)["error"], rtol=1e-12)


def test_field_and_error_refuse_overlaps_no_weights_have():
    """``vector_field`` and ``generalisation_error`` at ``(R, Q)`` with ``Q - R T^-1 R^T`` not PSD, or
    ``Q`` not symmetric, raise as the setup's ``R0``, ``Q0`` do (they returned numbers: a helper got
    ``dR = -0.097`` at ``R = 0.9``, ``Q = 0.5 I``)."""
    s = _tiny_setup()
    with pytest.raises(ValueError, match=r"derive.vector_field: Q - R T\^-1 R\^T must be positive semidefinite"):
        derive.vector_field(s, [[0.9]], [[0.5]])
    with pytest.raises(ValueError, match=r"derive.generalisation_error: Q - R T\^-1 R\^T"):
        derive.generalisation_error(s, [[0.9]], [[0.5]])
    two = derive.Setup(derive.soft_committee, derive.soft_committee, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2))
    with pytest.raises(ValueError, match="Q must be symmetric"):
        derive.vector_field(two, 0.1 * jnp.eye(2), jnp.array([[0.5, 0.1], [0.0, 0.5]]))
    assert np.isfinite(float(derive.generalisation_error(s, [[0.7]], [[0.5]])))  # on the boundary side: 0.49 <= 0.5


@pytest.mark.slow
def test_minibatch_divides_the_eta2_term_in_theory_and_in_sgd():
    """Mean gradient of B samples a step: same drift, eta^2 term / B (docs, "Mini-batches"). The
    linear model's field against its closed form, and SGD at B = 8 (eta = 1.5, D = 2000) against
    the derived ODE of B = 8 (measured gaps 0.004 to 0.008) and of B = 1 (0.36 in Q)."""
    lin = derive.Setup(lambda lam, v: lam[0], lambda nu: nu[0], R0=[[0.1]], Q0=[[0.4]], eta=0.5, noise=0.3)
    R, Q, eta, sigma = 0.1, 0.4, 0.5, 0.3
    for B in (1, 4):
        f = derive.vector_field(lin.replace(minibatch=B), lin.R0, lin.Q0)
        assert float(f["R"][0, 0]) == pytest.approx(eta * (1 - R), abs=1e-12)
        want = 2 * eta * (R - Q) + eta**2 / B * (Q - 2 * R + 1 + sigma**2)
        assert float(f["Q"][0, 0]) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="minibatch"):
        lin.replace(minibatch=0)
    s = derive.Setup(
        derive.soft_committee, derive.soft_committee, jnp.array([[0.1, 0.0], [0.0, 0.05]]), 0.5 * jnp.eye(2), eta=1.5
    )
    grid = af.LinearGrid(13)
    s8 = s.replace(minibatch=8)
    sim = derive.train(s8, 6.0, key=0, D=2000, save=grid)
    assert sim.meta["batch"] == 8
    own = af.compare(derive.solve(s8, 6.0, save=grid), sim)
    single = af.compare(derive.solve(s, 6.0, save=grid), sim)
    assert max(own.values()) < 0.03, own
    assert single["Q"] > 0.2, single
    assert derive.Setup.from_record(s8.record()).minibatch == 8


@pytest.mark.slow
def test_one_learning_rate_per_student_unit():
    """eta of shape (K,): row k of W steps at eta_k; the field is diag(eta) E[delta nu^T] and
    diag(eta) E[delta lam^T] + transpose + diag(eta) E[delta delta^T] diag(eta); SGD follows it."""
    R0 = jnp.array([[0.1, 0.0], [0.0, 0.05]])
    Q0 = jnp.array([[0.5, 0.05], [0.05, 0.4]])
    eta = jnp.array([0.5, 2.0])
    s = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, eta=eta)
    E = derive.expectations(s, R0, Q0, None, derive.rule(s))
    f = derive.vector_field(s, R0, Q0)
    D_eta = jnp.diag(eta)
    np.testing.assert_allclose(f["R"], D_eta @ E["delta_nu"], rtol=1e-12)
    want_Q = D_eta @ E["delta_lam"] + (D_eta @ E["delta_lam"]).T + D_eta @ E["delta_delta"] @ D_eta
    np.testing.assert_allclose(f["Q"], want_Q, rtol=1e-12)
    th = derive.solve(s, 5.0, save=af.LinearGrid(6))
    runs = [derive.train(s, 5.0, D=2000, key=k, save=af.LinearGrid(6)) for k in range(2)]
    # 0.029 measured; single runs 0.015 to 0.051 (keys 0 to 11)
    assert np.mean([max(af.compare(th, r, ["R", "Q"]).values()) for r in runs]) < 0.06
    with pytest.raises(ValueError, match=r"one per student unit, shape \(K,\) = \(2,\), got shape \(3,\)"):
        derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, eta=jnp.ones(3))
    with pytest.raises(ValueError, match="give the readout its own scalar rate eta_v"):
        derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, eta=eta, v0=jnp.ones(2))


def test_a_kinked_model_under_gauss_hermite_warns():
    """A ReLU student (or abs) makes the per-sample loss's derivative jump along lines in input
    space, which Gauss-Hermite integrates slowly (dQ_01/dt -0.00151 under the default rule against
    -0.00285 under QuasiMonteCarlo(2**18)): Setup warns, naming the remedy. A smooth model, or a
    Monte Carlo rule, does not."""
    import warnings

    from attnflow.derive.setup import _kink_excess

    R0, Q0, v0 = jnp.array([[0.10, 0.02], [0.03, 0.08]]), jnp.array([[0.5, 0.05], [0.05, 0.4]]), jnp.array([0.5, 0.4])
    relu = lambda lam, v: v @ jax.nn.relu(lam)
    tanh = lambda nu: jnp.sum(jnp.tanh(nu))
    with pytest.warns(UserWarning, match=r"has a kink .*GaussHermite\(points=16\).*QuasiMonteCarlo\(2\*\*18\)"):
        s = derive.Setup(relu, tanh, R0, Q0, v0=v0, eta=0.5)
    assert _kink_excess(relu, tanh, s.loss, 2, 2, (2,)) > 0.5
    with pytest.warns(UserWarning, match="has a kink"):
        derive.Setup(lambda lam, v=None: jnp.sum(jnp.abs(lam)), tanh, R0, Q0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        derive.Setup(relu, tanh, R0, Q0, v0=v0, quadrature=derive.QuasiMonteCarlo(2**10))
        smooth = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0)
        derive.Setup(lambda lam, v: v @ jnp.tanh(lam), lambda nu: jnp.sum(jnp.tanh(10 * nu)), R0, Q0, v0=v0)
    assert _kink_excess(derive.soft_committee, derive.soft_committee, smooth.loss, 2, 2, None) < 1e-3
    fields = [derive.vector_field(s.replace(quadrature=q), R0, Q0, v0) for q in (None, derive.QuasiMonteCarlo(2**18))]
    assert float(fields[0]["Q"][0, 1]) == pytest.approx(-0.00151, abs=1e-5)
    assert float(fields[1]["Q"][0, 1]) == pytest.approx(-0.00285, abs=2e-5)


def test_label_noise_gets_its_own_gauss_hermite_nodes():
    """The label noise xi enters the squared loss linearly, so every integrand is a polynomial of
    degree <= 2 in it: 2 Gauss-Hermite nodes are exact, and the default rule spends the budget on
    the fields (d = 3 + 1: 32 points per field against 16 for a uniform 4-d grid, which put the
    error of this tanh model 3.8e-3 off; now 1.1e-4, against 4e-5 for the noise-free 40-point rule)."""
    stud = lambda lam, v: v @ jnp.tanh(lam)
    teach = lambda nu: jnp.tanh(2 * nu[0])
    R0, Q0, v0 = jnp.array([[0.3], [-0.1]]), jnp.array([[0.6, 0.1], [0.1, 0.5]]), jnp.array([0.5, 0.4])
    clean = derive.Setup(stud, teach, R0, Q0, v0=v0)
    noisy = clean.replace(noise=0.5)
    assert clean.quadrature == derive.GaussHermite(40) and noisy.quadrature == derive.GaussHermite(32, noise_points=2)
    assert derive.rule(noisy)[0].shape == (32**3 * 2, 4)
    e_clean, e_noisy = (float(derive.generalisation_error(s, R0, Q0, v0)) for s in (clean, noisy))
    assert abs(e_noisy - e_clean) < 3e-4  # 1.1e-4 measured; eq. (5) does not depend on xi
    # exact in xi: more noise nodes change nothing but rounding
    more = noisy.replace(quadrature=derive.GaussHermite(32, noise_points=9))
    f2 = derive.vector_field(noisy, R0, Q0, v0)
    with pytest.warns(UserWarning, match=r"294,912 nodes \(32\*\*3 \* 9 \(label noise\)\)"):
        f9 = derive.vector_field(more, R0, Q0, v0)
    for k in f2:
        np.testing.assert_allclose(f2[k], f9[k], rtol=1e-11, atol=1e-14)
    # a loss other than the squared one gets NOISE_POINTS nodes in xi
    logistic = derive.Setup(stud, teach, R0, Q0, v0=v0, noise=0.5, loss=lambda y_hat, y: jnp.log1p(jnp.exp(-y_hat * y)))
    assert logistic.quadrature.noise_points == derive.NOISE_POINTS
    with pytest.raises(ValueError, match="noise_points must be"):
        derive.GaussHermite(10, noise_points=0)


def test_field_arguments_are_checked_like_the_setup():
    """NaN overlaps pass the realisability test (eigvalsh of NaN is NaN): they are refused by
    name, as a readout of the wrong shape is (JAX's dot_general error otherwise)."""
    R0, Q0, v0 = jnp.array([[0.3], [-0.1]]), jnp.array([[0.6, 0.1], [0.1, 0.5]]), jnp.array([0.5, 0.4])
    s = derive.Setup(lambda lam, v: v @ jnp.tanh(lam), lambda nu: jnp.tanh(nu[0]), R0, Q0, v0=v0)
    for fn in (derive.vector_field, derive.generalisation_error):
        with pytest.raises(ValueError, match=r"^R must be finite; entry \(0, 0\) is nan$"):
            fn(s, R0.at[0, 0].set(jnp.nan), Q0, v0)
        with pytest.raises(ValueError, match=r"^Q must be finite; entry \(1, 1\) is inf$"):
            fn(s, R0, Q0.at[1, 1].set(jnp.inf), v0)
        with pytest.raises(ValueError, match=r"^v must be finite; entry \(1,\) is nan$"):
            fn(s, R0, Q0, v0.at[1].set(jnp.nan))
        with pytest.raises(ValueError, match=r"^v must have the shape of the setup's v0, \(2,\), got \(3,\)$"):
            fn(s, R0, Q0, jnp.ones(3))


def test_quadrature_warnings_name_the_users_line():
    import warnings

    R0, Q0 = 0.1 * jnp.eye(2), 0.5 * jnp.eye(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        derive.Setup(lambda lam, v=None: jnp.sum(jax.nn.relu(lam)), derive.soft_committee, R0, Q0)
        s = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=derive.GaussHermite(24))
        derive.rule(s)  # 331,776 nodes: over twice HERMITE_BUDGET
    messages = [(w.filename, str(w.message)) for w in caught]
    assert [m[:22] for _, m in messages] == ["derive.Setup: the per-", "GaussHermite(points=24"]
    assert {f for f, _ in messages} == {__file__}


def test_a_record_keeps_whether_the_quadrature_was_given():
    f = derive.soft_committee
    s = derive.Setup(f, f, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2))
    pinned = s.replace(quadrature=derive.GaussHermite(16))  # equal to the default, but given
    assert s.record()["quadrature_default"] is True and "quadrature_default" not in pinned.record()
    back, pinned_back = (derive.Setup.from_record(x.record()) for x in (s, pinned))
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(s)
    assert back.replace(noise=0.1).quadrature == derive.GaussHermite(13, noise_points=2)
    assert pinned_back.replace(noise=0.1).quadrature == derive.GaussHermite(16)


def test_a_quadrature_of_ones_own_with_the_one_argument_rule_still_works():
    """``rule(dim)`` of a user's Quadrature written before the noise argument: called with it only
    under label noise."""

    class Midpoints(derive.Quadrature):
        def rule(self, dim):
            return derive.GaussHermite(12).rule(dim)

    R0, Q0 = 0.1 * jnp.eye(2), 0.5 * jnp.eye(2)
    own = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=Midpoints())
    ref = own.replace(quadrature=derive.GaussHermite(12))
    np.testing.assert_allclose(derive.vector_field(own, R0, Q0)["Q"], derive.vector_field(ref, R0, Q0)["Q"], rtol=1e-13)


def test_a_record_names_its_functions_by_module_and_never_swaps_in_a_package_one():
    """A record kept only a function's bare name, and `from_record` looked that name up in the
    package: a user's tanh committee named ``soft_committee`` with a log-cosh loss named
    ``squared_loss`` came back as the package's erf committee and squared loss (dR/dt 0.2195 ->
    0.2908, silently). Now the record holds ``module:qualname`` and only the package's own
    functions come back; one's own is refused, saying how to pass it in."""
    R, Q = 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2)

    def tanh_committee(lam, v=None):
        return jnp.sum(jnp.tanh(lam))

    def log_cosh(y_hat, y):
        return jnp.log(jnp.cosh(y_hat - y))

    # named as a script's module-level functions would be, like the package's
    tanh_committee.__name__ = tanh_committee.__qualname__ = "soft_committee"
    log_cosh.__name__ = log_cosh.__qualname__ = "squared_loss"
    mine = derive.Setup(tanh_committee, tanh_committee, R, Q, loss=log_cosh)
    rec = mine.record()
    assert (rec["student"], rec["loss"]) == (f"{__name__}:soft_committee", f"{__name__}:squared_loss")
    hint = (
        "which is not one of attnflow.derive's (soft_committee, squared_loss, erf_activation, signal_token, ...): "
        "a record keeps a function by its name only and gives back only the package's own, so it cannot give back "
        "yours (a lambda, a function of your script or module, even one named like a package function). Pass it in: "
        'derive.Setup.from_record({**rec, "student": f}), f your function'
    )
    with pytest.raises(ValueError) as err:
        derive.Setup.from_record(rec)
    assert str(err.value) == f"setup.student: the record names the function '{__name__}:soft_committee', {hint}"
    back = derive.Setup.from_record({**rec, "student": tanh_committee, "teacher": tanh_committee, "loss": log_cosh})
    f_mine, f_back = (np.asarray(derive.vector_field(s, R, Q)["R"]) for s in (mine, back))
    np.testing.assert_array_equal(f_back, f_mine)
    assert f_mine[0, 0] == pytest.approx(0.21950, abs=1e-5)  # the package's erf committee: 0.29081
    with pytest.raises(ValueError, match=r"^setup.loss: the record names the function '.*:squared_loss'"):
        derive.Setup.from_record({**rec, "student": tanh_committee, "teacher": tanh_committee})
    # a lambda: the message the docs promise, exactly
    anonymous = lambda lam, v: jnp.sum(jnp.tanh(lam))
    assert anonymous.__qualname__.endswith("never_swaps_in_a_package_one.<locals>.<lambda>")
    with pytest.raises(ValueError) as err:
        derive.Setup.from_record(derive.Setup(anonymous, derive.soft_committee, R, Q).record())
    named = f"'{__name__}:{anonymous.__qualname__}'"
    assert str(err.value) == f"setup.student: the record names the function {named}, {hint}"
    # the package's own come back, themselves; a module that is not theirs does not
    pkg = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q)
    assert pkg.record()["student"] == "attnflow.derive.setup:soft_committee"
    assert pkg.record()["loss"] == "attnflow.derive.setup:squared_loss"
    again = derive.Setup.from_record(pkg.record())
    assert again.student is derive.soft_committee and again.loss is derive.squared_loss
    np.testing.assert_array_equal(derive.vector_field(again, R, Q)["R"], derive.vector_field(pkg, R, Q)["R"])
    with pytest.raises(ValueError, match=r"^setup.teacher: the record names the function 'mymodel:soft_committee'"):
        derive.Setup.from_record({**pkg.record(), "teacher": "mymodel:soft_committee"})
    # a record written with bare names (before the module was recorded) reads the package's
    old = derive.Setup.from_record({**pkg.record(), "student": "soft_committee", "loss": "squared_loss"})
    assert old.student is derive.soft_committee and old.loss is derive.squared_loss
    with pytest.raises(ValueError, match=r"^setup.student: the record names the function 'tanh_committee', which"):
        derive.Setup.from_record({**pkg.record(), "student": "tanh_committee"})


def test_a_loss_of_another_shape_and_a_model_not_finite_are_refused_at_setup():
    """A loss of shape (5,) on scalar outputs was summed (a field 5 times too large, and more);
    a student ``v @ log(lam)`` gave an all-NaN field with no error. Both are refused by `Setup`,
    naming the function; a function infinite only on a set of measure zero, or only far beyond
    the fields' scale, is accepted."""
    R, Q, v0 = 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2), jnp.array([0.3, 0.2])
    base = dict(student=lambda lam, v: v @ jnp.tanh(lam), teacher=derive.soft_committee, R0=R, Q0=Q, v0=v0)
    with pytest.raises(ValueError) as err:
        derive.Setup(**base, loss=lambda y_hat, y: jnp.ones(5) * (y_hat - y) ** 2)
    assert str(err.value) == (
        "loss(student output, teacher output) returns shape (5,) for outputs of shape (): it must return a "
        "scalar, as the outputs are"
    )
    vec = dict(base, student=lambda lam, v: v * jnp.tanh(lam), teacher=lambda nu: jnp.tanh(nu))
    with pytest.raises(
        ValueError, match=r"returns shape \(3,\) for outputs of shape \(2,\): it must return a scalar or"
    ):
        derive.Setup(**vec, loss=lambda y_hat, y: jnp.ones(3) * jnp.sum(y_hat - y) ** 2)
    assert derive.Setup(**vec).K == 2  # per-entry squared loss, shape (2,): summed
    tail = (
        r", one of 16 random Gaussian inputs \(standard deviations 0.1, 1\): the derived field would be NaN\. "
        r"A model must be finite for almost every input"
    )
    cases = [
        (
            dict(student=lambda lam, v: v @ jnp.log(lam)),
            r"^student\(lam, v\) is nan at lam = \[0.2041, -0.2556\] \(v = v0\)",
        ),
        (dict(teacher=lambda nu: jnp.sqrt(nu[0])), r"^teacher\(nu\) is nan at nu = \[-0.2828, 0.1021\]"),
        (
            dict(loss=lambda y_hat, y: jnp.log(y_hat - y)),
            r"^loss\(student output, teacher output\) is nan at student output 0.0104, teacher output 0.1166",
        ),
        # finite forward, NaN backward: the where hides the NaN branch only from the value
        (
            dict(student=lambda lam, v: v @ jnp.where(lam > 0, jnp.sqrt(lam), 0.0)),
            r"^the gradient of the loss with respect to the student's fields and readout is nan at lam = \[0.2041, "
            r"-0.2556\] \(v = v0\), nu = \[0.0883, 0.058\]",
        ),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message + tail):
            derive.Setup(**{**base, **kw})
    with pytest.raises(ValueError, match=r"^student\(lam, v\) is nan"):  # replace checks it too
        derive.Setup(**base).replace(student=lambda lam, v: v @ jnp.log(lam))
    # infinite on a set of measure zero (lam = 0), or only at fields of size 10 and more: accepted, and finite
    for student in (lambda lam, v: v @ jnp.log(jnp.abs(lam)), lambda lam, v: v @ jnp.exp(lam**2 / 4)):
        s = derive.Setup(**{**base, "student": student})
        f = derive.vector_field(s, R, Q, v0)
        assert all(np.all(np.isfinite(np.asarray(x))) for x in f.values())
    # the token model is checked too
    from attnflow import heads

    M, Qh = jnp.array([[0.5], [-0.3]]), jnp.array([[0.6, 0.1], [0.1, 0.4]])
    tokens = dict(data=derive.SingleLocation(heads.Setup().prior, L=4), quadrature=derive.MonteCarlo(2**10))
    first = r"^student\(lam, v\) is nan at lam = \[\[0.2041, -0.2556, 0.0418, -0.0568\], \[-0.0453"
    with pytest.raises(ValueError, match=first):
        derive.Setup(lambda lam, v: jnp.log(lam[0]), derive.signal_token, M, Qh, **tokens)


def test_a_rule_too_large_is_refused_by_the_setup():
    """``GaussHermite(8)`` at ``d = K + M = 8`` (``8^8`` nodes) was accepted by `Setup` and
    refused only at the first evaluation of the field: now at construction, with the same message."""
    f = derive.soft_committee
    R, Q = 0.1 * jnp.ones((4, 4)), 0.5 * jnp.eye(4)
    message = r"^GaussHermite\(points=8\) in d = 8 dimensions makes 8\*\*8 nodes; use fewer points or QuasiMonteCarlo$"
    with pytest.raises(ValueError, match=message):
        derive.Setup(f, f, R, Q, quadrature=derive.GaussHermite(8))
    small = derive.Setup(f, f, R, Q, quadrature=derive.GaussHermite(7))  # 7^8 = 5.8e6 nodes: allowed
    with pytest.raises(ValueError, match=message):
        small.replace(quadrature=derive.GaussHermite(8))
    noisy = r"^GaussHermite\(points=8, noise_points=8\) in d = 9 dimensions makes 8\*\*8 \* 8 \(label noise\) nodes"
    with pytest.raises(ValueError, match=noisy):
        small.replace(quadrature=derive.GaussHermite(8, noise_points=8), noise=0.1)
    with pytest.raises(ValueError, match=r"^SparseGaussHermite\(level=6\) needs level >= d = 8$"):
        derive.Setup(f, f, R, Q, quadrature=derive.SparseGaussHermite(6))
