"""`integrate`: the one verb over Diffrax.

Every reduced or order-parameter ODE of attnflow goes through `integrate`, which
returns a `Trajectory` of named observables. Defaults: Tsit5 (stages unrolled for small
fields, see `UnrolledTsit5`) with a PID controller,
float64, explicit ``max_steps`` whose overflow raises an error naming the time reached,
optional terminating events, optional progress meter. Where to save is a `SaveGrid`
object and how to solve a `SolverOptions` object, passed straight through by every theory
package. Numbers are data: floats in ``args`` (and ``t0``, ``t1``, ``rtol``, ``atol``) become
arrays before compilation, so a new value never compiles again, and everything a sweep
varies may be a traced array: one compilation serves a whole `sweep`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from . import _validate as V
from ._errors import check_traced, fail_if
from ._io import LOG_INTERVAL
from ._jit import filter_jit
from .options import LinearGrid, SaveGrid, SolverOptions, TimeGrid, _caller_outside_attnflow
from .stiff import AutoStiff, KrylovW
from .trajectory import Trajectory, flatten_names

__all__ = [
    "RK4",
    "UnrolledTsit5",
    "crossing_time",
    "integrate",
    "ODE",
    "ObservableEvent",
    "observable_event",
    "gradient_flow",
    "require_x64",
    "enable_x64",
    "x64_enabled",
    "as_data",
    "DivergenceError",
    "MaxStepsError",
    "UNROLL_MAX_PRIMITIVES",
]


_TSIT5 = diffrax.Tsit5.tableau


class RK4(diffrax.AbstractERK):
    """The classical fourth-order Runge--Kutta method (Diffrax ships none), for fixed steps:
    ``k1 = f(t, y)``, ``k2 = f(t + h/2, y + h k1/2)``, ``k3 = f(t + h/2, y + h k2/2)``,
    ``k4 = f(t + h, y + h k3)``, ``y + h (k1 + 2 k2 + 2 k3 + k4) / 6``. It has no error
    estimate: use it with ``diffrax.ConstantStepSize()`` (`SolverOptions.fixed_step`)."""

    tableau: ClassVar[diffrax.ButcherTableau] = diffrax.ButcherTableau(
        c=np.array([0.5, 0.5, 1.0]),
        b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
        b_error=np.zeros(4),
        a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    )
    interpolation_cls: ClassVar[Callable[..., diffrax.AbstractLocalInterpolation]] = (
        diffrax.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms: Any) -> int:
        return 4


class UnrolledTsit5(diffrax.AbstractAdaptiveSolver):
    """Tsitouras' 5(4) pair (Tsitouras 2011) with its seven stages unrolled at trace time.

    The same Butcher tableau, FSAL property, embedded error estimate and fifth-order dense
    interpolation as `diffrax.Tsit5`, so a solve takes the same steps and agrees to
    round-off (tested to 1e-12). Diffrax's generic Runge--Kutta step runs the stages in an
    inner ``while`` loop (it serves implicit and variable-stage schemes); for the small,
    explicit ODEs of attnflow that inner loop, and under `jax.vmap` its per-stage buffer
    updates, cost more than the vector field. Unrolling removes them (measured in
    ``benchmarks/sweep_vs_loop.py``, docs page "Benchmarks"). Any `diffrax.AbstractTerm` with a deterministic
    control (``ODETerm``) works; `integrate`'s default for fields of at most
    `UNROLL_MAX_PRIMITIVES` primitive operations.
    """

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = diffrax.Tsit5.interpolation_cls

    def order(self, terms):
        return 5

    def error_order(self, terms):
        return 5

    def strong_order(self, terms):
        return None

    def init(self, terms, t0, t1, y0, args):
        # FSAL state: the vector field at the start of the next step.
        return terms.vf(t0, y0, args)

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, f0, made_jump):
        if made_jump is not False:
            # After a jump (events, jump_ts) the stored FSAL value is stale.
            f0 = jax.lax.cond(made_jump, lambda: terms.vf(t0, y0, args), lambda: f0)
        control = terms.contr(t0, t1)
        dt = t1 - t0
        ks = [terms.prod(f0, control)]
        y_stage = y0
        for c_i, a_i in zip(_TSIT5.c, _TSIT5.a_lower):
            y_stage = jax.tree_util.tree_map(lambda y, *k: y + _combine(a_i, k), y0, *ks)
            f_i = terms.vf(t0 + float(c_i) * dt, y_stage, args)
            ks.append(terms.prod(f_i, control))
        # FSAL: the last stage sits at (t1, y1) with the weights b_sol, so it is y1 and f(t1, y1).
        y1, f1 = y_stage, f_i
        y_error = jax.tree_util.tree_map(lambda *k: _combine(_TSIT5.b_error, k), *ks)
        k = jax.tree_util.tree_map(lambda *k: jnp.stack(k), *ks)
        return y1, y_error, dict(y0=y0, y1=y1, k=k), f1, diffrax.RESULTS.successful


UNROLL_MAX_PRIMITIVES = 64
"""`integrate`'s default solver is `UnrolledTsit5` for vector fields of at most this many
primitive operations (counted through nested calls), else ``diffrax.Tsit5``: unrolling
pays for small fields (the Saxe field has 5 primitives) and only lengthens the compilation
of large ones (the heads Monte Carlo field has 112)."""

# the default controller's smallest step, as a fraction of the span t1 - t0 (1e4 times float64's
# resolution of t1): below it a solve stops with dt_min_reached
_DTMIN_FRACTION = 1e-12


def _n_primitives(jaxpr) -> int:
    """Number of primitive equations in ``jaxpr``, including those of nested jaxprs."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    sub = sub.jaxpr
                if isinstance(sub, jax.extend.core.Jaxpr):
                    n += _n_primitives(sub)
    return n


def _combine(weights, ks):
    """``sum_j w_j k_j`` over the non-zero tableau weights (trace-time constants)."""
    parts = [float(w) * k for w, k in zip(weights, ks) if w != 0]
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    return out


class DivergenceError(FloatingPointError):
    """A NaN or Inf appeared during integration or training."""


class MaxStepsError(RuntimeError):
    """The solver used up ``max_steps`` before reaching ``t1``."""


def enable_x64() -> None:
    """Switch JAX to 64-bit floats, process-wide: an entry point's call, made once at the start of
    a program (the ``attnflow`` command and the test suite make it). No other attnflow function
    changes JAX's configuration; ``with jax.enable_x64(True):`` is the per-block alternative."""
    jax.config.update("jax_enable_x64", True)


def x64_enabled() -> bool:
    """Whether float64 arrays can be made here (globally or inside ``jax.enable_x64(True)``)."""
    return jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.dtype("float64")


