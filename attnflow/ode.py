"""`integrate`: the one verb over Diffrax.

Every reduced or order-parameter ODE of attnflow goes through `integrate`, which
returns a `Trajectory` of named observables. Defaults: Tsit5 (stages unrolled for small
fields, see `UnrolledTsit5`) with a PID controller,
float64, explicit ``max_steps`` whose overflow raises an error naming the time reached,
optional terminating events, optional progress meter. Everything a sweep varies
(``args``, ``y0``, ``t1``, ``rtol``, ``atol``) may be a traced array, so one compilation
serves a whole `sweep`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from . import _validate as V
from ._jit import filter_jit
from .trajectory import Trajectory

__all__ = ["UnrolledTsit5", "integrate", "gradient_flow", "save_times", "require_x64", "enable_x64", "DivergenceError", "MaxStepsError"]


_TSIT5 = diffrax.Tsit5.tableau


class UnrolledTsit5(diffrax.AbstractAdaptiveSolver):
    """Tsitouras' 5(4) pair (Tsitouras 2011) with its seven stages unrolled at trace time.

    The same Butcher tableau, FSAL property, embedded error estimate and fifth-order dense
    interpolation as `diffrax.Tsit5`, so a solve takes the same steps and agrees to
    round-off (tested to 1e-12). Diffrax's generic Runge--Kutta step runs the stages in an
    inner ``while`` loop (it serves implicit and variable-stage schemes); for the small,
    explicit ODEs of attnflow that inner loop, and under `jax.vmap` its per-stage buffer
    updates, cost more than the vector field. Unrolling removes them: a 256-lane vmapped
    solve of the Saxe mode ODE runs about 2.5x faster and a single jitted solve about 1.5x
    (``benchmarks/sweep_vs_loop.py``). Any `diffrax.AbstractTerm` with a deterministic
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
primitive operations (counted through nested calls), else ``diffrax.Tsit5``. The heads
Monte Carlo field (112 primitives) compiled in 4.3 s unrolled against 3.1 s rolled and ran
at the same speed; the Saxe field (5 primitives) runs 2.5x faster unrolled under vmap."""


def _n_primitives(jaxpr) -> int:
    """Number of primitive equations in ``jaxpr``, including those of nested jaxprs."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(inner, "eqns"):
                    n += _n_primitives(inner)
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
    """Switch JAX to 64-bit floats. Call once at program start (the CLI and tests do)."""
    jax.config.update("jax_enable_x64", True)


def x64_enabled() -> bool:
    return jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.dtype("float64")


def require_x64(where: str) -> None:
    if not x64_enabled():
        raise RuntimeError(
            f"{where} runs in float64 but JAX 64-bit mode is off. Call attnflow.enable_x64() "
            "at the start of your program (or wrap the call in `with jax.enable_x64(True):`), "
            "or pass dtype=jnp.float32 explicitly."
        )


def save_times(t0: Any, t1: Any, n: int, spacing: str = "linear", t_min: Any = None) -> jax.Array:
    """Save grid of ``n`` times from ``t0`` to ``t1``.

    ``spacing="log"`` places ``t0`` first and then ``n - 1`` points log-spaced in the
    elapsed time from ``t_min`` (default ``1e-6 (t1 - t0)``) to ``t1 - t0``: the right
    grid for plateaus that last decades.
    """
    n = V.positive_int("n_save", n, minimum=2)
    V.choice("spacing", spacing, ("linear", "log"))
    t0 = jnp.asarray(t0, dtype=float)
    t1 = jnp.asarray(t1, dtype=float)
    if spacing == "linear":
        return jnp.linspace(t0, t1, n)
    span = t1 - t0
    lo = span * 1e-6 if t_min is None else jnp.asarray(t_min, dtype=float)
    rest = jnp.exp(jnp.linspace(jnp.log(lo), jnp.log(span), n - 1))
    # Make the last point exactly t1 (exp(log(x)) can be off in the last bit).
    rest = rest.at[-1].set(span)
    return jnp.concatenate([t0[None], t0 + rest])


def _default_observe(t, y, args):
    if isinstance(y, Mapping):
        return _flatten_names(y)
    if isinstance(y, (jax.Array, np.ndarray)):
        return {"y": y}
    leaves, _ = jax.tree_util.tree_flatten_with_path(y)
    return {"y" + jax.tree_util.keystr(p): leaf for p, leaf in leaves}


def _flatten_names(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten_names(v, name + "."))
        else:
            out[name] = v
    return out


class _EventFn(eqx.Module):
    fn: Callable = eqx.field(static=True)

    def __call__(self, t, y, args, **kwargs):
        return self.fn(t, y, args)


def _ok(result) -> jax.Array:
    return (result == diffrax.RESULTS.successful) | (result == diffrax.RESULTS.event_occurred)


