"""Differentiable QK/OV theory: sensitivities at a fixed loss and the sharpest ratio under a time budget.

The outcome of training to a loss ``L*`` is the pair (time to ``L*``, attention ``alpha`` at
``L*``): `reach_loss` integrates the reduced ODE (3) until the loss event fires, and
`attnflow.sensitivity` differentiates it, event time included, with respect to ``log r``
(`ratio_sensitivity`, eq. (11)). The first integral gives the same slope without integrating
(`fixed_loss_slope`, eq. (12)).

Rates under a cap (eq. (13)): stability limits the larger learning rate, so at ratio ``r``
the faster circuit runs at the cap, ``eta_QK = eta_max min(r, 1)`` and
``eta_OV = eta_max min(1, 1/r)`` (`capped_rates`). Scaling both rates by ``c`` divides every
time by ``c`` and leaves the state at ``L*`` unchanged, so this is the fastest clock for each
``r``. `pareto_front` traces (time, alpha) over ``r``; `optimal_ratio` maximises ``alpha`` at ``L*``
subject to reaching ``L*`` within a time budget, by an augmented-Lagrangian Optax loop on
``log r`` (eq. (14)).
"""

from __future__ import annotations

import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _validate as V
from .._errors import warn_traced
from .._jit import filter_jit
from ..ode import require_x64
from ..options import LinearGrid, SolverOptions
from ..sensitivity import Sensitivity, sensitivity, solver_for_mode
from ..sweep import sweep
from .setup import Setup
from .theory import (
    DEFAULT_SOLVER,
    _check_loss_target,
    _start_loss,
    alpha,
    invariant,
    loss_to_margin,
    solve,
    state_at_loss,
)

__all__ = [
    "OptimalRatio",
    "capped_rates",
    "default_horizon",
    "fixed_loss_slope",
    "optimal_ratio",
    "pareto_front",
    "ratio_sensitivity",
    "reach_loss",
]

_OUTCOME = ("t", "mu_ov", "mu_qk", "alpha")


