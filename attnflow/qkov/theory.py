"""Reduced dynamics of QK vs OV learning speeds (eqs. (2)-(8) of the qkov docs page).

State: ``{"mu_ov": mu_OV, "mu_qk": mu_QK}`` (scalars or batched arrays); parameters: a
`attnflow.qkov.Setup`.

    alpha = m e^{mu_QK} / (m e^{mu_QK} + n),   E = e^{alpha mu_OV} + M - 1,
    L = log(1 + (M - 1) e^{-alpha mu_OV})                                       (2)

    d mu_OV/dt = eta_OV alpha / (b E) * g_OV                                     (3a)
    d mu_QK/dt = kappa c^2 eta_QK (M-1) alpha (1-alpha) mu_OV / (M b^p E) * g_QK  (3b)

with factorisation multipliers ``g_OV = 2 sqrt(b) mu_OV`` (factorised OV, else 1) and
``g_QK = 2 s_QK mu_QK / c`` (factorised QK, else 1), ``s_QK = b`` (distinct_uniform query)
or ``sqrt(b)`` (dedicated query: one query row per class); ``kappa = 1 + b/|C|`` with the
common correction (else 1), ``p = 2`` (distinct_uniform query) or 1 (dedicated query).

First integral (4): ``Phi(mu_QK) - K Psi(mu_OV)`` is constant, with
``K = kappa c^2 r (M-1) / (M b^(p-1))``, ``r = eta_QK / eta_OV``,
``Phi_CA = mu + (m/n) e^mu``, ``Phi_FA = c (ln mu + (m/n) Ei(mu)) / (2 s_QK)``,
``Psi_CO = mu^2 / 2``, ``Psi_FO = mu / (2 sqrt b)``.

Time: `solve` integrates in ``t``, the clock of the gradient flow ``dW/dt = -eta grad L``
(and of `attnflow.qkov.train`). The authors integrate in ``tau = t min(eta_QK, eta_OV)``
(`to_tau`, `from_tau`); `authors_rk4` replicates their scheme and reports ``t``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._errors import check_traced
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..ode import ODE, crossing_time, integrate, observable_event, require_x64, with_progress
from ..options import LogGrid, SaveGrid, SolverOptions
from ..trajectory import Trajectory
from .setup import PAPER_HORIZON_TAU, PAPER_LOSS_TARGET, Setup

__all__ = [
    "escape_time",
    "AUTHORS_SAVE",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "alpha",
    "authors_rk4",
    "effective_rate",
    "first_integral",
    "from_tau",
    "invariant",
    "large_t_asymptotics",
    "loss",
    "loss_to_margin",
    "reduced_field",
    "solve",
    "state_at_loss",
    "to_tau",
    "upper_bounds",
]


def _check_setup(setup: Any) -> Setup:
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.qkov.Setup, got {setup!r}")
    return setup


def alpha(mu_qk: Any, setup: Setup) -> jax.Array:
    """Attention mass on distinct tokens, ``m e^mu / (m e^mu + n)`` (eq. (2); a logistic, overflow-safe)."""
    return jax.nn.sigmoid(mu_qk + np.log(setup.m / setup.n))


def _inv_E(a_mu: jax.Array, M: int) -> jax.Array:
    """``1 / E = 1 / (e^{a mu} + M - 1)`` without overflow."""
    e = jnp.exp(-a_mu)
    return e / (1.0 + (M - 1.0) * e)


def loss(state: dict, setup: Setup) -> jax.Array:
    """Reduced loss ``log(1 + (M-1) e^{-alpha mu_OV})`` (eq. (2))."""
    a = alpha(state["mu_qk"], setup)
    return jnp.log1p((setup.M - 1.0) * jnp.exp(-a * state["mu_ov"]))


def loss_to_margin(L: Any, M: Any) -> jax.Array:
    """``ell = alpha mu_OV`` at which the loss equals ``L``: ``-ln((e^L - 1) / (M - 1))`` (eq. (5))."""
    return -jnp.log(jnp.expm1(jnp.asarray(L)) / (jnp.asarray(M) - 1.0))


def reduced_field(t: Any, state: dict, setup: Setup) -> dict:
    """Vector field (3a)-(3b) of all four parametrisations, in time ``t``."""
    mu_ov, mu_qk = state["mu_ov"], state["mu_qk"]
    a = alpha(mu_qk, setup)
    one_minus_a = jax.nn.sigmoid(-(mu_qk + np.log(setup.m / setup.n)))
    invE = _inv_E(a * mu_ov, setup.M)
    b, M, c = float(setup.b), float(setup.M), setup.score_scale
    g_ov = 2.0 * np.sqrt(b) * mu_ov if setup.factorised_ov else 1.0
    g_qk = 2.0 * setup.s_qk * mu_qk / c if setup.factorised_qk else 1.0
    d_ov = setup.eta_ov * a * invE / b * g_ov
    d_qk = (
        setup.kappa
        * c**2
        * setup.eta_qk
        * (M - 1.0)
        * a
        * one_minus_a
        * mu_ov
        * invE
        / (M * b**setup.query_power)
        * g_qk
    )
    return {"mu_ov": d_ov, "mu_qk": d_qk}


def _K(setup: Setup) -> jax.Array:
    """Coefficient of the first integral: ``kappa c^2 r (M-1) / (M b^(p-1))``."""
    return (
        setup.kappa
        * setup.score_scale**2
        * setup.ratio
        * (setup.M - 1.0)
        / (setup.M * float(setup.b) ** (setup.query_power - 1))
    )


def _Phi(mu_qk, setup):
    if setup.factorised_qk:
        return (
            setup.score_scale
            * (jnp.log(mu_qk) + setup.m / setup.n * jax.scipy.special.expi(mu_qk))
            / (2.0 * setup.s_qk)
        )
    return mu_qk + setup.m / setup.n * jnp.exp(mu_qk)


def _Psi(mu_ov, setup):
    if setup.factorised_ov:
        return mu_ov / (2.0 * np.sqrt(setup.b))
    return 0.5 * mu_ov**2


def invariant(state: dict, setup: Setup) -> jax.Array:
    """``Phi(mu_QK) - K Psi(mu_OV)``, constant along the flow (eq. (4))."""
    return _Phi(state["mu_qk"], setup) - _K(setup) * _Psi(state["mu_ov"], setup)


def first_integral(state: dict, setup: Setup, initial: dict | None = None) -> jax.Array:
    """Residual of the first integral (4) relative to ``initial`` (default: the setup's start,
    `Setup.initial_state`); zero along every solution from ``initial``.

    For CACO from 0 this is ``mu_QK + (m/n)(e^{mu_QK} - 1) - K mu_OV^2 / 2``.
    """
    return invariant(state, setup) - invariant(setup.initial_state(initial), setup)


def state_at_loss(setup: Setup, loss_target: Any, *, initial: dict | None = None, iterations: int = 200) -> dict:
    """The state ``{mu_ov, mu_qk, alpha}`` where the flow from ``initial`` (default: the
    setup's start) first reaches the loss ``loss_target``, without integrating (eq. (5)).

    With ``ell = loss_to_margin(L)``, the root of the strictly increasing
    ``F(mu_QK) = Phi(mu_QK) - K Psi(ell / alpha(mu_QK)) - I_0``, bracketed from ``mu_QK(0)``
    by doubling and refined by ``iterations`` bisections, then one Newton step, which leaves
    the value and gives the derivatives of the implicit function theorem,
    ``d mu_QK / d p = -(dF / dp) / (dF / d mu_QK)``: differentiable with ``jax.grad`` and
    `attnflow.sensitivity` with respect to every array of ``setup``, ``loss_target`` and
    ``initial``. Traceable (setup arrays and the target may be sweep axes). ``loss_target``
    must be finite, positive and below the initial loss: ``ValueError`` when concrete; traced,
    a point of `attnflow.sweep` fails with the same message, and elsewhere the values are NaN.
    """
    _check_setup(setup)
    require_x64("qkov.state_at_loss")
    iterations = V.positive_int("iterations", iterations)
    dtype = jnp.result_type(float)
    init = setup.initial_state(initial)
    _check_loss_target(loss_target, lambda: _start_loss(setup, initial))
    return _state_at_loss(setup, jnp.asarray(loss_target, dtype), init, iterations)


# the error of solve and train given both loss_target and event
_LOSS_OR_EVENT = "give loss_target or event, not both (loss_target=L is event=lambda t, o: o['loss'] - L)"


def _check_loss_target(loss_target: Any, start_loss: Callable[[], Any], name: str = "loss_target") -> None:
    """Refuse a loss target the flow cannot reach, for every qkov verb that stops at a loss
    (`solve`, `state_at_loss`, `escape_time`, `authors_rk4`, `attnflow.qkov.train`, and
    `attnflow.qkov.reach_loss` through `solve`): every entry of ``loss_target`` must be finite
    and positive (`L = 0` is reached only as ``t -> inf``, eq. (2)) and below the initial loss
    ``L0 = start_loss()`` (the flow only decreases the loss). Concrete values raise
    ``ValueError`` naming ``name``; traced ones (a sweep axis) mark the sweep point failed with
    the same message (`attnflow._errors.check_traced`), not left to read as "not reached by t1"."""
    V.positive(name, loss_target)
    L0 = start_loss()
    below = "must lie below the initial loss L(0)"
    why = ": the flow only decreases the loss"
    if V.any_traced((loss_target, L0)):
        shown = "" if V.any_traced(L0) else f" = {V.show(L0)}"
        check_traced(lambda: jnp.any(~(jnp.asarray(loss_target) < L0)), f"{name} {below}{shown}{why}")
        return
    if np.any(~(np.asarray(loss_target) < np.asarray(L0))):
        raise ValueError(f"{name} = {V.show(loss_target)} {below} = {V.show(L0)}{why}")


def _start_loss(setup: Setup, initial: dict | None) -> Any:
    """The loss (2) at the start of `solve` (``initial``, already checked by
    `Setup.initial_state`, or the setup's own start), for `_check_loss_target`: in NumPy when the
    start is concrete, so that the check gives a number inside a sweep's trace and compiles no
    JAX program; `loss` of the start when it is traced."""
    if initial is None:
        start = {"mu_ov": setup.mu0 if setup.factorised_ov else 0.0, "mu_qk": setup.mu0 if setup.factorised_qk else 0.0}
    else:
        start = {k: initial[k] for k in ("mu_ov", "mu_qk")}
    if V.any_traced(start):
        return loss(setup.initial_state(initial), setup)
    mu_ov, mu_qk = (np.asarray(start[k], np.float64) for k in ("mu_ov", "mu_qk"))
    a = 0.5 * (1.0 + np.tanh(0.5 * (mu_qk + np.log(setup.m / setup.n))))  # alpha (2), a logistic without overflow
    with np.errstate(over="ignore"):  # a start of loss inf (mu_ov -> -inf) is the number inf, as in `loss`
        return np.log1p((setup.M - 1.0) * np.exp(-a * mu_ov))


@filter_jit
def _state_at_loss(setup, loss_target, initial, iterations):
    dtype = loss_target.dtype
    ell = loss_to_margin(loss_target, setup.M)
    I0 = invariant(initial, setup)
    # the bracket and the bisection carry no derivatives (comparisons); the Newton step below does
    lo0 = jax.lax.stop_gradient(jnp.broadcast_to(initial["mu_qk"], jnp.shape(ell)).astype(dtype))

    def F(mu):
        return _Phi(mu, setup) - _K(setup) * _Psi(ell / alpha(mu, setup), setup) - I0

    def F_fixed(mu):
        return jax.lax.stop_gradient(F(mu))

    def grow(c):
        lo, step = c
        return lo, 2.0 * step

    _, step = jax.lax.while_loop(
        lambda c: jnp.any((F_fixed(c[0] + c[1]) < 0) & (c[1] < 1e6)), grow, (lo0, jnp.ones_like(lo0))
    )
    lo, hi = lo0, lo0 + step

    def bisect(_, c):
        lo, hi = c
        mid = 0.5 * (lo + hi)
        neg = F_fixed(mid) < 0
        return jnp.where(neg, mid, lo), jnp.where(neg, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iterations, bisect, (lo, hi))
    root = 0.5 * (lo + hi)
    # one Newton step from the root: F(root) is round-off, so the value stays, and the step's
    # derivative is the implicit function theorem's -(dF/dp) / (dF/dmu) (the term with F drops)
    F_root, dF_dmu = jax.jvp(F, (root,), (jnp.ones_like(root),))
    mu_qk = root - F_root / dF_dmu
    a = alpha(mu_qk, setup)
    out = {"mu_ov": ell / a, "mu_qk": mu_qk, "alpha": a}
    above = loss_target >= loss(initial, setup)  # traced: no error, NaN values
    return {k: jnp.where(above, jnp.nan, v) for k, v in out.items()}


# ----------------------------------------------------------------------------- solve
DEFAULT_SAVE = LogGrid(150)
"""`solve`'s (and `attnflow.qkov.train`'s) save grid when none is given: 150 points, the
first at 0, the rest log-spaced from ``1e-6 t1`` to ``t1``."""

DEFAULT_SOLVER = SolverOptions(rtol=1e-10, atol=1e-12, max_steps=200_000)
"""`solve`'s solver options when none are given (Tsit5, tight tolerances)."""


def _solve_field(t, y, args):
    return reduced_field(t, y, args["setup"])


def _solve_observe(t, y, args):
    from .observe import state_observables

    return state_observables(y, args["setup"])


def _loss_event(t, y, args):
    return loss(y, args["setup"]) - args["loss_target"]


def ode(setup: Setup, *, initial: dict | None = None) -> ODE:
    """The reduced ODE (3a)-(3b) of ``setup`` as an `attnflow.ODE`: ``ode(t, y)`` is
    `reduced_field`, ``ode.y0`` the setup's start (`Setup.initial_state`, or ``initial``),
    ``ode.observables(y)`` `attnflow.qkov.OBSERVABLES`, and ``ode.solve(t1)`` is
    ``solve(setup, t1)``. Its state is ``{"mu_ov", "mu_qk"}``; ``args`` is ``{"setup": setup}``.
    """
    _check_setup(setup)
    return ODE(
        _solve_field,
        {"setup": setup},
        setup.initial_state(initial),
        _solve_observe,
        DEFAULT_SAVE,
        DEFAULT_SOLVER,
        meta=(
            ("theory", "qkov"),
            ("equation", "reduced ODE (3)"),
            ("parametrisation", setup.parametrisation),
            ("clock", "t; gradient flow dW/dt = -eta grad L per circuit"),
        ),
    )


@keyword_hints("qkov.solve")
def solve(
    setup: Setup,
    t1: Any,
    *,
    loss_target: Any = None,
    initial: dict | None = None,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    event: Callable[[Any, dict], Any] | None = None,
    progress: bool | None = None,
) -> Trajectory:
    """The theory of ``setup``: the reduced ODE (3a)-(3b) integrated in time ``t`` from the
    setup's start (`Setup.initial_state`, or ``initial``) to ``t1``.

    ``t`` is the clock of the gradient flow ``dW/dt = -eta grad L`` and of
    `attnflow.qkov.train`: for ``r < 1`` the authors' ``tau = t min(eta_QK, eta_OV)`` runs
    slower than ``t``; convert with `to_tau` / `from_tau`.

    ``loss_target``: ``None`` (default) integrates to ``t1``; a number stops the solve at the
    first time the loss reaches it (a terminating event): ``traj.t_event`` is that time
    (NaN if the loss stays above the target until ``t1``) and the save points after it hold
    the event state, so ``traj.final()`` is the state there. A target that is not finite and
    positive, or not below the initial loss, raises ``ValueError`` (traced, at a point of
    `attnflow.sweep`: the point fails with the same message).
    ``event(t, obs) -> scalar`` on the observables ``obs`` (a dict of `attnflow.qkov.OBSERVABLES` at time
    ``t``) stops the solve where it first changes sign, e.g. ``lambda t, o: o["alpha"] - 0.9``;
    ``traj.t_event`` is that time (NaN if it never does) and the save points after it hold the
    event state; traceable under ``jit``, ``vmap`` and `attnflow.sweep` (`attnflow.ObservableEvent`).
    ``loss_target=L`` is ``event=lambda t, o: o["loss"] - L``; give one of the two.

    Records `attnflow.qkov.OBSERVABLES` (``mu_ov, mu_qk, alpha, loss``). Default save grid
    `DEFAULT_SAVE`, solver `DEFAULT_SOLVER`. New learning rates (``setup.replace(eta_qk=...)``)
    and targets reuse the compiled solve.
    ``progress=True`` shows the solve's progress meter with the solver it would use anyway
    (``solver``, else `DEFAULT_SOLVER`), where ``solver=af.SolverOptions(progress=True)`` would
    replace the package's solver and tolerances by the core's defaults.
    """
    require_x64("qkov.solve")
    if loss_target is not None and event is not None:
        raise ValueError(_LOSS_OR_EVENT)
    o = ode(setup, initial=initial)
    args = dict(o.args)
    stop: Callable[[Any, Any, Any], Any] | None = observable_event(event, _solve_observe)
    if loss_target is not None:
        _check_loss_target(loss_target, lambda: _start_loss(setup, initial))
        args["loss_target"] = jnp.asarray(loss_target, jnp.result_type(float))
        stop = _loss_event
    return integrate(
        o.field,
        o.y0,
        t1,
        args=args,
        save=save or o.save,
        solver=with_progress(solver, o.solver, progress),
        observe=o.observe,
        event=stop,
        meta=dict(o.meta),
    )


def to_tau(t: Any, setup: Setup) -> jax.Array:
    """The authors' clock ``tau = t min(eta_QK, eta_OV)``."""
    return jnp.asarray(t) * jnp.minimum(setup.eta_qk, setup.eta_ov)


def from_tau(tau: Any, setup: Setup) -> jax.Array:
    """``t = tau / min(eta_QK, eta_OV)``: the time of `solve` and `attnflow.qkov.train`."""
    return jnp.asarray(tau) / jnp.minimum(setup.eta_qk, setup.eta_ov)


# ----------------------------------------------------------------------------- authors' RK4
AUTHORS_SAVE = LogGrid(300)
"""`authors_rk4`'s save grid when none is given, read on its step axis."""


def authors_rk4(
    setup: Setup,
    *,
    loss_target: Any = PAPER_LOSS_TARGET,
    d_tau: float = 10.0,
    horizon_tau: float = PAPER_HORIZON_TAU,
    clip: float = 60.0,
    clamp: float = 1e6,
    denominator_eps: float = 1e-12,
    initial: dict | None = None,
    save: SaveGrid | None = None,
) -> Trajectory:
    """Replica of the authors' fixed-step RK4 for the reduced ODE (3), one compiled ``while_loop``.

    Their scheme: steps of ``d_tau`` in ``tau = t min(eta_QK, eta_OV)``; exponentials
    clipped to ``+-clip``, ``denominator_eps`` added to the alpha and rate denominators,
    ``mu`` clamped to ``[0, clamp]`` after each step; stop at the first step whose loss is
    ``<= loss_target`` or at ``horizon_tau`` (the authors double a horizon of 2e5 up to 5e7,
    which for a fixed-step scheme is the same as running to 5e7).

    Reports on the clock ``t`` of `solve` (``ts = tau / min(eta)``) the same observables;
    ``traj.t_event`` is the time of the stopping step (NaN if the horizon came first).
    ``save`` is read on the step axis (default `AUTHORS_SAVE`); unreached save points hold
    the final state. ``loss_target`` is checked as in `solve`.
    """
    require_x64("qkov.authors_rk4 (its reference values are float64)")
    _check_setup(setup)
    dtype = jnp.result_type(float)
    d_tau = V.finite_scalar("d_tau", d_tau)
    horizon_tau = V.finite_scalar("horizon_tau", horizon_tau)
    V.positive("d_tau", d_tau)
    V.positive("horizon_tau", horizon_tau)
    max_steps = int(np.ceil(horizon_tau / d_tau))
    steps = (save or AUTHORS_SAVE).steps(max_steps)
    init = setup.initial_state(initial)
    _check_loss_target(loss_target, lambda: _start_loss(setup, initial))
    y0 = jnp.stack([init["mu_ov"], init["mu_qk"]])
    tau, ys, k_end, hit = _rk4(
        setup,
        y0,
        jnp.asarray(loss_target, dtype),
        tuple(int(s) for s in steps),
        max_steps,
        d_tau,
        float(clip),
        float(clamp),
        float(denominator_eps),
    )
    from .observe import state_observables

    scale = jnp.minimum(setup.eta_qk, setup.eta_ov)
    state = {"mu_ov": ys[:, 0], "mu_qk": ys[:, 1]}
    t_event = jnp.where(hit, k_end * d_tau / scale, jnp.nan)
    return Trajectory(
        tau / scale,
        state_observables(state, setup),
        {
            "theory": "qkov",
            "integrator": "authors_rk4",
            "d_tau": d_tau,
            "parametrisation": setup.parametrisation,
            "clock": "t = tau / min(eta_qk, eta_ov)",
        },
        t_event=t_event,
    )


@filter_jit
def _rk4(setup, y0, loss_target, save_steps, max_steps, d_tau, clip, clamp, eps):
    dtype = y0.dtype
    scale = jnp.minimum(setup.eta_ov, setup.eta_qk)
    m, n, b, M, c = float(setup.m), float(setup.n), float(setup.b), float(setup.M), setup.score_scale
    p = float(setup.query_power)

    def ex(x):
        return jnp.exp(jnp.clip(x, -clip, clip))

    def alpha_of(mu_qk):
        em = ex(mu_qk)
        return m * em / (m * em + n + eps)

    def rates(y):
        mu_ov, mu_qk = y[0], y[1]
        a = alpha_of(mu_qk)
        E = ex(a * mu_ov) + M - 1.0 + eps
        g_ov = 2.0 * np.sqrt(b) * mu_ov if setup.factorised_ov else 1.0
        g_qk = 2.0 * setup.s_qk * mu_qk / c if setup.factorised_qk else 1.0
        d_ov = setup.eta_ov * a / (b * E + eps) * g_ov
        d_qk = setup.kappa * c**2 * setup.eta_qk * (M - 1.0) * a * (1.0 - a) * mu_ov / (M * b**p * E + eps) * g_qk
        return jnp.stack([d_ov, d_qk]) / scale

    def loss_of(y):
        return jnp.log(1.0 + (M - 1.0) * ex(-alpha_of(y[1]) * y[0]))

    save_idx = jnp.asarray(save_steps)
    ns = len(save_steps)

    def cond(carry):
        k, y, _, _ = carry
        return (k < max_steps) & (loss_of(y) > loss_target)

    def body(carry):
        k, y, buf, ptr = carry
        h = d_tau
        k1 = rates(y)
        k2 = rates(y + 0.5 * h * k1)
        k3 = rates(y + 0.5 * h * k2)
        k4 = rates(y + h * k3)
        y = jnp.clip(y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), 0.0, clamp)
        k = k + 1
        j = jnp.minimum(ptr, ns - 1)
        hit = save_idx[j] == k
        buf = jnp.where(hit, buf.at[j].set(jnp.concatenate([k[None].astype(dtype) * d_tau, y])), buf)
        return k, y, buf, ptr + hit.astype(ptr.dtype)

    first = jnp.concatenate([jnp.zeros(1, dtype), y0])
    buf0 = jnp.zeros((ns, 3), dtype).at[0].set(first)
    ptr0 = jnp.asarray(1 if save_steps[0] == 0 else 0)
    k, y, buf, ptr = jax.lax.while_loop(cond, body, (jnp.asarray(0), y0, buf0, ptr0))
    final = jnp.concatenate([k[None].astype(dtype) * d_tau, y])
    filled = jnp.where((jnp.arange(ns) < ptr)[:, None], buf, final[None])
    filled = filled.at[-1].set(final)
    return filled[:, 0], filled[:, 1:], k, loss_of(y) <= loss_target


