"""Differentiable theory: `attnflow.sensitivity` through event-terminated solves (closed form, finite
differences, adjoints under jit and vmap) and the qkov sensitivities, fixed-loss slope and optimal ratio."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow import focus, heads, qkov

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


def test_forward_mode_sensitivity_agrees_with_reverse_through_the_event():
    from attnflow.sensitivity import solver_for_mode

    def t_half_forward(s, eta):
        return _t_half(s, eta, solver_for_mode("forward", af.SolverOptions()).adjoint)

    fwd = af.sensitivity(t_half_forward, mode="forward", s=2.0, eta=1.0)
    rev = af.sensitivity(t_half, s=2.0, eta=1.0)
    for name in ("s", "eta"):
        np.testing.assert_allclose(float(fwd.grad[name]["t"]), float(rev.grad[name]["t"]), rtol=1e-8)
    assert float(fwd.grad["s"]["t"]) == pytest.approx(closed_form(2.0, 1.0)[1], rel=1e-6)
    with pytest.raises(ValueError, match="mode must be one of"):
        af.sensitivity(t_half, mode="sideways", s=2.0, eta=1.0)
    with pytest.raises(ValueError, match="mode='forward' needs"):
        solver_for_mode("forward", af.SolverOptions(adjoint=diffrax.DirectAdjoint()))
    with pytest.raises(ValueError, match="BacksolveAdjoint"):
        solver_for_mode("reverse", af.SolverOptions(adjoint=diffrax.ForwardMode()))


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


def test_sensitivity_of_a_whole_trajectory_leaves_its_counts_undifferentiated():
    """``fn`` may return a `Trajectory` (its ``stats`` are integer solver counts): the observables
    are differentiated at every save time, the counts get a zero derivative, in both modes."""
    ts = np.linspace(0.0, 3.0, 7)

    def solve(u0, mode="reverse"):
        solver = af.solver_for_mode(mode, af.SolverOptions(rtol=1e-10, atol=1e-12))
        return af.integrate(logistic, u0, 3.0, args={"s": 2.0, "eta": 1.0}, save=af.TimeGrid(ts), solver=solver)

    e = np.exp(-4.0 * ts)  # u = s / (1 + (s / u0 - 1) e^{-2 eta s t}), s = 2, eta = 1
    want = 2.0 * (2.0 / U0**2) * e / (1.0 + (2.0 / U0 - 1.0) * e) ** 2  # du(t)/du0
    for mode in ("reverse", "forward"):
        res = af.sensitivity(lambda u0, mode=mode: solve(u0, mode), mode=mode, u0=U0)
        assert isinstance(res.value, af.Trajectory) and isinstance(res.grad["u0"], af.Trajectory)
        np.testing.assert_allclose(np.asarray(res.value["y"]), np.asarray(solve(U0)["y"]), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(res.grad["u0"]["y"]), want, rtol=1e-6)
        assert int(res.value.stats["num_steps"]) > 0  # the counts themselves are kept
        for k, v in res.grad["u0"].stats.items():
            assert v.dtype == np.float64 and float(v) == 0.0, k
    assert repr(res).startswith("Sensitivity(value=Trajectory(ts(7,), y(7,)), grad={'u0': Trajectory(")
    # an integer leaf of an array parameter: zeros of shape leaf + parameter
    res = af.sensitivity(lambda w: {"n": jnp.arange(3), "y": w**2}, w=np.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(res.grad["w"]["n"]), np.zeros((3, 2)))
    np.testing.assert_allclose(np.asarray(res.grad["w"]["y"]), np.diag([2.0, 4.0]))


def test_reverse_mode_through_a_run_time_loop_says_to_pass_forward():
    def fourth(x):  # x^4 by a loop of run-time length, as gradient descent steps
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (0, x))[1]

    with pytest.raises(ValueError, match=r"lax.while_loop(.|\n)*sensitivity: fn runs a loop .* pass mode='forward'"):
        af.sensitivity(fourth, x=2.0)
    assert float(af.sensitivity(fourth, mode="forward", x=2.0).grad["x"]) == pytest.approx(32.0, rel=1e-14)
    from attnflow import deeplinear as dl

    s = dl.Setup(s=(3.0, 1.0), u0=1e-2)
    with pytest.raises(ValueError, match="pass mode='forward'"):
        af.sensitivity(lambda eta: dl.train(s.replace(eta=eta), 0.5, key=0, save=af.LinearGrid(3))["loss"][-1], eta=0.5)


# ----------------------------------------------------------------------------- qkov
L_STAR = 1e-2
RATIOS = np.array([0.1, 1.0, 2.0, 10.0])


def _paper(r):
    return qkov.paper_setup(ratio=r)


@pytest.mark.slow
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
    # forward mode (the default, as the other packages' *_sensitivity) and reverse mode agree
    rev = qkov.ratio_sensitivity(_paper(RATIOS[0]), L_STAR, mode="reverse").grad["log_r"]
    for k in ("t", "alpha"):
        np.testing.assert_allclose(rev[k], grad[k][0], rtol=1e-8)
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
# The derivatives of the theory's outcomes are checked against central differences taken on the
# same compiled program: one jit(vmap(...)) over the points and their +-h neighbours (h = 1e-4
# relative), whose values give the differences and whose derivatives at the centres are checked.
# One compilation per theory; the eager single calls of the jit/vmap test are the second.
FD_STEP = 1e-4


def _fd_lanes(centres: dict) -> dict:
    """The centres, then for each centre and each parameter its +h and -h neighbours."""
    names = list(centres)
    c = {k: np.asarray(v, dtype=float) for k, v in centres.items()}
    lanes = {k: [*c[k]] for k in names}
    for i in range(len(c[names[0]])):
        for name in names:
            for sign in (1.0, -1.0):
                for k in names:
                    x = c[k][i]
                    lanes[k].append(x * (1.0 + sign * FD_STEP) if k == name else x)
    return {k: jnp.asarray(v) for k, v in lanes.items()}


def _check_against_fd(sens, centres: dict, rtol: float) -> dict:
    """Relative errors of each derivative at each centre against the central differences of the
    values on the neighbour lanes; asserts they are below ``rtol``."""
    names = list(centres)
    n = len(centres[names[0]])
    value = np.asarray(sens.value)
    errors = {}
    for i in range(n):
        for j, name in enumerate(names):
            base = n + 2 * len(names) * i + 2 * j
            h = FD_STEP * float(centres[name][i])
            fd = (value[base] - value[base + 1]) / (2 * h)
            g = float(sens.grad[name][i])
            errors[(name, i)] = abs(fd - g) / abs(g)
    assert max(errors.values()) < rtol, errors
    return errors


HEADS_POINTS = {"eta": [1.0, 1.25], "s": [3.0, 3.0]}


# Built outside any transformation: a FlippedSpike made inside jit or vmap has a traced p, so it is
# not known to be sign-symmetric and the bank drops its antithetic copies (another bank). The
# transformed setups replace eta and s in this one.
HEADS_BASE = heads.Setup()
HEADS_BANK = heads.BankOptions(n=16)
HEADS_SOLVER = heads.DEFAULT_SOLVER.replace(rtol=1e-10, atol=1e-12)


def _heads_setup(eta, s):
    return HEADS_BASE.replace(eta=eta, prior=eqx.tree_at(lambda p: p.s, HEADS_BASE.prior, s))


def _heads_sens(eta, s):
    return heads.specialisation_time_sensitivity(_heads_setup(eta, s), bank=HEADS_BANK, solver=HEADS_SOLVER)


_heads_batch = jax.jit(jax.vmap(_heads_sens))


@pytest.fixture(scope="module")
def heads_batch():
    lanes = _fd_lanes(HEADS_POINTS)
    return _heads_batch(lanes["eta"], lanes["s"])


def test_heads_specialisation_time_sensitivity_matches_central_differences(heads_batch):
    """d t_spec / d eta and d t_spec / d s through the escape event (15) of the ODE (8), under jit
    and vmap, against central differences. The Monte Carlo bank is fixed (common random numbers:
    the field is a smooth deterministic function of the state, eta and s), so the two agree to
    the solver tolerance (about 1e-8 at rtol = 1e-10), not only within the bank's Monte Carlo error."""
    errors = _check_against_fd(heads_batch, HEADS_POINTS, 1e-5)
    assert max(errors.values()) < 1e-5
    for name in ("eta", "s"):
        assert np.all(np.asarray(heads_batch.grad[name][:2]) < 0)  # faster learning, stronger signal: sooner
    t = np.asarray(heads_batch.value[:2])
    assert np.all(np.isfinite(t)) and t[1] < t[0]


