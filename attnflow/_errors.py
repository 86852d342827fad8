"""Failures inside traced code: raise (one run) or mark the point and carry on (a sweep).

`fail_if(tree, pred, message)` is what attnflow's verbs call where a traced run can fail
(an ODE that used up ``max_steps`` or diverged, an SGD run that diverged). Outside a sweep
it is ``equinox.error_if``: the program stops with ``message``. Inside `attnflow.sweep`,
which traces each grid point under `collecting`, it instead replaces the floating outputs
of the failing point by NaN and records ``pred`` and ``message``; the sweep returns a
status per point, so one diverging point does not throw away the others, and names the
failing coordinates.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend.core import get_opaque_trace_state

__all__ = ["fail_if", "warn_traced", "collecting", "status_code", "check_traced", "blank_failed"]


class _Sink(list):
    """The failures recorded by `collecting`, the warnings (`warn_traced`), and the trace it
    records them for."""

    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[tuple[Any, str]] = []
        self.trace = get_opaque_trace_state()


_SINK: contextvars.ContextVar[_Sink | None] = contextvars.ContextVar("attnflow_fail_sink", default=None)


def fail_if(tree: Any, pred: Any, message: str) -> Any:
    """``tree``, failing with ``message`` where the (traced) boolean ``pred`` is true.

    Outside `collecting`: ``equinox.error_if`` (a runtime error). Inside: the inexact leaves
    of ``tree`` become NaN where ``pred`` holds, and ``(pred, message)`` is recorded; but only
    in the trace `collecting` was entered in, or one nested in it by ``jax.jvp``,
    ``jax.grad`` (its linearisation) or ``jax.vmap`` (`_in_point`: the point fails where any
    lane of such a ``vmap`` does); inside a further ``jit``, ``lax`` loop or ``cond`` of the user's (whose
    values cannot leave it), ``equinox.error_if`` again.
    """
    sink = _SINK.get()
    point_pred = _in_point(pred, sink)
    if point_pred is None:
        # raise whatever equinox's default mode (EQX_ON_ERROR) is: an attnflow failure is never
        # silently turned into NaN. The values become NaN, derivatives included, too: a
        # forward-mode derivative that is all a caller keeps leaves the check out of the program
        # (its value is unused), and must not then be a finite number from a failed solve
        tree = jax.tree_util.tree_map(lambda x: nan_where(pred, x) if eqx.is_inexact_array(x) else x, tree)
        return eqx.error_if(tree, pred, message, on_error="raise")
    assert sink is not None  # _in_point found the current trace nested in the sink's
    sink.append((point_pred, message))
    # ``pred`` itself, not the point's: under a vmap inside the point only the failing lanes are NaN
    return _blank(tree, pred)


def check_traced(bad: Any, message: str) -> None:
    """Record the failure ``message`` where ``bad()`` (a traced boolean) holds, when traced
    inside `collecting` (a sweep point: the point is marked failed and its values become
    NaN). Elsewhere nothing: the check has no output to carry an error, so the value is let
    through (checked where it was made)."""
    sink = _SINK.get()
    if not _nested_in(sink):
        return
    point_bad = _in_point(jnp.asarray(bad()), sink)
    if sink is not None and point_bad is not None:
        sink.append((point_bad, message))


def warn_traced(bad: Any, message: str) -> None:
    """Record the warning ``message`` where ``bad()`` (a traced boolean) holds, when traced inside
    `collecting` (a sweep point: the point keeps its values, and the sweep names it with the
    warning). Elsewhere nothing: a verb warns about concrete values itself, and a traced value
    outside a sweep has no place to report to."""
    sink = _SINK.get()
    if not _nested_in(sink):
        return
    point_bad = _in_point(jnp.asarray(bad()), sink)
    if sink is not None and point_bad is not None:
        sink.warnings.append((point_bad, message))


def recording() -> bool:
    """Whether `check_traced` records here (inside `collecting`, in its trace or one nested in
    it by ``jax.jvp``, ``jax.grad`` or ``jax.vmap``: a sweep point, `_nested_in`), so that a
    value it refuses may be replaced by a harmless stand-in (the point's values become NaN
    anyway). Elsewhere a refused traced value must be let through as given."""
    return _nested_in(_SINK.get())


# The transformations whose values can be brought back to the trace they are nested in: a
# forward-mode (or linearised) value by its primal, a batched one by `any` over its batch axis.
# By name: `jax.extend` exports none of these classes. A jit, loop or cond body (DynamicJaxprTrace)
# is not one: its values cannot leave it.
_NESTING = frozenset({"JVPTrace", "LinearizeTrace", "BatchTrace"})


def _trace(state: Any) -> Any:
    """The trace behind an opaque trace state (None if this JAX hides it)."""
    ref = getattr(state, "_trace_ref", None)
    return ref() if ref is not None else None


def _nested_in(sink: _Sink | None) -> bool:
    """Whether the current trace is ``sink``'s, or nested in it by `_NESTING` transformations
    only (a ``jax.jvp``, ``jax.grad`` or ``jax.vmap`` inside a sweep point): its failures can
    be recorded."""
    if sink is None:
        return False
    state = get_opaque_trace_state()
    if state == sink.trace:
        return True
    trace, target = _trace(state), _trace(sink.trace)
    while target is not None and type(trace).__name__ in _NESTING:
        trace = getattr(trace, "parent_trace", None)
        if trace is target:
            return True
    return False


def _in_point(pred: Any, sink: _Sink | None) -> Any:
    """``pred`` as a value of ``sink``'s trace (a sweep point), or None where it cannot be one
    (no sink; a trace not nested in it by `_NESTING` only). A forward-mode tracer gives its
    primal (a boolean has no tangent); a ``vmap`` inside the point gives `any` over its lanes."""
    if sink is None or not _nested_in(sink):
        return None
    outer = []  # the sink's trace and those it is nested in: their values are the point's
    trace = _trace(sink.trace)
    while trace is not None:
        outer.append(trace)
        trace = getattr(trace, "parent_trace", None)
    x = pred
    while isinstance(x, jax.core.Tracer):
        trace = getattr(x, "_trace", None)
        if any(trace is t for t in outer):
            return x
        kind = type(trace).__name__
        if kind == "BatchTrace":
            # bound in the current (innermost) trace, the unbatched reduction passes to the outer
            # traces, down to that of ``x.val``
            if x.batch_dim is None:
                x = x.val
            elif isinstance(x.batch_dim, int):
                x = jnp.any(x.val, axis=x.batch_dim)
            else:
                return None
        elif kind in ("JVPTrace", "LinearizeTrace"):
            x = x.primal
        else:
            return None
    return x


def blank_failed(tree: Any, code: Any) -> Any:
    """The inexact leaves of ``tree`` as NaN where the status ``code`` is nonzero."""
    return _blank(tree, code > 0)


def _blank(tree: Any, mask: Any) -> Any:
    """The inexact leaves of ``tree`` as NaN where the boolean ``mask`` holds."""

    def blank(x):
        if isinstance(x, jax.Array | jnp.ndarray) and jnp.issubdtype(x.dtype, jnp.inexact):
            return jnp.where(mask, jnp.asarray(jnp.nan, x.dtype), x)
        return x

    return jax.tree_util.tree_map(blank, tree)


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[Any, str]]]:
    """Record the failures of `fail_if` calls traced inside the block instead of raising."""
    sink = _Sink()
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def status_code(failures: list[tuple[Any, str]], warned: Sequence[tuple[Any, str]] = ()) -> jax.Array:
    """``1 +`` the index of the first recorded failure that holds; else, where a warning holds,
    ``-2 - (len(failures) + j)`` for the first such warning ``j`` (its message's index in
    ``failures + warned``, as `attnflow.SweepResult.status` reads it); else ``0``."""
    code = jnp.zeros((), jnp.int32)
    for j, (pred, _) in reversed(list(enumerate(warned))):
        code = jnp.where(pred, jnp.int32(-2 - len(failures) - j), code)
    for i, (pred, _) in reversed(list(enumerate(failures))):
        code = jnp.where(pred, jnp.int32(i + 1), code)
    return code


def nan_where(bad: Any, x: Any) -> Any:
    """``x``, NaN where ``bad``, and so is its forward-mode derivative (``jnp.where(bad, nan, x)``
    has the derivative 0 there). For `fail_if`: a forward-mode derivative that is all a caller
    keeps must not be a finite number from a failed solve. No cotangent enters ``x``'s own
    computation where ``bad`` (a NaN sent back through a solver's adjoint fails its linear solve)."""
    return _nan_where(bad, jnp.where(bad, jax.lax.stop_gradient(x), x))


@jax.custom_jvp
def _nan_where(bad: Any, x: Any) -> Any:
    return jnp.where(bad, jnp.nan, x)


@_nan_where.defjvp
def _nan_where_jvp(primals: Any, tangents: Any) -> Any:
    bad, x = primals
    _, dx = tangents
    # a factor, not a where: the tangent stays linear in dx, so reverse mode transposes it
    return _nan_where(bad, x), dx * jnp.where(bad, jnp.nan, 1.0).astype(jnp.result_type(dx))