def integrate(
    field: Callable[[Any, Any, Any], Any],
    y0: Any,
    t1: Any,
    *,
    t0: Any = 0.0,
    args: Any = None,
    ts: Any = None,
    n_save: int = 200,
    spacing: str = "linear",
    t_min: Any = None,
    observe: Callable[[Any, Any, Any], Mapping[str, Any]] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: Any = 1e-8,
    atol: Any = 1e-10,
    dt0: Any = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    max_steps: int = 100_000,
    event: Callable[[Any, Any, Any], Any] | diffrax.Event | None = None,
    progress: bool = False,
    dtype: Any = jnp.float64,
    adjoint: diffrax.AbstractAdjoint | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Trajectory:
    """Integrate ``dy/dt = field(t, y, args)`` from ``t0`` to ``t1``.

    Parameters
    ----------
    field:
        Vector field ``(t, y, args) -> dy/dt`` with ``dy/dt`` the same pytree as ``y``.
    y0:
        Initial state, any pytree of arrays.
    t1, t0:
        End and start times (may be traced).
    args:
        Parameters passed to ``field`` (pytree of arrays: learning rates, ratios, ...).
    ts, n_save, spacing, t_min:
        Save times: explicit ``ts``, or ``n_save`` points, ``"linear"`` or ``"log"``
        spaced (see `save_times`).
    observe:
        ``(t, y, args) -> {name: array}``: the observables recorded at each save time.
        Default: the state itself (a dict state keeps its keys; an array is ``"y"``).
    solver, rtol, atol, dt0, stepsize_controller:
        Default Tsit5 with ``PIDController(rtol, atol)``: `UnrolledTsit5` (stages
        unrolled) for fields of at most `UNROLL_MAX_PRIMITIVES` primitive operations,
        ``diffrax.Tsit5()`` above (identical steps; faster compilation of a large field).
        Any Diffrax solver is accepted. A fixed-step run is
        ``stepsize_controller=diffrax.ConstantStepSize()`` with ``dt0``.
    max_steps:
        Hard cap on solver steps; overflow raises `MaxStepsError` naming the time reached.
    event:
        ``(t, y, args) -> scalar``: the solve stops when it changes sign (located by a
        Newton root find). Save points after the event hold the event time and state,
        so ``traj.ts[-1]`` and ``traj.final()`` are the event time and state. A
        ``diffrax.Event`` is also accepted.
    progress:
        Show Diffrax's tqdm progress meter.
    dtype:
        Floating dtype of the state (float64 by default; requires `enable_x64`).

    Returns
    -------
    Trajectory with ``ts`` of shape ``(T,)`` and one array per observable.
    """
    if jnp.dtype(dtype) == jnp.dtype("float64"):
        require_x64("integrate")
    max_steps = V.positive_int("max_steps", max_steps)
    V.positive("rtol", rtol)
    V.positive("atol", atol)
    if not callable(field):
        raise ValueError(f"field must be callable (t, y, args) -> dy/dt, got {field!r}")
    if not jax.tree_util.tree_leaves(y0):
        raise ValueError(f"y0 must contain at least one array, got {y0!r}")
    V.finite_tree("y0", y0)
    if not V.any_traced((t0, t1)):
        t0f, t1f = V.finite_scalar("t0", t0), V.finite_scalar("t1", t1)
        if not t1f > t0f:
            raise ValueError(f"t1 must be greater than t0, got t0={t0!r}, t1={t1!r}")
    y0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), y0)
    # Shape check: the field must return the state's structure and shapes. The traced field
    # also gives its size, which picks the default solver below.
    field_jaxpr, out_struct = jax.make_jaxpr(field, return_shape=True)(jnp.asarray(t0, dtype), y0, args)
    in_struct = jax.eval_shape(lambda y: y, y0)
    if jax.tree_util.tree_structure(out_struct) != jax.tree_util.tree_structure(in_struct) or any(
        a.shape != b.shape for a, b in zip(jax.tree_util.tree_leaves(out_struct), jax.tree_util.tree_leaves(in_struct))
    ):
        raise ValueError(f"field returns {out_struct}, which does not match the state {in_struct}")

    # Saving only the two endpoints needs no per-step save loop (which, under vmap, costs
    # as much as the step itself): Diffrax saves t0 and t1 outside the loop.
    endpoints = ts is None and n_save == 2 and spacing == "linear"
    if ts is None:
        ts = save_times(t0, t1, n_save, spacing, t_min)
    ts = jnp.asarray(ts, dtype=dtype)
    if ts.ndim != 1:
        raise ValueError(f"ts must be 1-D, got shape {ts.shape}")
    observe = observe or _default_observe
    if solver is None:
        # Same steps and results either way (to 1e-12); unrolling pays on small fields and
        # copies a large one seven times into the program, which only slows compilation.
        small = _n_primitives(field_jaxpr.jaxpr) <= UNROLL_MAX_PRIMITIVES
        solver = UnrolledTsit5() if small else diffrax.Tsit5()
    if stepsize_controller is None:
        stepsize_controller = diffrax.PIDController(rtol=rtol, atol=atol)
    if isinstance(event, diffrax.Event) or event is None:
        ev = event
    else:
        # A module wrapper (equal when the user function is the same object) rather than a fresh
        # lambda, so repeated calls with the same event hit the compilation cache.
        ev = diffrax.Event(cond_fn=_EventFn(event), root_finder=optx.Newton(rtol=1e-12, atol=1e-12))

    traced = V.any_traced((y0, args, t0, t1, ts, rtol, atol))
    out_ts, out_ys, result, t_end, y_end = _solve(
        field, y0, args, jnp.asarray(t0, dtype), jnp.asarray(t1, dtype), ts, observe, solver,
        stepsize_controller, dt0, max_steps, ev, progress, adjoint, endpoints,
    )
    if traced:
        # Inside jit/vmap the time cannot be formatted into the message; fail loudly anyway.
        # Attach the checks to every output so none is dead-code-eliminated away.
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in jax.tree_util.tree_leaves(out_ys)]))
        out_ts, out_ys = eqx.error_if(
            (out_ts, out_ys), ~_ok(result),
            f"integrate: solver failed before t1 (max_steps={max_steps} reached or step size "
            "collapsed); increase max_steps, loosen rtol/atol, or use an implicit solver",
        )
        out_ts, out_ys = eqx.error_if(
            (out_ts, out_ys), ~finite, "integrate: non-finite value (NaN/Inf) in the solution: the ODE diverged"
        )
    else:
        _check_solution(field, args, result, t_end, y_end, out_ts, out_ys, max_steps, t1)
    m = {"integrator": type(solver).__name__, "max_steps": max_steps}
    if not V.any_traced((rtol, atol)) and np.ndim(rtol) == 0 and np.ndim(atol) == 0:
        m.update(rtol=float(rtol), atol=float(atol))
    m.update(meta or {})
    return Trajectory(out_ts, out_ys, m)


