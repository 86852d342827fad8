"""`simulate`: `lax.scan`-compiled training of an Equinox model with an Optax optimizer.

Three modes, each an object (as Diffrax does with solvers):

- `FullBatch(data)`: gradient descent on a deterministic loss (a population loss with
  ``data=None``, or a fixed dataset). With learning rate eta this is the Euler scheme of
  gradient flow on the clock ``t = eta * step``.
- `OnlineSGD(sampler, batch_size)`: a fresh batch ``sampler(key, batch_size)`` per step
  (the high-dimensional online limit uses ``t = step * batch_size / D``).
- `Minibatch(dataset, batch_size)`: rows drawn uniformly with replacement from a fixed
  dataset at each step.

Observables are recorded at the steps of a `SaveGrid` (by default log-spaced) inside the
compiled loop: the run is one XLA program, with no host round-trip per step. The caller
states the clock (``clock``: time per step), so a simulation lands on the same time axis
as its theory.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _validate as V
from ._errors import fail_if
from ._jit import filter_jit
from .analysis import check_saved_event, with_event_time
from .ode import DivergenceError, trainable
from .options import LogGrid, SaveGrid, TimeGrid
from .trajectory import Trajectory, flatten_names

__all__ = ["simulate", "check_divergence", "FullBatch", "OnlineSGD", "Minibatch", "TrainingMode"]


class TrainingMode(eqx.Module):
    """How each step's batch is produced: `FullBatch`, `OnlineSGD` or `Minibatch`."""

    @abc.abstractmethod
    def batch(self, key: jax.Array) -> Any:
        """The batch of one step, from that step's key."""

    def default_observe(self, loss: Callable) -> Callable:
        """What `simulate` records when no ``observe`` is given."""
        raise ValueError(f"{type(self).__name__} has no deterministic loss to record by default; pass observe=...")


class FullBatch(TrainingMode):
    """Full-batch gradient descent on ``loss(model, data)``; ``data=None`` for a population loss."""

    data: Any = None

    def __check_init__(self):
        V.finite_tree("data", self.data)  # a NaN in the data would read as a divergence at step 0

    def batch(self, key):
        return self.data

    def default_observe(self, loss):
        return _LossOn(loss, self.data)


class _LossOn(eqx.Module):
    """``{"loss": loss(model, data)}``: a value equal for the same ``loss``, so a repeated
    `simulate` with the default observables reuses its compilation."""

    loss: Callable  # a function is static to filter_jit by itself; a loss module's arrays stay data
    data: Any

    def __call__(self, model):
        return {"loss": self.loss(model, self.data)}


class OnlineSGD(TrainingMode):
    """Online SGD: a fresh batch ``sampler(key, batch_size)`` every step."""

    sampler: Callable[[jax.Array, int], Any]
    batch_size: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        V.positive_int("batch_size", self.batch_size)
        if not callable(self.sampler):
            raise ValueError(f"sampler must be callable (key, batch_size) -> batch, got {self.sampler!r}")

    def batch(self, key):
        return self.sampler(key, self.batch_size)


class Minibatch(TrainingMode):
    """Minibatch SGD on a fixed dataset (pytree with a leading sample axis), with replacement."""

    dataset: Any
    batch_size: int = eqx.field(static=True, default=32)

    def __check_init__(self):
        V.positive_int("batch_size", self.batch_size)
        sizes = {np.shape(x)[0] for x in jax.tree_util.tree_leaves(self.dataset)}
        if len(sizes) != 1:
            raise ValueError(f"dataset leaves must share their leading (sample) axis, got sizes {sorted(sizes)}")
        V.finite_tree("dataset", self.dataset)

    def batch(self, key):
        n = jax.tree_util.tree_leaves(self.dataset)[0].shape[0]
        idx = jax.random.randint(key, (self.batch_size,), 0, n)
        # NumPy leaves too (a traced index cannot index a NumPy array)
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x)[idx], self.dataset)