@pytest.mark.slow  # a second compilation (the eager solve), about 20 s
def test_heads_sensitivity_vmap_and_jit_match_eager_single_calls(heads_batch):
    """jit(vmap) over two learning rates gives what two eager single calls give."""
    for i in range(2):
        one = _heads_sens(HEADS_POINTS["eta"][i], HEADS_POINTS["s"][i])
        np.testing.assert_allclose(float(one.value), float(heads_batch.value[i]), rtol=1e-12)
        for name in ("eta", "s"):
            np.testing.assert_allclose(float(one.grad[name]), float(heads_batch.grad[name][i]), rtol=1e-10)


@pytest.mark.slow
def test_heads_specialisation_time_derivatives():
    """At the reference of the docs (bank of 512 draws): forward and reverse mode agree, the primal
    `specialisation_time` is the sensitivity's value, and central differences of it agree to 1e-6."""
    bank = heads.BankOptions(n=512)
    tight = HEADS_SOLVER

    def setup(eta, s):
        return _heads_setup(eta, s)

    def t_spec(eta, s):
        return heads.specialisation_time(setup(eta, s), bank=bank, solver=tight)

    fwd = jax.jit(lambda e, s: heads.specialisation_time_sensitivity(setup(e, s), bank=bank, solver=tight))(1.0, 3.0)
    rev = jax.jit(
        lambda e, s: heads.specialisation_time_sensitivity(setup(e, s), bank=bank, solver=tight, mode="reverse")
    )(1.0, 3.0)
    fd = af.central_difference(jax.jit(t_spec), eta=1.0, s=3.0)
    assert abs(float(fwd.value) - float(jax.jit(t_spec)(1.0, 3.0))) < 1e-12 * float(fwd.value)
    for name in ("eta", "s"):
        g = float(fwd.grad[name])
        assert g < 0
        assert abs(float(rev.grad[name]) - g) < 1e-9 * abs(g), name
        assert abs(float(fd[name]) - g) < 1e-6 * abs(g), name