def _check_setup(setup: Any, where: str | None = None) -> Setup:
    """``setup`` if it is a `Setup`; with ``where`` (a verb that integrates the flow), also
    float64 on, the error naming that verb rather than the `solve` underneath."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.qkov.Setup, got {setup!r}")
    if where is not None:
        require_x64(where)
    return setup


def _check_loss(setup: Setup, loss_target: Any, initial: dict | None = None) -> None:
    """`solve`'s check of a loss target (`_check_loss_target`): finite, positive and below the
    loss at the start (``initial``, checked, or the setup's own)."""
    _check_loss_target(loss_target, lambda: _start_loss(setup, initial))


def default_horizon(setup: Setup, loss_target: Any) -> jax.Array:
    """A time by which the flow has reached ``loss_target``: ``100 (M-1) b (m+n) / (m eta_min L*)``,
    100 times the time the loss needs with attention frozen at ``alpha_0 = m / (m+n)`` and
    the slower rate for both circuits (eq. (6)). `reach_loss`'s default ``t1``."""
    eta_min = jnp.minimum(setup.eta_qk, setup.eta_ov)
    L = jnp.asarray(loss_target)
    return 100.0 * (setup.M - 1) * setup.b * (setup.m + setup.n) / (setup.m * eta_min * L)


def reach_loss(setup: Setup, loss_target: Any, *, t1: Any = None, solver: SolverOptions | None = None) -> dict:
    """Time ``t`` at which the reduced flow (3) first reaches the loss ``loss_target``, and the
    state there: ``{"t", "mu_ov", "mu_qk", "alpha"}``.

    `solve` with a terminating loss event, saving only the end points. Differentiable (with
    `attnflow.sensitivity` or ``jax.grad``) with respect to every array of ``setup`` and to
    ``loss_target``, the event time included (eq. (S1) of `attnflow.sensitivity`), and
    traceable under ``jit`` and ``vmap``. ``t1``: the horizon (default `default_horizon`); NaN
    values if the loss is still above the target there. ``solver``: default `DEFAULT_SOLVER`.
    """
    _check_setup(setup, "qkov.reach_loss")
    _check_loss(setup, loss_target)
    t1 = default_horizon(setup, loss_target) if t1 is None else t1
    tr = solve(setup, t1, loss_target=loss_target, save=LinearGrid(2), solver=solver or DEFAULT_SOLVER)
    end = tr.final()
    ok = jnp.isfinite(tr.t_event)
    out = {"t": tr.t_event}
    out.update({k: jnp.where(ok, end[k], jnp.nan) for k in ("mu_ov", "mu_qk", "alpha")})
    return out


def capped_rates(ratio: Any, eta_max: Any = 1.0) -> tuple[jax.Array, jax.Array]:
    """``(eta_QK, eta_OV)`` at ratio ``r`` with the faster circuit at the cap ``eta_max`` (eq. (13)):
    ``eta_QK = eta_max min(r, 1)``, ``eta_OV = eta_max min(1, 1/r)``."""
    r = jnp.asarray(ratio)
    return eta_max * jnp.minimum(r, 1.0), eta_max * jnp.minimum(1.0, 1.0 / r)


def _at_log_ratio(setup: Setup, log_r: Any, eta_max: Any) -> Setup:
    if eta_max is None:
        return setup.replace(eta_qk=jnp.exp(log_r) * setup.eta_ov)
    eta_qk, eta_ov = capped_rates(jnp.exp(log_r), eta_max)
    return setup.replace(eta_qk=eta_qk, eta_ov=eta_ov)


def ratio_sensitivity(
    setup: Setup,
    loss_target: Any,
    *,
    eta_max: Any = None,
    t1: Any = None,
    solver: SolverOptions | None = None,
    mode: str = "forward",
) -> Sensitivity:
    """`reach_loss` and its derivative with respect to ``log r`` through the event-terminated ODE
    (eq. (11)): ``.value`` is ``{"t", "mu_ov", "mu_qk", "alpha"}`` at the setup's ratio,
    ``.grad["log_r"]`` their derivatives. ``mode``: ``"forward"`` (default: one input, four
    outputs; as `attnflow.focus.escape_time_sensitivity` and `attnflow.heads.escape_time_sensitivity`)
    or ``"reverse"`` (`attnflow.sensitivity`), with the adjoint that mode needs
    (`attnflow.solver_for_mode` on ``solver``, default `DEFAULT_SOLVER`).

    ``eta_max=None`` keeps ``eta_OV`` and moves ``eta_QK = r eta_OV``; a number moves both rates
    as `capped_rates`. The state at ``L*`` depends on ``r`` only, so ``d alpha / d log r`` is the
    same either way; the time's derivative is not. Traceable (``jit``, ``vmap``, `attnflow.sweep`).
    """
    _check_setup(setup, "qkov.ratio_sensitivity")
    _check_loss(setup, loss_target)
    if eta_max is not None and not V.any_traced(eta_max):
        V.positive("eta_max", eta_max)

    solver = solver_for_mode(mode, DEFAULT_SOLVER if solver is None else solver)

    def outcome(log_r):
        return reach_loss(_at_log_ratio(setup, log_r, eta_max), loss_target, t1=t1, solver=solver)

    return sensitivity(outcome, mode, log_r=jnp.log(setup.ratio))


def fixed_loss_slope(setup: Setup, loss_target: Any, *, initial: dict | None = None) -> dict:
    """``d/d log r`` of ``{mu_ov, mu_qk, alpha}`` at the loss ``loss_target`` by the implicit
    function theorem on the first integral (eq. (12)), without integrating.

    At fixed loss ``mu_OV = ell / alpha(mu_QK)`` (eq. (5)), and the state is the root of
    ``F(mu_QK, r) = I(ell / alpha(mu_QK), mu_QK; r) - I(initial; r)`` (eq. (4)); hence
    ``d mu_QK / d log r = -(dF/d log r) / (dF/d mu_QK)``, and ``alpha``, ``mu_OV`` follow by the
    chain rule. ``initial``: default the setup's start. Traceable.
    """
    _check_setup(setup)
    init = setup.initial_state(initial)
    _check_loss(setup, loss_target, init)
    st = state_at_loss(setup, loss_target, initial=init)
    ell = loss_to_margin(loss_target, setup.M)

    def F(mu_qk, log_r):
        s = setup.replace(eta_qk=jnp.exp(log_r) * setup.eta_ov)
        state = {"mu_ov": ell / alpha(mu_qk, s), "mu_qk": mu_qk}
        return invariant(state, s) - invariant(init, s)

    log_r = jnp.log(setup.ratio)
    dF_dmu, dF_dr = jax.grad(F, argnums=(0, 1))(st["mu_qk"], log_r)
    d_mu_qk = -dF_dr / dF_dmu
    a = st["alpha"]
    d_alpha = a * (1.0 - a) * d_mu_qk
    return {"mu_qk": d_mu_qk, "alpha": d_alpha, "mu_ov": -ell / a**2 * d_alpha}


def pareto_front(
    setup: Setup,
    loss_target: Any,
    ratios: Any,
    *,
    eta_max: Any = 1.0,
    t1: Any = None,
    solver: SolverOptions | None = None,
    progress: bool = False,
) -> dict:
    """Time to ``loss_target`` and ``alpha`` there for each ratio, rates `capped_rates` (eq. (13)):
    ``{"ratio", "t", "alpha", "pareto"}`` (NumPy arrays), one compiled `attnflow.sweep` over
    ``ratios``. ``pareto`` marks the non-dominated ratios: no other ratio reaches the loss
    sooner with at least the same ``alpha``, or with larger ``alpha`` no later.
    """
    _check_setup(setup, "qkov.pareto_front")
    _check_loss(setup, loss_target)
    V.positive("eta_max", eta_max)
    r = V.reals("ratios", ratios)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"ratios must be a non-empty 1-D array, got shape {r.shape}")
    V.positive("ratios", r)
    eta_max = float(eta_max)

    def point(log_r):
        out = reach_loss(_at_log_ratio(setup, log_r, eta_max), loss_target, t1=t1, solver=solver)
        return {"t": out["t"], "alpha": out["alpha"]}

    res = sweep(point, {"log_r": np.log(r)}, progress=progress)
    t, a = np.asarray(res.values["t"]), np.asarray(res.values["alpha"])
    ok = np.isfinite(t) & np.isfinite(a)
    dominated = np.zeros(r.size, bool)
    for i in np.flatnonzero(ok):
        better = ok & (t <= t[i]) & (a >= a[i]) & ((t < t[i]) | (a > a[i]))
        dominated[i] = bool(better.any())
    return {"ratio": r, "t": t, "alpha": a, "pareto": ok & ~dominated}