def as_data(tree: Any, dtype: Any = None) -> Any:
    """``tree`` with every Python or NumPy float (and float array) replaced by a JAX array.

    JAX compiles a function once per value of each *static* argument, and ``eqx.filter_jit``
    treats Python numbers as static: a learning rate passed as ``0.1`` and then ``0.2``
    compiles twice. As arrays they are data, and one compilation serves every value.
    Integers, booleans, strings and callables are left as they are (they usually set
    shapes or choices). ``dtype``: the floating dtype of the new arrays (default: JAX's).
    """

    fdtype = jnp.result_type(float) if dtype is None else dtype

    def conv(x):
        if isinstance(x, bool):
            return x
        # an explicit dtype: a weakly typed array would be a different abstract value, so
        # 0.5 after a float64 default would compile again
        if isinstance(x, (float, np.floating)) or (isinstance(x, np.ndarray) and x.dtype.kind == "f"):
            return jnp.asarray(x, dtype=fdtype)
        if isinstance(x, (complex, np.complexfloating)):
            return jnp.asarray(x)
        return x

    return jax.tree_util.tree_map(conv, tree)


def require_x64(where: str) -> None:
    """``RuntimeError`` naming ``where`` unless JAX's 64-bit mode is on."""
    if not x64_enabled():
        float32 = " (or integrate your own field in float32: integrate(..., dtype=jnp.float32))"
        raise RuntimeError(
            f"{where} runs in float64 but JAX 64-bit mode is off. Call attnflow.enable_x64() "
            "at the start of your program (or wrap the call in `with jax.enable_x64(True):`)"
            f"{float32 if where == 'integrate' else ''}."
        )


def _default_observe(t, y, args):
    if isinstance(y, Mapping):
        return flatten_names(y)
    if isinstance(y, (jax.Array, np.ndarray)):
        return {"y": y}
    leaves, _ = jax.tree_util.tree_flatten_with_path(y)
    return {"y" + jax.tree_util.keystr(p): leaf for p, leaf in leaves}


class _EventFn(eqx.Module):
    fn: Callable = eqx.field(static=True)

    def __call__(self, t, y, args, **kwargs):
        out = self.fn(t, y, args)
        if jnp.issubdtype(jnp.result_type(out), jnp.floating):
            # in JAX's default float dtype: Diffrax's root find pairs the event's value with a Python 0.0 in
            # a lax.cond, which fails on a float32 value while 64-bit mode is on (a float32 solve)
            out = jnp.asarray(out, jnp.result_type(float))
        return out


class ObservableEvent(eqx.Module):
    """A terminating event on a theory's observables: ``fn(t, obs) -> scalar`` with ``obs`` the
    named observables (``observe(t, y, args)``, flattened to dotted names) at the state ``y``;
    the solve stops where it first changes sign. What every theory package's ``solve(...,
    event=fn)`` passes to `integrate`: ``event=lambda t, o: o["loss"] - 0.1`` stops where the
    loss reaches 0.1. Observables the event does not read are not computed in the step loop
    (XLA removes them). Equal when ``fn`` and ``observe`` are the same objects, so a repeated
    solve reuses its compilation."""

    fn: Callable = eqx.field(static=True)
    observe: Callable = eqx.field(static=True)

    def __call__(self, t, y, args):
        return self.fn(t, _NamedObservables(_Observer(self.observe)(t, y, args)))


class _NamedObservables(dict):
    """Observables whose missing name is a ``KeyError`` listing the names there are."""

    def __missing__(self, name):
        raise KeyError(f"no observable {name!r}; the observables are {sorted(self)}")


def observable_event(fn: Any, observe: Callable) -> ObservableEvent | None:
    """``fn`` (or ``None``) as an `ObservableEvent` on ``observe``; ``ValueError`` if ``fn`` is
    not callable."""
    if fn is None:
        return None
    if not callable(fn):
        raise ValueError(f"event must be callable (t, observables) -> scalar, got {fn!r:.80}")
    return ObservableEvent(fn, observe)


def _ok(result) -> jax.Array:
    return (result == diffrax.RESULTS.successful) | (result == diffrax.RESULTS.event_occurred)


_SPLIT_COMPLEX = (
    "attnflow integrates real states (its error norms and checks are for real numbers): split a complex "
    "state z into real and imaginary parts, {'re': z.real, 'im': z.imag}, with the field returning "
    "{'re': dz.real, 'im': dz.imag}"
)