def simulate(
    loss: Callable[[Any, Any], jax.Array],
    model: Any,
    optimizer: optax.GradientTransformation,
    steps: int | None,
    *,
    mode: TrainingMode | None = None,
    key: Any = 0,
    observe: Callable[[Any], Mapping[str, Any]] | None = None,
    save: SaveGrid | None = None,
    clock: Any = 1.0,
    filter_spec: Any = eqx.is_inexact_array,
    progress: bool = False,
    return_model: bool = False,
    throw: bool = True,
    meta: Mapping[str, Any] | None = None,
):
    """Train ``model`` for ``steps`` optimizer steps and record named observables.

    Parameters
    ----------
    loss:
        ``loss(model, batch) -> scalar``.
    model:
        An Equinox module (or any pytree); its leaves selected by ``filter_spec`` are trained.
        Python floats among the rest (``Lin(a=0.1, ...)``: no array) stay fixed, with a
        ``UserWarning`` naming them; a ``ValueError`` names them when nothing would train.
    optimizer:
        An Optax transformation (see `attnflow.per_circuit` for per-circuit rates).
    steps:
        Number of optimizer steps (training goes on past the last save step, so that the
        returned model is the one after ``steps``). ``None`` with ``save=TimeGrid(steps)``:
        train to the grid's last step. A caller's compiled function may pass the grid's steps
        (and ``steps``) traced, as arguments: it then compiles once for every run with as many
        save points; a traced grid is taken as given (whole, increasing steps in
        ``[0, steps]``: check it before tracing, as `SaveGrid.steps_for` does).
    mode:
        `FullBatch` (default), `OnlineSGD` or `Minibatch`.
    key:
        PRNG key or integer seed for batch sampling (may be traced: vmap over seeds).
    observe:
        ``observe(model) -> {name: array}`` recorded at the save steps. Default for
        `FullBatch`: ``{"loss": loss(model, data)}``.
    save:
        A `SaveGrid` read on the step axis ``[0, steps]``: ``LogGrid(100)`` (default),
        ``LinearGrid(n)``, or ``TimeGrid(steps)`` with explicit whole-number steps.
    clock:
        Time per step, so that ``t = clock * step``: the learning rate for gradient flow,
        ``batch_size / D`` for online SGD in dimension D. May be traced.
    filter_spec:
        Which leaves of ``model`` train (default: inexact arrays), as ``eqx.partition`` takes it.
    progress:
        A progress bar of the run's steps on stderr, filled after each save segment and closed
        after the last step.
    return_model:
        Also return the trained model.
    throw:
        ``True``: a non-finite loss or parameter raises `DivergenceError` naming the step
        (inside ``jit``/``vmap``: an equinox runtime error). ``False``: no error; the
        parameters freeze at their last finite values (those the divergence step started
        from, whose loss may be non-finite: save steps from there on record their
        observables, ``inf`` included) and the divergence step (``-1`` for none) is returned
        after the trajectory (and model), for callers that decide themselves (a sweep in
        which one point may diverge).

    Returns
    -------
    `Trajectory` with ``ts`` of shape ``(T,)`` (and the final model if ``return_model``;
    and the divergence step if ``throw=False``).

    The step grid is an argument of the compiled loop, not part of it: runs of other lengths
    with as many save points reuse one compilation.
    """
    if steps is None and not isinstance(save, TimeGrid):
        raise ValueError(f"steps=None needs save=TimeGrid(steps) (the run ends at its last step), got save={save!r}")
    grid_traced = isinstance(save, TimeGrid) and V.any_traced(save.ts)
    if steps is not None and V.any_traced(steps) and not grid_traced:
        raise ValueError("steps may be traced only with a traced save=TimeGrid(steps) (a caller's compiled grid)")
    if steps is not None and not V.any_traced(steps):
        steps = V.positive_int("steps", steps)
    mode = FullBatch() if mode is None else mode
    if not isinstance(mode, TrainingMode):
        raise ValueError(f"mode must be FullBatch, OnlineSGD or Minibatch, got {mode!r}")
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"optimizer must be an optax GradientTransformation, got {optimizer!r}")
    save = LogGrid(100) if save is None else save
    if not isinstance(save, SaveGrid):
        raise ValueError(f"save must be a SaveGrid (LinearGrid, LogGrid or TimeGrid), got {save!r}")
    V.positive("clock", clock)
    s_save: Any
    if grid_traced:
        # the caller traced its grid (and checked it before tracing: whole steps, increasing,
        # within [0, steps])
        s_save = jnp.asarray(save.ts).astype(jnp.int32)  # type: ignore[attr-defined]
    elif isinstance(save, TimeGrid) and steps is None:
        last = np.max(np.asarray(save.ts))
        if not last > 0:
            raise ValueError(
                f"steps=None trains to the last step of the TimeGrid, which must be positive, got {last:g}"
            )
        s_save = save.steps(int(last))
        steps = int(s_save[-1])
    else:
        assert steps is not None  # refused above unless save is a TimeGrid
        s_save = save.steps(steps)
    # training goes on to `steps` past a grid that ends before it (the returned model is at `steps`)
    end = s_save[-1] if steps is None else steps
    observe = observe or mode.default_observe(loss)
    key = V.prng_key(key)  # an integer seed (possibly traced, for vmap over seeds) or a key
    params, static = trainable("simulate", model, filter_spec)
    V.finite_tree("model", params)
    _check_loss(loss, params, static, mode, key)
    traced = V.any_traced((params, key, clock, mode, optimizer, s_save))

    out_params, ys, bad = _run(
        loss,
        params,
        static,
        optimizer,
        mode,
        key,
        observe,
        jnp.asarray(s_save, dtype=jnp.int32),
        jnp.asarray(end, dtype=jnp.int32),
        progress,
    )
    ts = jnp.asarray(clock) * jnp.asarray(s_save).astype(jnp.result_type(float))
    if throw and traced:
        ts, ys, out_params = fail_if(
            (ts, ys, out_params),
            bad >= 0,
            "simulate: non-finite loss or parameters during training (diverged); lower the learning rate",
        )
        finite = jnp.all(
            jnp.array(
                [
                    jnp.all(jnp.isfinite(v))
                    for v in jax.tree_util.tree_leaves(ys)
                    if jnp.issubdtype(v.dtype, jnp.inexact)
                ]
                or [True]
            )
        )
        ts, ys, out_params = fail_if(
            (ts, ys, out_params),
            ~finite,
            "simulate: an observable became non-finite (NaN/Inf) while the parameters stayed finite",
        )
    elif throw and int(bad) >= 0:
        b = int(bad)
        raise DivergenceError(
            f"simulate: non-finite loss or parameters at step {b} (t = {float(clock) * b:.6g}); "
            "the run diverged: lower the learning rate or check the data"
        )
    elif throw:
        for name, v in ys.items():
            v = np.asarray(v)
            if v.dtype.kind in "fc" and not np.all(np.isfinite(v)):
                i = int(np.argmax(~np.all(np.isfinite(v.reshape(v.shape[0], -1)), axis=1)))
                raise DivergenceError(
                    f"simulate: observable {name!r} became non-finite at step {int(s_save[i])} "
                    f"(t = {float(ts[i]):.6g}), while the parameters stayed finite: the observable is undefined "
                    "there (a log or division at zero?)"
                )
    m: dict[str, Any] = {"mode": type(mode).__name__}
    if steps is not None and not V.any_traced(steps):
        m["steps"] = steps  # a traced count cannot sit in the (static) metadata: its caller adds it
    m.update(meta or {})
    traj = Trajectory(ts, ys, m)
    out: tuple = (traj,)
    if return_model:
        out += (eqx.combine(out_params, static),)
    if not throw:
        out += (bad,)
    return out[0] if len(out) == 1 else out