def test_heads_sensitivity_bad_input():
    s = heads.Setup()
    with pytest.raises(ValueError, match="setup must be"):
        heads.specialisation_time("CACO")
    with pytest.raises(ValueError, match="threshold"):
        heads.specialisation_time(s, threshold=-0.5)
    with pytest.raises(ValueError, match="threshold = 1e-06"):  # the heads start above it
        heads.specialisation_time(s, threshold=1e-6)
    # focus's names and argument order: the threshold second, positional or not
    assert heads.escape_time is heads.specialisation_time
    assert heads.escape_time_sensitivity is heads.specialisation_time_sensitivity
    with pytest.raises(ValueError, match="threshold = 1e-06"):
        heads.escape_time(s, 1e-6)
    with pytest.raises(ValueError, match="t1"):  # None is the default threshold, as in focus
        heads.escape_time(s, None, t1=-1.0)
    with pytest.raises(ValueError, match="t1"):
        heads.specialisation_time_sensitivity(s, t1=0.0)
    with pytest.raises(ValueError, match="mode"):
        heads.specialisation_time_sensitivity(s, mode="sideways")
    with pytest.raises(ValueError, match="ForwardMode"):
        heads.specialisation_time_sensitivity(s, solver=heads.DEFAULT_SOLVER.replace(adjoint=diffrax.DirectAdjoint()))
    with pytest.raises(ValueError, match="BacksolveAdjoint"):
        heads.specialisation_time_sensitivity(
            s, mode="reverse", solver=heads.DEFAULT_SOLVER.replace(adjoint=diffrax.BacksolveAdjoint())
        )
    with pytest.raises(ValueError, match="FlippedSpike"):
        heads.specialisation_time_sensitivity(s.replace(prior=heads.AnisotropicGaussian([0.0], [1.0])))


# ----------------------------------------------------------------------------- focus
FOCUS_POINTS = {"lam": [0.5, 0.6], "tau": [1.0, 1.0]}


def _focus_sens(lam, tau):
    return focus.escape_time_sensitivity(focus.Setup(chain=focus.MarkovChain.lazy(lam=lam), tau=tau))


