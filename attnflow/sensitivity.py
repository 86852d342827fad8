"""Sensitivities: derivatives of a theory's outcome with respect to named parameters.

An *outcome* is any number computed from a solve: the state or an observable at the end,
the time an event fires (``Trajectory.t_event``), a value read off a trajectory. `sensitivity`
returns the outcome and its derivative with respect to every named parameter, by
reverse-mode differentiation through `attnflow.integrate` (Diffrax's checkpointed adjoint,
the discretise-then-differentiate derivative of the adaptive solve).

Event times. A solve stopped by ``event=g`` ends at ``t*(p)`` with ``g(t*, y(t*; p), p) = 0``;
its derivative is the implicit-function formula

    dt*/dp = -(dg/dp) / (dg/dt),   dg/dt = d_t g + grad_y g . f(t*, y(t*), p),        (S1)

with ``dg/dp`` the total derivative at fixed ``t`` (through ``y(t; p)`` and ``p``), and the state
at the event moves by ``dy(t*)/dp = d_p y(t*; p) + f(t*, y(t*), p) dt*/dp`` (S2). Diffrax locates
``t*`` by an Optimistix root find on the solver's dense interpolant, and Optimistix
differentiates roots by the implicit function theorem, which is (S1) on the interpolant; the
final state is the interpolant at ``t*``, which gives (S2). Nothing needs adding: tested
against the closed form of a logistic flow, against central differences, and under ``jit`` and
``vmap`` for Diffrax's ``RecursiveCheckpointAdjoint`` (the default), ``DirectAdjoint`` and
``ForwardMode`` (pass ``SolverOptions(adjoint=...)`` to `integrate`, and use ``jax.jacfwd`` with
``ForwardMode``; Diffrax refuses ``BacksolveAdjoint`` with events and with the saving of `integrate`).

`central_difference` gives the finite-difference estimate of the same derivatives, the check
of every gradient in the test suite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _validate as V
from .options import SolverOptions
from .trajectory import Trajectory

__all__ = ["MODES", "Sensitivity", "central_difference", "sensitivity", "solver_for_mode"]

MODES = ("reverse", "forward")
"""How `sensitivity` differentiates: ``jax.jacrev`` or ``jax.jacfwd``."""


class Sensitivity(eqx.Module):
    """An outcome and its derivatives (the result of `sensitivity`).

    - ``value``: what ``fn(**params)`` returned (a scalar, an array or a pytree of them);
    - ``grad``: ``{name: derivative}``, for each parameter the derivative of ``value`` with the
      structure of ``value``; a leaf of shape ``S`` differentiated by a parameter of shape ``P``
      has shape ``S + P`` (the Jacobian; ``S = P = ()`` gives the plain derivative).
    """

    value: Any
    grad: dict[str, Any]

    def __repr__(self) -> str:
        # numbers, not only shapes, where the outcome is a few numbers (a time, a loss)
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((self.value, self.grad))):
            return super().__repr__()

        class _Shape:  # a large array by dtype and shape, as Equinox prints a module
            def __init__(self, x):
                self.text = f"{np.dtype(x.dtype).str[1:]}{list(x.shape)}"

            def __repr__(self):
                return self.text

        def show(x):
            if not hasattr(x, "shape"):  # a Trajectory prints its observables' shapes itself
                return x
            return _Shape(x) if x.size > 8 else np.asarray(x).tolist()

        def tree(x):
            return jax.tree_util.tree_map(show, x, is_leaf=lambda y: isinstance(y, Trajectory))

        value = tree(self.value)
        grad = {k: tree(g) for k, g in self.grad.items()}
        return f"Sensitivity(value={value!r}, grad={grad!r})"


def _check(fn: Any, params: Mapping[str, Any]) -> dict[str, jax.Array]:
    if not callable(fn):
        raise ValueError(f"fn must be callable (**params) -> outcome, got {fn!r}")
    if not params:
        raise ValueError("give at least one parameter to differentiate by, as a keyword: sensitivity(fn, eta=0.5)")
    out = {}
    dtype = jnp.result_type(float)
    for name, value in params.items():
        if V.any_traced(value):
            out[name] = jnp.asarray(value, dtype=jnp.result_type(value, dtype))
            continue
        arr = V.reals(f"parameter {name!r}", value)
        V.finite_tree(f"parameter {name!r}", arr)
        out[name] = jnp.asarray(arr, dtype=dtype)
    return out


def sensitivity(fn: Callable[..., Any], /, mode: str = "reverse", **params: Any) -> Sensitivity:
    """The outcome ``fn(**params)`` and its derivatives with respect to each named parameter.

    ``fn`` takes the parameters as keywords and returns the outcome: typically it builds a
    setup from them, solves (`attnflow.integrate` or a theory's ``solve``, possibly with an
    ``event``) and reads a number off the trajectory (``traj.t_event``, ``traj.final()[name]``).
    The derivative is taken by reverse mode through the solve, including the event time,
    whose derivative is the implicit-function formula (S1) of this module's documentation
    (Diffrax provides it; tested against closed forms and finite differences).

    The outcome is an array or a pytree of them, a `Trajectory` included (``fn`` may return a
    whole solve: ``grad[name]`` is then a `Trajectory` holding ``d y(t) / d name`` of every
    observable at every save time). Floating leaves are differentiated; integer and boolean
    leaves (a solve's ``stats`` counts, flags) are returned as they are in ``value`` and get a zero
    derivative (float, of shape leaf + parameter) in ``grad``. Where the outcome is NaN (an event
    that never fired by ``t1``), its derivatives are NaN too: differentiation itself gives the 0
    of the ``where`` that made it NaN (which a ``jax.grad`` of your own keeps, so that
    ``jnp.nanmean`` masks work), and a 0 would read as a real derivative.

    Parameters are real numbers or arrays (floats become float arrays, so new values reuse the
    compilation); they may be traced, so `sensitivity` works inside ``jax.jit``, ``jax.vmap`` and
    `attnflow.sweep`. Returns a `Sensitivity` (``.value``, ``.grad[name]``).

    ``mode="forward"`` differentiates with ``jax.jacfwd`` instead: cheaper for few parameters
    and often faster to compile; a solve inside ``fn`` then needs Diffrax's ``ForwardMode``
    adjoint (`solver_for_mode`). (A parameter cannot be called ``mode``.) Gradient descent and
    SGD (a package's ``train``, `attnflow.simulate`) loop for a number of steps JAX sees only at
    run time, which reverse mode cannot differentiate: there the default mode raises JAX's
    ``ValueError`` with a line added that says to pass ``mode="forward"``.

    A non-callable ``fn``, no parameters, an unknown ``mode``, or a parameter that is not a
    finite real number or array raises ``ValueError`` naming it.

    ```python
    def t_half(s, eta):                     # time the logistic flow reaches s / 2
        traj = af.integrate(logistic, 1e-3, 50.0, args={"s": s, "eta": eta},
                            event=half_learned, save=af.LinearGrid(2))
        return traj.t_event

    res = af.sensitivity(t_half, s=2.0, eta=1.0)
    res.value, res.grad["s"], res.grad["eta"]
    ```
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    p = _check(fn, params)
    structure = {}  # the outcome's tree and which leaves are floating, found while tracing

    def outcome(q):
        leaves, structure["tree"] = jax.tree_util.tree_flatten(fn(**q))
        leaves = [jnp.asarray(x) for x in leaves]
        # integer and boolean leaves (a Trajectory's solver counts, flags) have no derivative
        structure["floating"] = [jnp.issubdtype(x.dtype, jnp.inexact) for x in leaves]
        return [x for x, f in zip(leaves, structure["floating"]) if f], leaves

    try:
        jac, leaves = (jax.jacrev if mode == "reverse" else jax.jacfwd)(outcome, has_aux=True)(p)
    except ValueError as err:
        if mode == "reverse" and "Reverse-mode differentiation does not work for lax.while_loop" in str(err):
            raise ValueError(
                f"{err}\nsensitivity: fn runs a loop whose length JAX sees only at run time (gradient descent or "
                "SGD in a package's train, attnflow.simulate), which reverse mode cannot differentiate: pass "
                "mode='forward' (and a solve inside fn needs solver_for_mode('forward', solver))"
            ) from None
        raise
    # jacrev gives the parameter dict in each differentiated leaf: put the names outside, and
    # give the other leaves a zero derivative of shape leaf + parameter
    grad = {}
    for name, x in p.items():
        rows = iter(jac)
        grad[name] = structure["tree"].unflatten(
            [
                _undefined_as_nan(v, next(rows)[name]) if f else jnp.zeros(v.shape + x.shape, x.dtype)
                for v, f in zip(leaves, structure["floating"])
            ]
        )
    return Sensitivity(structure["tree"].unflatten(leaves), grad)


def _undefined_as_nan(value: jax.Array, d: jax.Array) -> jax.Array:
    """``d`` (shape value + parameter), NaN where ``value`` is NaN: an outcome that is not defined
    (an event that never fired) has no derivative, where differentiation gives the 0 of the
    ``where`` that made it NaN. Applied after differentiating, so that a user's own ``jax.grad``
    keeps that 0, which masks (``jnp.nanmean``) rely on."""
    bad = jnp.isnan(value).reshape(value.shape + (1,) * (d.ndim - value.ndim))
    return jnp.where(bad, jnp.nan, d)


def solver_for_mode(mode: str, solver: SolverOptions) -> SolverOptions:
    """``solver`` with the adjoint that differentiation ``mode`` needs through a solve: Diffrax's
    ``ForwardMode`` for ``"forward"`` (set when ``solver.adjoint`` is None); for ``"reverse"`` the
    default checkpointed adjoint or ``DirectAdjoint`` (``ForwardMode`` is forward only, and
    Diffrax refuses ``BacksolveAdjoint`` with events). A mismatch raises ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(solver, SolverOptions):
        # None cannot stand for a package's defaults here: its tolerances would be lost
        raise ValueError(
            f"solver must be SolverOptions, got {solver!r}; for a package's defaults pass its "
            "DEFAULT_SOLVER (e.g. solver_for_mode('forward', heads.DEFAULT_SOLVER))"
        )
    adj = solver.adjoint
    if mode == "forward":
        if adj is None:
            return solver.replace(adjoint=diffrax.ForwardMode())
        if not isinstance(adj, diffrax.ForwardMode):
            raise ValueError(f"mode='forward' needs solver.adjoint None or diffrax.ForwardMode(), got {adj!r}")
        return solver
    if isinstance(adj, (diffrax.ForwardMode, diffrax.BacksolveAdjoint)):
        raise ValueError(
            f"mode='reverse' needs solver.adjoint None (RecursiveCheckpointAdjoint) or diffrax.DirectAdjoint(), "
            f"got {adj!r} (ForwardMode is forward only; Diffrax refuses BacksolveAdjoint with events)"
        )
    return solver


def central_difference(fn: Callable[..., Any], /, *, step: float = 1e-4, relative: bool = True, **params: Any) -> dict:
    """Central finite differences of ``fn(**params)``: ``{name: (f(p + h) - f(p - h)) / 2h}``
    for each scalar parameter, with the structure of the outcome.

    ``h = step * |p|`` with ``relative=True`` (``step`` where ``p = 0``), else ``h = step``.
    The truncation error is ``O(h^2)``; with an adaptive solve inside ``fn`` the two evaluations
    take different steps, so the estimate also carries about ``solver rtol / h`` of noise:
    ``step = 1e-4`` with ``rtol = 1e-10`` gives about 1e-6 relative. The check of `sensitivity`.
    Array parameters raise ``ValueError`` (difference their entries one by one).
    """
    p = _check(fn, params)
    step = V.finite_scalar("step", step)
    V.positive("step", step)
    out = {}
    for name, x in p.items():
        if jnp.ndim(x) != 0:
            raise ValueError(f"central_difference: parameter {name!r} must be a scalar, got shape {jnp.shape(x)}")
        h = jnp.where(x != 0, step * jnp.abs(x), step) if relative else jnp.asarray(step, x.dtype)
        up = fn(**{**p, name: x + h})
        down = fn(**{**p, name: x - h})
        out[name] = jax.tree_util.tree_map(lambda a, b, h=h: (jnp.asarray(a) - jnp.asarray(b)) / (2.0 * h), up, down)
    return out