def _refuse_complex(what: str, tree: Any) -> None:
    """``ValueError`` naming the first complex leaf of ``tree`` (arrays or shapes) and how to split it:
    a complex ``y0`` would be cast to the real dtype (its imaginary part dropped)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dt = getattr(leaf, "dtype", None)
        if dt is None:
            dt = np.result_type(leaf)
        if jnp.issubdtype(dt, jnp.complexfloating):
            where = f" (at {jax.tree_util.keystr(path)})" if path else ""
            raise ValueError(f"integrate: {what}{where}, dtype {jnp.dtype(dt)}; {_SPLIT_COMPLEX}")


def integrate(
    field: Callable[[Any, Any, Any], Any] | ODE,
    y0: Any,
    t1: Any,
    *,
    t0: Any = 0.0,
    args: Any = None,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    observe: Callable[[Any, Any, Any], Mapping[str, Any]] | None = None,
    event: Callable[[Any, Any, Any], Any] | diffrax.Event | None = None,
    dtype: Any = jnp.float64,
    meta: Mapping[str, Any] | None = None,
    return_state: bool = False,
) -> Any:
    """Integrate ``dy/dt = field(t, y, args)`` from ``t0`` to ``t1``.

    Parameters
    ----------
    field:
        Vector field ``(t, y, args) -> dy/dt`` with ``dy/dt`` the same pytree as ``y``; or an
        `ODE` (``P.ode(setup)``), whose ``args``, ``observe``, save grid, solver and metadata
        are then the defaults (give no ``args`` with it).
    y0:
        Initial state, any pytree of arrays.
    t1, t0:
        End and start times (may be traced).
    args:
        Parameters passed to ``field`` (a pytree: learning rates, ratios, a theory's
        ``Setup``). Floats in it become arrays (`as_data`), so new values reuse the
        compiled solve.
    save:
        A `SaveGrid`: `LinearGrid` (default, 200 points), `LogGrid` or `TimeGrid`.
        ``LinearGrid(2)`` saves only ``t0`` and ``t1``, outside the step loop.
    solver:
        `SolverOptions` (solver, tolerances, ``dt0``, ``max_steps``, controller, adjoint,
        progress). Default: Tsit5 with ``PIDController(rtol=1e-8, atol=1e-10)``:
        `UnrolledTsit5` (stages unrolled) for fields of at most `UNROLL_MAX_PRIMITIVES`
        primitive operations, ``diffrax.Tsit5()`` above (identical steps; faster
        compilation of a large field).
    observe:
        ``(t, y, args) -> {name: array}``: the observables recorded at each save time.
        Default: the state itself (a dict state keeps its keys; an array is ``"y"``). Nested
        mappings are flattened to dotted names (``{"a": {"b": x}}`` gives ``"a.b"``).
    event:
        ``(t, y, args) -> scalar``: the solve stops when it changes sign (located by a
        Newton root find). Save points after the event hold the event time and state,
        so ``traj.ts[-1]`` and ``traj.final()`` are the event time and state, and
        ``traj.t_event`` is the event time (NaN when it did not fire). A ``diffrax.Event``
        is also accepted.
    dtype:
        Floating dtype of the state (float64 by default; requires `enable_x64`).
    meta:
        Extra metadata stored in the trajectory.
    return_state:
        Also return the final state (the pytree ``y`` at ``t1``, or at the event), to
        continue from it or to read what the observables leave out.

    Returns
    -------
    Trajectory with ``ts`` of shape ``(T,)`` and one array of shape ``(T, ...)`` per
    observable (and the final state with ``return_state=True``). A solve that uses up
    ``max_steps`` raises `MaxStepsError` naming the time reached; a non-finite value raises
    `DivergenceError` naming the time (inside ``jit``/``vmap``: an ``equinox`` runtime error
    with the same advice).
    """
    if isinstance(field, ODE):
        # an ODE brings its args, observables and defaults; what is given here overrides them
        ode = field
        field, args = field_and_args("integrate", ode, args)
        observe = ode.observe if observe is None else observe
        save = ode.save if save is None else save
        solver = ode.solver if solver is None else solver
        meta = {**dict(ode.meta), **(meta or {})}
    if jnp.dtype(dtype) == jnp.dtype("float64"):
        require_x64("integrate")
    save = LinearGrid() if save is None else save
    solver = SolverOptions() if solver is None else solver
    if not isinstance(save, SaveGrid):
        raise ValueError(f"save must be a SaveGrid (LinearGrid, LogGrid or TimeGrid), got {save!r}")
    if not isinstance(solver, SolverOptions):
        raise ValueError(f"solver must be SolverOptions(...), got {solver!r}")
    if not callable(field):
        raise ValueError(f"field must be callable (t, y, args) -> dy/dt, got {field!r}")
    if observe is not None and not callable(observe):
        raise ValueError(f"observe must be callable (t, y, args) -> {{name: array}}, got {observe!r}")
    if not jax.tree_util.tree_leaves(y0):
        raise ValueError(f"y0 must contain at least one array, got {y0!r}")
    if jnp.issubdtype(jnp.dtype(dtype), jnp.complexfloating):
        raise ValueError(f"integrate: dtype must be a real floating dtype, got {jnp.dtype(dtype)}; {_SPLIT_COMPLEX}")
    _refuse_complex("y0 is complex", y0)
    V.finite_tree("y0", y0)
    if not V.any_traced((t0, t1)):
        t0f, t1f = V.finite_scalar("t0", t0), V.finite_scalar("t1", t1)
        if not t1f > t0f:
            raise ValueError(f"t1 must be greater than t0, got t0={t0!r}, t1={t1!r}")
    y0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), y0)
    args = as_data(args, dtype)
    t0, t1 = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    # Traced inputs cannot be refused here: they are checked in the program (below), and bad ones
    # replaced by harmless stand-ins so that the solve runs and the point fails with its reason
    # (a point of a sweep; an error under a user's jit) rather than with a solver's complaint.
    input_failures: list[tuple[Any, str]] = []
    if V.any_traced((t0, t1)):
        bad_span = ~(t1 > t0)
        input_failures.append((bad_span, "integrate: t1 must be greater than t0"))
        t1 = jnp.where(bad_span, t0 + 1, t1)
    if V.any_traced(y0):
        bad_y0 = ~jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in jax.tree_util.tree_leaves(y0)]))
        input_failures.append((bad_y0, "integrate: the initial state y0 is not finite (NaN/Inf)"))
        y0 = jax.tree_util.tree_map(lambda v: jnp.where(bad_y0, jnp.zeros_like(v), v), y0)
    # Shape check: the field must return the state's structure and shapes. The traced field
    # also gives its size, which picks the default solver below.
    # trace with the arrays of args as inputs and everything else (functions, strings) closed over
    dyn_args, static_args = eqx.partition(args, eqx.is_array)
    try:
        field_jaxpr, out_struct = jax.make_jaxpr(
            lambda t, y, a: field(t, y, eqx.combine(a, static_args)), return_shape=True
        )(t0, y0, dyn_args)
    except (TypeError, AttributeError, KeyError, IndexError) as err:
        raise ValueError(f"field(t, y, args) failed on the initial state: {type(err).__name__}: {err}") from None
    _refuse_complex("field returns a complex dy/dt", out_struct)
    V.matches_state("", out_struct, y0)
    obs = _Observer(observe or _default_observe)
    _check_observe(obs, t0, y0, args)

    # Saving only the two endpoints needs no per-step save loop (which, under vmap, costs
    # as much as the step itself): Diffrax saves t0 and t1 outside the loop.
    endpoints = isinstance(save, LinearGrid) and save.n == 2
    ts = jnp.asarray(save.times(t0, t1), dtype=dtype)
    if isinstance(save, TimeGrid) and not V.any_traced((ts, t0, t1)):
        lo, hi = float(ts[0]), float(ts[-1])
        # to the times' own resolution (float32 times of 0.3 are 0.30000001), as train reads them
        raw = np.asarray(save.ts)
        tol = (8 * float(np.finfo(raw.dtype).eps) if raw.dtype.kind == "f" else 0.0) * max(abs(float(t1)), 1.0)
        if lo < float(t0) - tol or hi > float(t1) + tol:
            raise ValueError(f"save times must lie in [t0, t1] = [{float(t0)!r}, {float(t1)!r}], got {lo!r} .. {hi!r}")
        ts = jnp.clip(ts, t0, t1)
    elif V.any_traced((ts, t0, t1)):
        bad_ts = ~(jnp.all(jnp.isfinite(ts)) & (ts[0] >= t0) & (ts[-1] <= t1) & jnp.all(jnp.diff(ts) >= 0))
        input_failures.append(
            (
                bad_ts,
                "integrate: save times must rise within [t0, t1] (a TimeGrid past t1? LogGrid t_min past t1 - t0?)",
            )
        )
        ts = jnp.where(bad_ts, jnp.linspace(t0, t1, ts.shape[0]), ts)
    method = solver.solver
    if method is None:
        # Same steps and results either way (to 1e-12); unrolling pays on small fields and
        # copies a large one seven times into the program, which only slows compilation.
        small = _n_primitives(field_jaxpr.jaxpr) <= UNROLL_MAX_PRIMITIVES
        method = UnrolledTsit5() if small else diffrax.Tsit5()
    rtol, atol = jnp.asarray(solver.rtol, dtype), jnp.asarray(solver.atol, dtype)
    controller = solver.stepsize_controller
    if controller is None:
        _warn_tolerances(solver.rtol, solver.atol, dtype)  # before solving: rtol and atol play a part
        # A step below _DTMIN_FRACTION of the span stops the solve (dt_min_reached) rather than
        # shrinking on: a field that is non-finite from the start (eta = 1e308) rejected every
        # step until max_steps, minutes of evaluating a large field for one error.
        floor = _DTMIN_FRACTION * jnp.abs(t1 - t0) if solver.dtmin is None else jnp.asarray(solver.dtmin, dtype)
        controller = diffrax.PIDController(rtol=rtol, atol=atol, dtmin=floor, force_dtmin=False)
    dt0 = None if solver.dt0 is None else jnp.asarray(solver.dt0, dtype)
    if isinstance(controller, diffrax.ConstantStepSize) and event is None and not V.any_traced((solver.dt0, t0, t1)):
        if solver.dt0 is None:
            raise ValueError("a constant step size needs dt0: SolverOptions.fixed_step(dt) sets both")
        # known before solving: a fixed-step run that cannot reach t1 would fail only at the end,
        # with the adaptive solver's advice (tolerances play no part here)
        need = int(np.ceil(abs(float(t1) - float(t0)) / float(solver.dt0) - 1e-9))
        if need > solver.max_steps:
            raise ValueError(
                f"fixed steps of dt0 = {float(solver.dt0):g} need {need} steps to t1 = {float(t1):g}, more than "
                f"max_steps = {solver.max_steps}: raise max_steps (SolverOptions.fixed_step(dt, max_steps={need})) "
                "or the step"
            )
    if isinstance(event, diffrax.Event) or event is None:
        ev = event
    elif callable(event):
        boolean = _check_event(event, t0, y0, args)
        # A module wrapper (equal when the user function is the same object) rather than a fresh
        # lambda, so repeated calls with the same event hit the compilation cache.
        tol = _event_tolerance(dtype)
        root_finder: optx.AbstractRootFinder | None = optx.Newton(rtol=tol, atol=tol)
        if boolean and jnp.dtype(dtype) != jnp.result_type(float):
            # A boolean event needs no root find (it fires at the end of its step, where Diffrax's root
            # find puts it), and in a dtype other than JAX's default one (float32 with 64-bit mode on)
            # Diffrax's root find fails to trace: it pairs the step's end time with a Python 0.0.
            root_finder = None
        ev = diffrax.Event(cond_fn=_EventFn(event), root_finder=root_finder)
    else:
        raise ValueError(f"event must be callable (t, y, args) -> scalar or a diffrax.Event, got {event!r}")

    traced = V.any_traced((y0, args, t0, t1, ts, rtol, atol))
    try:
        out_ts, out_ys, result, t_end, y_end, stats = _solve(
            field,
            y0,
            args,
            t0,
            t1,
            ts,
            obs,
            method,
            controller,
            dt0,
            solver.max_steps,
            ev,
            solver.progress,
            solver.adjoint,
            endpoints,
        )
    except TypeError as err:
        if "forward-mode autodiff" not in str(err):
            raise
        raise TypeError(
            "integrate: forward-mode differentiation (jax.jacfwd, jax.jvp) through a solve needs Diffrax's "
            "ForwardMode adjoint: pass solver=af.solver_for_mode('forward', options), with options the "
            "SolverOptions you solve with (a package's DEFAULT_SOLVER by default)"
        ) from err
    # a field, observable or event that closes over a traced value (jax.grad of a closure) traces too
    traced = traced or V.any_traced((out_ts, out_ys, t_end))
    for bad, message in input_failures:  # first, so that a point fails with its input's reason
        out_ts, out_ys, y_end = fail_if((out_ts, out_ys, y_end), bad, message)
    if traced:
        # Inside jit/vmap the time cannot be formatted into the message; fail loudly anyway.
        # Attach the checks to every output so none is dead-code-eliminated away.
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in jax.tree_util.tree_leaves(out_ys)]))
        out_ts, out_ys, y_end = fail_if(
            (out_ts, out_ys, y_end),
            ~_ok(result),
            f"integrate: solver failed before t1 (max_steps={solver.max_steps} reached, step size "
            "collapsed, or an event's root find failed); increase max_steps, loosen rtol/atol, use an implicit "
            "solver, or make the event a smooth function of t",
        )
        out_ts, out_ys, y_end = fail_if(
            (out_ts, out_ys, y_end),
            ~finite,
            "integrate: non-finite value (NaN/Inf) in the solution: the ODE diverged",
        )
    else:
        _check_solution(field, args, result, t_end, y_end, out_ts, out_ys, solver.max_steps, t1, method, ev)
    t_event = None
    if ev is not None:
        t_event = jnp.where(result == diffrax.RESULTS.event_occurred, t_end, jnp.nan)
    m = {"integrator": type(method).__name__, "max_steps": solver.max_steps}
    if isinstance(solver.stepsize_controller, diffrax.ConstantStepSize):
        m.update(controller="ConstantStepSize")  # rtol and atol play no part; the step does
        if not V.any_traced(solver.dt0) and np.ndim(solver.dt0) == 0:
            m.update(dt0=float(solver.dt0))
    elif not V.any_traced((rtol, atol)) and np.ndim(rtol) == 0 and np.ndim(atol) == 0:
        m.update(rtol=float(rtol), atol=float(atol))
    m.update(meta or {})
    traj = Trajectory(out_ts, out_ys, m, t_event=t_event, stats=stats)
    return (traj, y_end) if return_state else traj


class ODE(eqx.Module):
    """An initial-value problem ``dy/dt = field(t, y, args)``, ``y(0) = y0``, with its named
    observables: what a theory package's ``solve`` integrates, as a value.

    Every theory package returns one from ``P.ode(setup)`` (`attnflow.qkov.ode`,
    `attnflow.focus.ode`, `attnflow.heads.ode`, `attnflow.derive.ode`,
    `attnflow.deeplinear.ode`), so that a user can ask their own question of the theory's ODE
    without learning each package's field and arguments:

    - ``ode(t, y)`` is ``dy/dt`` at the state ``y`` (a pytree shaped like ``ode.y0``);
    - ``ode.observables(y)`` the theory's named observables at ``y`` (the names of ``P.OBSERVABLES``);
    - ``ode.solve(t1)`` integrates it with `integrate`, on the package's default save grid and
      solver, and returns the `Trajectory` that ``P.solve(setup, t1)`` returns;
    - the core verbs take it wherever they take a field, without ``args``:
      ``af.integrate(ode, y0, t1)``, ``af.fixed_point(ode, y)``, ``af.jacobian(ode, y)``,
      ``af.spectrum(ode, y)``, ``af.unstable_subspace(ode, y)``.

    Fields: ``field`` (``(t, y, args) -> dy/dt``, static), ``args`` (its data: the setup and what
    the theory built from it, e.g. a quadrature rule or a Monte Carlo bank), ``y0``, ``observe``
    (``(t, y, args) -> {name: array}``, static; ``None`` records the state), ``save`` and
    ``solver`` (the defaults of ``solve``) and ``meta`` (the metadata ``solve`` stores, as
    ``(key, value)`` pairs, static). An ODE is a pytree: it goes through ``jax.jit``,
    ``jax.vmap`` and `attnflow.sweep` (build it inside the function that is swept, from the swept
    setup). Numbers in ``args`` and ``y0`` are data: a new value reuses the compiled solve.
    """

    field: Callable = eqx.field(static=True)
    args: Any
    y0: Any
    observe: Callable | None = eqx.field(static=True, default=None)
    save: SaveGrid = eqx.field(default_factory=LinearGrid)
    solver: SolverOptions = eqx.field(default_factory=SolverOptions)
    meta: tuple = eqx.field(static=True, default=())

    def __check_init__(self):
        if not callable(self.field):
            raise ValueError(f"field must be callable (t, y, args) -> dy/dt, got {self.field!r:.80}")
        if self.observe is not None and not callable(self.observe):
            raise ValueError(f"observe must be callable (t, y, args) -> {{name: array}}, got {self.observe!r:.80}")
        if not isinstance(self.save, SaveGrid):
            raise ValueError(f"save must be a SaveGrid (LinearGrid, LogGrid or TimeGrid), got {self.save!r:.80}")
        if not isinstance(self.solver, SolverOptions):
            raise ValueError(f"solver must be SolverOptions(...), got {self.solver!r:.80}")
        if not isinstance(self.meta, tuple) or not all(isinstance(kv, tuple) and len(kv) == 2 for kv in self.meta):
            raise ValueError(f"meta must be a tuple of (key, value) pairs, got {self.meta!r:.80}")
        try:  # static data: jit hashes it
            hash(self.meta)
        except TypeError:
            raise ValueError(
                f"meta values must be hashable (strings, numbers, tuples), got {self.meta!r:.120}"
            ) from None

    def __call__(self, t: Any, y: Any) -> Any:
        """``dy/dt = field(t, y, args)`` at the state ``y``."""
        self._check_state("ode(t, y)", y)
        return self.field(t, y, self.args)

    def observables(self, y: Any, t: Any = 0.0) -> dict[str, Any]:
        """The named observables at the state ``y`` (and time ``t``), as ``solve`` records them
        at each save time (nested names flattened to dotted ones)."""
        self._check_state("ode.observables(y)", y)
        return _Observer(self.observe or _default_observe)(t, y, self.args)

    def _check_state(self, who: str, y: Any) -> None:
        # a state of another shape would fail deep inside the field with JAX's shape error
        # (shapes read from the leaves, without tracing: a call in a Python loop stays cheap)
        want, want_def = jax.tree_util.tree_flatten(self.y0)
        have, have_def = jax.tree_util.tree_flatten(y)
        if want_def != have_def or any(np.shape(a) != np.shape(b) for a, b in zip(want, have)):  # type: ignore[operator]
            shapes = jax.tree_util.tree_map(np.shape, self.y0)
            got = jax.tree_util.tree_map(np.shape, y)
            raise ValueError(f"{who}: y must be a state shaped like ode.y0, {shapes}; got {got}")

    def solve(
        self,
        t1: Any,
        *,
        y0: Any = None,
        t0: Any = 0.0,
        save: SaveGrid | None = None,
        solver: SolverOptions | None = None,
        event: Callable[[Any, dict], Any] | None = None,
        return_state: bool = False,
        progress: bool | None = None,
    ) -> Any:
        """`integrate` from ``y0`` (default ``self.y0``) at ``t0`` to ``t1``, saving on ``save``
        with ``solver`` (defaults: the ODE's), recording its observables. ``progress=True``
        shows a progress meter with the solver options that would be used anyway.

        ``event(t, obs) -> scalar`` on the named observables stops the solve where it first
        changes sign, as in every package's ``solve`` (`ObservableEvent`); ``traj.t_event`` is
        that time (NaN if it never does). ``return_state=True`` returns ``(traj, y_end)``, the
        state at ``t1`` (or at the event), from which ``ode.solve(t2, y0=y_end, t0=t1)`` goes on."""
        theory = dict(self.meta).get("theory")
        if theory is not None:
            require_x64(f"{theory}.solve")  # name the user's verb, not the integrate underneath
        event_fn = observable_event(event, self.observe or _default_observe)
        y0 = self.y0 if y0 is None else y0
        solver = with_progress(solver, self.solver, progress)
        return integrate(self, y0, t1, t0=t0, save=save, solver=solver, event=event_fn, return_state=return_state)


def crossing_time(
    ode: ODE,
    name: str,
    threshold: Any,
    t1: Any,
    *,
    rising: bool = False,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The first time the scalar observable ``name`` of ``ode``'s solution from ``ode.y0`` falls
    to ``threshold`` (``rising=True``: rises to it, e.g. an overlap or a specialisation): the
    event time of ``ode.solve(t1, event=lambda t, o: o[name] - threshold)``, NaN if it has not
    by ``t1``. What each package's ``escape_time`` is built on (a loss or an
    error leaving its plateau). A JAX function of ``threshold`` and of the arrays in ``ode``: it
    goes through ``jax.jit``, ``jax.vmap``, `attnflow.sweep` and `attnflow.sensitivity` (the
    event time's derivative is eq. (S1) there).

    Raises ``ValueError`` before solving for an observable ``ode`` does not have, one that is
    not a scalar (pass its entry as an observable of your own ``ODE``), or a concrete
    ``threshold`` that is not finite or not below (``rising``: above) the observable's value at
    ``ode.y0``."""
    if not isinstance(ode, ODE):
        raise ValueError(f"ode must be an attnflow.ODE (a package's P.ode(setup)), got {ode!r:.80}")
    start = ode.observables(ode.y0)
    if name not in start:
        raise ValueError(f"the ODE has no observable {name!r}; it has {sorted(start)}")
    if np.shape(start[name]) != ():
        raise ValueError(f"observable {name!r} has shape {np.shape(start[name])}: crossing_time needs a scalar one")
    if not V.any_traced(t1):
        V.positive("t1 (horizon)", t1)
    if not V.any_traced(threshold):
        V.finite_scalar("threshold", threshold)
        s0 = None if V.any_traced(start[name]) else float(start[name])
        if s0 is not None and not (float(threshold) > s0 if rising else float(threshold) < s0):
            raise ValueError(
                f"threshold = {V.show(threshold)} must lie {'above' if rising else 'below'} the start value of "
                f"{name!r}, {s0:.6g}: the solve would stop at once"
                + ("" if rising else " (rising=True for an observable that grows)")
            )
    if V.any_traced((threshold, start[name])):
        # a sweep over the threshold or the start: the point fails with the reason, not left to
        # read as "not reached by t1" (heads.check_escape_start does the same)
        side = "above" if rising else "below"
        check_traced(
            lambda: ~(threshold > start[name]) if rising else ~(threshold < start[name]),
            f"crossing_time: the threshold must lie {side} the start value of {name!r}: the solve would stop at once",
        )
    theory = dict(ode.meta).get("theory")
    if theory is not None:
        require_x64(f"{theory}.escape_time")
    threshold = jnp.asarray(threshold, dtype=jnp.result_type(float))
    # the ODE and the threshold travel as data (args): a new threshold or setup reuses the
    # compiled solve, and both can be traced (jit, grad, sweep)
    traj = integrate(
        _ode_field,
        ode.y0,
        t1,
        args=(ode, threshold),
        save=LinearGrid(2),
        solver=with_progress(solver, ode.solver, progress),
        observe=_ode_observe,
        event=_Crossing(name),
        meta=dict(ode.meta),
    )
    return traj.t_event


def _ode_field(t: Any, y: Any, args: tuple) -> Any:
    return args[0](t, y)


def _ode_observe(t: Any, y: Any, args: tuple) -> Any:
    return args[0].observables(y, t)


class _Crossing(eqx.Module):
    """``obs[name] - threshold`` with ``args = (ode, threshold)``."""

    name: str = eqx.field(static=True)

    def __call__(self, t: Any, y: Any, args: tuple) -> Any:
        return args[0].observables(y, t)[self.name] - args[1]


def with_progress(solver: SolverOptions | None, default: SolverOptions | None, progress: bool | None) -> Any:
    """The solver options a ``solve`` uses: ``solver``, else ``default`` (a package's
    ``DEFAULT_SOLVER``), with ``progress`` set on them when it is not ``None``. So
    ``solve(setup, t1, progress=True)`` keeps the package's solver and tolerances, where
    ``solver=af.SolverOptions(progress=True)`` would replace them with the core defaults."""
    chosen = default if solver is None else solver
    if progress is None:
        return chosen
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be True, False or None, got {progress!r}")
    chosen = SolverOptions() if chosen is None else chosen
    if not isinstance(chosen, SolverOptions):
        raise ValueError(f"solver must be SolverOptions(...), got {chosen!r}")
    return chosen.replace(progress=progress)


def field_and_args(who: str, field: Any, args: Any) -> tuple[Callable, Any]:
    """``(field, args)`` of a field given as a function and its ``args``, or as an `ODE` (which
    carries its own ``args``; giving both is an error)."""
    if isinstance(field, ODE):
        if args is not None:
            raise ValueError(f"{who}: an ODE carries its own args; give args only with a field function")
        return field.field, field.args
    return field, args


class _Observer(eqx.Module):
    """``observe`` with nested mappings flattened to dotted names (equal when the user function
    is the same object, so repeated calls hit the compilation cache)."""

    fn: Callable = eqx.field(static=True)

    def __call__(self, t, y, args):
        out = self.fn(t, y, args)
        if not isinstance(out, Mapping):
            raise ValueError(f"observe must return a mapping name -> array, got {type(out).__name__}")
        # a plain number (``{"c": 3}``) is an observable like an array: the save loop needs shapes
        return {
            k: jnp.asarray(v, dtype=jnp.result_type(float))
            if isinstance(v, (int, float, np.integer, np.floating))
            else v
            for k, v in flatten_names(out).items()
        }


_EVENT_TOL_F64 = 1e-12
"""The tolerance (relative and absolute, in time and in the event's value) of the Newton root find
that locates an event in float64."""


def _event_tolerance(dtype: Any) -> float:
    """The event root find's tolerance in ``dtype``: `_EVENT_TOL_F64`, or 8 ulps of the dtype where
    that is larger (float32: 9.5e-7). In float32 the event's value near its root is rounding noise of
    about ``eps |u|``, which a tolerance of 1e-12 never accepts: the Newton iteration ran out of steps."""
    return max(_EVENT_TOL_F64, 8 * float(jnp.finfo(dtype).eps))


_TOL_FLOOR_ULPS = 1 / 16
"""`integrate` warns when ``rtol`` and ``atol`` both lie below this many ulps of the state's dtype."""


def _warn_tolerances(rtol: Any, atol: Any, dtype: Any) -> None:
    """A ``UserWarning`` when the default controller's ``rtol`` and ``atol`` (concrete numbers) both
    lie below `_TOL_FLOOR_ULPS` of the dtype's resolution ``eps``: the error estimate cannot go much
    below ``eps |y|``, so the controller rejects steps and shrinks them until ``max_steps`` (float32:
    ``rtol=1e-9`` takes 3 to 7 times the steps of ``1e-8``, ``1e-12`` runs out of 100,000 steps)."""
    if V.any_traced((rtol, atol)) or np.ndim(rtol) or np.ndim(atol):
        return
    eps = float(jnp.finfo(dtype).eps)
    floor = _TOL_FLOOR_ULPS * eps
    if float(rtol) < floor and float(atol) < floor:
        name = jnp.dtype(dtype).name
        warnings.warn(
            f"integrate: rtol={float(rtol):g} and atol={float(atol):g} lie below the resolution of {name} "
            f"(eps = {eps:.3g}): the solver cannot make its error that small, so it rejects and shrinks steps and "
            f"may run out of max_steps (MaxStepsError). Use rtol and atol of at least {floor:.2g}"
            + (" (SolverOptions(rtol=1e-6, atol=1e-8) in float32)" if name == "float32" else "")
            + (", or float64" if jnp.finfo(dtype).bits < 64 else ""),
            stacklevel=_caller_outside_attnflow(),
        )


def _check_event(event, t0, y0, args) -> bool:
    """The event must give one real number (or a boolean): named error before any computing.
    Whether it gives a boolean."""
    dyn_args, static_args = eqx.partition(args, eqx.is_array)
    failure = "event failed on the initial state"
    if isinstance(event, ObservableEvent):
        failure = (
            "event(t, obs) failed on the initial observables (the event of an ODE's and every package's solve is "
            "event(t, obs) on the named observables; for event(t, y, args) on the state use "
            "af.integrate(ode, y0, t1, event=...))"
        )
    out = V.abstract_call(
        failure,
        lambda t, y, a: event(t, y, eqx.combine(a, static_args)),
        t0,
        y0,
        dyn_args,
    )
    V.one_number("event", out, allow_bool=True)
    return bool(jnp.issubdtype(out.dtype, jnp.bool_))


def _check_observe(obs, t0, y0, args) -> None:
    """Every observable must be an array (or a number): named error before any computing."""
    bad: list[tuple[str, str]] = []

    def probe(t, y, a):
        out = {}
        for name, v in obs(t, y, a).items():
            if isinstance(v, (jax.Array, np.ndarray, np.number, int, float, complex)):
                out[name] = v
            else:
                bad.append((name, type(v).__name__))
                out[name] = 0.0
        return out

    dyn_args, static_args = eqx.partition(args, eqx.is_array)
    try:
        jax.eval_shape(lambda t, y, a: probe(t, y, eqx.combine(a, static_args)), t0, y0, dyn_args)
    except (TypeError, AttributeError) as err:
        raise ValueError(f"observe(t, y, args) failed on the initial state: {type(err).__name__}: {err}") from None
    if bad:
        raise ValueError(f"observable {bad[0][0]!r} must be an array, got {bad[0][1]}")


class _LogLines:
    """The progress of one solve as occasional plain lines, for a stream that is not a terminal
    (a log file): a line once the progress has grown by `_ProgressMeter.LOG_STEP` and at least
    `_ProgressMeter.LOG_SECONDS` have passed since the last one, and a closing line if any was
    printed. A solve shorter than that prints nothing."""

    def __init__(self, file: Any) -> None:
        import time

        self.file, self.clock = file, time.monotonic
        self.t0 = self.last_t = self.clock()
        self.last_p = 0.0
        self.printed = False

    def step(self, progress: float) -> None:
        now = self.clock()
        if progress - self.last_p >= _ProgressMeter.LOG_STEP and now - self.last_t >= _ProgressMeter.LOG_SECONDS:
            elapsed = now - self.t0
            left = elapsed * (1 - progress) / progress if progress > 0 else float("nan")
            self._line(f"{100 * progress:.0f}% after {elapsed:.0f} s, about {left:.0f} s left")
            self.last_p, self.last_t = progress, now

    def close(self) -> None:
        if self.printed:
            self._line(f"done in {self.clock() - self.t0:.0f} s")

    def _line(self, text: str) -> None:
        print(f"[attnflow] {_ProgressMeter.LABEL}: {text}", file=self.file, flush=True)
        self.printed = True


class _ProgressMeter(diffrax.TqdmProgressMeter):
    """The progress meter of `integrate` (``SolverOptions(progress=True)``), on stderr.

    On a terminal, a tqdm bar labelled ``integrate`` with the percentage of ``[t0, t1]``
    done, elapsed and remaining time, redrawn at most every `MIN_INTERVAL` seconds and
    cleared when the solve ends. On any other stream (a log file), plain lines instead
    (`_LogLines`): ``[attnflow] integrate: P% after T s, about R s left``, at most one per
    `LOG_SECONDS` and per `LOG_STEP` of progress. The compiled solve asks the host for an
    update every ``refresh_steps`` steps.
    """

    refresh_steps: int = 100
    LABEL: ClassVar[str] = "integrate"
    MIN_INTERVAL: ClassVar[float] = 0.5
    LOG_SECONDS: ClassVar[float] = LOG_INTERVAL  # as every progress bar of attnflow in a log file
    LOG_STEP: ClassVar[float] = 0.1

    @staticmethod
    def _init_bar() -> Any:
        import sys

        stream = sys.stderr
        if not (hasattr(stream, "isatty") and stream.isatty()):
            return _LogLines(stream)
        import tqdm

        return tqdm.tqdm(
            total=100,
            desc=_ProgressMeter.LABEL,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]",
            mininterval=_ProgressMeter.MIN_INTERVAL,
            leave=False,
            file=stream,
        )

    @staticmethod
    def _step_bar(bar: Any, progress: Any) -> None:
        p = min(max(float(np.asarray(progress)), 0.0), 1.0)
        if isinstance(bar, _LogLines):
            bar.step(p)
        else:
            bar.update(100 * p - bar.n)  # tqdm redraws at most every mininterval seconds

    @staticmethod
    def _close_bar(bar: Any) -> None:
        bar.close()


