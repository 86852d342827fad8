"""Dense output of the W-steps of `KrylovW` and `AutoStiff` (`attnflow.stiff._dense_coeffs`): the
order conditions and stiff stability of its weights, and saved values and event times on stiff
problems against tight references."""

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.stiff import ROS34PW2

THETA = np.linspace(0.0, 1.0, 2001)


def _tableau():
    tab = ROS34PW2
    s = len(tab.b)
    alpha, G = np.zeros((s, s)), tab.gamma * np.eye(s)
    for i in range(s):
        alpha[i, :i] = tab.alpha[i]
        G[i, :i] = tab.gammas[i]
    return alpha.sum(1), G.sum(1), alpha + G, np.asarray(tab.dense), np.asarray(tab.dense_stiff)


def _weights(table, theta):
    theta = np.asarray(theta, float)
    return table @ np.stack([theta, theta**2, theta**3])  # (stages, len(theta))


def test_dense_weights_meet_the_order_conditions():
    c, g, B, P, S = _tableau()
    b = np.asarray(ROS34PW2.b)
    for table in (P, S):
        w = _weights(table, THETA)
        # the W-method's conditions to order 2, for any matrix A, at every theta; b_i(1) = b_i
        np.testing.assert_allclose(w.sum(0), THETA, atol=1e-13)
        np.testing.assert_allclose(c @ w, THETA**2 / 2, atol=1e-13)
        np.testing.assert_allclose(g @ w, 0.0, atol=1e-13)
        np.testing.assert_allclose(_weights(table, [1.0])[:, 0], b, atol=1e-13)
    # P also meets the bushy third-order one, and is the only cubic that does (PETSc's TSROSWRA34PW2)
    np.testing.assert_allclose((c**2) @ _weights(P, THETA), THETA**3 / 3, atol=1e-13)
    rows, rhs = [], []
    for vec, values in ((np.ones(4), (1, 0, 0)), (c, (0, 0.5, 0)), (g, (0, 0, 0)), (c**2, (0, 0, 1 / 3))):
        for p in range(3):
            rows.append(np.kron(np.eye(3)[p], vec))
            rhs.append(values[p])
    for i in range(4):
        rows.append(np.kron(np.ones(3), np.eye(4)[i]))
        rhs.append(b[i])
    unique, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    assert np.linalg.matrix_rank(np.array(rows)) == 12
    np.testing.assert_allclose(unique.reshape(3, 4).T, P, atol=1e-12)
    # stiff limit: weights w = B^-T b(theta) on the stage values; 1 - sum w multiplies the error of
    # y0 in a stiff direction (never amplified), sum w c^3 - theta^3 is the third-order defect
    for table, defect in ((P, 0.0849), (S, 0.0455)):
        w = np.linalg.solve(B.T, _weights(table, THETA))
        assert np.max(np.abs(1 - w.sum(0))) <= 1 + 1e-12
        assert np.max(np.abs((c**3) @ w - THETA**3)) == pytest.approx(defect, abs=1e-4)


def test_dense_output_is_stable_on_the_left_half_plane():
    # y' = lambda y with A = lambda, z = h lambda: the interpolant's growth factor
    # R_theta(z) = 1 + b(theta).k(z) - (1 - 1 / (1 - gamma z)) d(theta).k(z) stays near 1
    _, _, B, P, S = _tableau()
    gamma = ROS34PW2.gamma
    re = -np.concatenate([[0.0], np.logspace(-3, 9, 49)])
    im = np.concatenate([[0.0], np.logspace(-3, 9, 49)])
    z = (re[:, None] + 1j * im[None, :]).ravel()
    M = np.eye(4)[None] - z[:, None, None] * B[None]  # (I - z B) k = z 1: the stages on y' = lambda y, y0 = 1
    k = np.linalg.solve(M, z[:, None, None] * np.ones((len(z), 4, 1)))[..., 0]
    theta = np.linspace(0.02, 1.0, 50)
    bP, d = _weights(P, theta), _weights(P - S, theta)
    R = 1 + k @ bP - (1 - 1 / (1 - gamma * z))[:, None] * (k @ d)
    assert np.max(np.abs(R)) < 1.011
    assert np.max(np.abs(R[np.abs(z) > 1e6])) <= 1 + 1e-6  # stiff: the error of y0 is not amplified


def _quadratic(t, y, a):
    # y' = -L (y - p) + p' with p = 1 + 2 t - 3 t^2: the solution from y(0) = 1 is p itself
    return -a * (y - (1 + 2 * t - 3 * t**2)) + 2 - 6 * t


def _cubic(t, y, a):
    return jnp.full_like(y, 2 - 6 * t + 3 * t**2)  # y = 1 + 2 t - 3 t^2 + t^3


@pytest.mark.parametrize("field, L", [(_quadratic, 0.0), (_quadratic, 1.0), (_quadratic, 1e6), (_cubic, 0.0)])
def test_dense_output_reproduces_polynomial_solutions(field, L):
    # a quadratic solution for any stiffness, a cubic one where f does not depend on y (b(theta)'s
    # third-order quadrature condition), at fixed steps of 0.25 and 40 save points between them
    ts = np.linspace(0.0, 1.0, 41)
    tr = af.integrate(
        field,
        jnp.ones(1),
        1.0,
        args=L,
        save=af.TimeGrid(ts),
        solver=af.SolverOptions.fixed_step(0.25, af.KrylovW(rank=1)),
    )
    exact = 1 + 2 * ts - 3 * ts**2 + (ts**3 if field is _cubic else 0.0)
    err = np.max(np.abs(np.asarray(tr["y"][:, 0]) - exact))
    assert err < 1e-13, err