_focus_batch = jax.jit(jax.vmap(_focus_sens))


@pytest.fixture(scope="module")
def focus_batch():
    lanes = _fd_lanes(FOCUS_POINTS)
    return _focus_batch(lanes["lam"], lanes["tau"])


def test_focus_escape_time_sensitivity_matches_central_differences(focus_batch):
    """d t_esc / d lam (laziness of the chain) and d t_esc / d tau (score scale) of the Stage II
    escape (the loss falls 0.05 below the unigram plateau H(pi)), through the event of the flow
    (P6), under jit and vmap, against central differences (deterministic: 1e-5 relative)."""
    errors = _check_against_fd(focus_batch, FOCUS_POINTS, 1e-5)
    assert max(errors.values()) < 1e-5
    for name in ("lam", "tau"):
        assert np.all(np.asarray(focus_batch.grad[name][:2]) < 0)  # lazier chain, sharper scores: sooner
    # the reference of the docs
    assert abs(float(focus_batch.value[0]) - 101.742) < 1e-3
    assert abs(float(focus_batch.grad["lam"][0]) + 216.33) < 1e-2


def test_focus_sensitivity_follows_the_default_threshold_where_it_moves_with_lam():
    """At lam = 0.2, H(pi) - L* = 0.034 < 1/6: the default threshold follows L*, so d t_esc / d lam
    of ``escape_time(setup)`` includes its move (-948 against -1661 at that threshold held fixed);
    escape_time_sensitivity gives each, by the threshold it is given, to 1e-5 of central
    differences."""

    def setup(lam):
        return focus.Setup(chain=focus.MarkovChain.lazy(focus.SYNTHETIC_PI, lam), m=4, mk=4)

    s = setup(0.2)
    thr = float(focus.escape_threshold(s))
    moving = af.central_difference(lambda lam: focus.escape_time(setup(lam), t1=2000.0), lam=0.2)["lam"]
    fixed = af.central_difference(lambda lam: focus.escape_time(setup(lam), thr, t1=2000.0), lam=0.2)["lam"]
    assert float(moving) == pytest.approx(-948.1, rel=1e-3) and float(fixed) == pytest.approx(-1660.9, rel=1e-3)
    by_default = focus.escape_time_sensitivity(s, t1=2000.0).grad["lam"]
    held = focus.escape_time_sensitivity(s, thr, t1=2000.0).grad["lam"]
    assert float(by_default) == pytest.approx(float(moving), rel=1e-5)
    assert float(held) == pytest.approx(float(fixed), rel=1e-5)


@pytest.mark.slow  # a second compilation (the eager solve), about 20 s
def test_focus_sensitivity_vmap_and_jit_match_eager_single_calls(focus_batch):
    """jit(vmap) over two values of lam gives what two eager single calls give."""
    for i in range(2):
        one = _focus_sens(FOCUS_POINTS["lam"][i], FOCUS_POINTS["tau"][i])
        np.testing.assert_allclose(float(one.value), float(focus_batch.value[i]), rtol=1e-12)
        for name in ("lam", "tau"):
            np.testing.assert_allclose(float(one.grad[name]), float(focus_batch.grad[name][i]), rtol=1e-10)


@pytest.mark.slow
def test_focus_escape_time_derivatives():
    """Forward and reverse mode agree, the primal `escape_time` is the sensitivity's value, and it
    agrees with the event of `integrate` on `focus.flow_field` written out by hand."""
    setup = focus.Setup()
    fwd = jax.jit(focus.escape_time_sensitivity)(setup)
    rev = jax.jit(lambda s: focus.escape_time_sensitivity(s, mode="reverse"))(setup)
    t = focus.escape_time(setup)
    pi = setup.chain.pi
    by_hand = af.integrate(
        _focus_field,
        setup.theta0(),
        5000.0,
        args=(setup, -jnp.sum(pi * jnp.log(pi)) - 0.05),
        event=_focus_escaped,
        save=af.LinearGrid(2),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-12),
    ).t_event
    assert abs(float(t) - float(by_hand)) < 1e-9 * float(t)
    assert abs(float(fwd.value) - float(t)) < 1e-9 * float(t)
    for name in ("lam", "tau"):
        g = float(fwd.grad[name])
        assert abs(float(rev.grad[name]) - g) < 1e-9 * abs(g), name