def _progress_meter() -> diffrax.AbstractProgressMeter:
    """`_ProgressMeter`, which fills in private hooks of Diffrax's tqdm meter (``_init_bar``,
    ``_step_bar``, ``_close_bar``); Diffrax's own meter where a Diffrax version lacks them."""
    hooks = ("_init_bar", "_step_bar", "_close_bar")
    if all(callable(getattr(diffrax.TqdmProgressMeter, h, None)) for h in hooks):
        return _ProgressMeter()
    return diffrax.TqdmProgressMeter()


@filter_jit
def _solve(
    field, y0, args, t0, t1, ts, observe, solver, controller, dt0, max_steps, event, progress, adjoint, endpoints=False
):
    term = diffrax.ODETerm(field)
    where = {"t0": True, "t1": True} if endpoints else {"ts": ts}
    saveat = diffrax.SaveAt(
        subs=[
            diffrax.SubSaveAt(**where, fn=lambda t, y, a: observe(t, y, a)),
            diffrax.SubSaveAt(t1=True),
        ]
    )
    kw = {}
    if adjoint is not None:
        kw["adjoint"] = adjoint
    sol = diffrax.diffeqsolve(
        term,
        solver,
        t0,
        t1,
        dt0,
        y0,
        args,
        saveat=saveat,
        stepsize_controller=controller,
        max_steps=max_steps,
        event=event,
        throw=False,
        progress_meter=_progress_meter() if progress else diffrax.NoProgressMeter(),
        **kw,
    )
    (save_ts, t_end), (save_ys, y_end) = sol.ts, sol.ys
    t_end = t_end[0]
    y_end = jax.tree_util.tree_map(lambda x: x[0], y_end)
    # Save points never reached (event, failure) are returned by Diffrax as +inf; hold the
    # final time and final observables there so the trajectory stays monotone and plottable.
    reached = jnp.isfinite(save_ts) & (save_ts <= t_end)
    obs_end = observe(t_end, y_end, args)
    out_ts = jnp.where(reached, save_ts, t_end)
    out_ys = {
        k: jnp.where(reached.reshape((-1,) + (1,) * (v.ndim - 1)), v, obs_end[k][None]) for k, v in save_ys.items()
    }
    stats = {k: sol.stats[k] for k in _STATS}
    return out_ts, out_ys, sol.result, t_end, y_end, stats


