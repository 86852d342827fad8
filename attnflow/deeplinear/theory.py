"""Gradient-flow theory of the two-layer linear network (Saxe, McClelland & Ganguli 2014).

With whitened inputs the population loss is ``L = 1/2 ||A - W2 W1||_F^2`` and gradient
flow with time constant ``tau`` (``tau = 1/eta`` in steps of learning rate ``eta``) is

    tau dW1/dt = W2^T (A - W2 W1),     tau dW2/dt = (A - W2 W1) W1^T.          (1)

On the balanced, mode-aligned manifold each mode strength ``u = a b`` obeys

    tau du/dt = 2 u (s - u),   u(t) = s e^{2st/tau} / (e^{2st/tau} - 1 + s/u0).    (2)

and the factors obey ``tau da/dt = b (s - a b)``, ``tau db/dt = a (s - a b)`` (3), whose
origin is a saddle with eigenvalues ``+-s / tau``. Flow (1) conserves
``W1 W1^T - W2^T W2`` (4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _validate as V
from .._keywords import keyword_hints
from ..ode import ODE, crossing_time, with_progress
from ..options import LinearGrid, SaveGrid, SolverOptions
from ..sensitivity import Sensitivity, sensitivity, solver_for_mode
from ..trajectory import Trajectory

__all__ = [
    "escape_time",
    "escape_time_sensitivity",
    "population_loss",
    "mode_strength",
    "mode_field",
    "factor_field",
    "matrix_field",
    "conserved",
    "solve",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
]


def population_loss(W1: jax.Array, W2: jax.Array, A: jax.Array) -> jax.Array:
    """``1/2 ||A - W2 W1||_F^2`` (whitened inputs, constant dropped)."""
    return 0.5 * jnp.sum((A - W2 @ W1) ** 2)


def mode_strength(t: Any, s: Any, u0: Any, tau: Any = 1.0) -> jax.Array:
    """Closed form (2): ``u(t) = s e^{2st/tau} / (e^{2st/tau} - 1 + s/u0)``.

    Written as ``s / (1 - e^{-2st/tau} (1 - s/u0))`` to avoid overflow at large t.
    """
    e = jnp.exp(-2.0 * jnp.asarray(s) * jnp.asarray(t) / tau)
    return s / (1.0 - e * (1.0 - s / jnp.asarray(u0)))


def mode_field(t: Any, u: jax.Array, args: dict) -> jax.Array:
    """Eq. (2): ``du/dt = 2 u (s - u) / tau``; ``args = {"s": s, "tau": tau}``."""
    return 2.0 * u * (args["s"] - u) / args["tau"]


def factor_field(t: Any, y: dict, args: dict) -> dict:
    """Eq. (3) on the state ``{"a": a, "b": b}`` (one entry per mode)."""
    a, b = y["a"], y["b"]
    r = (args["s"] - a * b) / args["tau"]
    return {"a": b * r, "b": a * r}


def matrix_field(t: Any, W: dict, args: dict) -> dict:
    """Eq. (1) on ``{"W1": W1, "W2": W2}``; ``args = {"A": A, "tau": tau}``."""
    E = (args["A"] - W["W2"] @ W["W1"]) / args["tau"]
    return {"W1": W["W2"].T @ E, "W2": E @ W["W1"].T}


def conserved(W1: jax.Array, W2: jax.Array, layer_ratio: Any = 1.0) -> jax.Array:
    """Eq. (4): ``W1 W1^T - W2^T W2``, constant under gradient flow (1); with per-layer rates
    ``eta_1 / eta_2 = layer_ratio = rho``, ``eta (W1 W1^T / eta_1 - W2^T W2 / eta_2) =
    W1 W1^T / sqrt(rho) - sqrt(rho) W2^T W2``, zero at `TwoLayerLinear.aligned`'s start."""
    root = jnp.sqrt(jnp.asarray(layer_ratio, W1.dtype))
    return W1 @ W1.T / root - root * W2.T @ W2


# ----------------------------------------------------------------------------- solve
DEFAULT_SAVE = LinearGrid(200)
"""`solve`'s save grid when none is given."""

DEFAULT_SOLVER = SolverOptions(rtol=1e-10, atol=1e-12)
"""`solve`'s solver options when none are given (tight: the closed form is the reference)."""