def _robertson(t, y, a):
    return jnp.stack(
        [
            -0.04 * y[0] + 1e4 * y[1] * y[2],
            0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2,
            3e7 * y[1] ** 2,
        ]
    )


def _robertson_np(t, y):
    return [-0.04 * y[0] + 1e4 * y[1] * y[2], 0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, 3e7 * y[1] ** 2]


def _robertson_jac(t, y):
    return [[-0.04, 1e4 * y[2], 1e4 * y[1]], [0.04, -1e4 * y[2] - 6e7 * y[1], -1e4 * y[1]], [0.0, 6e7 * y[1], 0.0]]


def _robertson_ref(t0, y0, ts, **kw):
    return solve_ivp(
        _robertson_np, (t0, ts[-1]), y0, method="Radau", rtol=1e-12, atol=1e-22, jac=_robertson_jac, t_eval=ts, **kw
    )


@pytest.mark.parametrize("solver", [af.AutoStiff(rank=3), af.KrylovW(rank=3)], ids=["AutoStiff", "KrylovW"])
def test_robertson_saved_values_through_the_stiff_stretch(solver):
    # saved values are the dense output between steps: a Hermite interpolant through f(y) put y2
    # 6 % and 15 % off at t = 4000 and 4e4 (h |lambda| times the O(tol) error of y); this one
    # keeps every component within 4.5 rtol (AutoStiff) and 5.0 rtol (KrylovW) of Radau's
    rtol, atol = 1e-6, 1e-12
    tr = af.integrate(
        _robertson,
        jnp.array([1.0, 0.0, 0.0]),
        4e5,
        save=af.LogGrid(49, t_min=1e-3),
        solver=af.SolverOptions(solver, rtol=rtol, atol=atol),
    )
    ts = np.asarray(tr.ts)
    ref = _robertson_ref(0.0, [1.0, 0.0, 0.0], ts).y.T
    rel = np.abs(np.asarray(tr["y"])[1:] - ref[1:]) / np.abs(ref[1:])
    assert rel.max() < 7 * rtol, rel.max(axis=0) / rtol


@pytest.mark.parametrize("solver", [af.KrylovW(rank=1), af.AutoStiff(rank=1)], ids=["KrylovW", "AutoStiff"])
def test_prothero_robinson_interior_values(solver):
    # y' = -L (y - sin t) + cos t, L = 1e6: the steps land on sin t to 1e-11 or so; the interior
    # values hold the dense output's own error, about 5 rtol (9 rtol with b(theta) alone)
    rtol = 1e-6
    ts = np.linspace(0.0, 10.0, 401)
    tr = af.integrate(
        lambda t, y, a: -a * (y - jnp.sin(t)) + jnp.cos(t),
        jnp.zeros(1),
        10.0,
        args=1e6,
        save=af.TimeGrid(ts),
        solver=af.SolverOptions(solver, rtol=rtol, atol=rtol),
    )
    err = np.max(np.abs(np.asarray(tr["y"][:, 0]) - np.sin(ts)))
    assert err < 6 * rtol, err / rtol


def _y2_event(t, y, a):
    return y[1] - 1e-6


@pytest.mark.parametrize(
    "solver", [af.AutoStiff(rank=3), af.KrylovW(rank=3), diffrax.Kvaerno5()], ids=["AutoStiff", "KrylovW", "Kvaerno5"]
)
def test_event_on_a_stiff_component(solver):
    # Robertson from t = 1, until the fast species y2 falls to 1e-6: the root find runs on the
    # dense output in the stiff stretch (Radau at rtol 1e-12: t = 3350.9831...)
    y1 = _robertson_ref(0.0, [1.0, 0.0, 0.0], [1.0]).y[:, -1]
    event = _robertson_ref(1.0, y1, [4e5], events=lambda t, y: y[1] - 1e-6).t_events[0][0]
    tr = af.integrate(
        _robertson,
        jnp.asarray(y1),
        4e5,
        t0=1.0,
        event=_y2_event,
        save=af.LinearGrid(2),
        solver=af.SolverOptions(solver, rtol=1e-6, atol=1e-12),
    )
    assert event == pytest.approx(3350.9831, abs=1e-3)
    assert float(tr.t_event) == pytest.approx(event, rel=2e-5)
    assert float(tr.final()["y"][1]) == pytest.approx(1e-6, rel=1e-9)


def _decay(t, y, a):
    return -y


def _flat_event(t, y, a):
    return jnp.where(y[0] > 0.5, 1.0, -1.0)  # changes sign, but no Newton step can find where


@pytest.mark.parametrize("solver", [None, af.AutoStiff()], ids=["Tsit5", "AutoStiff"])
def test_failed_event_root_find_is_named(solver):
    with pytest.raises(
        RuntimeError,
        match=r"integrate: the event fired, but the root find \(Newton\) that locates its time on the solver's "
        r"dense output failed \(nonlinear_max_steps_reached\), near t = 0\.7\d+\. The event function may be flat, "
        r"kinked or discontinuous in t there: make it a smooth function .* or return a boolean from the event",
    ):
        af.integrate(_decay, jnp.ones(1), 3.0, event=_flat_event, solver=af.SolverOptions(solver))