# ----------------------------------------------------------------------------- growth laws
def upper_bounds(t: Any, setup: Setup) -> dict:
    """CACO upper bounds (eq. (6), ``kappa = c = 1``): with ``alpha_0 = m / (m + n)``,
    ``mu_OV <= ln(1 + alpha_0 eta_OV t / b) / alpha_0`` and ``mu_QK <= r (M-1) mu_OV^2 / (2 M b)``
    (the latter evaluated at the bound on ``mu_OV``). Valid for every ``t`` of a CACO solve from 0
    with ``kappa = c = 1`` and ``distinct_uniform`` queries; any other setup raises ``ValueError``
    (a CAFO solve exceeds the "bound" on ``mu_OV`` by 14.5 at the defaults)."""
    _check_caco_reference(setup, "upper_bounds")
    a0 = setup.m / (setup.m + setup.n)
    mu_ov = jnp.log1p(a0 * setup.eta_ov * jnp.asarray(t) / setup.b) / a0
    return {"mu_ov": mu_ov, "mu_qk": setup.ratio * (setup.M - 1) / (2 * setup.M * setup.b) * mu_ov**2}


def _check_caco_reference(setup: Setup, what: str) -> None:
    """``ValueError`` unless ``setup`` is the case eqs. (6)-(7) are derived for: CACO, no common
    correction, ``c = 1``, ``distinct_uniform`` queries."""
    _check_setup(setup)
    bad = []
    if setup.parametrisation != "CACO":
        bad.append(f"parametrisation={setup.parametrisation!r}")
    if setup.common_correction:
        bad.append("common_correction=True")
    if not V.any_traced(setup.score_scale) and float(setup.score_scale) != 1.0:
        bad.append(f"score_scale={float(setup.score_scale):g}")
    if setup.query_mode != "distinct_uniform":
        bad.append(f"query_mode={setup.query_mode!r}")
    if bad:
        raise ValueError(
            f"{what} holds for CACO with kappa = c = 1 and distinct_uniform queries (eqs. (6)-(7)); this setup has "
            f"{', '.join(bad)}"
        )