_STATS = ("num_steps", "num_accepted_steps", "num_rejected_steps")
"""Diffrax's solver statistics that `integrate` records in `Trajectory.stats`."""


def _stiff_remedy(method: Any, y: Any) -> str:
    """The advice on stiffness in a `MaxStepsError`, for the solver that failed (``y`` the state)."""
    name = type(method).__name__
    if isinstance(method, (AutoStiff, KrylovW)):
        n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(y))
        does = "already takes steps" if isinstance(method, KrylovW) else "already switches, when stiff, to steps"
        if method.rank >= n:
            where = f"implicit in every direction of the state (size {n})"
        else:
            dirs = "direction" if method.rank == 1 else f"{method.rank} directions"
            where = (
                f"implicit in its stiffest {dirs}; if more are stiff, raise rank (two per stiff complex "
                "eigenvalue pair)"
            )
        return f"a blow-up or a finite-time singularity of the ODE: {name}(rank={method.rank}) {does} that are {where}"
    if isinstance(method, diffrax.AbstractImplicitSolver):
        return f"a blow-up or a finite-time singularity of the ODE, as the solver, {name}, is already implicit"
    return (
        "a blow-up, a singularity, or a stiff stretch: SolverOptions(solver=af.AutoStiff()) switches to an implicit "
        "step"
    )