def check_divergence(traj: Trajectory, step: Any, clock: Any = 1.0) -> Trajectory:
    """``traj`` if the run it records did not diverge (``step < 0``), else an error naming the step.

    ``step`` is the divergence step returned by ``simulate(..., throw=False)``. Outside any
    trace a diverged run raises `DivergenceError` with the step and its time
    (``clock * step``); inside ``jit``/``vmap`` the check is attached to the returned
    trajectory (``equinox.error_if``), so a diverging run stops with a message instead of
    returning NaNs; inside `attnflow.sweep` the point is marked failed and its values NaN.
    """
    if V.any_traced((step, traj)):
        return fail_if(
            traj,
            step >= 0,
            "simulate: non-finite loss or parameters during training (diverged); lower the learning rate",
        )
    b = int(step)
    if b >= 0:
        raise DivergenceError(
            f"simulate: non-finite loss or parameters at step {b} (t = {float(clock) * b:.6g}); "
            "the run diverged: lower the learning rate or check the data"
        )
    return traj


def check_start(given: Any, reference: Any, what: str) -> Any:
    """``given``, a network to train on from (``train(..., model=...)``), checked against the
    shapes of ``reference`` (the setup's own start, e.g. from ``eqx.filter_eval_shape``): the
    same structure and array shapes, else ``ValueError`` naming the first difference."""

    def arrays(tree):
        return eqx.filter(tree, lambda x: eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct))

    if type(given) is not type(reference) or (
        jax.tree_util.tree_structure(arrays(given)) != jax.tree_util.tree_structure(arrays(reference))  # type: ignore[operator]
    ):
        raise ValueError(
            f"model must be {what} shaped like the setup's own start ({type(reference).__name__}), "
            f"got {type(given).__name__}"
        )
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(arrays(given)), jax.tree_util.tree_leaves(arrays(reference)), strict=True
    ):
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(
                f"model{jax.tree_util.keystr(path)} has shape {tuple(a.shape)}, the setup's start {tuple(b.shape)}"
            )
    V.finite_tree("model", arrays(given))
    return given