def _focus_field(t, theta, a):
    return focus.flow_field(t, theta, a[0])


def _focus_escaped(t, theta, a):
    setup, threshold = a
    return focus.population_loss(theta, setup.chain, setup.tau) - threshold


def test_focus_sensitivity_bad_input():
    s = focus.Setup()
    with pytest.raises(ValueError, match="setup must be"):
        focus.escape_time(None)
    with pytest.raises(ValueError, match="threshold"):
        focus.escape_time(s, np.nan)
    with pytest.raises(ValueError, match="initial loss"):
        focus.escape_time(s, 2.0)
    floor = float(s.chain.bayes_floor())
    with pytest.raises(ValueError, match="never reached: it must lie above the chain's Bayes floor"):
        focus.escape_time(s, floor - 0.01)  # computes nothing: a NaN after a long solve otherwise
    with pytest.raises(ValueError, match="t1"):
        focus.escape_time_sensitivity(s, t1=-1.0)
    with pytest.raises(ValueError, match="mode"):
        focus.escape_time_sensitivity(s, mode="both")
    with pytest.raises(ValueError, match="lazy"):
        cyclic = focus.MarkovChain(np.ones(3) / 3, np.roll(np.eye(3), 1, axis=1))  # stationary, not lazy
        focus.escape_time_sensitivity(s.replace(chain=cyclic))


@pytest.mark.slow
def test_focus_escape_time_below_the_floor_fails_its_sweep_point():
    """Traced thresholds (a sweep): the point below the floor fails with the reason, not a silent NaN."""
    small = focus.Setup(m=2, mk=2, eps=1e-2)
    with pytest.warns(RuntimeWarning, match="thr=0.5: focus.escape_time: the threshold .loss. is never reached"):
        res = af.sweep(lambda thr: focus.escape_time(small, thr), {"thr": np.array([0.7, 0.5])}, progress=False)
    assert np.isfinite(res.values[0]) and np.isnan(res.values[1]) and res.status[0] == 0 and res.status[1] != 0


@pytest.mark.slow
def test_focus_escape_time_sensitivity_in_a_sweep_and_under_jit():
    """A sweep of sensitivities over ``lam`` in which one point's threshold lies below its Bayes floor
    (0.717 at ``lam = 0.1``) fails that point with the reason and keeps the other (the check sits
    outside the derivative; one under it fails its point alike); a threshold traced under a user's
    jit of a concrete setup works (the laziness is read off in NumPy)."""
    pi = focus.Setup().chain.pi

    def setup(lam):
        return focus.Setup(chain=focus.MarkovChain.lazy(pi, lam), m=2, mk=2, eps=1e-2)

    with pytest.warns(RuntimeWarning, match="lam=0.1: focus.escape_time_sensitivity: the threshold .loss. is never"):
        res = af.sweep(
            lambda lam: focus.escape_time_sensitivity(setup(lam), 0.6).grad["lam"],
            {"lam": np.array([0.5, 0.1])},
            progress=False,
        )
    assert np.isfinite(res.values[0]) and np.isnan(res.values[1]) and res.status[1] != 0
    jitted = jax.jit(lambda thr: focus.escape_time_sensitivity(setup(0.5), thr).value)(0.6)
    assert float(jitted) == pytest.approx(float(focus.escape_time(setup(0.5), 0.6)), rel=1e-9)


def test_focus_default_escape_threshold_is_the_end_of_stage_two():
    """For a chain only a little below its unigram plateau (``H(pi) - L* = 0.119``) the default
    threshold is 0.3 of the way to ``L*`` (not ``H(pi) - 0.05``, which only Stage IV reached, at
    t = 737): the escape comes at the end of Stage II, near the predicted ``T_I + T_II = 169``."""
    s = focus.Setup(chain=focus.MarkovChain.lazy(jnp.array([0.5, 0.25, 0.15, 0.07, 0.03]), 0.3), eps=1e-2, m=4, mk=4)
    p = focus.stage_predictions(s)
    H, floor = float(p["H_pi"]), float(p["L_star"])
    assert float(focus.escape_threshold(s)) == pytest.approx(H - focus.ESCAPE_FRACTION * (H - floor), rel=1e-14)
    t_esc = float(focus.escape_time(s))
    assert abs(t_esc / float(p["T_I"] + p["T_II"]) - 1) < 0.1  # 179.8 against 169.1
    # the reference chain (H(pi) - L* = 0.17) keeps the fixed margin
    ref = focus.Setup()
    fixed = float(ref.chain.entropy()) - focus.ESCAPE_MARGIN
    assert float(focus.escape_threshold(ref)) == pytest.approx(fixed, rel=1e-14)