_ROOT_FIND_FAILURES = (
    "nonlinear_max_steps_reached",
    "nonlinear_divergence",
    "singular",
    "breakdown",
    "stagnation",
    "nonfinite",
)
"""Names of the Optimistix results that Diffrax returns when the root find locating an event fails."""


def _check_solution(field, args, result, t_end, y_end, out_ts, out_ys, max_steps, t1, method, event) -> None:
    t_end = float(t_end)
    state_finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(y_end))
    for name, v in out_ys.items():
        v = np.asarray(v)
        if v.dtype.kind in "fc" and not np.all(np.isfinite(v)):
            bad = int(np.argmax(~np.all(np.isfinite(v.reshape(v.shape[0], -1)), axis=1)))
            where = f"observable {name!r} became non-finite at t = {float(out_ts[bad]):.6g} (save index {bad})"
            if state_finite and bool(_ok(result)):
                raise DivergenceError(
                    f"integrate: {where}, while the state stayed finite to the end: "
                    "the observable is undefined there (a log or division at zero?)"
                )
            raise DivergenceError(f"integrate: {where}; the ODE diverged there")
    if bool(_ok(result)):
        return
    # getattr with a default: older optimistix releases lack some of these results
    codes = [(name, getattr(diffrax.RESULTS, name, None)) for name in _ROOT_FIND_FAILURES]
    failed = [name for name, code in codes if code is not None and bool(result == code)]
    if event is not None and event.root_finder is not None and failed:
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(y_end))
        low = ""
        if jnp.finfo(dtype).bits < 64:
            # the root find accepts |event| below its tolerance, 8 ulps: rounding noise of a large event fails it
            low = (
                f" In {jnp.dtype(dtype).name} the event's value near its root is rounding noise of about "
                f"eps |terms| (eps = {float(jnp.finfo(dtype).eps):.3g}), which the root find accepts only below "
                f"{_event_tolerance(dtype):.2g}: divide the event by the size of its terms (order 1 near the root), "
                "or solve in float64."
            )
        raise RuntimeError(
            f"integrate: the event fired, but the root find ({type(event.root_finder).__name__}) that locates its "
            f"time on the solver's dense output failed ({failed[0]}), near t = {t_end:.6g}.{low} The event "
            "function may be flat, kinked or discontinuous in t there: make it a smooth function that changes "
            "sign, tighten rtol/atol (a more accurate dense output to find the root on), or return a boolean "
            "from the event (it then fires at the end of the step in which it becomes true, without a root find)"
        )
    dy = field(jnp.asarray(t_end), y_end, args)
    if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(dy)):
        raise DivergenceError(
            f"integrate: the vector field is non-finite at t = {t_end:.6g} (the solve stalled there "
            "before t1); the ODE diverges or leaves its domain"
        )
    size = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(y_end))
    if result == diffrax.RESULTS.dt_min_reached:
        raise MaxStepsError(
            f"integrate: the step size fell below the floor SolverOptions.dtmin (default {_DTMIN_FRACTION:g} "
            f"(t1 - t0)) at t = {t_end:.6g} before t1 = {float(t1):.6g} (largest state entry there: {size:.3g}): "
            f"the solution changes too fast there ({_stiff_remedy(method, y_end)}), or loosen rtol/atol; over a "
            "long span (t1 - t0 of 1e14 and more) the start may need smaller steps than the default floor: "
            "SolverOptions(dtmin=0) removes it"
        )
    if result == diffrax.RESULTS.max_steps_reached:
        raise MaxStepsError(
            f"integrate: max_steps={max_steps} reached at t = {t_end:.6g} before t1 = {float(t1):.6g} "
            f"(largest state entry there: {size:.3g}; a huge value means the ODE blows up). "
            f"Increase max_steps, loosen rtol/atol or shorten t1; the cause may be {_stiff_remedy(method, y_end)}."
        )
    raise RuntimeError(f"integrate: solver stopped at t = {t_end:.6g} with result {result}")