def _setup_mode_field(t: Any, u: jax.Array, setup: Any) -> jax.Array:
    # eq. (2) with tau = 1 / eta
    return 2.0 * setup.eta * u * (setup.s - u)


def _setup_observe(t: Any, u: jax.Array, setup: Any) -> dict:
    from .observe import mode_observables

    return mode_observables(u, setup.s)


def ode(setup: Any) -> ODE:
    """The mode ODE (2) of ``setup`` as an `attnflow.ODE`: ``ode(t, u)`` is
    ``2 eta u (s - u)``, ``ode.y0`` the modes' start ``u0``, ``ode.observables(u)``
    `attnflow.deeplinear.OBSERVABLES`, and ``ode.solve(t1)`` is ``solve(setup, t1)``. Its state
    is the array ``u`` of shape ``(k,)``; ``args`` is the setup.
    """
    from .setup import Setup

    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.deeplinear.Setup, got {setup!r}")
    return ODE(
        _setup_mode_field,
        setup,
        setup.initial_state(),
        _setup_observe,
        DEFAULT_SAVE,
        DEFAULT_SOLVER,
        meta=(
            ("theory", "deeplinear"),
            ("equation", "mode ODE (2)"),
            ("clock", "t; gradient flow dW/dt = -eta grad L"),
        ),
    )


@keyword_hints(
    "deeplinear.solve",
    initial="the start is a field of the setup, deeplinear.Setup(u0=...)",
    loss_target="event=lambda t, obs: obs['loss'] - L stops there; "
    "deeplinear.escape_time(setup, L, t1=...) is its time",
)
def solve(
    setup: Any,
    t1: Any,
    *,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    event: Callable[[Any, dict], Any] | None = None,
    progress: bool | None = None,
) -> Trajectory:
    """The theory of ``setup``: the mode ODE (2), ``du_i/dt = 2 eta u_i (s_i - u_i)`` from
    ``u_i(0) = u0``, integrated to ``t1`` (the same clock as `attnflow.deeplinear.train`).

    Records `attnflow.deeplinear.OBSERVABLES` (``u`` of shape ``(T, k)``, ``loss`` of shape
    ``(T,)``). Default save grid `DEFAULT_SAVE`, solver `DEFAULT_SOLVER`. The closed form is
    `mode_strength` with ``tau = 1 / eta``.

    ``event(t, obs) -> scalar`` on the observables ``obs`` (a dict of `attnflow.deeplinear.OBSERVABLES` at time
    ``t``) stops the solve where it first changes sign, e.g. ``lambda t, o: o["loss"] - 0.1``;
    ``traj.t_event`` is that time (NaN if it never does) and the save points after it hold the
    event state; traceable under ``jit``, ``vmap`` and `attnflow.sweep` (`attnflow.ObservableEvent`).
    ``progress=True`` shows the solve's progress meter with the solver it would use anyway
    (``solver``, else `DEFAULT_SOLVER`), where ``solver=af.SolverOptions(progress=True)`` would
    replace the package's solver and tolerances by the core's defaults.
    """
    return ode(setup).solve(t1, save=save, solver=solver, event=event, progress=progress)


