"""Stiff solvers: `KrylovW` (ROS34PW2 with a Krylov approximation of the Jacobian) and `AutoStiff`."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.deeplinear import mode_field

S = jnp.array([3.0, 2.0, 1.0, 0.5])
L = 1e4  # stiffness of the scalar test problem


def _relax(t, y, a):
    # y' = -L (y - cos t): a stiff, time-dependent problem with a closed form
    return -a["L"] * (y - jnp.cos(t))


def _relax_exact(t, y0, lam):
    return (lam**2 * np.cos(t) + lam * np.sin(t)) / (lam**2 + 1) + (y0 - lam**2 / (lam**2 + 1)) * np.exp(-lam * t)


def _sharp(t, y, a):
    # a gradient flow whose stiffness lives in one direction: eigenvalues -a["big"] and -1 .. -0.1
    return {"u": -a["big"] * (y["u"] - jnp.sin(y["v"][0])), "v": -a["rates"] * y["v"]}


def _steps(solver, field, y0, t1, args, rtol):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        solver,
        0.0,
        t1,
        None,
        y0,
        args,
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=rtol * 1e-3),
        max_steps=1_000_000,
    )
    return int(sol.stats["num_steps"]), sol.ys


def test_auto_stiff_is_tsit5_while_the_problem_is_not_stiff():
    kw = dict(args={"s": S, "tau": 1.0}, save=af.LogGrid(60))
    tsit5 = af.integrate(mode_field, jnp.full(4, 1e-3), 14.0, solver=af.SolverOptions(rtol=1e-9, atol=1e-12), **kw)
    auto = af.integrate(
        mode_field, jnp.full(4, 1e-3), 14.0, solver=af.SolverOptions(af.AutoStiff(), rtol=1e-9, atol=1e-12), **kw
    )
    # the same steps (Trajectory.stats), the same values and the same dense output (Tsit5's
    # interpolant as a polynomial)
    np.testing.assert_allclose(auto["y"], tsit5["y"], rtol=1e-12, atol=1e-14)
    assert {k: int(v) for k, v in auto.stats.items()} == {k: int(v) for k, v in tsit5.stats.items()}
    assert int(tsit5.stats["num_steps"]) > 20


@pytest.mark.parametrize("solver", [af.KrylovW(rank=1), af.AutoStiff(rank=1)], ids=["KrylovW", "AutoStiff"])
def test_stiff_time_dependent_problem_against_its_closed_form(solver):
    tr = af.integrate(
        _relax,
        jnp.ones(1),
        10.0,
        args={"L": L},
        save=af.LinearGrid(50),
        solver=af.SolverOptions(solver, rtol=1e-8, atol=1e-10),
    )
    err = np.max(np.abs(np.asarray(tr["y"][:, 0]) - _relax_exact(np.asarray(tr.ts), 1.0, L)))
    assert err < 5e-8, err
    n = int(tr.stats["num_steps"])
    assert n == int(tr.stats["num_accepted_steps"]) + int(tr.stats["num_rejected_steps"])
    n_tsit5, _ = _steps(af.UnrolledTsit5(), _relax, jnp.ones(1), 10.0, {"L": L}, 1e-8)
    assert n * 20 < n_tsit5, (n, n_tsit5)  # the explicit solver is held at h ~ 3.3 / L


def _lotka_volterra(t, y, a):
    return jnp.array([1.5 * y[0] - y[0] * y[1], -3.0 * y[1] + y[0] * y[1], 0.3 * y[0] - 0.2 * y[2]])


def test_krylov_w_is_third_order():
    # fixed steps h and h/2 on a nonlinear coupled problem: the error falls by 2^3
    y0 = jnp.array([1.0, 1.0, 0.5])
    ref = af.integrate(_lotka_volterra, y0, 2.0, save=af.LinearGrid(2), solver=af.SolverOptions(rtol=1e-13, atol=1e-14))
    errs = []
    for n in (25, 50, 100, 200):
        tr = af.integrate(
            _lotka_volterra,
            y0,
            2.0,
            save=af.LinearGrid(2),
            solver=af.SolverOptions(af.KrylovW(rank=3), dt0=2.0 / n, stepsize_controller=diffrax.ConstantStepSize()),
        )
        errs.append(float(jnp.max(jnp.abs(tr["y"][-1] - ref["y"][-1]))))
    orders = np.log2(np.asarray(errs[:-1]) / np.asarray(errs[1:]))
    assert np.all((orders > 2.7) & (orders < 3.5)), orders


def test_low_rank_jacobian_captures_the_sharp_directions():
    # three equal stiff eigenvalues -2e4 (a repeated eigenvalue: subspace iteration, not a single
    # Krylov vector, captures all three) and ten slow ones in [-1, -0.1]
    big, t1 = 2e4, 20.0
    args = {"big": big, "rates": jnp.linspace(0.1, 1.0, 10)}
    y0 = {"u": jnp.ones(3), "v": jnp.linspace(1.0, 2.0, 10)}
    tsit5_floor = t1 * big / 3.51  # Tsit5's steps at its stability limit
    v_exact = np.linspace(1.0, 2.0, 10) * np.exp(-np.linspace(0.1, 1.0, 10) * t1)
    for solver in (af.KrylovW(rank=4), af.AutoStiff(rank=4)):
        n, y = _steps(solver, _sharp, y0, t1, args, 1e-6)
        assert n * 20 < tsit5_floor, (type(solver).__name__, n)
        np.testing.assert_allclose(y["v"][-1], v_exact, rtol=1e-4, atol=1e-9)
        # u sits on the slow manifold u = sin(v_0) up to O(1/big)
        np.testing.assert_allclose(y["u"][-1], np.sin(v_exact[0]), atol=1e-5)


def test_events_and_sweeps_with_auto_stiff():
    def stop(t, y, a):
        return y[0] - 0.5

    tr = af.integrate(
        _relax,
        jnp.ones(1),
        10.0,
        args={"L": L},
        event=stop,
        save=af.LinearGrid(2),
        solver=af.SolverOptions(af.AutoStiff(rank=1), rtol=1e-9, atol=1e-12),
    )
    # y follows cos t closely: it reaches 1/2 near t = pi/3
    assert abs(float(tr.t_event) - np.pi / 3) < 1e-3
    res = af.sweep(
        lambda lam: af.integrate(
            _relax,
            jnp.ones(1),
            2.0,
            args={"L": lam},
            save=af.LinearGrid(2),
            solver=af.SolverOptions(af.AutoStiff(rank=1), rtol=1e-8, atol=1e-10),
        )["y"][-1, 0],
        {"lam": np.array([1e3, 1e4])},
        progress=False,
    )
    np.testing.assert_allclose(res.values, [_relax_exact(2.0, 1.0, 1e3), _relax_exact(2.0, 1.0, 1e4)], atol=5e-8)


def test_bad_options():
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        af.KrylovW(rank=0)
    with pytest.raises(ValueError, match="refresh"):
        af.KrylovW(refresh=0)
    with pytest.raises(ValueError, match="patience"):
        af.AutoStiff(patience=0)
    # a bool is an int to Python, but not a count
    with pytest.raises(ValueError, match=r"^rank must be a positive integer, got True$"):
        af.KrylovW(rank=True)
    for name in ("rank", "refresh", "patience", "calm_steps"):
        with pytest.raises(ValueError, match=rf"^{name} must be a positive integer, got False$"):
            af.AutoStiff(**{name: False})
    with pytest.raises(ValueError, match=r"^refresh must be a positive integer, got 2\.0$"):
        af.KrylovW(refresh=2.0)
    for name, value in (("threshold", True), ("threshold", float("nan")), ("calm", "2"), ("calm", -1.0)):
        with pytest.raises(ValueError, match=rf"^{name} must be a positive number, got "):
            af.AutoStiff(**{name: value})


def test_rank_above_the_state_size_is_clipped():
    kw = dict(args={"L": L}, save=af.LinearGrid(5))
    big = af.integrate(_relax, jnp.ones(1), 1.0, solver=af.SolverOptions(af.KrylovW(rank=50)), **kw)
    one = af.integrate(_relax, jnp.ones(1), 1.0, solver=af.SolverOptions(af.KrylovW(rank=1)), **kw)
    np.testing.assert_array_equal(big["y"], one["y"])


def _exchange(t, y, k):
    # y1' = -k y1 + y2, y2' = k y1 - y2: y1 + y2 is conserved, so the Jacobian has a zero eigenvalue
    return jnp.stack([-k * y[0] + y[1], k * y[0] - y[1]])


def _exchange_y1(k, solver):
    return af.integrate(_exchange, jnp.array([1.0, 0.0]), 1.0, args=k, save=af.LinearGrid(2), solver=solver)["y"][-1, 0]


def _exchange_grad(k):
    # d/dk of y1(1) = (1 + k e^-(1+k)) / (1 + k): -0.138770593537702 at k = 2
    e = np.exp(-(1 + k))
    return ((e - k * e) * (1 + k) - (1 + k * e)) / (1 + k) ** 2


@pytest.mark.parametrize("solver", [af.AutoStiff(), af.KrylovW()], ids=["AutoStiff", "KrylovW"])
def test_gradients_through_a_singular_jacobian(solver):
    # rank (8, clipped to 2) covers the zero eigenvalue: the derivative of the subspace's QR would
    # be NaN, and a W-method needs none (A is a constant of each step). AutoStiff never leaves
    # Tsit5 here, yet builds the subspace at the start.
    assert _exchange_grad(2.0) == pytest.approx(-0.138770593537702, rel=1e-14)
    opts = af.SolverOptions(solver, rtol=1e-10, atol=1e-12)
    assert abs(float(jax.grad(_exchange_y1)(2.0, opts)) - _exchange_grad(2.0)) < 1e-10
    fwd = af.solver_for_mode("forward", opts)
    assert abs(float(jax.jacfwd(_exchange_y1)(2.0, fwd)) - _exchange_grad(2.0)) < 1e-10


def _robertson(t, y, k1):
    return jnp.stack([-k1 * y[0] + 1e4 * y[1] * y[2], k1 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, 3e7 * y[1] ** 2])


def _robertson_y1(k1, solver):
    return af.integrate(_robertson, jnp.array([1.0, 0.0, 0.0]), 1.0, args=k1, save=af.LinearGrid(2), solver=solver)[
        "y"
    ][-1, 0]


@pytest.mark.slow  # 4-5 s each; the default run keeps test_gradients_through_a_singular_jacobian
@pytest.mark.parametrize("solver", [af.AutoStiff(rank=3), af.KrylovW(rank=3)], ids=["AutoStiff", "KrylovW"])
def test_gradients_through_a_stiff_solve_with_a_conserved_quantity(solver):
    # Robertson (y1 + y2 + y3 = 1) with the stiff branch active: reverse and forward mode against
    # central differences (d y1(1) / d k1 = -0.7666)
    opts = af.SolverOptions(solver, rtol=1e-10, atol=1e-14)
    h = 1e-5
    fd = (float(_robertson_y1(0.04 + h, opts)) - float(_robertson_y1(0.04 - h, opts))) / (2 * h)
    assert fd == pytest.approx(-0.76658, abs=1e-4)
    rev = float(jax.grad(_robertson_y1)(0.04, opts))
    fwd = float(jax.jacfwd(_robertson_y1)(0.04, af.solver_for_mode("forward", opts)))
    assert rev == pytest.approx(fd, rel=1e-6)
    assert fwd == pytest.approx(rev, rel=1e-10)


def _square(t, y, a):
    return y**2  # blows up at t = 1 from y = 1


@pytest.mark.parametrize(
    "solver, advice",
    [
        (
            None,
            "a blow-up, a singularity, or a stiff stretch: SolverOptions(solver=af.AutoStiff()) switches to an "
            "implicit step",
        ),
        (
            af.AutoStiff(),
            "a blow-up or a finite-time singularity of the ODE: AutoStiff(rank=8) already switches, when stiff, to "
            "steps that are implicit in every direction of the state (size 2)",
        ),
        (
            af.KrylovW(rank=1),
            "a blow-up or a finite-time singularity of the ODE: KrylovW(rank=1) already takes steps that are implicit "
            "in its stiffest direction; if more are stiff, raise rank (two per stiff complex eigenvalue pair)",
        ),
        (
            diffrax.Kvaerno5(),
            "a blow-up or a finite-time singularity of the ODE, as the solver, Kvaerno5, is already implicit",
        ),
    ],
    ids=["Tsit5", "AutoStiff", "KrylovW", "Kvaerno5"],
)
def test_step_failure_advice_names_the_solver_in_use(solver, advice):
    # the advice to switch to AutoStiff is for explicit solvers only
    with pytest.raises(af.MaxStepsError) as err:
        af.integrate(_square, jnp.ones(2), 2.0, solver=af.SolverOptions(solver))
    msg = str(err.value)
    assert msg.startswith("integrate: the step size fell below the floor SolverOptions.dtmin")
    assert f"the solution changes too fast there ({advice}), or loosen rtol/atol;" in msg
    assert ("af.AutoStiff()" in msg) == (solver is None)
    with pytest.raises(af.MaxStepsError) as err:
        af.integrate(_square, jnp.ones(2), 2.0, solver=af.SolverOptions(solver, max_steps=5))
    msg = str(err.value)
    assert msg.startswith("integrate: max_steps=5 reached at t = ")
    assert msg.endswith(f"Increase max_steps, loosen rtol/atol or shorten t1; the cause may be {advice}.")