def gradient_flow(
    loss: Callable[[Any], Any],
    model: Any,
    t1: Any,
    *,
    rates: Mapping[str, Any] | None = None,
    labels: Any = None,
    rate: Any = 1.0,
    filter_spec: Any = None,
    observe: Callable[[Any], Mapping[str, Any]] | None = None,
    **integrate_kwargs: Any,
) -> Trajectory:
    """Gradient flow ``d theta / dt = -eta_label grad L(theta)`` of a model, by `integrate`.

    ``loss(model) -> scalar`` (a population loss); ``model`` an Equinox module or pytree,
    whose leaves selected by ``filter_spec`` (default: inexact arrays) flow (Python floats
    stay fixed: a ``UserWarning`` names them, or a ``ValueError`` when nothing flows). Per-circuit
    rates: ``labels`` (a pytree of labels, see `attnflow.label_by_path`) and ``rates``
    (``{label: eta}``, arrays allowed); otherwise one ``rate``. ``observe(model)`` gives
    the recorded observables (default: the loss). Remaining keywords (``save``,
    ``solver``, ``event``, ``meta``) go to `integrate`. This is the exact flow whose Euler
    scheme `simulate` runs with `FullBatch`. Calling it again with the same ``loss`` and
    ``observe`` functions and new rates reuses the compiled solve.
    """
    filter_spec = eqx.is_inexact_array if filter_spec is None else filter_spec
    params, static = trainable("gradient_flow", model, filter_spec)
    if (rates is None) != (labels is None):
        raise ValueError("give both labels and rates for per-circuit rates, or neither")
    if rates is not None:
        for name, r in rates.items():
            V.positive(f"learning rate for circuit {name!r}", r)
        used = set(jax.tree_util.tree_leaves(labels))
        if used - set(rates):
            raise ValueError(f"no rate given for circuit(s) {sorted(used - set(rates))}")
        rates = {k: jnp.asarray(v) for k, v in rates.items()}
    else:
        V.positive("rate", rate)
    flow = _Flow(loss, observe, static, labels, rates, jnp.asarray(rate))
    return integrate(_flow_field, params, t1, args=flow, observe=_flow_observe, **integrate_kwargs)


