"""Differentiable theory: `attnflow.sensitivity` through event-terminated solves (closed form, finite
differences, adjoints under jit and vmap) and the qkov sensitivities, fixed-loss slope and optimal ratio."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow import qkov

U0 = 1e-3


def logistic(t, u, a):  # du/dt = 2 eta u (s - u)
    return 2.0 * a["eta"] * u * (a["s"] - u)


def half_learned(t, u, a):
    return u - 0.5 * a["s"]


def _t_half(s, eta, adjoint=None):
    traj = af.integrate(
        logistic,
        U0,
        50.0,
        args={"s": s, "eta": eta},
        event=half_learned,
        save=af.LinearGrid(2),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-12, adjoint=adjoint),
    )
    return {"t": traj.t_event, "u": traj.final()["y"]}


def t_half(s, eta):
    return _t_half(s, eta)


def closed_form(s, eta):
    """t* = log(s/u0 - 1) / (2 eta s) and its derivatives in s and eta."""
    t = np.log(s / U0 - 1.0) / (2 * eta * s)
    dt_ds = 1.0 / ((s - U0) * 2 * eta * s) - t / s
    return t, dt_ds, -t / eta


def test_event_time_derivative_is_the_implicit_function_formula():
    res = af.sensitivity(t_half, s=2.0, eta=1.0)
    t, dt_ds, dt_deta = closed_form(2.0, 1.0)
    assert abs(float(res.value["t"]) - t) < 1e-8 * t
    assert abs(float(res.grad["s"]["t"]) - dt_ds) < 1e-6 * abs(dt_ds)
    assert abs(float(res.grad["eta"]["t"]) - dt_deta) < 1e-6 * abs(dt_deta)
    # the state at the event is u* = s / 2 whatever the parameters: (S2) holds
    assert abs(float(res.grad["s"]["u"]) - 0.5) < 1e-7
    assert abs(float(res.grad["eta"]["u"])) < 1e-7
    fd = af.central_difference(t_half, s=2.0, eta=1.0)
    for name in ("s", "eta"):
        assert abs(float(fd[name]["t"] - res.grad[name]["t"])) < 1e-6 * abs(float(res.grad[name]["t"]))


def test_check_grads_through_the_event():
    check_grads(lambda s: t_half(s, 1.0)["t"], (jnp.asarray(2.0),), order=1, modes=("rev",), eps=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "adjoint", [None, diffrax.DirectAdjoint(), diffrax.ForwardMode()], ids=["checkpoint", "direct", "forward"]
)
def test_adjoints_agree_under_jit_and_vmap_with_events(adjoint):
    s = jnp.array([0.5, 1.0, 2.0, 4.0])
    if isinstance(adjoint, diffrax.ForwardMode):  # forward-mode only: jacfwd
        d = jax.jit(jax.vmap(jax.jacfwd(lambda s: _t_half(s, 1.0, adjoint)["t"])))(s)
    else:
        d = jax.jit(jax.vmap(jax.grad(lambda s: _t_half(s, 1.0, adjoint)["t"])))(s)
    want = np.array([closed_form(float(x), 1.0)[1] for x in s])
    np.testing.assert_allclose(np.asarray(d), want, rtol=1e-6)


def test_backsolve_adjoint_is_refused():
    # Diffrax refuses it with events, and with the SaveAt(subs=...) of integrate
    with pytest.raises(NotImplementedError, match="BacksolveAdjoint"):
        _t_half(2.0, 1.0, diffrax.BacksolveAdjoint())


def test_sensitivity_is_traceable_and_shapes():
    sens = jax.jit(jax.vmap(lambda s: af.sensitivity(t_half, s=s, eta=1.0)))(jnp.array([1.0, 2.0]))
    assert sens.grad["s"]["t"].shape == (2,)
    want = [closed_form(x, 1.0)[1] for x in (1.0, 2.0)]
    np.testing.assert_allclose(np.asarray(sens.grad["s"]["t"]), want, rtol=1e-6)
    # array parameters give Jacobians of shape outcome + parameter
    res = af.sensitivity(lambda w: {"a": w**2, "b": jnp.sum(w)}, w=np.array([1.0, 2.0]))
    assert res.grad["w"]["a"].shape == (2, 2) and res.grad["w"]["b"].shape == (2,)
    np.testing.assert_allclose(np.asarray(res.grad["w"]["a"]), np.diag([2.0, 4.0]))


def test_sensitivity_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="fn must be callable"):
        af.sensitivity(3.0, s=1.0)
    with pytest.raises(ValueError, match="at least one parameter"):
        af.sensitivity(t_half)
    with pytest.raises(ValueError, match="parameter 's'"):
        af.sensitivity(t_half, s="two", eta=1.0)
    with pytest.raises(ValueError, match="parameter 'eta'"):
        af.sensitivity(t_half, s=2.0, eta=np.nan)
    with pytest.raises(ValueError, match="step"):
        af.central_difference(t_half, step=-1.0, s=2.0, eta=1.0)
    with pytest.raises(ValueError, match="'w' must be a scalar"):
        af.central_difference(lambda w: w, w=np.ones(2))


# ----------------------------------------------------------------------------- qkov
L_STAR = 1e-2
RATIOS = np.array([0.1, 1.0, 2.0, 10.0])


def _paper(r):
    return qkov.paper_setup(ratio=r)


def test_dalpha_dlogr_matches_finite_differences_and_first_integral():
    """d alpha / d log r at fixed loss through the event-terminated ODE (eq. (11)), against central
    differences (1e-5 relative) and the implicit-function derivative of the first integral (eq. (12)),
    under jit and vmap."""
    sens = jax.jit(jax.vmap(lambda r: qkov.ratio_sensitivity(_paper(r), L_STAR)))(jnp.asarray(RATIOS))
    grad = sens.grad["log_r"]

    def alpha_at(log_r):
        return qkov.reach_loss(_paper(jnp.exp(log_r)), L_STAR)

    fd = jax.jit(jax.vmap(lambda x: af.central_difference(alpha_at, step=1e-4, relative=False, log_r=x)))(
        jnp.log(RATIOS)
    )["log_r"]
    ift = jax.jit(jax.vmap(lambda r: qkov.fixed_loss_slope(_paper(r), L_STAR)))(jnp.asarray(RATIOS))
    for k in ("alpha", "mu_qk", "mu_ov"):
        g = np.asarray(grad[k])
        assert np.max(np.abs(g - np.asarray(fd[k])) / np.abs(g)) < 1e-5, k
        assert np.max(np.abs(g - np.asarray(ift[k])) / np.abs(g)) < 1e-6, k
    # the time's derivative (eta_OV fixed): against finite differences too
    assert np.max(np.abs(np.asarray(grad["t"] - fd["t"]) / np.asarray(grad["t"]))) < 1e-5
    assert np.all(np.asarray(grad["alpha"]) > 0)  # same loss, sharper attention (eq. (5))


@pytest.mark.slow  # the qkov-optimal-ratio experiment makes the same check
def test_optimal_ratio_agrees_with_brute_force():
    s = qkov.Setup()  # reference configuration: small, fast
    L = 1e-2
    ratios = np.geomspace(0.1, 100.0, 31)
    front = qkov.pareto_front(s, L, ratios)
    i1 = int(np.argmin(np.abs(ratios - 1.0)))
    assert front["pareto"][i1:].all() and not front["pareto"][: i1 - 1].any()  # the front is r >= 1
    budget = float(np.sqrt(front["t"][i1 + 10] * front["t"][i1 + 11]))
    feasible = front["t"] <= budget
    best = int(np.argmax(np.where(feasible, front["alpha"], -np.inf)))
    opt = qkov.optimal_ratio(s, L, budget)
    spacing = np.log(ratios[1] / ratios[0])
    assert abs(float(opt.log_ratio) - np.log(ratios[best])) <= spacing
    assert abs(float(opt.violation)) < 1e-3 and float(opt.multiplier) > 0
    assert abs(float(opt.t) / budget - 1.0) < 1e-3


def test_qkov_bad_input():
    s = qkov.Setup()
    with pytest.raises(ValueError, match="loss_target"):
        qkov.reach_loss(s, -1.0)
    with pytest.raises(ValueError, match="setup"):
        qkov.ratio_sensitivity("CACO", 1e-2)
    with pytest.raises(ValueError, match="time_budget"):
        qkov.optimal_ratio(s, 1e-2, 0.0)
    with pytest.raises(ValueError, match="eta_max"):
        qkov.pareto_front(s, 1e-2, [1.0, 2.0], eta_max=-1.0)
    with pytest.raises(ValueError, match="ratios"):
        qkov.pareto_front(s, 1e-2, [[1.0]])
    with pytest.raises(ValueError, match="outer"):
        qkov.optimal_ratio(s, 1e-2, 1e3, outer=0)


# ----------------------------------------------------------------------------- heads
@pytest.mark.slow
def test_heads_specialisation_time_derivatives():
    """d t_spec / d eta and d t_spec / d s (prior signal) through the escape event of the heads ODE,
    against central differences on the same fixed Monte Carlo bank (the field is then a smooth,
    deterministic function: the two agree to the solver tolerance, not to the bank's error)."""
    from attnflow import heads

    bank = heads.BankOptions(n=512)
    tight = heads.DEFAULT_SOLVER.replace(rtol=1e-10, atol=1e-12)

    def t_spec(eta, s):
        st = heads.Setup(eta=eta, prior=heads.FlippedSpike(s, 0.5))
        traj = heads.solve(st, 200.0, escape=heads.ESCAPE_THRESHOLD, save=af.LinearGrid(2), bank=bank, solver=tight)
        return traj.t_event

    res = jax.jit(lambda e, s: af.sensitivity(t_spec, eta=e, s=s))(1.0, 3.0)
    fd = jax.jit(lambda e, s: af.central_difference(t_spec, eta=e, s=s))(1.0, 3.0)
    assert np.isfinite(float(res.value))
    for name in ("eta", "s"):
        g = float(res.grad[name])
        assert g < 0  # faster learning and a stronger signal both specialise sooner
        assert abs(float(fd[name]) - g) < 1e-6 * abs(g), name


# ----------------------------------------------------------------------------- focus
def _focus_field(t, theta, a):
    from attnflow import focus

    return focus.flow_field(t, theta, a[0])


def _focus_escaped(t, theta, a):
    from attnflow import focus

    setup, threshold = a
    return focus.population_loss(theta, setup.chain, setup.tau) - threshold


@pytest.mark.slow
def test_focus_escape_time_derivatives():
    """d(escape time)/d lambda (laziness of the chain) and d/d tau (score scale) of the Stage II
    escape (the loss falls 0.05 below the unigram plateau H(pi)), through an event of `integrate`
    on `focus.flow_field`, against central differences."""
    from attnflow import focus

    def t_escape(lam, tau):
        setup = focus.Setup(chain=focus.MarkovChain.lazy(lam=lam), tau=tau)
        pi = setup.chain.pi
        threshold = -jnp.sum(pi * jnp.log(pi)) - 0.05
        traj = af.integrate(
            _focus_field,
            setup.theta0(),
            5000.0,
            args=(setup, threshold),
            event=_focus_escaped,
            save=af.LinearGrid(2),
            solver=af.SolverOptions(rtol=1e-10, atol=1e-12),
        )
        return traj.t_event

    res = jax.jit(lambda lam, tau: af.sensitivity(t_escape, lam=lam, tau=tau))(0.5, 1.0)
    fd = jax.jit(lambda lam, tau: af.central_difference(t_escape, lam=lam, tau=tau))(0.5, 1.0)
    assert np.isfinite(float(res.value))
    for name in ("lam", "tau"):
        g = float(res.grad[name])
        assert g < 0  # a lazier chain and sharper scores both escape sooner
        assert abs(float(fd[name]) - g) < 1e-6 * abs(g), name