def run_training(run: Callable, args: tuple, *, clock: Any, total: int, event: Any = None) -> Any:
    """A theory package's compiled training ``run(*args) -> (trajectory, divergence step)``, or
    ``(trajectory, trained model, divergence step)`` (`simulate` with ``throw=False``, the
    step grid traced), as its ``train`` returns it: an ``event`` checked on the run's
    observables before any computing (by tracing ``run``, which its call then reuses), a
    diverged run stopped with the step (`check_divergence`), the step count in the metadata,
    ``t_event`` the first time ``event(t, obs)`` reaches or crosses zero on the saved points
    (`attnflow.event_time`); and the model, when ``run`` returns one."""
    if event is not None:
        check_saved_event(event, eqx.filter_eval_shape(run, *args)[0])
    out = run(*args)
    traj = with_event_time(check_divergence(out[0], out[-1], clock).with_meta(steps=total), event)
    return (traj, out[1]) if len(out) == 3 else traj


@filter_jit
def _run(loss, params, static, optimizer, mode, key, observe, s_save, end, progress):
    opt_state = optimizer.init(params)
    lengths = jnp.diff(s_save)

    def observe_p(p):
        out = observe(eqx.combine(p, static))
        if not isinstance(out, Mapping):
            raise ValueError(f"observe must return a mapping name -> array, got {type(out).__name__}")
        return flatten_names(out)

    def step_fn(i, carry):
        p, o, k, bad = carry
        k, sub = jax.random.split(k)
        batch = mode.batch(sub)
        value, grads = jax.value_and_grad(lambda q: loss(eqx.combine(q, static), batch))(p)
        updates, o_new = optimizer.update(grads, o, p)
        # keep each parameter's dtype (a float64 learning rate must not promote float32 weights)
        p_new = jax.tree_util.tree_map(
            lambda a, u: a if u is None else (a + u).astype(a.dtype), p, updates, is_leaf=lambda x: x is None
        )
        # x * 0 is 0 for finite x and NaN for NaN or Inf, and a sum of zeros cannot overflow:
        # one fast sum per leaf finds any non-finite entry (XLA:CPU lowers all(isfinite(x)) as an
        # unfused boolean reduce-window, 5x slower on the heads-SGD weights)
        probe = value * 0 + sum(jnp.sum(x * 0) for x in jax.tree_util.tree_leaves(p_new))
        finite = probe == 0
        bad = jnp.where((bad < 0) & ~finite, i, bad)
        # Once diverged, freeze: the parameters (and the optimizer state) stay at the last finite
        # values, those of the divergence step, whose loss may itself be non-finite (it is what
        # stopped the run); the save steps from there on record the observables of these parameters.
        keep = bad < 0
        p = jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), p_new, p)
        o = jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), o_new, o)
        return p, o, k, bad

    def segment(carry, length):
        p, o, k, bad, step = carry
        p, o, k, bad = jax.lax.fori_loop(step, step + length, step_fn, (p, o, k, bad))
        if progress:
            # `bad` comes out of the segment's loop: an argument that holds the tick until the segment is done
            jax.debug.callback(_progress_tick, *_host_scalars(step + length, end, bad))
        return (p, o, k, bad, step + length), observe_p(p)

    # the first save step may be past 0 (a grid from t_min): train to it, then observe
    p, o, k, bad = jax.lax.fori_loop(0, s_save[0], step_fn, (params, opt_state, key, jnp.asarray(-1, jnp.int32)))
    y0 = observe_p(p)
    (p, o, k, bad, _), ys = jax.lax.scan(segment, (p, o, k, bad, s_save[0]), lengths)
    p, o, k, bad = jax.lax.fori_loop(s_save[-1], end, step_fn, (p, o, k, bad))  # past the last save
    ys = {name: jnp.concatenate([jnp.asarray(y0[name])[None], ys[name]]) for name in y0}
    if progress:
        # after the last step (`bad` is its result) and so after every tick
        jax.debug.callback(_progress_close, *_host_scalars(end, end, bad))
    return p, ys, bad