def test_focus_stage_two_with_negative_c_ends_at_its_rate_abs_c():
    """c < 0 (a reversible chain): the antisymmetric mode W_Q = -W_K of the attention block grows
    at |c| and the H(pi) plateau ends (T_II was inf). Predicted T_I + log(1/eps)/|c| = 331.9; the
    flow leaves the plateau at 287 (escape_time)."""
    s = focus.Setup(chain=focus.MarkovChain.reversible(focus.SYNTHETIC_PI, key=1), m=4, mk=4)
    p = focus.stage_predictions(s)
    c = float(p["c"])
    assert c < 0
    assert float(p["T_II"]) == pytest.approx(np.log(1 / s.eps) / abs(c), rel=1e-14)
    t_esc = float(focus.escape_time(s, t1=3000.0))
    assert 0.75 < t_esc / float(p["T_I"] + p["T_II"]) < 1.0  # 287 against 332
    iid = focus.Setup(chain=focus.MarkovChain.lazy(focus.SYNTHETIC_PI, 0.0), m=4, mk=4)  # c = 0: no mode grows
    assert float(focus.stage_predictions(iid)["c"]) == 0.0 and float(focus.stage_predictions(iid)["T_II"]) == np.inf


@pytest.mark.slow
def test_event_time_derivatives_and_unfired_events():
    """Logistic u' = u (1 - u), u(0) = 0.1: the event u = c fires at t = log(9 c / (1 - c)), d t / d c =
    1 / (c (1 - c)), in both modes and per entry of a batch. An event that never fires has t_event NaN
    and derivative 0 (that of the where that makes it NaN): a mean over entries masks them with nanmean,
    whose gradient is then the fired entries' (the event closes over c: integrate traces it too)."""

    def field(t, u, a):
        return u * (1 - u)

    def t_event(c, t1, solver=None):
        traj = af.integrate(
            field, jnp.array(0.1), t1, save=af.LinearGrid(2), event=lambda t, u, a: u - c, solver=solver
        )
        return traj.t_event

    c = 0.5
    assert float(t_event(c, 10.0)) == pytest.approx(np.log(9.0), rel=1e-6)
    forward = af.SolverOptions(adjoint=diffrax.ForwardMode())
    for mode, solver in ((jax.grad, None), (jax.jacfwd, forward)):
        assert float(mode(t_event)(c, 10.0, solver)) == pytest.approx(1 / (c * (1 - c)), rel=1e-5)
        assert np.isnan(float(t_event(c, 1.0, solver))) and float(mode(t_event)(c, 1.0, solver)) == 0.0
    t1s = jnp.array([10.0, 1.0, 10.0])  # the middle entry fires after its t1
    batch = jax.vmap(jax.grad(t_event), in_axes=(None, 0))(c, t1s)
    np.testing.assert_allclose(batch, [4.0, 0.0, 4.0], rtol=1e-5)
    masked = jax.grad(lambda c: jnp.nanmean(jax.vmap(t_event, in_axes=(None, 0))(c, t1s)))(c)
    assert float(masked) == pytest.approx(4.0, rel=1e-5)


def test_forward_mode_without_its_adjoint_says_what_to_pass():
    def loss(eta, solver=None):
        return af.integrate(lambda t, y, a: -a * y, jnp.array(1.0), 1.0, args=eta, solver=solver).ys["y"][-1]

    with pytest.raises(TypeError, match="needs Diffrax's ForwardMode adjoint: pass solver=af.solver_for_mode"):
        jax.jacfwd(loss)(2.0)
    with pytest.raises(ValueError, match="solver must be SolverOptions, got None; .* DEFAULT_SOLVER"):
        af.solver_for_mode("forward", None)
    forward = af.solver_for_mode("forward", af.SolverOptions(rtol=1e-10, atol=1e-12))
    assert float(jax.jacfwd(loss)(2.0, forward)) == pytest.approx(-np.exp(-2.0), rel=1e-8)