def trainable(who: str, model: Any, filter_spec: Any) -> tuple[Any, Any]:
    """``eqx.partition(model, filter_spec)``: the leaves that train and the rest, for `gradient_flow`
    and `attnflow.simulate`. Python floats among the rest (a field given as ``0.1`` rather than
    ``jnp.asarray(0.1)``: no inexact array, so the default filter leaves it out) are named in a
    ``UserWarning``, or in a ``ValueError`` when nothing would train. Integers and booleans are left
    alone (they usually set shapes or choices), as are fields declared ``eqx.field(static=True)``."""
    params, static = eqx.partition(model, filter_spec)
    floats = [
        f"model{jax.tree_util.keystr(path)} = {leaf!r}"
        for path, leaf in jax.tree_util.tree_flatten_with_path(static)[0]
        if isinstance(leaf, float)
    ]
    if not floats:
        return params, static
    fix = (
        "only JAX or NumPy float arrays train: give them as arrays (jnp.asarray(0.1)), or declare a constant "
        "eqx.field(static=True)"
    )
    shown = ", ".join(floats[:5]) + (f" and {len(floats) - 5} more" if len(floats) > 5 else "")
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(f"{who}: nothing in the model trains: its floats are Python floats ({shown}); {fix}")
    warnings.warn(
        f"{who}: Python float(s) in the model do not train and stay fixed ({shown}); {fix}",
        stacklevel=_caller_outside_attnflow(),
    )
    return params, static


class _Flow(eqx.Module):
    """Everything `gradient_flow`'s field needs besides the parameters; functions are static,
    rates are data."""

    loss: Callable = eqx.field(static=True)
    observe: Callable | None = eqx.field(static=True)
    static: Any
    labels: Any  # string leaves: static under filter_jit
    rates: Any
    rate: Any


def _flow_field(t, p, flow):
    g = jax.grad(lambda q: flow.loss(eqx.combine(q, flow.static)))(p)
    if flow.rates is None:
        return jax.tree_util.tree_map(lambda x: -flow.rate * x, g)
    return jax.tree_util.tree_map(lambda x, lab: -flow.rates[lab] * x, g, flow.labels)


def _flow_observe(t, p, flow):
    m = eqx.combine(p, flow.static)
    return dict(flow.observe(m)) if flow.observe is not None else {"loss": flow.loss(m)}