def large_t_asymptotics(t: Any, setup: Setup) -> dict:
    """Leading-order large-``t`` formulas of CACO (eq. (7), ``kappa = c = 1``), NOT the
    integrated state (use `solve` for that; the formulas hold up to ``o(1)`` corrections that
    decay only like ``1 / log t``):

    ``mu_OV ~ ln(eta_OV t / b)``, ``e^{mu_QK} ~ n r (M-1) mu_OV^2 / (2 M b m)``,
    ``1 - alpha ~ 2 M b / (r (M-1) mu_OV^2)``, ``L ~ (M-1) b / (eta_OV t)``;
    returned as ``mu_ov``, ``mu_qk``, ``one_minus_alpha``, ``loss``. Other setups than CACO with
    ``kappa = c = 1`` and ``distinct_uniform`` queries raise ``ValueError``."""
    _check_caco_reference(setup, "large_t_asymptotics")
    t = jnp.asarray(t)
    mu_ov = jnp.log(setup.eta_ov * t / setup.b)
    r = setup.ratio
    return {
        "mu_ov": mu_ov,
        "mu_qk": jnp.log(setup.n * r * (setup.M - 1) * mu_ov**2 / (2 * setup.M * setup.b * setup.m)),
        "one_minus_alpha": 2 * setup.M * setup.b / (r * (setup.M - 1) * mu_ov**2),
        "loss": (setup.M - 1) * setup.b / (setup.eta_ov * t),
    }