def _host_scalars(*xs: Any) -> tuple[jax.Array, ...]:
    """``xs`` with any batch axis of `jax.vmap` reduced away (by their maximum), so that a callback
    under ``vmap`` (a sweep over seeds) runs once, not once per batch element."""
    return tuple(eqx.internal.unvmap_max(jnp.asarray(x)) for x in xs)


_BAR = None


def _check_loss(loss: Any, params: Any, static: Any, mode: TrainingMode, key: jax.Array) -> None:
    """``loss(model, batch)`` must be callable and give one real number: named error before
    any computing (traced abstractly, on a batch of the mode)."""
    if not callable(loss):
        raise ValueError(f"loss must be callable (model, batch) -> scalar, got {loss!r:.80}")
    out = V.abstract_call(
        "loss(model, batch) failed on the initial model",
        lambda p, k: loss(eqx.combine(p, static), mode.batch(k)),
        params,
        key,
    )
    V.one_number("loss(model, batch)", out)


def _progress_tick(done: Any, total: Any, after: Any = None) -> None:
    """The progress bar of `simulate` (``progress=True``) at ``done`` of ``total`` steps: called on
    the host after each save segment (``after``, the segment's result, only orders the call). A bar
    left by an interrupted run (more steps done, or another total) is closed and a new one begun."""
    global _BAR
    from ._io import progress_bar

    done, total = int(done), int(total)
    if _BAR is not None and (done < _BAR.n or _BAR.total != total):
        _BAR.close()
        _BAR = None
    if _BAR is None:
        _BAR = progress_bar(desc="simulate", unit="step", total=total)
    _BAR.update(done - _BAR.n)


def _progress_close(done: Any, total: Any, after: Any = None) -> None:
    """The bar filled to ``done`` steps (those past the last save step included) and closed: called
    on the host after the run's last step."""
    global _BAR
    if _BAR is None and int(total) > 0:  # a grid of one save step has no segment, and so no tick
        _progress_tick(done, total)
    if _BAR is not None:
        _BAR.update(max(int(done) - _BAR.n, 0))
        _BAR.close()
        _BAR = None