@filter_jit
def _solve(field, y0, args, t0, t1, ts, observe, solver, controller, dt0, max_steps, event, progress, adjoint,
           endpoints=False):
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
        term, solver, t0, t1, dt0, y0, args,
        saveat=saveat,
        stepsize_controller=controller,
        max_steps=max_steps,
        event=event,
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter(),
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
        k: jnp.where(reached.reshape((-1,) + (1,) * (v.ndim - 1)), v, obs_end[k][None])
        for k, v in save_ys.items()
    }
    return out_ts, out_ys, sol.result, t_end, y_end


def _check_solution(field, args, result, t_end, y_end, out_ts, out_ys, max_steps, t1) -> None:
    t_end = float(t_end)
    for name, v in out_ys.items():
        v = np.asarray(v)
        if v.dtype.kind in "fc" and not np.all(np.isfinite(v)):
            bad = int(np.argmax(~np.all(np.isfinite(v.reshape(v.shape[0], -1)), axis=1)))
            raise DivergenceError(
                f"integrate: observable {name!r} became non-finite at t = {float(out_ts[bad]):.6g} "
                f"(save index {bad}); the ODE diverged there"
            )
    if bool(_ok(result)):
        return
    dy = field(jnp.asarray(t_end), y_end, args)
    if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(dy)):
        raise DivergenceError(
            f"integrate: the vector field is non-finite at t = {t_end:.6g} (the solve stalled there "
            "before t1); the ODE diverges or leaves its domain"
        )
    size = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(y_end))
    if result == diffrax.RESULTS.max_steps_reached:
        raise MaxStepsError(
            f"integrate: max_steps={max_steps} reached at t = {t_end:.6g} before t1 = {float(t1):.6g} "
            f"(largest state entry there: {size:.3g}; a huge value means the ODE blows up). "
            "Increase max_steps, loosen rtol/atol, shorten t1, or try an implicit solver "
            "(diffrax.Kvaerno5()) if the problem is stiff."
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
    whose leaves selected by ``filter_spec`` (default: inexact arrays) flow. Per-circuit
    rates: ``labels`` (a pytree of labels, see `attnflow.label_by_path`) and ``rates``
    (``{label: eta}``, arrays allowed); otherwise one ``rate``. ``observe(model)`` gives
    the recorded observables (default: the loss). Remaining keywords go to `integrate`.
    This is the exact flow whose Euler scheme `simulate` runs with ``FullBatch``.
    """
    import equinox as eqx  # local: keep module import light

    filter_spec = eqx.is_inexact_array if filter_spec is None else filter_spec
    params, static = eqx.partition(model, filter_spec)
    if (rates is None) != (labels is None):
        raise ValueError("give both labels and rates for per-circuit rates, or neither")
    if rates is not None:
        for name, r in rates.items():
            V.positive(f"learning rate for circuit {name!r}", r)
        used = set(jax.tree_util.tree_leaves(labels))
        if used - set(rates):
            raise ValueError(f"no rate given for circuit(s) {sorted(used - set(rates))}")
    else:
        V.positive("rate", rate)

    def field(t, p, args):
        g = jax.grad(lambda q: loss(eqx.combine(q, static)))(p)
        if args["rates"] is None:
            return jax.tree_util.tree_map(lambda x: -args["rate"] * x, g)
        return jax.tree_util.tree_map(lambda x, lab: -args["rates"][lab] * x, g, labels)

    obs = observe or (lambda m: {"loss": loss(m)})
    return integrate(field, params, t1, args={"rates": rates, "rate": rate},
                     observe=lambda t, p, a: dict(obs(eqx.combine(p, static))), **integrate_kwargs)