class OptimalRatio(eqx.Module):
    """Result of `optimal_ratio`: the ratio, the outcome there, the certificate and the path.

    ``ratio``, ``log_ratio``; ``t`` (time to ``L*``) and ``alpha`` at ``L*`` there;
    ``multiplier``: the Lagrange multiplier of the time budget (> 0: the budget binds);
    ``violation``: ``log(t / budget)`` (``<= 0`` feasible); ``stationarity``: the derivative of
    the Lagrangian ``-logit(alpha) + multiplier log(t / budget)`` in ``log r`` (0 at a KKT
    point); ``history``: ``log r`` after every Optax step.
    """

    ratio: jax.Array
    log_ratio: jax.Array
    t: jax.Array
    alpha: jax.Array
    multiplier: jax.Array
    violation: jax.Array
    stationarity: jax.Array
    history: jax.Array

    def converged(self, tol: float = 1e-3) -> jax.Array:
        """Whether the result is a KKT point of (14) to ``tol``: feasible (``violation <= tol``),
        stationary (``|stationarity| <= tol``) and complementary (``|multiplier violation| <=
        tol``: a multiplier only where the budget binds). ``False``: more ``outer`` rounds or
        ``inner`` steps, or another start ``log_r0``. Traceable (an array of the batch's shape)."""
        V.positive("tol", tol)
        return (
            (self.violation <= tol)
            & (jnp.abs(self.stationarity) <= tol)
            & (jnp.abs(self.multiplier * self.violation) <= tol)
        )

    def __repr__(self) -> str:
        leaves = (self.ratio, self.t, self.alpha, self.multiplier, self.violation, self.stationarity)
        if V.any_traced(leaves) or any(np.ndim(x) for x in leaves):
            return super().__repr__()
        r, t, a, lam, g, st = (float(x) for x in leaves)
        return (
            f"OptimalRatio(ratio={r:.6g}, t={t:.6g}, alpha={a:.6g}, multiplier={lam:.4g}, "
            f"violation={g:.3g}, stationarity={st:.3g}, steps={int(np.size(self.history))})"
        )


INFEASIBLE_TOL = 1e-3
"""`optimal_ratio` warns when its result misses the budget by more than this (``log(t / budget)``)."""


