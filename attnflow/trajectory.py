"""`Trajectory`: named observables over time, the one result type of attnflow.

Theory (`integrate`) and simulation (`simulate`) both return a `Trajectory`, so an
overlay or a test is always the same comparison: two sets of named arrays on a clock.

Layout: ``ts`` has shape ``(..., T)`` and every observable ``ys[name]`` has shape
``(..., T, *feature)``; the leading ``...`` are batch axes added by ``vmap`` or `sweep`.
``meta`` is a JSON-serialisable dict (config, seed, versions) carried as static data.
``t_event`` (shape ``(...)``) is the time a terminating event fired, NaN where it did not
(`attnflow.integrate` with ``event=``); ``None`` for runs without an event.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Container, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._io import json_default, optional_import, save_arrays
from .options import _caller_outside_attnflow

__all__ = ["Trajectory", "compare", "versions", "flatten_names", "name_list"]


def name_list(names: str | Iterable[str] | None, default: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a tuple of observable names: one string is one name (not its characters);
    ``None`` gives ``default``."""
    if names is None:
        return tuple(default)
    if isinstance(names, str):
        return (names,)
    out = tuple(names)
    for n in out:
        if not isinstance(n, str):
            raise ValueError(f"observable names must be strings, got {n!r}")
    return out


def _free_name(name: str, taken: Container[str]) -> str:
    """``name``, or ``name`` with ``_value`` appended (as often as needed) when ``taken`` has it:
    the name under which `Trajectory.to_xarray`, `Trajectory.to_pandas` and
    `attnflow.SweepResult.to_xarray` store a value named like a coordinate, an axis or a column
    of their own (an observable ``t`` becomes ``t_value``)."""
    while name in taken:
        name = f"{name}_value"
    return name


def flatten_names(d: Mapping, prefix: str = "") -> dict:
    """A nested mapping of observables as one flat mapping with dotted names:
    ``{"a": {"b": x}, "c": y}`` gives ``{"a.b": x, "c": y}``. Two entries that would get the
    same name (``{"a.b": x, "a": {"b": y}}``, keys ``1`` and ``"1"``) raise ``ValueError``."""
    out: dict = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        inner = flatten_names(v, name + ".") if isinstance(v, Mapping) else {name: v}
        for n, x in inner.items():
            if n in out:  # {"a.b": x, "a": {"b": y}}, or keys 1 and "1": one would overwrite the other
                raise ValueError(
                    f"observable names collide: two entries are both named {n!r} once nested keys are joined "
                    "with '.' (and keys written as strings); rename one of them"
                )
            out[n] = x
    return out


def versions() -> dict[str, str]:
    """Versions of the packages a result depends on (recorded in saved metadata)."""
    import importlib.metadata as md

    out = {}
    for pkg in ("attnflow", "jax", "jaxlib", "equinox", "diffrax", "optax", "optimistix", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _freeze_meta(meta: Mapping[str, Any] | None) -> str:
    # Metadata travels as a canonical JSON string: hashable (so it can sit in a pytree's
    # static part under jit/vmap) and exactly what `save` writes.
    if meta is not None and not isinstance(meta, Mapping):
        raise ValueError(f"meta must be a mapping key -> JSON-serialisable value, got {type(meta).__name__}")
    meta = dict(meta or {})
    try:
        return json.dumps(meta, sort_keys=True, default=_json_value)
    except (TypeError, ValueError):
        pass
    for key, value in meta.items():  # which entry: a repr would be stored, and read back as a string
        try:
            json.dumps(value, default=_json_value)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"meta[{key!r}] must be JSON-serialisable (numbers, strings, lists, dicts, arrays), "
                f"got {type(value).__name__} {value!r:.80} ({err})"
            ) from None
    return json.dumps(meta, sort_keys=True, default=_json_value)  # a non-string key: json's own error