def effective_rate(eta_A: Any, eta_B: Any, sigma: Any) -> jax.Array:
    """Implicit learning rate of a weighted-balanced factorised circuit, ``2 sqrt(eta_A eta_B) sigma(W)``
    (eq. (8)), ``sigma(W)`` its singular value on the invariant manifold."""
    return 2.0 * jnp.sqrt(jnp.asarray(eta_A) * jnp.asarray(eta_B)) * jnp.asarray(sigma)


def escape_time(
    setup: Setup,
    threshold: Any,
    *,
    t1: Any,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The first time the population loss (the observable ``loss``) falls to ``threshold`` along the
    reduced flow (3) (the ``t`` of `reach_loss`, without its state): the event time of `solve`
    with the event ``loss - threshold`` from the setup's start (`attnflow.crossing_time` on
    `ode`), NaN if it has not by ``t1``. The same verb as `attnflow.focus.escape_time` and
    `attnflow.heads.escape_time`: traceable (``jax.jit``, ``jax.vmap``, `attnflow.sweep`) and
    differentiable with `attnflow.sensitivity` (the event time's derivative, eq. (S1) there).
    ``threshold`` is checked as ``loss_target`` in `solve`: ``ValueError`` unless it is finite,
    positive and below the start's ``loss`` (traced, a point of `attnflow.sweep` fails with the
    same message)."""
    _check_setup(setup)
    _check_loss_target(threshold, lambda: _start_loss(setup, None), "threshold")
    return crossing_time(ode(setup), "loss", threshold, t1, solver=solver, progress=progress)