def optimal_ratio(
    setup: Setup,
    loss_target: Any,
    time_budget: Any,
    *,
    eta_max: Any = 1.0,
    log_r0: Any = 0.0,
    outer: int = 12,
    inner: int = 25,
    learning_rate: float = 0.1,
    penalty: float = 10.0,
    t1: Any = None,
    solver: SolverOptions | None = None,
) -> OptimalRatio:
    """The ratio ``r`` that maximises ``alpha`` at ``loss_target`` among the ratios that reach
    it within ``time_budget``, rates `capped_rates` (eq. (14)).

    Maximises ``logit alpha(r)`` subject to ``g(r) = log(t(r) / budget) <= 0`` by the augmented
    Lagrangian method on ``x = log r``: ``outer`` rounds, each ``inner`` Adam steps
    (``learning_rate``, cosine-decayed over all ``outer * inner`` steps) on
    ``-logit alpha + (penalty / 2) max(0, g + lambda / penalty)^2``, then
    ``lambda <- max(0, lambda + penalty g)``. Every step differentiates `reach_loss` through the
    event-terminated ODE; the loop is one compiled ``lax.scan``. Start ``log_r0`` (default
    ``r = 1``, the fastest ratio under the cap). Since ``alpha`` at fixed loss rises with ``r``
    (eq. (5)), the budget binds at the optimum when it is shorter than the time of the largest
    ratio considered. Returns `OptimalRatio` (check ``violation`` and ``stationarity``, or
    ``OptimalRatio.converged()``). Warns (``RuntimeWarning``) when the result misses the budget
    (``violation > INFEASIBLE_TOL``): no ratio the search reached meets it; in a sweep the point
    is named with the warning.
    """
    _check_setup(setup, "qkov.optimal_ratio")
    _check_loss(setup, loss_target)
    V.positive("time_budget", time_budget)
    V.positive("eta_max", eta_max)
    outer = V.positive_int("outer", outer)
    inner = V.positive_int("inner", inner)
    V.positive("learning_rate", learning_rate)
    V.positive("penalty", penalty)
    log_r0 = V.finite_scalar("log_r0", log_r0)
    dtype = jnp.result_type(float)
    res = _optimal_ratio(
        setup,
        jnp.asarray(loss_target, dtype),
        jnp.asarray(time_budget, dtype),
        jnp.asarray(eta_max, dtype),
        jnp.asarray(log_r0, dtype),
        jnp.asarray(penalty, dtype),
        t1,
        solver,
        outer,
        inner,
        float(learning_rate),
    )
    missed = "qkov.optimal_ratio: the result does not reach loss_target within time_budget"
    if V.any_traced(res.violation):  # in a sweep: the point is named with the warning
        warn_traced(lambda: res.violation > INFEASIBLE_TOL, f"{missed} (violation log(t / budget) > {INFEASIBLE_TOL})")
    elif float(res.violation) > INFEASIBLE_TOL:
        warnings.warn(
            f"{missed}: loss {V.show(loss_target)} is reached at t = {float(res.t):.6g} > time_budget = "
            f"{V.show(time_budget)} (ratio {float(res.ratio):.4g}); no ratio the search reached meets the "
            "budget: raise it or eta_max, or see OptimalRatio.converged()",
            RuntimeWarning,
            stacklevel=2,
        )
    return res


@filter_jit
def _optimal_ratio(setup, loss_target, budget, eta_max, x0, rho, t1, solver, outer, inner, learning_rate):
    def parts(x):
        out = reach_loss(_at_log_ratio(setup, x, eta_max), loss_target, t1=t1, solver=solver)
        a = out["alpha"]
        return jnp.log(a) - jnp.log1p(-a), jnp.log(out["t"] / budget), out

    def parts_grad(x):
        res = sensitivity(lambda log_r: parts(log_r)[:2], log_r=x)
        (f, g), (df, dg) = res.value, res.grad["log_r"]
        return f, g, df, dg

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, outer * inner, alpha=1e-3))

    def inner_step(carry, _):
        x, lam, state = carry
        _, g, df, dg = parts_grad(x)
        active = jnp.maximum(0.0, g + lam / rho)
        grad = -df + rho * active * dg
        upd, state = opt.update(grad, state, x)
        x = optax.apply_updates(x, upd)
        return (x, lam, state), x

    def outer_step(carry, _):
        x, lam, state = carry
        (x, _, state), xs = jax.lax.scan(inner_step, (x, lam, state), None, length=inner)
        _, g, _, _ = parts_grad(x)
        lam = jnp.maximum(0.0, lam + rho * g)
        return (x, lam, state), xs

    (x, lam, _), hist = jax.lax.scan(outer_step, (x0, jnp.zeros_like(x0), opt.init(x0)), None, length=outer)
    _, g, df, dg = parts_grad(x)
    out = parts(x)[2]
    return OptimalRatio(
        ratio=jnp.exp(x),
        log_ratio=x,
        t=out["t"],
        alpha=out["alpha"],
        multiplier=lam,
        violation=g,
        stationarity=-df + lam * dg,
        history=hist.reshape(-1),
    )