def escape_time(
    setup: Any,
    threshold: Any,
    *,
    t1: Any,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The first time the population loss (the observable ``loss``) falls to ``threshold`` along the
    gradient flow: the event time of `solve` with the event ``loss - threshold`` from the setup's
    start (`attnflow.crossing_time` on `ode`), NaN if it has not by ``t1``. The same verb as
    `attnflow.focus.escape_time` and `attnflow.heads.escape_time`: traceable (``jax.jit``,
    ``jax.vmap``, `attnflow.sweep`) and differentiable with `attnflow.sensitivity` (the event
    time's derivative, eq. (S1) there); `escape_time_sensitivity` gives its derivatives in
    ``eta``, ``s`` and ``u0``. ``ValueError`` for a concrete ``threshold`` not below the start's
    ``loss``, or not above 0: the loss ``1/2 sum_i (s_i - u_i)^2`` reaches 0 only as
    ``t -> inf`` (a traced one there gives NaN, the event never firing)."""
    _check_escape(setup, threshold, t1)
    return crossing_time(ode(setup), "loss", threshold, t1, solver=solver, progress=progress)


def _check_escape(setup: Any, threshold: Any, t1: Any) -> None:
    """The checks of `escape_time` on concrete values: a `Setup`, a positive ``t1``, a finite
    ``threshold`` in ``(0, loss at the start)``."""
    from .observe import mode_observables
    from .setup import Setup

    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.deeplinear.Setup, got {setup!r}")
    if not V.any_traced(t1):
        V.positive("t1 (horizon)", t1)
    if V.any_traced(threshold):
        return
    value = V.finite_scalar("threshold", threshold)
    if value <= 0.0:
        raise ValueError(
            f"threshold = {V.show(threshold)} must lie above 0: the loss 1/2 sum_i (s_i - u_i)^2 reaches 0 only "
            "as t -> inf, so the solve would never stop"
        )
    if not V.any_traced((setup.s, setup.u0)):
        # also checked by crossing_time, but escape_time_sensitivity's solve sees s and u0 traced
        start = float(mode_observables(setup.initial_state(), setup.s)["loss"])
        if not value < start:
            raise ValueError(
                f"threshold = {V.show(threshold)} must lie below the start value of 'loss', {start:.6g}: "
                "the solve would stop at once"
            )


def escape_time_sensitivity(
    setup: Any,
    threshold: Any,
    *,
    t1: Any,
    solver: SolverOptions | None = None,
    mode: str = "forward",
    progress: bool | None = None,
) -> Sensitivity:
    """`escape_time` and its derivatives in the learning rate ``eta``, the mode strengths ``s`` and the
    initial strength ``u0``, through the mode ODE (2) and its stopping event ``loss = threshold``
    (the implicit-function formula (S1) of `attnflow.sensitivity`); ``threshold`` stays fixed.

    Returns a `attnflow.Sensitivity`: ``.value`` is ``t_esc`` (NaN, with NaN derivatives, if the
    loss has not fallen to ``threshold`` by ``t1``), ``.grad["eta"]`` a number, ``.grad["s"]`` one
    derivative per mode (shape ``(k,)``), ``.grad["u0"]`` the shape of ``u0`` (a number, or one
    per mode). Time scales as ``1 / eta`` in (2), so ``d t_esc / d eta = -t_esc / eta``; for one
    mode ``t_esc = log((s/u0 - 1) / (s/u* - 1)) / (2 s eta)`` with ``u* = s - sqrt(2 threshold)``,
    so ``d t_esc / d u0 = -1 / (2 eta u0 (s - u0))``. At the reference `Setup` with
    ``threshold = 1`` (``t1 = 10``): ``t_esc = 1.9415``, ``d/d eta = -1.9415``,
    ``d/d u0 = -260.81``, ``d/d s = (-0.0094, -0.5762, 0.4053, 0.2469)``: the loss falls to 1
    while the mode ``s = 2`` is learned, which a stronger ``s_2`` hastens, and the weak modes'
    ``s_i^2 / 2`` raise the plateau it must fall from (implicit differentiation of the closed
    form (2) agrees to 1e-8). The solver is `DEFAULT_SOLVER` unless given.

    ``mode``: ``"forward"`` (default) is ``jax.jacfwd`` with Diffrax's ``ForwardMode`` adjoint;
    ``"reverse"`` is ``jax.jacrev`` with the solver's adjoint (`attnflow.solver_for_mode`). Both give
    the same numbers. Traceable: ``jax.jit``, ``jax.vmap`` over setups, `attnflow.sweep`. Float64.
    The same verb as `attnflow.focus.escape_time_sensitivity` and
    `attnflow.heads.escape_time_sensitivity`.

    Raises ``ValueError`` naming the value for the bad inputs of `escape_time`, an unknown ``mode``
    or an adjoint that does not fit it.
    """
    _check_escape(setup, threshold, t1)
    solver = solver_for_mode(mode, with_progress(solver, DEFAULT_SOLVER, progress))

    def outcome(eta: Any, s: Any, u0: Any) -> jax.Array:
        return escape_time(setup.replace(eta=eta, s=s, u0=u0), threshold, t1=t1, solver=solver)

    return sensitivity(outcome, mode=mode, eta=setup.eta, s=setup.s, u0=setup.u0)