def _json_value(obj: Any) -> Any:
    """`attnflow._io.json_default` for real or boolean arrays and NumPy scalars, and paths;
    anything else (a complex or datetime value too) refused (``TypeError``), where json_default
    would store its ``repr``."""
    if isinstance(obj, Path):
        return json_default(obj)
    if isinstance(obj, np.ndarray | jax.Array | np.generic) and np.dtype(obj.dtype).kind in "biuf":
        return json_default(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


@jax.tree_util.register_pytree_node_class
class Trajectory:
    """Times plus a dict of named arrays plus metadata.

    Parameters
    ----------
    ts:
        Save times, shape ``(..., T)``; non-decreasing and finite along the time axis.
    ys:
        Mapping from observable name to array of shape ``(..., T, *feature)``.
    meta:
        JSON-serialisable metadata (config, seed, ...).
    t_event:
        Time at which a terminating event fired, shape ``(...)`` (NaN where it did not),
        or ``None``.
    stats:
        Solver statistics, name -> array of the batch shape ``(...)``: `attnflow.integrate`
        records Diffrax's ``num_steps``, ``num_accepted_steps`` and ``num_rejected_steps``
        (so a sweep has one count per grid point); empty for training runs.
    """

    __slots__ = ("ts", "ys", "_meta", "t_event", "stats")

    def __init__(
        self,
        ts: Any,
        ys: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
        t_event: Any = None,
        stats: Mapping[str, Any] | None = None,
    ):
        if not isinstance(ys, Mapping):
            raise ValueError(f"ys must be a mapping name -> array, got {type(ys).__name__}")
        for k in ys:
            if not isinstance(k, str):
                raise ValueError(f"observable names must be strings, got {k!r}")
        if not isinstance(ts, jax.core.Tracer | jax.Array):
            try:
                arr = np.asarray(ts)
            except (TypeError, ValueError, OverflowError):
                arr = np.asarray(None)
            if arr.dtype.kind not in "fiu":
                raise ValueError(f"ts must be an array of real save times, got {ts!r:.80}")
            ts = arr.astype(float) if arr.dtype.kind in "iu" else arr  # integer steps become times
        ts = jnp.asarray(ts)
        if jnp.issubdtype(ts.dtype, jnp.integer):  # a JAX array of steps too: at/compare interpolate in t
            ts = ts.astype(jnp.result_type(float))
        elif not jnp.issubdtype(ts.dtype, jnp.floating):
            raise ValueError(f"ts must be an array of real save times, got dtype {ts.dtype}")
        if ts.ndim < 1:
            raise ValueError(f"ts must have a time axis, got shape {ts.shape}")
        T = ts.shape[-1]
        if not isinstance(ts, jax.core.Tracer):
            t = np.asarray(ts, dtype=float)
            # a run whose times are all NaN is a failed point of a sweep (NaN-filled); others must be finite
            failed = np.all(np.isnan(t), axis=-1, keepdims=True)
            if not np.all(np.isfinite(t) | failed):
                bad = np.argwhere(~(np.isfinite(t) | failed))[0]
                raise ValueError(f"ts must be finite; entry {tuple(int(i) for i in bad)} is {float(t[tuple(bad)])}")
            if T > 1 and np.any(np.diff(t, axis=-1) < 0):
                i = int(np.argwhere(np.diff(t, axis=-1) < 0)[0][-1])
                raise ValueError(f"ts must be non-decreasing along time; ts[..., {i}] > ts[..., {i + 1}]")
        ys = {k: jnp.asarray(v) for k, v in ys.items()}
        for k, v in ys.items():
            if v.ndim < ts.ndim or v.shape[: ts.ndim] != ts.shape:
                raise ValueError(
                    f"observable {k!r} has shape {v.shape}; its leading axes must match "
                    f"ts.shape {ts.shape} (time axis of length {T})"
                )
        if t_event is not None:
            t_event = jnp.asarray(t_event)
            if t_event.shape != ts.shape[:-1]:
                raise ValueError(f"t_event must have the batch shape {ts.shape[:-1]}, got {t_event.shape}")
        if stats is not None and not isinstance(stats, Mapping):
            raise ValueError(f"stats must be a mapping name -> array or None, got {type(stats).__name__}")
        stats = {str(k): jnp.asarray(v) for k, v in (stats or {}).items()}
        for k, v in stats.items():
            if v.shape != ts.shape[:-1]:
                raise ValueError(f"stats[{k!r}] must have the batch shape {ts.shape[:-1]}, got {v.shape}")
        self.ts = ts
        self.ys = ys
        self._meta = _freeze_meta(meta)
        self.t_event = t_event
        self.stats = stats

    # --- pytree protocol -------------------------------------------------------------
    def tree_flatten(self):
        names = tuple(sorted(self.ys))
        stat_names = tuple(sorted(self.stats))
        children = (self.ts, tuple(self.ys[n] for n in names), self.t_event, tuple(self.stats[n] for n in stat_names))
        return children, (names, self._meta, stat_names)

    @classmethod
    def tree_unflatten(cls, aux, children):
        names, meta, stat_names = aux
        obj = object.__new__(cls)
        obj.ts = children[0]
        obj.ys = dict(zip(names, children[1]))
        obj._meta = meta
        obj.t_event = children[2]
        obj.stats = dict(zip(stat_names, children[3]))
        return obj

    # --- access --------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return json.loads(self._meta)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.ys)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.ts.shape[:-1])

    def __getitem__(self, name: str) -> jax.Array:
        try:
            return self.ys[name]
        except KeyError:
            raise KeyError(f"no observable {name!r}; this trajectory has {sorted(self.ys)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.ys

    def __len__(self) -> int:
        return int(self.ts.shape[-1])

    def keys(self) -> tuple[str, ...]:
        """The observable names (`names`): ``dict(traj)`` is ``{name: array}``."""
        return self.names

    def items(self) -> Iterator[tuple[str, jax.Array]]:
        """``(name, array)`` of every observable, as ``traj.ys.items()``."""
        return iter(self.ys.items())

    def __iter__(self) -> Iterator[Any]:
        # len(traj) counts save times and traj[name] reads an observable: iterating would be
        # ambiguous (Python would index 0, 1, ... by name), so say which to use
        raise TypeError(
            "a Trajectory is not iterable: iterate over traj.names (or traj.items(), dict(traj)) for the "
            "observables, traj.ts for the save times"
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.ys.items())
        return f"Trajectory(ts{tuple(self.ts.shape)}, {fields})"

    def select(self, *names: str) -> Trajectory:
        """A trajectory with only the given observables."""
        return Trajectory(self.ts, {n: self[n] for n in names}, self.meta, self.t_event, self.stats)

    def with_ys(self, **ys: Any) -> Trajectory:
        """A trajectory with extra (or replaced) observables on the same clock."""
        return Trajectory(self.ts, {**self.ys, **ys}, self.meta, self.t_event, self.stats)

    def with_meta(self, **entries: Any) -> Trajectory:
        """The same trajectory with metadata entries added or replaced (JSON-serialisable)."""
        return Trajectory(self.ts, self.ys, {**self.meta, **entries}, self.t_event, self.stats)

    def rename(self, **names: str) -> Trajectory:
        """Observables renamed, ``new=old`` (e.g. ``traj.rename(loss="population_loss")``)."""
        missing = [old for old in names.values() if old not in self.ys]
        if missing:
            raise KeyError(f"no observable {missing[0]!r} to rename; this trajectory has {sorted(self.ys)}")
        olds = set(names.values())
        clash = [new for new in names if new in self.ys and new not in olds]
        if clash:
            raise ValueError(
                f"cannot rename onto {clash[0]!r}: this trajectory already has an observable of that name "
                f"(rename or drop it too: traj.rename({clash[0]}='...', ...))"
            )
        ys = {k: v for k, v in self.ys.items() if k not in olds}
        ys.update({new: self.ys[old] for new, old in names.items()})
        return Trajectory(self.ts, ys, self.meta, self.t_event, self.stats)

    def batch(self, index: Any) -> Trajectory:
        """Index the leading batch axes (e.g. one seed or one learning rate of a sweep), as NumPy
        indexes an array of shape `batch_shape`: ``traj.batch(1)``, ``traj.batch((0, 2))``,
        ``traj.batch((slice(None), 0))``. An ``...`` stands for the batch axes the rest leaves out,
        never the time or feature axes (``traj.batch((..., 0))`` is the first entry of the last
        batch axis). An index taking more axes than there are batch axes raises ``ValueError``
        naming it and the batch shape."""
        if not self.batch_shape:
            raise ValueError("this trajectory has no batch axes to index")
        index = self._batch_index(index)
        ts = self.ts[index]
        ys = {k: v[index] for k, v in self.ys.items()}
        t_event = None if self.t_event is None else self.t_event[index]
        return Trajectory(ts, ys, self.meta, t_event, {k: v[index] for k, v in self.stats.items()})

    def _batch_index(self, index: Any) -> tuple[Any, ...]:
        """``index`` as a tuple that reaches no further than the batch axes, its ``...`` spelt out
        as the batch axes it stands for: indexing ``ts`` with more would silently slice the save
        times (and the feature axes of the observables) instead of raising."""
        nb = len(self.batch_shape)
        items = index if isinstance(index, tuple) else (index,)
        taken = 0
        for item in items:
            if item is None or item is Ellipsis or isinstance(item, bool | np.bool_):
                continue  # a new axis (None, a scalar mask) takes none; ... takes what the others leave
            if isinstance(item, slice | int | np.integer):
                taken += 1
            else:  # an array index: a boolean mask takes its dimensions, integers one axis
                arr = item if isinstance(item, jax.Array | np.ndarray) else np.asarray(item)
                taken += arr.ndim if arr.dtype == bool else 1
        shown = _show_index(items)
        dots = [j for j, item in enumerate(items) if item is Ellipsis]
        if len(dots) > 1:
            raise ValueError(f"batch: index {shown} has more than one '...'")
        if taken > nb:
            raise ValueError(
                f"batch: index {shown} takes {taken} axes, but this trajectory has {nb} batch "
                f"{'axis' if nb == 1 else 'axes'} (batch shape {self.batch_shape}); batch indexes the batch axes only "
                "(save times: traj.at(t) or traj.resample(t); a component: traj[name][..., j])"
            )
        if dots:
            i = dots[0]
            items = items[:i] + (slice(None),) * (nb - taken) + items[i + 1 :]
        return items

    def mean(self, axis: int | tuple[int, ...] | None = None) -> Trajectory:
        """The average over batch axes (default: all of them), e.g. over the seeds of a sweep of
        `train`. The runs must share their save times. ``t_event`` is averaged alike (NaN for a
        group in which an event did not fire: ``np.nanmean(traj.t_event, axis)`` averages the
        others); ``stats`` (solver counts of single runs) are dropped. A failed run (a point of a sweep filled with NaN)
        makes its group's mean NaN; runs that finished keep their times and values."""
        return self._reduce(jnp.mean, axis, "mean")

    def std(self, axis: int | tuple[int, ...] | None = None, ddof: int = 0) -> Trajectory:
        """The standard deviation over batch axes (default: all), as `mean`: ``sqrt(sum (y -
        mean)^2 / (n - ddof))`` over the ``n`` runs. ``ddof = 0`` (the default) is the spread of
        the runs; ``ddof = 1`` the unbiased estimate of the seed-to-seed variance, for error bars
        from a few seeds (``t_event`` too)."""
        if not isinstance(ddof, int | np.integer) or isinstance(ddof, bool) or ddof < 0:
            raise ValueError(f"std: ddof must be an integer >= 0, got {ddof!r}")
        return self._reduce(lambda v, axis: jnp.std(v, axis=axis, ddof=int(ddof)), axis, "std", min_runs=ddof + 1)

    def _reduce(self, fn: Any, axis: int | tuple[int, ...] | None, what: str, min_runs: int = 1) -> Trajectory:
        nb = len(self.batch_shape)
        if nb == 0:
            raise ValueError(f"{what}: this trajectory has no batch axes to reduce")
        axes = tuple(range(nb)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        if not all(isinstance(a, int) and -nb <= a < nb for a in axes):
            raise ValueError(f"{what}: axis must be batch axes in [{-nb}, {nb}), got {axis!r}")
        axes = tuple(sorted({a % nb for a in axes}))
        n = math.prod(self.batch_shape[a] for a in axes)
        if n < min_runs:
            raise ValueError(f"{what}: ddof = {min_runs - 1} needs more than {min_runs - 1} runs, got {n}")
        ts = self.ts[tuple(0 if i in axes else slice(None) for i in range(nb))]
        ys = {k: fn(v, axis=axes) for k, v in self.ys.items()}
        if not isinstance(self.ts, jax.core.Tracer):
            t = np.asarray(self.ts)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN groups: every run of it failed
                t0 = np.nanmax(t, axis=axes)  # the times of the runs that finished (failed runs are NaN)
                spread = np.nanmax(np.abs(t - np.expand_dims(t0, axes))) if np.isfinite(t).any() else 0.0
            if spread > 1e-9 * (1.0 + float(np.nanmax(np.abs(t0), initial=0.0))):
                raise ValueError(f"{what}: the runs have different save times (by up to {spread:.3g}); resample first")
            failed = np.isnan(t).any(axis=-1)  # failed runs: their group's times become NaN too
            failed = np.any(failed, axis=axes)
            ts = jnp.asarray(np.where(failed[..., None], np.nan, t0))
        t_event = None if self.t_event is None else fn(self.t_event, axis=axes)
        return Trajectory(ts, ys, {**self.meta, "reduced": what}, t_event)

    def final(self) -> dict[str, jax.Array]:
        """The last saved value of every observable (for event-terminated runs: the event state)."""
        return {k: jnp.take(v, -1, axis=self.ts.ndim - 1) for k, v in self.ys.items()}

    def map(self, fn, *names: str) -> dict[str, jax.Array]:
        """Apply ``fn`` to each named observable."""
        return {n: fn(self[n]) for n in (names or self.names)}

    # --- interpolation -------------------------------------------------------------
    def at(self, t: Any, names: Iterable[str] | None = None, log_time: bool = False) -> dict[str, jax.Array]:
        """Linearly interpolate observables at times ``t``, per batch element.

        ``t`` of shape ``(k,)`` (or a scalar: ``k = 1``) gives every run the same times: an
        observable of shape ``(..., T, *feature)`` becomes ``(..., k, *feature)``. ``t`` of shape
        ``batch_shape + (k,)`` gives each run its own times (``traj.at(traj.t_event[..., None])``
        reads every run at its own event time), with the same result shape; leading axes of size
        1 broadcast. Any other shape raises ``ValueError`` naming both shapes.

        ``log_time=True`` interpolates in ``log t`` (better on log-spaced saves); between a save
        at ``t = 0`` and the first positive save time, where ``log t`` is not defined, linearly
        in ``t``. Outside the saved range the end values are held.
        """
        t = jnp.atleast_1d(jnp.asarray(t, dtype=self.ts.dtype))
        names = name_list(names, self.names)
        for n in names:
            self[n]  # KeyError naming a missing observable before any work
        batch = self.batch_shape
        per_run = t.ndim > 1
        if per_run:
            # one row of times per run: the batch axes of t must be the trajectory's (or broadcast to them)
            try:
                fits = t.ndim == len(batch) + 1 and np.broadcast_shapes(t.shape[:-1], batch) == batch
            except ValueError:
                fits = False
            if not fits and not batch:
                raise ValueError(f"at: t of shape {t.shape} for an unbatched trajectory: give times of shape (k,)")
            if not fits:
                per = "(" + ", ".join([*map(str, batch), "k"]) + ")"
                raise ValueError(
                    f"at: t of shape {t.shape} does not fit a trajectory of batch shape {batch}: give times "
                    f"of shape (k,) (the same for every run) or {per} (each run its own)"
                )
            t = jnp.broadcast_to(t, batch + t.shape[-1:])
        tiny = jnp.finfo(self.ts.dtype).tiny  # log time: t = 0 (the start of every save grid) as t -> 0+

        def interp1(ts, y, t):
            flat = y.reshape(y.shape[0], -1)
            out = jax.vmap(lambda col: jnp.interp(t, ts, col), in_axes=1, out_axes=1)(flat)
            if log_time:
                x, xp = jnp.log(jnp.maximum(t, tiny)), jnp.log(jnp.maximum(ts, tiny))
                logged = jax.vmap(lambda col: jnp.interp(x, xp, col), in_axes=1, out_axes=1)(flat)
                first_positive = jnp.min(jnp.where(ts > 0, ts, jnp.inf))
                out = jnp.where((t < first_positive)[:, None], out, logged)
            return out.reshape((t.shape[0],) + y.shape[1:])

        fn = interp1
        for _ in range(self.ts.ndim - 1):
            fn = jax.vmap(fn, in_axes=(0, 0, 0 if per_run else None))
        return {n: fn(self.ts, self[n], t) for n in names}

    def resample(self, t: Any, log_time: bool = False) -> Trajectory:
        """This trajectory interpolated onto the time grid ``t``: of shape ``(k,)`` for every run,
        or ``batch_shape + (k,)`` for each run its own (as `at`). Every time must lie within the
        span of the run it is read from, ``[ts[0], ts[-1]]`` up to the rounding `compare` allows:
        ``ValueError`` naming the time and the span otherwise (`at` holds the end values there,
        and a trajectory relabelled onto such times would pass `compare`'s range check). Traced
        times (under ``jit``) cannot be checked: there the end values are held, as in `at`."""
        given = getattr(t, "dtype", None)  # a float32 clock's rounding counts as inside, as in compare
        given = given if given is not None and np.issubdtype(given, np.floating) else self.ts.dtype
        t = jnp.atleast_1d(jnp.asarray(t, dtype=self.ts.dtype))
        ys = self.at(t, log_time=log_time)  # checks the shape of t
        ts = jnp.broadcast_to(t, self.batch_shape + t.shape[-1:])
        _check_span(self.ts, ts, "resample", given)
        return Trajectory(ts, ys, self.meta, self.t_event, self.stats)

    # --- interop ---------------------------------------------------------------------
    def to_xarray(self, batch_dims: Iterable[str] | None = None):
        """An ``xarray.Dataset``: one variable per observable on dimensions
        ``(*batch_dims, "t", name_dim0, ...)``, with ``t`` as a coordinate (per batch element
        when the batch elements have their own times, then named ``time``), ``t_event`` a variable
        on the batch dimensions, and ``meta`` in ``attrs``. An observable named ``t``, ``time``,
        ``t_event`` or like a batch dimension is stored as ``<name>_value``, as in
        `attnflow.SweepResult.to_xarray`.

        Needs the optional dependency xarray (``pip install "attnflow[xarray]"``).
        """
        xr = optional_import("xarray", "Trajectory.to_xarray")
        bdims = (
            tuple(batch_dims) if batch_dims is not None else tuple(f"batch{i}" for i in range(len(self.batch_shape)))
        )
        if len(bdims) != len(self.batch_shape):
            raise ValueError(f"batch_dims must name {len(self.batch_shape)} batch axes, got {bdims}")
        ts = np.asarray(self.ts)
        shared = ts.ndim == 1 or bool(np.all(ts == ts.reshape(-1, ts.shape[-1])[0]))
        data = {}
        for k, v in self._columns_named(bdims).items():
            v = np.asarray(v)
            feat = tuple(f"{k}_dim{j}" for j in range(v.ndim - ts.ndim))
            data[k] = (bdims + ("t",) + feat, v)
        coords = {"t": ts.reshape(-1, ts.shape[-1])[0]} if shared else {"time": (bdims + ("t",), ts)}
        if self.t_event is not None:
            data["t_event"] = (bdims, np.asarray(self.t_event))
        return xr.Dataset(data, coords=coords, attrs={"meta": self._meta})

    def _columns_named(self, batch_dims: tuple[str, ...]) -> dict[str, Any]:
        """The observables under the names `to_xarray` and `to_pandas` store them by: an
        observable named like the time (``t``, ``time``), ``t_event`` or a batch axis gets
        ``_value`` appended (`_free_name`), so that it overwrites none of them."""
        reserved = {"t", "time", "t_event", *batch_dims}
        out: dict[str, Any] = {}
        for k, v in self.ys.items():
            out[k if k not in reserved else _free_name(k, reserved | set(self.ys) | set(out))] = v
        return out

    def to_pandas(self):
        """A ``pandas.DataFrame`` in long form: one row per (batch index, save time), one column
        per scalar observable (and per component of a vector observable, ``name[i, j]``), after
        the columns ``batch0``, ... and ``t``. An observable named ``t``, ``time``, ``t_event`` or
        ``batch<i>`` is stored as ``<name>_value``, as in `to_xarray`.

        Needs the optional dependency pandas (``pip install "attnflow[xarray]"`` brings it).
        """
        pd = optional_import("pandas", "Trajectory.to_pandas")
        ts = np.asarray(self.ts)
        n_batch = int(np.prod(self.batch_shape, dtype=int))
        T = ts.shape[-1]
        cols: dict[str, np.ndarray] = {}
        for i, size in enumerate(self.batch_shape):
            idx = np.indices(self.batch_shape)[i].reshape(-1)
            cols[f"batch{i}"] = np.repeat(idx, T)
            del size
        cols["t"] = ts.reshape(-1)
        for k, v in self._columns_named(tuple(f"batch{i}" for i in range(len(self.batch_shape)))).items():
            v = np.asarray(v).reshape((n_batch * T,) + v.shape[ts.ndim :])
            if v.ndim == 1:
                cols[k] = v
            else:
                for j in np.ndindex(v.shape[1:]):
                    cols[f"{k}[{', '.join(map(str, j))}]"] = v[(slice(None),) + j]
        return pd.DataFrame(cols)

    # --- files -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (``.npz``: arrays) and ``path.json`` (metadata), atomically.

        Each file is written to a temporary name in the same folder and renamed, so an
        interrupted save never leaves a half-written result.
        """
        path = _npz_path(path)
        arrays = {"__ts__": np.asarray(self.ts)}
        for k, v in self.ys.items():
            arrays[f"y:{k}"] = np.asarray(v)
        if self.t_event is not None:
            arrays["__t_event__"] = np.asarray(self.t_event)
        for k, v in self.stats.items():
            arrays[f"stat:{k}"] = np.asarray(v)
        meta = {"attnflow_trajectory": 1, "names": list(self.ys), "meta": self.meta, "versions": versions()}
        return save_arrays(path, arrays, meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trajectory:
        """A trajectory written by `save` (``path`` with or without ``.npz``; the metadata from
        ``path.json`` when it is there). Arrays load as JAX arrays: float64 ones (the ``attnflow``
        command saves theory in float64) stay float64 with JAX's 64-bit mode on; with it off they
        are rounded to float32 and a ``UserWarning`` names them and `attnflow.enable_x64`.
        ``FileNotFoundError`` when there is no file, ``ValueError`` when it is not a saved trajectory."""
        path = _npz_path(path)
        if not path.exists():
            raise FileNotFoundError(f"no saved trajectory at {path}")
        try:
            with np.load(path, allow_pickle=False) as data:
                if "__ts__" not in data.files:
                    raise ValueError("no save times (__ts__)")
                ts = data["__ts__"]
                ys = {k[2:]: data[k] for k in data.files if k.startswith("y:")}
                t_event = data["__t_event__"] if "__t_event__" in data.files else None
                stats = {k[5:]: data[k] for k in data.files if k.startswith("stat:")}
        except Exception as err:  # zip, pickle or format errors of a foreign or corrupt file
            raise ValueError(f"{path} is not a trajectory saved by attnflow ({type(err).__name__}: {err})") from None
        meta_path = path.with_suffix(".json")
        meta = {}
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())["meta"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
                raise ValueError(
                    f"{meta_path} is not the metadata of an attnflow trajectory ({type(err).__name__}: {err})"
                ) from None
        _warn_if_narrowed(path, {"ts": ts, **ys, "t_event": t_event, **{f"stats[{k!r}]": v for k, v in stats.items()}})
        return cls(ts, ys, meta, t_event, stats)


def _warn_if_narrowed(path: Path, arrays: Mapping[str, Any]) -> None:
    """A ``UserWarning`` naming the arrays of a saved trajectory (`Trajectory.load`) or of the
    trajectories of a saved sweep (`attnflow.SweepResult.load`) that JAX would round from 64 to
    32 bits (its 64-bit mode off): the CLI saves theory in float64, and rounding it to float32 on
    load would silently turn a 1e-10 agreement with a closed form into 1e-7."""
    if jax.dtypes.canonicalize_dtype(np.float64) == np.float64:
        return
    wide = [k for k, v in arrays.items() if v is not None and v.dtype in (np.float64, np.complex128)]
    if wide:
        shown = ", ".join(wide[:4]) + (f" and {len(wide) - 4} more" if len(wide) > 4 else "")
        warnings.warn(
            f"{path} holds float64 arrays ({shown}) but JAX's 64-bit mode is off, so they load as float32 "
            "(rounded to about 7 digits): call attnflow.enable_x64() at the start of the program, or load inside "
            "`with jax.enable_x64(True):`, to keep float64 (np.load reads the file as saved)",
            stacklevel=_caller_outside_attnflow(),
        )


def _show_index(items: tuple[Any, ...]) -> str:
    """An index as it is written in brackets: ``(slice(None), 0)`` as ``[:, 0]``, an array as
    ``<int64 array of shape (2,)>``."""

    def one(item: Any) -> str:
        if item is Ellipsis:
            return "..."
        if isinstance(item, slice):
            text = ":".join("" if x is None else str(x) for x in (item.start, item.stop))
            return text if item.step is None else f"{text}:{item.step}"
        if isinstance(item, jax.Array | np.ndarray) and item.ndim > 0:
            return f"<{item.dtype} array of shape {tuple(item.shape)}>"
        return f"{item!r:.40}"

    return "[" + ", ".join(one(item) for item in items) + "]"


def _npz_path(path: str | os.PathLike) -> Path:
    """The ``.npz`` file of a trajectory named ``path``: ``path`` itself when it ends in ``.npz``,
    else ``path`` with ``.npz`` appended (a name such as ``eta0.5`` keeps its dot: ``eta0.5.npz``),
    the same for `Trajectory.save` and `Trajectory.load`."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def compare(
    reference: Trajectory,
    other: Trajectory,
    names: str | Iterable[str] | None = None,
    log_time: bool = False,
    relative: bool = False,
    floor: float = 1e-12,
    per_run: bool = False,
) -> dict[str, Any]:
    """Maximum discrepancy between two trajectories, observable by observable.

    ``reference`` (usually theory) is interpolated at ``other``'s save times, so a
    theory curve can be compared with simulation snapshots taken on another grid.
    With ``relative=True`` the error is ``|a - b| / max(|a|, floor)``.
    ``other`` may carry batch axes (seeds or a grid of a sweep): an unbatched ``reference``
    is compared with every run, a batched one along its axes, which must lead ``other``'s (the
    same batch shape: run by run; a theory over ``(eta,)`` against runs over ``(eta, seed)``: each
    theory curve with the seeds of its ``eta``).
    Returns ``{name: max error}`` over time, batch and feature axes, or with
    ``per_run=True`` ``{name: array of other's batch shape}`` (the gap of each run).
    ``other``'s save times must lie within ``reference``'s (a theory solved to ``t1`` says
    nothing past it): ``ValueError`` otherwise. Failed runs (NaN, from a sweep) give NaN gaps.

    ``names`` (one name or several) must be on both sides: ``ValueError`` naming the side that
    lacks one and the names it has. ``names=None`` compares the observables the two share and
    leaves out those on one side only (theory and training record different extras); none
    shared is a ``ValueError``. Both arguments are trajectories: a `attnflow.SweepResult` of
    runs is refused with a ``ValueError`` saying to pass ``res.values``.
    """
    names = _checked_pair(reference, other, names, "compare")
    rb, ob = reference.batch_shape, other.batch_shape
    out: dict[str, Any] = {}
    for n in names:

        def gap(ref: Trajectory, ts: jax.Array, b: jax.Array, n: str = n) -> jax.Array:
            a = ref.at(ts, [n], log_time=log_time)[n]
            err = jnp.abs(a - b)
            if relative:
                err = err / jnp.maximum(jnp.abs(a), floor)
            return jnp.max(err)

        fn = gap
        for i in reversed(range(len(ob))):  # one batch axis of other at a time, innermost first;
            # the reference's axes are other's leading ones (a theory per eta, runs per eta and seed)
            fn = jax.vmap(fn, in_axes=(0 if i < len(rb) else None, 0, 0))
        runs = fn(reference.select(n), other.ts, other[n])
        out[n] = np.asarray(runs) if per_run else float(jnp.max(runs))
    return out


def _checked_pair(reference: Any, other: Any, names: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    """The observables `compare` (or `attnflow.trajectory_gap`, ``what``) measures, after the
    checks the two share: both are trajectories (a `attnflow.SweepResult` is refused, naming its
    ``.values``); ``names`` (one or several) are on both sides, ``None`` the shared ones (at least
    one); the reference is unbatched or its batch axes lead other's; each observable has the
    same shape per save time on both sides; other's save times lie within the reference's
    (`_check_within`). ``ValueError`` naming the side and the value otherwise."""
    from .sweep import SweepResult

    for side, tr in (("reference", reference), ("other", other)):
        if isinstance(tr, SweepResult):
            raise ValueError(
                f"{what}: {side} is a SweepResult over {tr.dims}; pass its trajectories, res.values (batch shape "
                f"{tr.shape}, one run per grid point), or one point, res.sel({tr.dims[0]}=...)"
            )
        if not isinstance(tr, Trajectory):
            raise ValueError(f"{what}: {side} must be a Trajectory, got {type(tr).__name__}")
    if names is None:
        names = tuple(n for n in other.names if n in reference)
        if not names:
            raise ValueError(
                f"{what}: no common observables: reference has {sorted(reference.names)}, other has "
                f"{sorted(other.names)}; rename one side's (traj.rename(loss='population_loss')) or compare "
                "other quantities"
            )
    names = name_list(names, ())
    if not names:
        raise ValueError(f"{what}: names is empty; give observable names, or None for the shared ones")
    for n in names:
        for side, tr in (("reference", reference), ("other", other)):
            if n not in tr:
                raise ValueError(f"{what}: {side} has no observable {n!r}; it has {sorted(tr.names)}")
    rb, ob = reference.batch_shape, other.batch_shape
    if rb and rb != ob[: len(rb)]:
        raise ValueError(
            f"{what}: reference has batch shape {rb} and other {ob}: {what} needs an unbatched reference, or a "
            "reference whose batch axes lead other's (theory over (eta,) against runs over (eta, seed)); "
            "index with .batch(i)"
        )
    for n in names:
        fr, fo = np.shape(reference[n])[len(rb) + 1 :], np.shape(other[n])[len(ob) + 1 :]
        if fr != fo:
            raise ValueError(
                f"{what}: observable {n!r} has shape {fr} per save time in reference and {fo} in other "
                "(different sizes? compare the runs of one setup, or pick a slice with .select/.batch)"
            )
    _check_within(reference, other, what)
    return names


def _time_slack(lo: Any, hi: Any, *dtypes: Any) -> Any:
    """How far a time may lie outside the span ``[lo, hi]`` and still count as inside: the
    rounding of two time grids (``dt * steps`` against ``linspace``), float32 ones included."""
    eps = max(np.finfo(d).eps for d in dtypes)
    return 16 * eps * (1.0 + np.maximum(np.abs(lo), np.abs(hi)))


def _check_within(reference: Trajectory, other: Trajectory, what: str = "compare") -> None:
    """``ValueError`` when ``other`` was saved at times outside ``reference``'s span (by more
    than `_time_slack`), naming the run of ``other`` and the curve of a batched ``reference``;
    ``what`` (``"compare"``, ``"trajectory_gap"``) starts the message."""
    if isinstance(reference.ts, jax.core.Tracer) or isinstance(other.ts, jax.core.Tracer):
        return
    r, o = np.asarray(reference.ts, dtype=float), np.asarray(other.ts, dtype=float)
    if not (np.isfinite(r).any() and np.isfinite(o).any()):
        return
    # curve by curve: a batched reference's axes lead other's (theory over eta, runs over (eta,
    # seed)), and each run must lie within its own reference curve's span
    lo_r, hi_r = r[..., 0], r[..., -1]
    extra = max(o.ndim - 1 - lo_r.ndim, 0)
    lo_r, hi_r = lo_r.reshape(lo_r.shape + (1,) * extra), hi_r.reshape(hi_r.shape + (1,) * extra)
    o_first, o_last = o[..., 0], o[..., -1]
    try:
        slack = _time_slack(lo_r, hi_r, np.asarray(reference.ts).dtype, np.asarray(other.ts).dtype)
        with np.errstate(invalid="ignore"):  # failed runs and curves (NaN times) are not checked
            out = (o_first < lo_r - slack) | (o_last > hi_r + slack)
    except ValueError:  # shapes compare refuses itself, naming them
        return
    if np.any(out):
        k = np.unravel_index(int(np.flatnonzero(out)[0]), out.shape)
        lo_b, hi_b = np.broadcast_to(lo_r, out.shape), np.broadcast_to(hi_r, out.shape)
        lo, hi = float(lo_b[k]), float(hi_b[k])
        o_lo, o_hi = float(np.broadcast_to(o_first, out.shape)[k]), float(np.broadcast_to(o_last, out.shape)[k])
        stopped = reference.t_event is not None and bool(np.isfinite(np.asarray(reference.t_event)).any())
        advice = (
            f"the reference stopped at its event (t_event = {float(np.nanmax(np.asarray(reference.t_event))):.6g}): "
            "run the other only to that time, or solve the reference without the event"
            if stopped
            else "solve the reference to a later time (or an earlier start)"
        )
        run = f" run {tuple(int(i) for i in k)}" if other.batch_shape else ""
        nr = len(reference.batch_shape)
        curve = f" curve {tuple(int(i) for i in k[:nr])}" if nr else ""
        p = _digits(*((o_hi, hi) if o_hi > hi else (o_lo, lo)))
        raise ValueError(
            f"{what}: other{run} is saved on [{o_lo:.{p}g}, {o_hi:.{p}g}] but reference{curve} covers only "
            f"[{lo:.{p}g}, {hi:.{p}g}]; {advice}"
        )


def _check_span(ts: Any, t: Any, what: str, *dtypes: Any) -> None:
    """``ValueError`` when a time of ``t`` (of shape ``ts.shape[:-1] + (k,)``: the times to read
    each run at) lies outside its run's saved span ``[ts[..., 0], ts[..., -1]]`` by more than
    `_time_slack` of the dtypes of ``ts``, ``t`` and ``dtypes`` (as `compare` checks), naming the
    time, the span and the run."""
    if isinstance(ts, jax.core.Tracer) or isinstance(t, jax.core.Tracer):
        return
    r, q = np.asarray(ts, dtype=float), np.asarray(t, dtype=float)
    lo, hi = r[..., :1], r[..., -1:]
    slack = _time_slack(lo, hi, np.asarray(ts).dtype, np.asarray(t).dtype, *dtypes)
    with np.errstate(invalid="ignore"):  # a failed run (NaN times) is not checked
        out = (q < lo - slack) | (q > hi + slack)
    if np.any(out):
        k = np.unravel_index(int(np.flatnonzero(out)[0]), out.shape)
        run = f" of run {tuple(int(i) for i in k[:-1])}" if r.ndim > 1 else ""
        a, b, c = float(q[k]), float(lo[k[:-1]][0]), float(hi[k[:-1]][0])
        p = _digits(a, c if a > c else b)
        raise ValueError(
            f"{what}: time {a:.{p}g} lies outside the saved span [{b:.{p}g}, {c:.{p}g}]{run}: a trajectory says "
            "nothing past its saves (traj.at(t) holds the end values there, if that is what you want)"
        )


def _digits(a: float, b: float) -> int:
    """Significant digits enough to tell ``a`` from ``b`` in a message (6, more when they agree
    there: a float32 clock's end 0.300000012 past a float64 horizon 0.3)."""
    return next((p for p in (6, 9, 12) if f"{a:.{p}g}" != f"{b:.{p}g}"), 17)
