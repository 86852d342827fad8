"""`sweep`: a cartesian grid of named axes in one compiled, vmapped, sharded call.

``sweep(fn, {"eta": etas, "seed": seeds})`` evaluates ``fn(eta=..., seed=...)`` at every
grid point. Points are cut into chunks that bound memory, and each chunk is one compiled
call whose leading axis is sharded over all devices with a ``jax.sharding`` mesh; through
``shard_map`` each device runs its own copy of the vmapped ``fn`` on its block, with no
communication between devices.

A grid of two or more axes is vectorised with one nested ``vmap`` per axis (chunks are
blocks of the first axis): whatever ``fn`` computes from some axes only (the data of a
seed, say) then stays unbatched along the others and is computed once, not once per grid
point. A flat ``vmap`` over the list of points (``nest=False``) batches everything.

With ``out_dir`` every finished chunk is saved atomically, and a rerun after an
interruption loads finished chunks instead of recomputing them, but only chunks of the same
sweep: the manifest holds a fingerprint of ``fn`` (its code, closure values, default
arguments and the globals it reads, through the functions it calls, the static fields of
pytrees and the attributes of objects) and its output structure, and a rerun with another
function refuses, saying what changed.

A grid point whose run fails inside the compiled call (an ODE that used up ``max_steps`` or
diverged, an SGD run that diverged) does not stop the sweep: its values are NaN, and
`SweepResult.status` and `SweepResult.failures` say which points failed and why
(``on_error="raise"`` raises instead, naming the first failing point).

A sweep spreads over processes and machines that share a folder through shards: with
``shard=Shard(i, N)`` and an ``out_dir``, a call computes only the chunks ``i - 1, i - 1 + N,
...`` into ``out_dir``, and a plain call on the same folder afterwards loads every chunk and
computes only what is missing (the merge). `process_shard` gives each process of a
``jax.distributed`` program its shard; `sweep_defaults` shards every sweep that code such as
an experiment calls (``attnflow run NAME --shard I/N``).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import enum
import functools
import hashlib
import inspect
import itertools
import json
import math
import os
import pathlib
import re
import site
import sys
import sysconfig
import time
import types
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._errors import blank_failed, collecting, status_code
from ._interrupt import redeliver_swallowed_interrupts
from ._io import atomic_write, save_arrays
from ._jit import cpu_compiler_options
from ._lanes import check_lanes, vmap_lanes

__all__ = [
    "Static",
    "sweep",
    "SweepResult",
    "SweepError",
    "use_cpu_cores",
    "Shard",
    "ShardPending",
    "process_shard",
    "sweep_defaults",
]

PENDING = -1
"""`SweepResult.status` of a point computed by another shard whose chunk is not in ``out_dir`` yet."""

WARNED = -2
"""`SweepResult.status` at or below this: the point ran with a warning (``-2 - k``: message ``k``)."""


class SweepError(RuntimeError):
    """Grid points of a sweep failed (raised with ``on_error="raise"``, or a failure inside the user's own
    ``jit``, loop or ``cond`` that cannot be kept to one point); the message names them."""


@dataclasses.dataclass(frozen=True, init=False)
class Static:
    """A `sweep` axis whose values change shapes or compiled constants: sizes (``D``, a context
    length, a number of heads), counts, flags. ``sweep`` loops over them in Python, one compiled
    program per value, and vectorises the other axes inside each; ``fn`` receives each value as
    the Python scalar given (an ``int`` stays an ``int``, usable as a shape).

    ``af.sweep(fn, {"D": af.Static([500, 2000, 8000]), "eta": etas})``: three compilations, each
    over every ``eta``. The outputs must have the same shapes for every static value.
    """

    values: tuple

    def __init__(self, values: Any):
        vals = tuple(values.tolist() if isinstance(values, np.ndarray) else values)
        if not vals:
            raise ValueError("Static axis needs at least one value")
        for v in vals:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, str, np.integer, np.floating)):
                raise ValueError(f"Static axis values must be numbers or strings, got {v!r}")
        bad = [v for v in vals if not isinstance(v, str) and not math.isfinite(v)]
        if bad:
            raise ValueError(f"Static axis values must be finite, got {bad!r} in {vals!r}")
        if len(set(vals)) != len(vals):
            raise ValueError(f"Static axis values must be distinct, got {vals!r}")
        object.__setattr__(self, "values", tuple(v.item() if isinstance(v, np.generic) else v for v in vals))


class SweepResult:
    """Values on a labelled grid.

    ``dims``: axis names in order; ``coords[name]``: the axis values; ``values``: the
    pytree returned by ``fn`` with every leaf of shape ``grid_shape + leaf_shape``;
    ``status``: an integer array of shape ``grid_shape``, 0 where the point ran, else
    ``1 +`` the index of its failure in ``messages`` (the point's values are then NaN),
    ``-2 -`` the index of a warning it ran with (its values kept: `SweepResult.warnings`), or
    -1 where the point is *pending*: a sharded sweep (`Shard`) left it to another shard whose
    chunk is not in ``out_dir`` yet (its values are NaN, 0 for integer leaves).
    """

    def __init__(
        self,
        dims: Sequence[str],
        coords: Mapping[str, np.ndarray],
        values: Any,
        meta: Mapping[str, Any] | None = None,
        status: Any = None,
        messages: Sequence[str] = (),
    ):
        self.dims = tuple(dims)
        self.coords = {k: np.asarray(v) for k, v in coords.items()}
        self.values = values
        self.meta = dict(meta or {})
        self.status = np.zeros(self.shape, np.int32) if status is None else np.asarray(status)
        self.messages = tuple(messages)

    @property
    def ok(self) -> np.ndarray:
        """Boolean array of shape ``grid_shape``: True where the point ran without failure (with
        or without a warning)."""
        return (self.status == 0) | (self.status <= WARNED)

    @property
    def pending(self) -> np.ndarray:
        """Boolean array of shape ``grid_shape``: True where the point is left to another shard
        and not computed yet (see `Shard`); all False for an unsharded sweep."""
        return self.status == PENDING

    @property
    def complete(self) -> bool:
        """True when no point is pending: every chunk of the grid was computed or loaded."""
        return not bool(np.any(self.pending))

    def warnings(self) -> list[tuple[dict[str, Any], str]]:
        """``[(coordinates, message)]`` of the points that ran with a warning, in grid order: a
        value the run can compute but should not be trusted as asked (gradient descent past its
        stability limit, which oscillates instead of converging). Their values are kept."""
        return self._points(self.status <= WARNED, lambda code: -code - 2, "warning")

    def _points(self, mask: np.ndarray, message_index: Callable[[int], int], kind: str) -> list:
        """``[(coordinates, message)]`` where ``mask`` holds, the message read from each status
        code by ``message_index``."""
        out = []
        for idx in zip(*np.nonzero(mask), strict=True):
            point = {d: self.coords[d][i].item() for d, i in zip(self.dims, idx, strict=True)}
            k = message_index(int(self.status[idx]))
            out.append((point, self.messages[k] if 0 <= k < len(self.messages) else f"{kind} {k}"))
        return out

    def failures(self) -> list[tuple[dict[str, Any], str]]:
        """``[(coordinates, message)]`` of the failed points, in grid order (pending points are
        not failures)."""
        return self._points(self.status > 0, lambda code: code - 1, "failure")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def _names(self) -> tuple[Any, ...] | None:
        """The names `__getitem__` reads: the keys of mapping values, the observables of a
        `Trajectory`; None for values without names (an array, a tuple)."""
        from .trajectory import Trajectory

        if isinstance(self.values, Trajectory):
            return self.values.names
        if isinstance(self.values, Mapping):
            return tuple(self.values)
        return None

    def __contains__(self, name: Any) -> bool:
        names = self._names()
        return names is not None and name in names

    def keys(self) -> tuple[Any, ...]:
        """The names of the values (``res[name]``): the keys of the dict ``fn`` returned, or the
        observables of its `Trajectory`, so that ``dict(res)`` is ``{name: grid array}``. Values
        without names (an array, a tuple) raise ``TypeError``: read ``res.values``."""
        names = self._names()
        if names is None:
            kind = "an array" if hasattr(self.values, "shape") else f"a {type(self.values).__name__}"
            raise TypeError(f"this sweep's values are {kind}, not named: read res.values (res.sel(...) for a point)")
        return names

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(name, values)`` for each name in `keys`, as ``dict(res).items()``."""
        return iter([(k, self[k]) for k in self.keys()])

    def __iter__(self) -> Iterator[Any]:
        # res[name] reads a value but a grid has points too: iterating would be ambiguous (and
        # Python would index 0, 1, ... as names), so say which to use
        raise TypeError(
            "a SweepResult is not iterable: iterate over res.keys() (or res.items(), dict(res)) for the named "
            "values, res.dims and res.coords for the axes"
        )

    def index(self, **point: Any) -> tuple[int, ...]:
        """Grid index of the point whose coordinates are closest to ``point`` (per named axis),
        with a warning naming the point taken when a value is not on its axis (relative
        distance above ``1e-6``). A numeric value outside an axis's range, or a label not on
        it, raises ``ValueError``. A list of values gives the array of their indices."""
        unknown = set(point) - set(self.dims)
        if unknown:
            raise ValueError(f"unknown sweep axis {sorted(unknown)}; axes are {self.dims}")
        idx: list[Any] = []
        for d in self.dims:
            if d in point and not isinstance(point[d], str) and np.ndim(point[d]) == 1:
                pos = self.dims.index(d)
                idx.append(np.array([self.index(**{d: v})[pos] for v in point[d]], dtype=int))
            elif d in point:
                c = self.coords[d]
                if c.dtype.kind in "fiu":
                    x = float(np.asarray(point[d], dtype=float))
                    lo, hi = float(np.min(c)), float(np.max(c))
                    eps = np.finfo(c.dtype).eps if c.dtype.kind == "f" else 0.0  # float32 axes round
                    slack = 16 * eps * max(abs(lo), abs(hi), 1e-300)
                    if not lo - slack <= x <= hi + slack:
                        raise ValueError(f"{d} = {x:g} is outside the sweep's axis {d} (from {lo:g} to {hi:g})")
                    i = int(np.argmin(np.abs(c - x)))
                    near = float(c.reshape(-1)[i])
                    if abs(near - x) > 1e-6 * max(abs(x), abs(near)) + slack:
                        # nearest is documented, but a mistyped value would otherwise pick a neighbour unseen
                        warnings.warn(
                            f"{d} = {x:g} is not on the sweep's axis {d}: taking the nearest point, {d} = {near:g}",
                            stacklevel=3,
                        )
                    idx.append(i)
                else:
                    hits = np.flatnonzero(c == point[d])
                    if not hits.size:
                        raise ValueError(f"{d} = {point[d]!r} is not on the sweep's axis {d}: {c.tolist()[:10]}")
                    idx.append(int(hits[0]))
            else:
                idx.append(slice(None))
        return tuple(idx)

    def sel(self, **point: Any) -> Any:
        """The values (a pytree like `values`, not a `SweepResult`) at (the nearest) given
        coordinates; unnamed axes are kept as the leading axes of each leaf, in the sweep's
        order, and an axis given a list of values keeps those points (``res.sel(eta=[0.5,
        1.0])``). A value outside an axis's range raises ``ValueError``."""
        idx = self.index(**point)

        def pick(x: Any) -> Any:
            for axis, i in enumerate(idx):  # lists first, each along its own axis (not jointly)
                if isinstance(i, np.ndarray):  # NumPy values stay NumPy (float64 kept without x64)
                    x = jnp.take(x, i, axis=axis) if isinstance(x, jax.Array) else np.take(x, i, axis=axis)
            return x[tuple(slice(None) if isinstance(i, np.ndarray) else i for i in idx)]

        return jax.tree_util.tree_map(pick, self.values)

    def __repr__(self) -> str:
        return f"SweepResult(dims={self.dims}, shape={self.shape})"

    def mean(self, dim: str | Sequence[str]) -> SweepResult:
        """The average over the named axis (or axes), e.g. ``res.mean("seed")`` of a sweep over
        ``eta`` and ``seed``: a `SweepResult` on the other axes, every leaf averaged (a
        `Trajectory` by `Trajectory.mean`: its runs must share their save times). A failed point
        makes its group's mean NaN and the group failed (its first failure's message); a pending
        one makes the group pending. Every axis cannot be reduced (no grid would be left,
        ``ValueError``): average the values of a sweep over seeds alone directly,
        ``res.values.mean()`` where they are a `Trajectory` (its batch axes are the sweep's),
        ``np.mean(res["loss"], axis=0)`` for an array."""
        return self._reduce(dim, "mean", lambda t, axes: t.mean(axes), lambda x, axes: np.mean(x, axis=axes))

    def std(self, dim: str | Sequence[str], ddof: int = 0) -> SweepResult:
        """The standard deviation over the named axis (or axes), as `mean`; ``ddof = 1`` for the
        unbiased seed-to-seed variance (`Trajectory.std`)."""
        if not isinstance(ddof, int | np.integer) or isinstance(ddof, bool) or ddof < 0:
            raise ValueError(f"std: ddof must be an integer >= 0, got {ddof!r}")
        return self._reduce(
            dim,
            "std",
            lambda t, axes: t.std(axes, ddof=int(ddof)),
            lambda x, axes: np.std(x, axis=axes, ddof=ddof),
            min_runs=int(ddof) + 1,
        )

    def _reduce(
        self, dim: Any, what: str, on_trajectory: Callable, on_array: Callable, min_runs: int = 1
    ) -> SweepResult:
        from .trajectory import Trajectory

        names = [dim] if isinstance(dim, str) else list(dim)
        unknown = [d for d in names if d not in self.dims]
        if unknown or not names:
            raise ValueError(f"{what}: {unknown or names} are not axes of this sweep; its axes are {self.dims}")
        axes = tuple(sorted(self.dims.index(d) for d in set(names)))
        if len(axes) == len(self.dims):
            ddof = f"ddof={min_runs - 1}" if min_runs > 1 else ""
            over = "0" if len(axes) == 1 else str(axes)
            raise ValueError(
                f"{what}: reducing every axis {self.dims} leaves no grid; keep one axis, or reduce the values "
                f"themselves: res.values.{what}({ddof}) where they are a Trajectory (its batch axes are the "
                f"sweep's), np.{what}(res[name], axis={over}{', ' + ddof if ddof else ''}) for an array"
            )
        n = math.prod(self.shape[a] for a in axes)
        if n < min_runs:  # as Trajectory.std (arrays would be NaN with a NumPy warning)
            raise ValueError(f"{what}: ddof = {min_runs - 1} needs more than {min_runs - 1} runs, got {n}")

        def reduce(x: Any) -> Any:
            if isinstance(x, Trajectory):
                return on_trajectory(x, axes)
            out = on_array(np.asarray(x), axes)
            return jnp.asarray(out) if isinstance(x, jax.Array) else out  # NumPy stays NumPy (its float64)

        values = jax.tree_util.tree_map(reduce, self.values, is_leaf=lambda x: isinstance(x, Trajectory))
        st = np.moveaxis(np.asarray(self.status), axes, tuple(range(-len(axes), 0)))
        st = st.reshape(st.shape[: st.ndim - len(axes)] + (-1,))
        failed = np.where(st > 0, st, np.iinfo(np.int32).max).min(axis=-1)  # the first failure's code
        warned = np.where(st <= WARNED, st, np.iinfo(np.int32).min).max(axis=-1)  # the first warning's code
        status = np.where(
            np.any(st > 0, axis=-1),
            failed,
            np.where(np.any(st == PENDING, axis=-1), PENDING, np.where(np.any(st <= WARNED, axis=-1), warned, 0)),
        )
        dims = tuple(d for d in self.dims if d not in names)
        meta = {**self.meta, f"{what}_over": [self.dims[a] for a in axes]}
        return SweepResult(
            dims, {d: self.coords[d] for d in dims}, values, meta, status.astype(np.int32), self.messages
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the whole result to ``path`` (``.npz``: every array) and ``path.json`` (axes,
        statuses and failure messages, ``meta``, and the structure of ``values``), atomically;
        `SweepResult.load` reads it back without ``fn``. ``values`` may nest dicts, lists,
        tuples, `Trajectory` objects and arrays."""
        from .trajectory import versions

        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        arrays: dict[str, np.ndarray] = {"status": np.asarray(self.status)}
        for j, d in enumerate(self.dims):
            arrays[f"coord_{j}"] = np.asarray(self.coords[d])
        spec = _encode_values(self.values, arrays)
        info = {
            "attnflow_sweep_result": 1,
            "dims": list(self.dims),
            "values": spec,
            "messages": list(self.messages),
            "meta": self.meta,
            "versions": versions(),
        }
        return save_arrays(path, arrays, info)

    @classmethod
    def load(cls, path: str | os.PathLike) -> SweepResult:
        """A result written by `SweepResult.save` (``path`` with or without ``.npz``). Axes,
        statuses and array values load as NumPy arrays, as saved; `Trajectory` values as JAX
        arrays, as `Trajectory.load` gives them: float64 ones stay float64 with JAX's 64-bit mode
        on, and with it off are rounded to float32 with a ``UserWarning`` naming them and
        `attnflow.enable_x64`."""
        from .trajectory import _warn_if_narrowed

        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        meta_path = path.with_suffix(".json")
        if not path.exists() or not meta_path.exists():
            folder = path.with_suffix("")
            # a Static sweep's out_dir holds one sweep folder per static value (D=250/sweep.json)
            if (folder / "sweep.json").exists() or (folder.is_dir() and any(folder.glob("*/sweep.json"))):
                raise FileNotFoundError(
                    f"{folder} is a sweep's out_dir (its chunks and sweep.json), not a result saved by "
                    "SweepResult.save: run the same af.sweep(fn, axes, out_dir=...) again, which loads the finished "
                    "chunks without computing them"
                )
            raise FileNotFoundError(f"no saved sweep result at {path} (and {meta_path.name})")
        try:
            info = json.loads(meta_path.read_text())
            if not isinstance(info, dict) or info.get("attnflow_sweep_result") != 1:
                raise ValueError("not a sweep result's metadata")
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            dims = info["dims"]
            coords = {d: arrays[f"coord_{j}"] for j, d in enumerate(dims)}
            loaded: dict[str, Any] = {}
            values = _decode_values(info["values"], arrays, loaded)
        except (ValueError, KeyError, TypeError, OSError) as err:
            raise ValueError(f"{path} is not a sweep result saved by attnflow ({type(err).__name__}: {err})") from None
        _warn_if_narrowed(path, loaded)  # the trajectories' arrays, as Trajectory.load warns
        return cls(dims, coords, values, info.get("meta"), arrays["status"], info.get("messages", ()))

    def to_xarray(self):
        """An ``xarray.Dataset`` on the grid dimensions ``dims`` with their ``coords``: one
        variable per leaf of ``values`` (named by its path: ``"loss"``, ``"[0]"``, ``"ts"``
        for a `Trajectory`'s times, ...), extra axes named ``<variable>_dim<i>``; ``meta`` in
        ``attrs``. A `Trajectory` leaf keeps its time axis as ``t`` (``time`` when a sweep axis
        is named ``t``) when its save times are the same at every grid point that ran (failed and
        pending points are NaN there).
        ``status`` is a variable too (`SweepResult.status`: 0 ran, > 0 failed, -1 pending, <= -2
        ran with a warning), so a failed point is told from a pending one; a leaf named like an axis (or ``status``)
        is stored as ``<name>_value``.

        Needs the optional dependency xarray (``pip install "attnflow[xarray]"``).
        """
        from ._io import optional_import
        from .trajectory import Trajectory, _free_name

        xr = optional_import("xarray", "SweepResult.to_xarray")
        data: dict[str, Any] = {}
        coords: dict[str, Any] = {d: self.coords[d] for d in self.dims}
        grid = len(self.dims)

        def add(name, arr, extra_dims=()):
            """Store a variable; returns its name (``<name>_value`` when an axis, ``status`` or a
            variable stored before has it)."""
            name = _free_name(name, {*self.dims, "status", *data})  # xarray keeps one variable per name
            arr = np.asarray(arr)
            n_extra = arr.ndim - grid - len(extra_dims)
            dims = self.dims + tuple(extra_dims) + tuple(f"{name}_dim{j}" for j in range(n_extra))
            data[name] = (dims, arr)
            return name

        def visit(prefix, value):
            if isinstance(value, Trajectory):
                ts = np.asarray(value.ts)
                flat = ts.reshape(-1, ts.shape[-1])
                # failed and pending points hold NaN times: only the points that ran must agree
                ran = ~np.all(np.isnan(flat), axis=1) if flat.dtype.kind in "fc" else np.ones(len(flat), bool)
                if ts.shape[:-1] == self.status.shape:  # points that ran, warned ones included
                    ran &= np.asarray(self.ok).reshape(-1)
                first = flat[ran][0] if ran.any() else None
                if first is not None and bool(np.all(flat[ran] == first)):
                    # a sweep axis named t keeps its own coordinates: the time axis is then "time",
                    # or "time_", ... past the names of axes and observables
                    taken = set(self.dims) | {f"{prefix}{k}" for k in value.ys}
                    tname = next(
                        n for n in (f"{prefix}t", *(f"{prefix}time" + "_" * i for i in range(99))) if n not in taken
                    )
                    coords[tname] = first
                    tdim = (tname,)
                else:
                    tdim = (f"{add(f'{prefix}ts', ts)}_dim0",)
                if value.t_event is not None:  # first: an observable named t_event becomes t_event_value
                    add(f"{prefix}t_event", value.t_event)
                for k, v in value.ys.items():
                    add(f"{prefix}{k}", v, tdim)
                return
            if isinstance(value, Mapping):
                for k, v in value.items():
                    visit(f"{prefix}{k}.", v) if isinstance(v, (Mapping, Trajectory, tuple, list)) else add(
                        f"{prefix}{k}", v
                    )
                return
            if isinstance(value, (tuple, list)):
                for i, v in enumerate(value):
                    visit(f"{prefix}[{i}].", v) if isinstance(v, (Mapping, Trajectory, tuple, list)) else add(
                        f"{prefix}[{i}]", v
                    )
                return
            add(prefix.rstrip(".") or "value", value)

        visit("", self.values)
        data["status"] = (self.dims, np.asarray(self.status))
        return xr.Dataset(data, coords=coords, attrs={"meta": json.dumps(self.meta, default=str)})


def _encode_values(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The structure of ``value`` as JSON, its arrays stored in ``arrays`` (`SweepResult.save`)."""
    from .trajectory import Trajectory

    def put(x: Any) -> int:
        i = sum(k.startswith("v_") for k in arrays)
        arrays[f"v_{i}"] = np.asarray(x)
        return i

    if isinstance(value, Trajectory):
        return {
            "kind": "trajectory",
            "ts": put(value.ts),
            "ys": {k: put(v) for k, v in value.ys.items()},
            "t_event": None if value.t_event is None else put(value.t_event),
            "stats": {k: put(v) for k, v in value.stats.items()},
            "meta": value.meta,
        }
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"SweepResult.save: mapping keys must be strings, got {list(value)[:5]}")
        return {"kind": "dict", "items": {k: _encode_values(v, arrays) for k, v in value.items()}}
    if isinstance(value, tuple | list):
        return {"kind": type(value).__name__, "items": [_encode_values(v, arrays) for v in value]}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, jax.Array | np.ndarray | np.generic | int | float | bool):
        return {"kind": "array", "index": put(value)}
    raise ValueError(f"SweepResult.save: cannot store a value of type {type(value).__name__}")


def _decode_values(
    spec: Any, arrays: Mapping[str, np.ndarray], loaded: dict[str, Any] | None = None, prefix: str = ""
) -> Any:
    """The inverse of `_encode_values`. The arrays that become a `Trajectory`'s (JAX arrays, of
    the dtypes JAX's configuration allows) are recorded in ``loaded`` by their path (``"ts"``,
    ``"loss"``, ``"run.t_event"``), for `SweepResult.load`'s warning on float64 ones."""
    from .trajectory import Trajectory

    kind = spec["kind"]
    if kind == "trajectory":
        ts = arrays[f"v_{spec['ts']}"]
        ys = {k: arrays[f"v_{i}"] for k, i in spec["ys"].items()}
        t_event = None if spec["t_event"] is None else arrays[f"v_{spec['t_event']}"]
        stats = {k: arrays[f"v_{i}"] for k, i in spec["stats"].items()}
        if loaded is not None:
            loaded.update({f"{prefix}{k}": v for k, v in {"ts": ts, **ys, "t_event": t_event}.items()})
            loaded.update({f"{prefix}stats[{k!r}]": v for k, v in stats.items()})
        return Trajectory(ts, ys, spec.get("meta") or {}, t_event, stats)
    if kind == "dict":
        return {k: _decode_values(v, arrays, loaded, f"{prefix}{k}.") for k, v in spec["items"].items()}
    if kind in ("tuple", "list"):
        items = [_decode_values(v, arrays, loaded, f"{prefix}[{i}].") for i, v in enumerate(spec["items"])]
        return tuple(items) if kind == "tuple" else items
    if kind == "none":
        return None
    if kind == "array":
        return arrays[f"v_{spec['index']}"]
    raise ValueError(f"unknown value kind {kind!r}")


def use_cpu_cores(n: int | None = None) -> int:
    """Expose ``n`` CPU devices to JAX (default: the cores this process may run on), so that
    `sweep` shards its grid points over the cores, one device per core.

    JAX shows a CPU as one device, and XLA then spreads each operation over the cores
    (intra-op threads), with a synchronisation per operation; small operations, as in
    online SGD, leave cores idle. One device per core runs independent grid points side
    by side (measured by `benchmarks/heads_sgd.py`, docs page "Benchmarks"). Sets ``jax_num_cpu_devices``, which JAX
    only accepts before its first computation: call this right after ``import attnflow``.
    Later, or when ``XLA_FLAGS`` already sets ``--xla_force_host_platform_device_count``, it changes
    nothing and warns. Returns the number of CPU devices requested (or in effect).
    """
    import os

    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"use_cpu_cores: n must be a positive integer, got {n!r}")
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        warnings.warn(
            "use_cpu_cores: XLA_FLAGS already sets the host device count; left as it is", RuntimeWarning, stacklevel=2
        )
        return len(jax.devices("cpu"))
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:
        warnings.warn(
            f"use_cpu_cores({n}): JAX has already run a computation, so its CPU device count is fixed "
            f"at {len(jax.devices('cpu'))}; call use_cpu_cores before any JAX operation",
            RuntimeWarning,
            stacklevel=2,
        )
        return len(jax.devices("cpu"))
    return int(n)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` of a sweep (counting from 1), to spread one grid over
    processes or machines that share a folder.

    ``sweep(fn, axes, out_dir=DIR, shard=Shard(i, N))`` computes only the chunks ``i - 1,
    i - 1 + N, i - 1 + 2N, ...`` of the grid and saves them in ``DIR``, then loads whatever
    chunks the other shards have saved there. A point whose chunk is still missing is
    *pending*: `SweepResult.pending` is True there and its values are NaN. Once every shard
    has run, a sweep of the same function and grid on ``DIR`` without ``shard`` loads every
    chunk and computes only what is still missing: that is the merge. Every shard and the
    merge must use the same function, axes and ``chunk_size`` (the folder's manifest refuses
    anything else); the default chunk size of a sharded sweep gives each shard about one
    chunk (at most 4096 points), and a merge without ``chunk_size`` uses the folder's.

    ``wait``: what a shard does when, after its own chunks, other shards' chunks are missing:
    ``False`` (default) returns at once with those points pending (a task of a Slurm job
    array, whose siblings may run later); ``True`` waits until every chunk is in the folder
    and returns the whole grid (processes started together, as under ``jax.distributed``;
    see `process_shard`); a number of seconds waits at most that long.

    ``Shard.parse("2/4")`` reads the ``I/N`` form the ``attnflow`` command takes.
    """

    index: int
    count: int
    wait: bool | float = False

    def __post_init__(self) -> None:
        for name in ("index", "count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"Shard {name} must be an integer, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.count < 1:
            raise ValueError(f"shard {self.index}/{self.count}: N, the number of shards, must be at least 1")
        if not 1 <= self.index <= self.count:
            n = self.count
            raise ValueError(
                f"shard {self.index}/{self.count}: need 1 <= I <= N (shard I of N, counting from 1: 1/{n} ... {n}/{n})"
            )
        w = self.wait
        if not isinstance(w, (bool, int, float, np.integer, np.floating)) or not (isinstance(w, bool) or w >= 0):
            raise ValueError(f"Shard wait must be True, False or a number of seconds >= 0, got {w!r}")

    @classmethod
    def parse(cls, text: str, wait: bool | float = False) -> Shard:
        """The shard written ``"I/N"`` (shard I of N, counting from 1), as in ``--shard 2/4``."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if m is None:
            raise ValueError(f"shard {text!r} is not of the form I/N (shard I of N, counting from 1, as in 2/4)")
        return cls(int(m[1]), int(m[2]), wait)

    def chunks(self, n_chunks: int) -> range:
        """Indices of the chunks this shard computes, out of ``n_chunks``."""
        return range(self.index - 1, n_chunks, self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _as_shard(shard: Any) -> Shard:
    if isinstance(shard, Shard):
        return shard
    if isinstance(shard, str):
        return Shard.parse(shard)
    if isinstance(shard, (tuple, list)) and len(shard) == 2:
        return Shard(*shard)
    raise ValueError(f"shard must be a Shard, an (index, count) pair or an 'I/N' string, got {shard!r}")


def process_shard(wait: bool | float = True) -> Shard:
    """This process's shard in a multi-process program: ``Shard(jax.process_index() + 1,
    jax.process_count(), wait)``.

    Call it after ``jax.distributed.initialize(...)`` and pass it to a sweep whose
    ``out_dir`` every process can read (a shared filesystem): each process computes its
    chunks, waits until the other processes' chunks are in the folder (``wait=True``, the
    default), and returns the whole grid, the same values as one process would. Each
    process computes on its own devices (``jax.local_devices()``), with no communication
    between processes beyond the folder. In a single process it is ``Shard(1, 1)``: the
    whole sweep.
    """
    return Shard(jax.process_index() + 1, jax.process_count(), wait)


class ShardPending(Exception):
    """A sweep sharded through `sweep_defaults` computed its own chunks, but chunks of other
    shards are not in its folder yet, so the code that called `sweep` cannot go on.

    Raised only for sweeps that take their shard from `sweep_defaults` (as ``attnflow run
    NAME --shard I/N`` does for an experiment's sweeps); a sweep given ``shard=`` itself
    returns its partial result instead. Attributes: ``shard`` (`Shard`), ``out_dir`` (the
    sweep's folder), ``sweep`` (its number in the `sweep_defaults` block, from 1),
    ``n_chunks``, ``computed`` (indices of the chunks this call computed) and ``missing``
    (indices of the chunks not in the folder yet).
    """

    def __init__(
        self, shard: Shard, out_dir: Path, sweep: int | None, n_chunks: int, computed: list[int], missing: list[int]
    ):
        self.shard, self.out_dir, self.sweep, self.n_chunks = shard, Path(out_dir), sweep, n_chunks
        self.computed, self.missing = list(computed), list(missing)
        which = f"sweep {sweep}" if sweep is not None else "sweep"
        super().__init__(
            f"{which} in {self.out_dir}: shard {shard} computed {len(self.computed)} chunk(s) "
            f"({len(shard.chunks(n_chunks))} of {n_chunks} are its own); {len(self.missing)} chunk(s) of other "
            "shards are not there yet"
        )


@dataclasses.dataclass
class _Defaults:
    out_dir: Path
    shard: Shard | None
    meta: dict[str, Any]
    log: list[dict[str, Any]]
    count: int = 0
    chunk_size: int | None = None


_DEFAULTS: contextvars.ContextVar[_Defaults | None] = contextvars.ContextVar("attnflow_sweep_defaults", default=None)


@dataclasses.dataclass
class _StaticSlot:
    """What `_static_sweep` tells the sweep of one static point: its place ``index`` of ``count``
    (chunks are numbered across the whole grid, so shards share every static value's work and
    ``on_chunk`` counts the whole grid); the sweep reports back its chunk count and what a
    shard of a `sweep_defaults` block left pending, and leaves failures to the whole grid."""

    index: int
    count: int
    n_chunks: int = 0
    pending: tuple | None = None
    number: int | None = None  # the static sweep's number in its sweep_defaults block (one for all its points)
    counts: tuple[int, int, int] = (0, 0, 0)  # chunks computed, loaded, pending: one log entry for the block


_STATIC_SLOT: contextvars.ContextVar[_StaticSlot | None] = contextvars.ContextVar("attnflow_static_slot", default=None)


@contextlib.contextmanager
def sweep_defaults(
    out_dir: str | Path,
    *,
    shard: Shard | tuple[int, int] | str | None = None,
    meta: Mapping[str, Any] | None = None,
    chunk_size: int | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Checkpoint folders, and a shard, for every `sweep` that code called inside the block
    runs (an experiment, which calls `sweep` itself).

    ``out_dir``: the k-th sweep called inside the block (k = 1, 2, ...) saves its chunks in
    ``out_dir/sweep-k`` unless it passes its own ``out_dir``, so running the same code again
    resumes every sweep from its chunks. ``shard`` (a `Shard`, ``(i, N)`` or ``"i/N"``): each
    sweep without its own ``shard`` computes only that shard's chunks; when it then lacks
    chunks of other shards it raises `ShardPending` (the calling code could not use a partial
    grid), for the caller of the block to catch. Run the block again without ``shard`` (the
    merge) once every shard is done, or with it to share the next sweep. ``meta`` is merged
    into each sweep's ``meta`` and so recorded in its manifest: a folder saved under other
    ``meta`` (the options of another run) is refused. ``chunk_size``: the chunk size of each
    sweep that passes none itself (``None``: the sweep's default, or its folder's), so that a
    sweep has more chunks than shards and an interrupted run loses at most a chunk.

    Yields a list that receives one dict per sweep run inside the block: ``sweep`` (k),
    ``out_dir``, ``n_chunks``, and chunk counts ``computed``, ``loaded`` and ``pending``.
    """
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"sweep_defaults: out_dir must be a folder path, got {out_dir!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"sweep_defaults: chunk_size must be a positive integer, got {chunk_size!r:.60}")
    _check_meta(meta, "sweep_defaults")
    ctx = _Defaults(Path(out_dir), None if shard is None else _as_shard(shard), dict(meta or {}), [])
    ctx.chunk_size = None if chunk_size is None else int(chunk_size)
    token = _DEFAULTS.set(ctx)
    try:
        yield ctx.log
    finally:
        _DEFAULTS.reset(token)


_SEED_AXES = ("seed", "key")  # axis names that hold seeds: integers only (`_grid`)


def _grid(axes: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, np.ndarray], dict[str, np.ndarray]]:
    if not axes:
        raise ValueError("sweep needs at least one axis")
    dims = tuple(axes)
    coords = {}
    for d in dims:
        try:
            c = np.asarray(axes[d])
        except ValueError:  # ragged: lists of different lengths
            raise ValueError(
                f"sweep axis {d!r} must be a non-empty 1-D array of values, got nested lists of different lengths: "
                f"{axes[d]!r:.100}"
            ) from None
        if c.ndim == 0:
            c = c[None]
        if c.ndim != 1 or c.size == 0:
            raise ValueError(f"sweep axis {d!r} must be a non-empty 1-D array, got shape {c.shape}")
        if c.dtype.kind not in "biuf":
            raise ValueError(
                f"sweep axis {d!r} must hold real numbers (it is traced, one value per grid point), got "
                f"{c.dtype} values {c.tolist()[:4]!r}; labels, strings and other choices that change the "
                f"program go in a Static axis: {{{d!r}: af.Static([...])}}"
            )
        if c.dtype.kind == "f" and not np.all(np.isfinite(c)):
            raise ValueError(f"sweep axis {d!r} has non-finite values: {c[~np.isfinite(c)]}")
        if d in _SEED_AXES and c.dtype.kind not in "iu":
            # a verb's key refuses a float seed when called directly; traced, it failed deep inside
            # each package's run, with a message that named neither the axis nor the key
            raise ValueError(
                f"sweep axis {d!r} must hold integer seeds (each becomes a PRNG key), got {c.dtype} values "
                f"{c.tolist()[:4]!r}: pass integers, e.g. np.arange({c.size})"
            )
        _check_representable(d, c)
        coords[d] = c
    mesh = np.meshgrid(*(coords[d] for d in dims), indexing="ij")
    flat = {d: m.reshape(-1) for d, m in zip(dims, mesh)}
    return dims, coords, flat


def _check_representable(name: str, c: np.ndarray) -> None:
    """With JAX's 64-bit mode off a traced axis runs in 32 bits: ``ValueError`` naming the axis
    when that would merge distinct values (``0.1`` and ``0.1 + 1e-9``) or wrap an integer (a
    seed ``2**32 + 1``), which would silently compute one point twice."""
    if jax.config.read("jax_enable_x64") or c.dtype.itemsize <= 4:
        return
    if c.dtype.kind in "iu":
        info = np.iinfo(np.int32)
        bad = c[(c < info.min) | (c > info.max)]
        if bad.size:
            raise ValueError(
                f"sweep axis {name!r} has integers outside 32 bits ({bad.tolist()[:3]}), which JAX runs in 32 bits "
                "while its 64-bit mode is off: call attnflow.enable_x64() first"
            )
        return
    if c.dtype.kind == "f" and len(np.unique(c.astype(np.float32))) < len(np.unique(c)):
        raise ValueError(
            f"sweep axis {name!r} has values that are equal in float32, in which JAX runs them while its 64-bit mode "
            f"is off ({c.tolist()[:4]}...): call attnflow.enable_x64() first"
        )


_CACHE: dict[tuple[Any, ...], Any] = {}  # compiled function per (fn, devices, layout)
_STRUCT: dict[tuple[Any, ...], Any] = {}  # output structure per compiled function and input shapes
_NO_SHARD_MAP: dict[tuple[Any, ...], bool] = {}  # layouts whose fn did not trace under shard_map
_STATIC_FNS: dict[tuple[Any, ...], Any] = {}  # fn of one static point (`_static_sweep`) per fn and point


class _Identity:
    """A cache key equal only to a key of the same object, which it holds (so that the object's
    ``id`` is not reused while the cache entry lives)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj


def _fn_key(fn: Any) -> Any:
    """``fn`` as a cache key of the compiled programs: a bound method by equality (``obj.run``
    is a new object at every access, equal while ``obj`` is the same object), anything else by
    identity (`_Identity`): an equal but other object (a dataclass whose ``__eq__`` skips a
    field) may compute something else. ``None`` for an unhashable callable (a mutable
    dataclass with ``__call__``, an Equinox module with array fields), which is not cached and
    compiles anew at every sweep: it may change between sweeps, and a cache keyed on it would
    keep it (and its arrays) alive."""
    try:
        hash(fn)
    except TypeError:
        return None
    return fn if isinstance(fn, types.MethodType) else _Identity(fn)


def _memo(store: dict, key: tuple, make: Callable[[], Any]) -> Any:
    """``store[key]``, made by ``make()`` on first use; at most 65 entries, oldest dropped
    (the keys hold user functions, which must not pile up in a long session)."""
    if key not in store:
        if len(store) > 64:
            store.pop(next(iter(store)))
        store[key] = make()
    return store[key]


@functools.lru_cache(maxsize=64)
def _shardings(devices: tuple, dims: tuple, nested: bool) -> tuple[NamedSharding, dict[str, NamedSharding]]:
    """The point-axis sharding over ``devices``, and each axis input's sharding: all split
    (flat), or the first split and the others whole on every device (nested)."""
    mesh = Mesh(np.asarray(devices), ("points",))
    split = NamedSharding(mesh, PartitionSpec("points"))
    whole = NamedSharding(mesh, PartitionSpec())
    return split, {d: split if i == 0 or not nested else whole for i, d in enumerate(dims)}


def _compiled(
    fn: Callable[..., Any],
    devices: tuple,
    dims: tuple,
    nested_dims: tuple | None = None,
    lanes: int | None = None,
    local: bool = False,
    version: str | None = None,
) -> Any:
    """One jitted, sharded, vmapped ``fn`` per (fn, devices, layout), reused across calls.
    ``version``: ``fn``'s fingerprint where the sweep computes it (an ``out_dir``), so that a
    setting ``fn`` reads that changed in the same session gives a new trace, not the old one.

    Flat (``nested_dims=None``): ``vmap`` over a list of points, each axis an array of the
    same length. Nested: one ``vmap`` per axis in ``nested_dims`` order, the first outermost;
    inputs are the 1-D axis values and the output is flattened back to points in C order
    (the order of the flat grid), so chunks of both layouts are stored alike.
    A new ``jax.jit`` per call would retrace and recompile every time; caching on the
    function object makes the second sweep of the same ``fn`` run at full speed. Returns the
    jitted function, whose output is ``(values, status)``, and the list of failure messages
    its status codes index (filled when it is traced).

    ``local``: wrap in ``shard_map``, so that each device runs its own copy of the batched
    ``fn`` on its block of points, with no communication. Under plain jit sharding the SPMD
    partitioner turns the stopping test of a vmapped adaptive solve (any lane not
    finished) into an all-reduce across devices at every step.

    ``lanes``: each device runs its points as consecutive groups of ``lanes`` points
    (nested: rows of the first axis, ``lanes // n_inner`` of them), one after another
    inside the compiled call (`attnflow._lanes.vmap_lanes`).
    """

    def make():
        sharding, inputs = _shardings(devices, dims, nested_dims is not None)
        messages: list[str] = []

        def fn_status(**p):
            # each point's failures (attnflow's fail_if) become a status code instead of an error
            with collecting() as sink:
                try:
                    out = fn(**p)
                except TypeError as err:  # JAX's tracer errors are TypeErrors
                    _note_traced_axes(err, p)
                    raise
            messages[:] = [m for _, m in sink] + [m for _, m in sink.warnings]
            code = status_code(sink, sink.warnings)
            return blank_failed(out, code), code

        if nested_dims is None:

            def batched(point):
                return vmap_lanes(lambda p: fn_status(**p), lanes)(point)
        else:

            def batched(point):
                def over(i, fixed):
                    if i == len(nested_dims):
                        return fn_status(**fixed)
                    d = nested_dims[i]
                    rows = None if i or lanes is None else max(1, lanes // n_inner)
                    return vmap_lanes(lambda x: over(i + 1, {**fixed, d: x}), rows)(point[d])

                n_inner = math.prod(point[d].shape[0] for d in nested_dims[1:])
                out = over(0, {})
                return jax.tree_util.tree_map(
                    lambda x: x.reshape((x.shape[0] * n_inner,) + x.shape[len(nested_dims) :]), out
                )

        # the compiled program is named after the swept function (compile logs, `count_compilations`)
        name = getattr(fn, "__name__", type(fn).__name__)
        batched.__name__ = batched.__qualname__ = f"sweep_{name if name.isidentifier() else 'lambda'}"
        body = batched
        if local:
            body = jax.shard_map(
                batched,
                mesh=sharding.mesh,
                in_specs=({d: s.spec for d, s in inputs.items()},),
                out_specs=sharding.spec,
                check_vma=False,
            )
        jitted = jax.jit(
            body,
            in_shardings=(inputs,),
            out_shardings=sharding,
            compiler_options=cpu_compiler_options() if devices[0].platform == "cpu" else {},
        )
        return jitted, messages

    key = _fn_key(fn)
    return make() if key is None else _memo(_CACHE, (key, devices, dims, nested_dims, lanes, local, version), make)


def _out_struct(compiled: Any, example: dict) -> Any:
    """``compiled.eval_shape(example)``, cached per compiled function and input shapes."""
    return _memo(
        _STRUCT,
        (compiled, tuple((d, e.shape, e.dtype) for d, e in example.items())),
        lambda: compiled.eval_shape(example),
    )


_CONCRETE_ERRORS = (  # JAX's refusals of a traced value where a concrete one is needed
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


_TRACED_AXIS = "attnflow.sweep: the axes"


def _note_traced_axes(err: Exception, point: Mapping[str, Any]) -> None:
    """Add a note to ``err`` (raised as it is, same type) when it is JAX's refusal of a traced
    value where a concrete one is needed (a shape, a scan length, a Python ``if``): the sweep's
    axes reach ``fn`` traced, and an axis that sets a shape must be wrapped in `Static`. The
    traced value may come from elsewhere in ``fn`` too, so the note says "if"."""
    if any(_TRACED_AXIS in note for note in getattr(err, "__notes__", ())):  # a sweep inside fn noted it
        return
    concrete = isinstance(err, _CONCRETE_ERRORS) or "must be 1D sequences of concrete values" in str(err)
    traced = [d for d in point if d != "_point"]  # _point: the placeholder of a sweep of Static axes only
    if not concrete or not traced:
        return
    ints = [d for d in traced if jnp.issubdtype(point[d].dtype, jnp.integer)]
    err.add_note(
        f"{_TRACED_AXIS} {', '.join(map(repr, traced))} reach fn traced (one compiled program covers all their "
        "values). If the value JAX needed concrete comes from one of them (a size, a scan length, a step count, a "
        f"Python branch), wrap that axis in af.Static([...]), one compiled program per value: "
        f"{{{(ints or traced)[0]!r}: af.Static([...])}}"
    )


def _check_axes(axes: Any) -> None:
    """``ValueError`` unless ``axes`` is a non-empty mapping whose names are strings (``fn`` takes
    them as keywords)."""
    if not isinstance(axes, Mapping) or not axes:
        raise ValueError(
            f"sweep: axes must be a non-empty dict name -> values, as {{'eta': etas, 'seed': seeds}}; got {axes!r:.100}"
        )
    for name in axes:
        if not isinstance(name, str):
            raise ValueError(
                f"sweep: axis name {name!r} ({type(name).__name__}) is not a string: fn receives each axis as a "
                "keyword argument named after it"
            )


def _check_axis_names(fn: Callable[..., Any], axes: Mapping[str, Any]) -> None:
    """``ValueError`` before any computing when ``fn`` cannot take the axes as keywords (``fn`` is
    called as ``fn(**point)``); functions without an inspectable signature pass."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**{str(name): None for name in axes})
    except TypeError as err:
        raise ValueError(
            f"sweep calls fn with the axis names as keywords ({', '.join(map(str, axes))}), but fn{sig} does not "
            f"accept them ({err}); name fn's parameters after the axes"
        ) from None


_F = TypeVar("_F", bound=Callable[..., Any])


def _delivering_interrupts(fn: _F) -> _F:
    """``fn`` run with a swallowed Ctrl-C sent again (`redeliver_swallowed_interrupts`): a long
    sweep is where an interrupt raised inside JAX's garbage-collection callback was lost."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with redeliver_swallowed_interrupts():
            return fn(*args, **kwargs)

    return cast(_F, run)


@_delivering_interrupts
def sweep(
    fn: Callable[..., Any],
    axes: Mapping[str, Any],
    *,
    chunk_size: int | None = None,
    out_dir: str | Path | None = None,
    devices: Sequence[jax.Device] | None = None,
    progress: bool = True,
    on_chunk: Callable[[int, int], None] | None = None,
    meta: Mapping[str, Any] | None = None,
    nest: bool | None = None,
    on_error: str = "nan",
    shard: Shard | tuple[int, int] | str | None = None,
    lanes: int | None = None,
) -> SweepResult:
    """Evaluate ``fn(**point)`` on the cartesian grid of ``axes``.

    Parameters
    ----------
    fn:
        Function of the axis names (keyword arguments, each a scalar array) returning a
        pytree of arrays. It is traced once per chunk shape: keep everything that varies
        an argument.
    axes:
        ``{name: 1-D values}``; the grid is their cartesian product in this order. A value
        wrapped in `Static` (sizes and other values that change shapes) is looped over in
        Python, one compiled program per value, with ``out_dir`` split into one subfolder per
        static point. An axis named ``seed`` or ``key`` holds integer seeds (floats raise
        ``ValueError``).
    chunk_size:
        Points per compiled call (default: all points up to 4096; sharded, about one chunk
        per shard; with an ``out_dir`` that holds this grid, the chunk size saved there),
        rounded up to a multiple of the device count (nested: to whole rows of the first
        axis, a multiple of the device count of them). Bounds memory for large grids. The
        chunks of a sharded or resumed sweep keep their size on any device count (each
        compiled call is padded to a multiple of the devices instead): a resume given the
        ``chunk_size`` its folder was saved with uses the folder's chunks, whatever the
        device count then and now.
    out_dir:
        If given, each finished chunk is saved there (``chunk_00000.npz``) with a
        ``sweep.json`` manifest; rerunning the same sweep loads finished chunks, and another
        sweep is refused (``ValueError`` saying what changed; when the folder holds no chunk
        yet, that its ``sweep.json`` may be deleted). Chunks without a ``sweep.json`` are never
        loaded: such a folder is refused. Chunks and manifest are written atomically, so
        processes sharing the folder are safe.
    devices:
        Devices to shard the point axis over (default: this process's devices,
        ``jax.local_devices()``, which under ``jax.distributed`` are not all devices).
    progress:
        tqdm progress bar over chunks.
    on_chunk:
        ``on_chunk(i, n_chunks)`` called after chunk ``i`` is computed (and saved).
    meta:
        A JSON-able dict added to `SweepResult.meta` and recorded in the manifest of
        ``out_dir`` (a folder saved under other ``meta`` is refused). Keys of the sweep's own
        entries (``n_points``, ``chunk_size``, ``computed_chunks``, ...) raise ``ValueError``.
    nest:
        ``True``: one nested ``vmap`` per axis, so work that depends on some axes only is
        shared across the others (for SGD over ratios x seeds, each seed's samples are
        drawn once for all ratios). ``False``: one ``vmap`` over the flat list of points.
        Default ``None``: nested for grids of two or more axes, unless ``chunk_size`` is
        smaller than one row (the product of the other axes' lengths). Both give the
        same values up to floating-point reassociation.
    on_error:
        What a failing grid point does (an attnflow run inside ``fn`` that diverged or used
        up its steps): ``"nan"`` (default) gives it NaN values, a nonzero
        `SweepResult.status` and a warning naming its coordinates; ``"raise"`` raises
        `SweepError` naming the failing points after the sweep.
    shard:
        Compute only this `Shard` of the grid (``Shard(i, N)``, ``(i, N)`` or ``"i/N"``) into
        ``out_dir`` (required), loading the chunks other shards saved there; points of
        chunks still missing are pending (`SweepResult.pending`, values NaN) unless the
        shard waits for them (``Shard(i, N, wait=True)``, `process_shard`). A later call
        without ``shard`` on the same ``out_dir`` merges: it loads every chunk and computes
        only the missing ones. Inside a `sweep_defaults` block, ``out_dir`` and ``shard``
        default to the block's.
    lanes:
        Run each device's points as consecutive groups of ``lanes`` points, one group after
        another inside the same compiled call (nested: groups of ``lanes // n_inner`` rows
        of the first axis). Under ``vmap`` an adaptive solve steps until its slowest lane is
        done; in groups, each group stops with its own slowest lane, so points that finish
        early stop costing work. Same values as without (``None``, the default: one
        group); pays on a CPU for grids whose neighbouring points take similar step counts
        (``benchmarks/sweep_vs_loop.py``); on a GPU keep one group.
    """
    if on_error not in ("nan", "raise"):
        raise ValueError(f"on_error must be 'nan' or 'raise', got {on_error!r}")
    slot = _STATIC_SLOT.get()
    if slot is not None:  # this sweep is one static point's; a sweep inside fn is not
        _STATIC_SLOT.set(None)
    if not callable(fn):
        raise TypeError(f"fn must be callable (the function of the axis names), got {fn!r}")
    _check_axes(axes)
    _check_axis_names(fn, axes)
    _check_meta(meta, "sweep")
    if any(isinstance(v, Static) for v in axes.values()):
        block = _DEFAULTS.get()
        number = None
        if block is not None:  # one number of the sweep_defaults block for the whole static sweep
            block.count += 1
            number = block.count
            if out_dir is None:
                out_dir = block.out_dir / f"sweep-{number}"
        return _static_sweep(
            fn,
            axes,
            block_number=number,
            chunk_size=chunk_size,
            out_dir=out_dir,
            devices=devices,
            progress=progress,
            on_chunk=on_chunk,
            meta=meta,
            nest=nest,
            on_error=on_error,
            shard=shard,
            lanes=lanes,
        )
    ctx = _DEFAULTS.get()
    number = None  # the sweep's number in its sweep_defaults block
    shard_from_block = False
    if ctx is not None and slot is not None and slot.number is not None:
        number = slot.number  # a static point's sweep: its folder is given, its number the block's
    elif ctx is not None:
        ctx.count += 1
        number = ctx.count
        if out_dir is None:
            out_dir = ctx.out_dir / f"sweep-{number}"
    if ctx is not None:
        if shard is None and ctx.shard is not None:
            shard, shard_from_block = ctx.shard, True
        if ctx.meta:
            meta = {**ctx.meta, **dict(meta or {})}
            _check_meta(meta, "sweep_defaults")
        if chunk_size is None and ctx.chunk_size is not None:
            chunk_size = ctx.chunk_size
    shard = None if shard is None else _as_shard(shard)
    if shard is not None and out_dir is None:
        raise ValueError(
            f"sweep: shard {shard} needs an out_dir, the folder where every shard saves its chunks and the merge "
            "finds them"
        )
    out_path = Path(out_dir) if out_dir is not None else None
    dims, coords, flat = _grid(axes)
    n = len(next(iter(flat.values())))
    devices = list(devices) if devices is not None else jax.local_devices()
    if not devices:
        raise ValueError("sweep: devices must name at least one device (None: this process's devices)")
    n_dev = len(devices)
    n_rows = len(coords[dims[0]])
    n_inner = n // n_rows  # points in one row of the first axis
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r:.60}")
    asked = None if chunk_size is None else int(chunk_size)  # as given, before rounding to the devices
    saved = None
    if out_path is not None:
        # the folder's chunk size, when none is given or the one it was saved with (given then, or
        # as rounded then): the same chunk_size on another device count rounds to another size
        saved_size, saved_asked = _saved_chunk_size(out_path, dims, coords)
        if asked is None or asked in (saved_size, saved_asked):
            saved = saved_size
    if chunk_size is None:
        # one chunk per shard (whole rows), at most 4096 points
        chunk_size = saved or min(-(-n_rows // (shard.count if shard is not None else 1)) * n_inner, 4096)
    elif saved is not None:
        chunk_size = saved
    if saved is None:
        chunk_size = min(int(chunk_size), n)  # a chunk never holds more than the grid
    if nest not in (None, True, False):
        raise ValueError(f"nest must be True, False or None, got {nest!r}")
    if nest is None:
        nest = len(dims) >= 2 and chunk_size >= n_inner and (saved is None or chunk_size % n_inner == 0)
    elif nest and saved is not None and chunk_size % n_inner:
        raise ValueError(
            f"sweep: the chunks saved in {out_path} hold {chunk_size} points, not whole rows of {n_inner}; "
            "resume them with nest=False"
        )
    # the stored chunks of a sharded or resumed sweep keep their size whatever this machine's device
    # count; each compiled call is then padded to a multiple of the devices
    shared_layout = shard is not None or saved is not None
    if nest:
        rows = max(1, chunk_size // n_inner)
        if not shared_layout:
            rows = int(math.ceil(rows / n_dev) * n_dev)
        chunk_size = rows * n_inner
        call = int(math.ceil(rows / n_dev) * n_dev)  # rows per compiled call
    else:
        if not shared_layout:
            chunk_size = int(math.ceil(chunk_size / n_dev) * n_dev)
        call = int(math.ceil(chunk_size / n_dev) * n_dev)  # points per compiled call
    n_chunks = int(math.ceil(n / chunk_size))

    # more than one device: shard_map (no cross-device step), unless fn does not trace under
    # it (equinox's closure conversion, used by Diffrax's event root find, compares
    # shardings that shard_map changes); one device needs no shard_map
    layout = (tuple(devices), dims, dims if nest else None, check_lanes(lanes))
    fn_key = _fn_key(fn)
    local = n_dev > 1 and (fn_key, *layout) not in _NO_SHARD_MAP
    fn_parts = _fingerprint_parts(fn) if out_path is not None else None
    version = _combined(fn_parts) if fn_parts is not None else None
    compiled, messages = _compiled(fn, *layout, local, version)

    def chunk_points(i):
        if nest:
            # a block of rows of the first axis (the last block padded by repetition) and the
            # other axes whole
            first = coords[dims[0]]
            lo = i * rows
            idx = np.minimum(np.arange(lo, lo + call), len(first) - 1)
            return {d: (first[idx] if j == 0 else coords[d]) for j, d in enumerate(dims)}
        lo = i * chunk_size
        idx = np.minimum(np.arange(lo, lo + call), n - 1)  # pad the last chunk by repetition
        return {d: flat[d][idx] for d in dims}

    example = {
        d: jax.ShapeDtypeStruct(v.shape, jax.dtypes.canonicalize_dtype(v.dtype)) for d, v in chunk_points(0).items()
    }
    try:
        out_struct = _out_struct(compiled, example)
    except Exception as err:
        if not local:
            raise
        compiled, messages = _compiled(fn, *layout, False, version)
        out_struct = _out_struct(compiled, example)  # fn's own errors surface here
        local = False
        # warned once; later sweeps of this fn go straight to jit sharding
        if fn_key is not None:
            _memo(_NO_SHARD_MAP, (fn_key, *layout), lambda: True)
        first = (str(err).strip().splitlines() or [""])[0][:160]
        warnings.warn(
            f"sweep: fn does not trace under shard_map ({type(err).__name__}: {first}); using jit "
            "sharding instead, under which a vmapped adaptive solve synchronises the devices at every step",
            RuntimeWarning,
            stacklevel=2,
        )
    leaves_struct, treedef = jax.tree_util.tree_flatten(out_struct)

    if out_path is not None:
        _check_manifest(out_path, dims, coords, chunk_size, treedef, leaves_struct, meta, fn_parts, asked, n_dev)

    def chunk_file(i: int) -> Path:
        assert out_path is not None
        return out_path / f"chunk_{i:05d}.npz"

    results: list[list[np.ndarray] | None] = [None] * n_chunks
    if out_path is not None:
        for i in range(n_chunks):
            results[i] = _load_chunk(chunk_file(i), leaves_struct, chunk_size)
    if shard is None:
        mine: Sequence[int] = range(n_chunks)
    elif slot is None:
        mine = shard.chunks(n_chunks)
    else:  # the shard's chunks of the whole grid, numbered across the static points
        offset = slot.index * n_chunks
        mine = [i for i in range(n_chunks) if (offset + i) % shard.count == shard.index - 1]
    todo = [i for i in mine if results[i] is None]
    chunk_base, chunk_total = (0, n_chunks) if slot is None else (slot.index * n_chunks, slot.count * n_chunks)

    devices_used = 0
    bar = None
    if progress and todo:
        from ._io import progress_bar

        desc = "sweep" if shard is None else f"sweep, shard {shard}"
        bar = progress_bar(total=len(mine), initial=len(mine) - len(todo), desc=desc, unit="chunk")
    try:
        for i in todo:
            # host arrays go straight into the jitted call, which places them by its
            # in_shardings (about 15 us; a device_put first costs about 100 us)
            try:
                out = compiled(chunk_points(i))
            except (jax.errors.JaxRuntimeError, ValueError) as err:
                if "CpuCallback error" not in str(err) and not isinstance(err, jax.errors.JaxRuntimeError):
                    raise  # (a cached program raises the same failure as a ValueError)
                # an attnflow check inside the user's own jit, loop, cond, custom_jvp or
                # checkpoint cannot hand its failure to the sweep (its values cannot leave that
                # program): it raises at run time, and the chunk's points are named here
                points = chunk_points(i)
                where = ", ".join(f"{d} in {np.unique(points[d]).tolist()[:6]}" for d in dims)
                # the check's own message: the line equinox raises it on
                said = [ln.split("RuntimeError: ", 1)[1] for ln in str(err).splitlines() if "RuntimeError: " in ln]
                first = said[0] if said else (str(err).strip().splitlines() or [""])[0]
                raise SweepError(
                    f"a point of chunk {i} ({where}) failed inside a jax.jit, lax.scan, lax.cond, custom_jvp or "
                    f"checkpoint of fn, where the sweep cannot mark one point failed: {first.strip()[:300]}. Call "
                    "attnflow's verbs outside such a transformation within fn to get NaN and a status per point"
                ) from err
            out_leaves = jax.tree_util.tree_leaves(out)
            if out_leaves:
                devices_used = max(devices_used, len(out_leaves[0].sharding.device_set))
            leaves = [np.asarray(x)[:chunk_size] for x in out_leaves]  # a call padded to the devices: the chunk
            results[i] = leaves
            if out_path is not None:
                atomic_write(chunk_file(i), functools.partial(_save_leaves, leaves=leaves))
            if bar is not None:
                bar.update(1)
            if on_chunk is not None:
                on_chunk(chunk_base + i, chunk_total)
    finally:
        if bar is not None:
            bar.close()

    if shard is not None and shard.wait is not False and any(r is None for r in results):
        # the other shards' chunks, as they appear in the shared folder
        deadline = math.inf if shard.wait is True else time.monotonic() + float(shard.wait)
        pause = 0.05
        while True:
            for i in range(n_chunks):
                if results[i] is None:
                    results[i] = _load_chunk(chunk_file(i), leaves_struct, chunk_size)
            if all(r is not None for r in results) or time.monotonic() >= deadline:
                break
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(2 * pause, 1.0)
    missing = [i for i in range(n_chunks) if results[i] is None]

    grid_shape = tuple(len(coords[d]) for d in dims)
    gathered: list[Any] = []
    for j, s in enumerate(leaves_struct):
        # a pending chunk: NaN values (0 for integers) and the status PENDING (the last leaf)
        fill = PENDING if j == len(leaves_struct) - 1 else (np.nan if np.dtype(s.dtype).kind in "fc" else 0)
        parts = [r[j] if r is not None else np.full((chunk_size, *s.shape[1:]), fill, s.dtype) for r in results]
        full = (parts[0] if n_chunks == 1 else np.concatenate(parts))[:n]
        gathered.append(jnp.asarray(full.reshape(grid_shape + full.shape[1:])))
    values, status = jax.tree_util.tree_unflatten(treedef, gathered)
    info = {
        "n_points": n,
        "chunk_size": chunk_size,
        "n_chunks": n_chunks,
        "n_devices": n_dev,
        "devices_used": devices_used,
        "nested": bool(nest),
        "shard_map": bool(local),
        "lanes": lanes,
        "computed_chunks": len(todo),
        **({"shard": str(shard), "pending_chunks": len(missing)} if shard is not None else {}),
        **dict(meta or {}),
    }
    result = SweepResult(dims, coords, values, info, status=np.asarray(status), messages=list(messages))
    counts = (len(todo), n_chunks - len(todo) - len(missing), len(missing))  # computed, loaded, pending
    if slot is not None:
        slot.counts = counts
    if ctx is not None and (slot is None or slot.number is None):
        ctx.log.append(_log_entry(number, out_path, n_chunks, *counts))
    if slot is not None:  # the static sweep pends, reports and raises for the whole grid
        slot.n_chunks = n_chunks
        if missing and shard_from_block:
            slot.pending = (shard, out_path, number, [chunk_base + i for i in todo], [chunk_base + i for i in missing])
        return result
    if missing and shard_from_block:
        assert shard is not None and out_path is not None
        raise ShardPending(shard, out_path, number, n_chunks, todo, missing)
    _report_failures(result, on_error, stacklevel=3)  # past the interrupt wrapper, at the caller of sweep
    return result


def _report_failures(result: SweepResult, on_error: str, stacklevel: int) -> None:
    """Warn about the failed points of ``result``, naming up to three by their coordinates, or
    raise `SweepError` with ``on_error="raise"``."""

    def named(points: list) -> str:  # up to three points, by their coordinates
        shown = "; ".join(f"{', '.join(f'{k}={v!r}' for k, v in p.items())}: {m}" for p, m in points[:3])
        return shown + (f" (and {len(points) - 3} more)" if len(points) > 3 else "")

    n = int(np.prod(result.shape))
    warned = result.warnings()
    if warned:
        warnings.warn(
            f"sweep: {len(warned)} of {n} grid points ran with a warning: {named(warned)} (SweepResult.warnings())",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    failed = result.failures()
    if not failed:
        return
    text = f"sweep: {len(failed)} of {n} grid points failed: {named(failed)}"
    if on_error == "raise":
        raise SweepError(text)
    warnings.warn(
        text + "; their values are NaN (SweepResult.status, SweepResult.failures())",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


def _log_entry(number: Any, out_dir: Any, n_chunks: int, computed: int, loaded: int, pending: int) -> dict[str, Any]:
    """A sweep's entry in its `sweep_defaults` block's log."""
    return {
        "sweep": number,
        "out_dir": str(out_dir),
        "n_chunks": n_chunks,
        "computed": computed,
        "loaded": loaded,
        "pending": pending,
    }


def _static_sweep(
    fn: Callable[..., Any], axes: Mapping[str, Any], *, out_dir: Any, block_number: int | None = None, **kwargs: Any
) -> SweepResult:
    """`sweep` with `Static` axes: one sweep of the array axes per point of the static axes,
    stacked into one `SweepResult` with the axes in the order given."""
    dims = tuple(axes)
    static = [d for d in dims if isinstance(axes[d], Static)]
    dynamic = {d: axes[d] for d in dims if d not in static}
    placeholder = "_point" if not dynamic else None
    if placeholder:  # only static axes: one point per program
        dynamic = {placeholder: np.zeros(1)}
    if kwargs.get("shard") is not None and out_dir is None:
        raise ValueError("sweep: a sharded sweep needs an out_dir, the folder every shard saves its chunks in")
    parts: list[tuple[SweepResult, np.ndarray]] = []
    messages: list[str] = []
    infos: list[dict] = []
    slots: list[_StaticSlot] = []
    on_error = kwargs.pop("on_error", "nan")
    combos = list(itertools.product(*(axes[d].values for d in static)))
    for p, combo in enumerate(combos):
        point = dict(zip(static, combo, strict=True))
        # one partial per (fn, static point), reused by later sweeps: the compiled programs are
        # cached on it, so a second sweep of the same fn neither retraces nor recompiles
        make_sub = functools.partial(functools.partial, _drop_placeholder, fn, point, placeholder)
        fn_key = _fn_key(fn)
        point_key = (fn_key, tuple((d, type(v).__name__, v) for d, v in point.items()), placeholder)
        sub_fn = make_sub() if fn_key is None else _memo(_STATIC_FNS, point_key, make_sub)
        where = None
        if out_dir is not None:
            where = Path(out_dir) / ",".join(f"{d}={v}" for d, v in point.items())
            where.mkdir(parents=True, exist_ok=True)
        slots.append(_StaticSlot(p, len(combos), number=block_number))
        token = _STATIC_SLOT.set(slots[-1])
        try:
            res = sweep(sub_fn, dynamic, out_dir=where, on_error="nan", **kwargs)
        finally:
            _STATIC_SLOT.reset(token)
        # a Trajectory's metadata is static structure and may name the static value (train's D,
        # dt, steps): it is merged below, so only the rest of the structure must agree
        if parts and str(jax.tree_util.tree_structure(_without_meta(res.values))) != str(
            jax.tree_util.tree_structure(_without_meta(parts[0][0].values))
        ):
            raise ValueError(
                f"sweep: fn returns a different structure at {point} than at the first static point (other "
                "observables or pytree nodes; static fields of returned modules are part of the structure)"
            )
        if parts:
            shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(res.values)]
            first = [np.shape(x) for x in jax.tree_util.tree_leaves(parts[0][0].values)]
            if shapes != first:
                raise ValueError(
                    f"sweep: fn returns shapes {shapes} at {point} but {first} at the first static point; "
                    "outputs must have the same shapes for every Static value"
                )
        status = np.asarray(res.status).copy()
        status[status > 0] += len(messages)  # failure and warning codes index the merged messages
        status[status <= WARNED] -= len(messages)
        messages.extend(res.messages)
        parts.append((res, status))
        infos.append(res.meta)
    static_shape = tuple(len(axes[d].values) for d in static)
    dyn_dims = tuple(dynamic) if not placeholder else ()

    def assemble(leaves: list[np.ndarray]) -> np.ndarray:
        arr = np.stack(leaves).reshape(static_shape + np.shape(leaves[0]))
        if placeholder:
            arr = arr.reshape(static_shape + np.shape(leaves[0])[1:])
        grid = (*static, *dyn_dims)
        order = [grid.index(d) for d in dims]
        rest = list(range(len(grid), arr.ndim))
        return np.transpose(arr, order + rest)

    values = jax.tree_util.tree_map(
        lambda *xs: jnp.asarray(assemble([np.asarray(x) for x in xs])), *_merged_meta([r.values for r, _ in parts])
    )
    status = assemble([st for _, st in parts])
    coords = {d: (np.asarray(axes[d].values) if d in static else np.asarray(axes[d])) for d in dims}
    coords = {d: (c[None] if c.ndim == 0 else c) for d, c in coords.items()}
    info = {
        **infos[0],
        "static_axes": list(static),
        "n_points": int(np.prod([len(c) for c in coords.values()])),
        "n_chunks": sum(i["n_chunks"] for i in infos),
        "computed_chunks": sum(i.get("computed_chunks", 0) for i in infos),
        "n_programs": len(parts),
    }
    if "pending_chunks" in infos[0]:
        info["pending_chunks"] = sum(i["pending_chunks"] for i in infos)
    result = SweepResult(dims, coords, values, info, status=status, messages=messages)
    block = _DEFAULTS.get()
    if block is not None and block_number is not None:  # one entry for the whole static sweep
        counts = (sum(sl.counts[i] for sl in slots) for i in range(3))
        block.log.append(_log_entry(block_number, out_dir, sum(sl.n_chunks for sl in slots), *counts))
    pending = [sl.pending for sl in slots if sl.pending is not None]
    if pending:  # a shard of a sweep_defaults block: the code after this sweep cannot go on yet
        shard, _, number, _, _ = pending[0]
        total = sum(sl.n_chunks for sl in slots)
        computed = [i for pend in pending for i in pend[3]]
        missing = [i for pend in pending for i in pend[4]]
        folder = Path(out_dir) if out_dir is not None else Path(pending[0][1]).parent
        raise ShardPending(shard, folder, number, total, computed, missing)
    _report_failures(result, on_error, stacklevel=4)
    return result


def _is_trajectory(x: Any) -> bool:
    from .trajectory import Trajectory

    return isinstance(x, Trajectory)


def _with_meta_replaced(traj: Any, meta: dict) -> Any:
    return type(traj)(traj.ts, traj.ys, meta, traj.t_event, traj.stats)


def _without_meta(values: Any) -> Any:
    """``values`` with every `Trajectory`'s metadata emptied (for comparing structures)."""
    return jax.tree_util.tree_map(
        lambda x: _with_meta_replaced(x, {}) if _is_trajectory(x) else x,
        values,
        is_leaf=_is_trajectory,
    )


def _merged_meta(results: list[Any]) -> list[Any]:
    """The results of the static points with one metadata per `Trajectory` position: an entry
    equal at every point stays as it is, one that differs (``D``, ``dt``, ``steps`` of a `train`
    per size) becomes the list of its values, one per static point in grid order."""
    per_point = [jax.tree_util.tree_leaves(r, is_leaf=_is_trajectory) for r in results]
    merged: list[dict] = []
    for j, first in enumerate(per_point[0]):
        if not _is_trajectory(first):
            merged.append({})
            continue
        metas = [leaves[j].meta for leaves in per_point]
        entry: dict[str, Any] = {}
        for key in dict.fromkeys(k for m in metas for k in m):
            vals = [m.get(key) for m in metas]
            entry[key] = vals[0] if all(v == vals[0] for v in vals) else vals
        merged.append(entry)
    out = []
    for r in results:
        leaves, treedef = jax.tree_util.tree_flatten(r, is_leaf=_is_trajectory)
        leaves = [_with_meta_replaced(x, merged[j]) if _is_trajectory(x) else x for j, x in enumerate(leaves)]
        out.append(jax.tree_util.tree_unflatten(treedef, leaves))
    return out


def _drop_placeholder(fn: Callable[..., Any], point: dict, placeholder: str | None, **kw: Any) -> Any:
    if placeholder is not None:
        kw.pop(placeholder)
    return fn(**point, **kw)


def _save_leaves(f: Any, leaves: list[np.ndarray]) -> None:
    np.savez(f, *leaves)


def _manifest(dims, coords, chunk_size, treedef, leaves_struct, meta, fingerprint, asked=None):
    """The manifest of a sweep folder; ``fingerprint``: `_fingerprint_parts` of ``fn`` (compared
    as one digest, kept by part to say which changed)."""
    return {
        "dims": list(dims),
        "coords": {d: coords[d].tolist() for d in dims},
        "chunk_size": int(chunk_size),
        "chunk_size_asked": asked,  # the chunk_size given (None: the default), before rounding to the devices
        "structure": str(treedef),
        "leaves": [[list(s.shape[1:]), str(s.dtype)] for s in leaves_struct],
        "meta": json.loads(json.dumps(dict(meta or {}), default=str)),
        "fn": _combined(fingerprint),
        "fn_parts": fingerprint,  # not compared: it names what changed when "fn" differs
    }


_WHAT = {
    "dims": "the axis names",
    "coords": "the axis values",
    "chunk_size": "the chunk size",
    "structure": "the structure of fn's output",
    "leaves": "the shapes of fn's output",
    "meta": "meta",
    "fn": "the function (its code, or the values it reads: closure, default arguments, globals, the attributes of "
    "objects and the code of the functions it calls)",
}
_COMPARED = ("meta", "fn", "structure", "leaves", "dims", "coords", "chunk_size")  # the keys a resume must match

_OWN_META = (
    "n_points",
    "lanes",
    "chunk_size",
    "n_chunks",
    "n_devices",
    "devices_used",
    "nested",
    "shard_map",
    "computed_chunks",
    "shard",
    "pending_chunks",
    "static_axes",
    "n_programs",
)
"""The keys of `SweepResult.meta` that a sweep writes itself; a user's ``meta`` may not use them."""


def _check_meta(meta: Mapping[str, Any] | None, who: str) -> None:
    """``ValueError`` when ``meta`` holds keys of the sweep's own bookkeeping (`_OWN_META`),
    which they would overwrite in `SweepResult.meta`."""
    taken = [k for k in _OWN_META if k in (meta or {})]
    if taken:
        raise ValueError(
            f"{who}: meta keys {taken} are the sweep's own entries of SweepResult.meta (reserved: "
            f"{', '.join(_OWN_META)}); rename them"
        )


def _check_manifest(
    out_path: Path,
    dims,
    coords,
    chunk_size,
    treedef,
    leaves_struct,
    meta,
    fingerprint,
    asked: int | None = None,
    n_dev: int = 1,
) -> dict[str, Any]:
    """Create the manifest of ``out_path``, or check that the one there describes this sweep
    (``ValueError`` naming what changed, and that its manifest may be deleted when the folder
    holds no chunk yet). Returns the manifest as JSON reads it back."""
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"out_dir {str(out_path)!r} is a file, not a folder")
    out_path.mkdir(parents=True, exist_ok=True)
    want = json.loads(json.dumps(_manifest(dims, coords, chunk_size, treedef, leaves_struct, meta, fingerprint, asked)))
    text = json.dumps(want, indent=1).encode()
    mf = out_path / "sweep.json"
    # chunks are saved only after the manifest exists (and the sweep never deletes it), so chunks
    # seen before a missing manifest are another sweep's, of unknown function and grid: refused,
    # never loaded as this sweep's values. Chunks first: a shard may create both in between
    stale = sorted(p.name for p in out_path.glob("chunk_*.npz"))
    if stale and not mf.exists():
        raise ValueError(
            f"sweep: {out_path} holds chunk files ({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}) but "
            "no sweep.json manifest, so nothing says which function and grid they belong to and they are never "
            "reused; delete the folder (or its chunk_*.npz files) or use a fresh out_dir"
        )
    # processes sharing the folder (shards) race to write it: one creates it, the others compare
    if not mf.exists() and _create_if_absent(mf, text):
        return want
    try:
        have = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{mf} is not a sweep manifest (invalid JSON: {err}); use a fresh out_dir or delete it"
        ) from None
    if not isinstance(have, dict):
        raise ValueError(f"{mf} is not a sweep manifest; use a fresh out_dir or delete it")
    changed = [key for key in _COMPARED if have.get(key) != want[key]]
    if not changed:
        return want
    # Not replaced even when no chunk is there yet: a process may still be computing the first
    # chunk of the sweep the manifest describes (a shard), and would save it under another's.
    way_out = (
        f"it holds no chunk yet (a run stopped before its first chunk): delete {mf} to start this sweep there"
        if not any(out_path.glob("chunk_*.npz"))
        else "its chunks are not reused. Use a fresh out_dir or delete the old one"
    )
    key = changed[0]
    if key == "meta":
        raise ValueError(
            f"sweep: {out_path} holds a sweep saved with other settings: {_meta_diff(have.get(key), want[key])}; "
            f"{way_out}"
        )
    if key == "chunk_size" and asked is not None:
        before = have.get("chunk_size_asked")
        given = f" (chunk_size={before} then)" if isinstance(before, int) else ""
        raise ValueError(
            f"sweep: {out_path} holds chunks of {have.get(key)} points{given}, and chunk_size={asked} gives "
            f"{want[key]} on {n_dev} device(s); pass the chunk_size it was saved with, or leave chunk_size out to "
            "resume with the folder's (on any device count)"
        )
    if key == "fn" and isinstance(have.get("fn_parts"), dict):
        saved, now = have["fn_parts"], want["fn_parts"]
        which = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
        raise ValueError(
            f"sweep: {out_path} holds a different sweep: the function (its code, or the values it reads) changed: "
            f"{', '.join(which[:6])}{' ...' if len(which) > 6 else ''} (against the saved sweep's); {way_out}"
        )
    if key in ("dims", "coords"):
        raise ValueError(f"sweep: {out_path} holds a different sweep: {_axes_diff(have, want)}; {way_out}")
    if key == "leaves":
        raise ValueError(
            f"sweep: {out_path} holds a different sweep: {_leaves_diff(have.get(key), want[key])}; {way_out}"
        )
    raise ValueError(
        f"sweep: {out_path} holds a different sweep: {_WHAT[key]} changed (saved {str(have.get(key))[:100]!r}, "
        f"now {str(want[key])[:100]!r}); {way_out}"
    )


def _axes_diff(have: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """What differs between the axes of a saved manifest and this sweep's: axes added, removed
    or reordered, or the first axis whose values differ, at its first differing index (values
    in full precision)."""
    saved, now = have.get("dims"), list(want["dims"])
    if saved != now:
        if not isinstance(saved, list):
            return f"the axis names changed (saved {saved!r}, now {now})"
        added = [d for d in now if d not in saved]
        removed = [d for d in saved if d not in now]
        what = [f"{', '.join(map(repr, added))} added"] if added else []
        what += [f"{', '.join(map(repr, removed))} removed"] if removed else []
        return f"the axes changed (saved {saved}, now {now}: {'; '.join(what) or 'another order'})"
    before = have.get("coords")
    if not isinstance(before, dict):
        before = {}
    for d in now:
        a, b = before.get(d), want["coords"][d]
        if a == b:
            continue
        if not isinstance(a, list):
            return f"the values of axis {d!r} changed (saved {str(a)[:100]}, now {len(b)} values)"
        if len(a) != len(b):
            return f"axis {d!r} has {len(b)} values, the saved sweep {len(a)} (saved {_ends(a)}, now {_ends(b)})"
        i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        return f"the values of axis {d!r} changed, first at index {i}: saved {a[i]!r}, now {b[i]!r}"
    return "the axis values changed"


def _leaves_diff(saved: Any, now: list) -> str:
    """What differs between the output leaves (``[shape, dtype]``) of a saved manifest and this
    sweep's: the first leaf whose dtype (with JAX's 64-bit mode, when that explains it) or shape
    changed. The last leaf, the sweep's own status, is not shown."""
    if isinstance(saved, list) and len(saved) == len(now):
        for i, (a, b) in enumerate(zip(saved[:-1], now[:-1], strict=True)):
            if a == b or not (isinstance(a, list) and len(a) == 2):
                continue
            where = f"output leaf {i}" if len(now) > 2 else "fn's output"
            if a[0] != b[0]:
                return f"the shape of {where} changed (saved {tuple(a[0])} {a[1]}, now {tuple(b[0])} {b[1]})"
            said = f"the dtype of {where} changed ({a[1]} saved, {b[1]} now)"
            try:
                bits = (jnp.dtype(a[1]).itemsize, jnp.dtype(b[1]).itemsize)
            except TypeError:  # not a dtype name
                bits = (0, 0)
            if bits == (8, 4) and not jax.config.read("jax_enable_x64"):
                said += (
                    ": JAX's 64-bit mode (jax_enable_x64) is off in this run; call attnflow.enable_x64() first to "
                    "resume it"
                )
            elif bits == (4, 8) and jax.config.read("jax_enable_x64"):
                said += ": the saved run had JAX's 64-bit mode (jax_enable_x64) off, this one has it on"
            return said
    shown = saved[:-1] if isinstance(saved, list) else saved
    return f"the shapes of fn's output changed (saved {str(shown)[:100]}, now {str(now[:-1])[:100]})"


def _ends(values: list) -> str:
    """A list by its ends: ``[0.0, 0.5, ..., 4.5]`` (whole when it has at most 4 values)."""
    if len(values) <= 4:
        return repr(values)
    return f"[{values[0]!r}, {values[1]!r}, ..., {values[-1]!r}]"


def _meta_diff(saved: Any, now: Any, prefix: str = "") -> str:
    """The entries where two manifests' ``meta`` differ, as ``name: saved vs now``."""
    if not (isinstance(saved, dict) and isinstance(now, dict)):
        return f"{prefix or 'meta'}: {str(saved)[:80]} vs {str(now)[:80]}"
    parts = []
    for k in sorted(set(saved) | set(now), key=str):
        a, b = saved.get(k, "(absent)"), now.get(k, "(absent)")
        if a != b:
            name = f"{prefix}{k}" if prefix else str(k)
            parts.append(
                _meta_diff(a, b, name + ".") if isinstance(a, dict) and isinstance(b, dict) else f"{name}: {a} vs {b}"
            )
    return "; ".join(parts)[:400]


def _create_if_absent(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call created it.

    The file appears whole or not at all (written to a temporary file first), and of
    processes racing to create it exactly one succeeds: a hard link fails when the name
    exists. On a filesystem without hard links, a rename after a check (a narrow race)."""
    tmp = atomic_write(path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.new"), lambda f: f.write(data))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here
        if path.exists():
            return False
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _saved_chunk_size(
    out_path: Path, dims: tuple[str, ...], coords: Mapping[str, np.ndarray]
) -> tuple[int | None, int | None]:
    """The chunk size of the sweep saved in ``out_path`` and the ``chunk_size`` given then, if
    it has the same grid, else None (a missing or foreign manifest is then reported by
    `_check_manifest`)."""
    try:
        have = json.loads((out_path / "sweep.json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(have, dict) or have.get("dims") != list(dims):
        return None, None
    if have.get("coords") != {d: coords[d].tolist() for d in dims}:
        return None, None

    def size(key: str) -> int | None:
        value = have.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    return size("chunk_size"), size("chunk_size_asked")


def _fingerprint(fn: Any) -> str:
    """A digest of what ``fn`` computes, as far as it can be read: its code (with nested code
    objects and the names it uses), the values of its closure cells, default arguments and
    the globals it reads, recursively through the functions it calls, partials, the static
    fields of pytrees (a `Setup`'s ``student``, by its code), the public attributes of objects
    that hold settings (an ``argparse.Namespace``, a dataclass, an object of the user's own
    class; not ``_``-named ones, which hold caches, counters and handles that change from run
    to run; of one reached from a function only the attributes its code names), paths by
    their text, and the methods of the user's own classes; arrays count by content. Modules
    count by name, and so do the module-level functions and classes of attnflow, the standard
    library and installed packages that ``fn`` reaches (their code changes with their version;
    ``fn`` itself is always read), and their other objects (a logger) by class;
    ``os.environ`` by name, also through an alias (its content differs between the shards of
    one job). Stable across processes: no addresses, no salted hashes."""
    return _combined(_fingerprint_parts(fn))


def _combined(parts: Mapping[str, str]) -> str:
    """One digest of the parts of a fingerprint."""
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()[:32]


def _part(obj: Any, root: bool = False) -> str:
    h = hashlib.sha256()
    _digest(obj, h, depth=0, seen={}, root=root)
    return h.hexdigest()[:16]


def _fingerprint_parts(fn: Any) -> dict[str, str]:
    """`_fingerprint` by part, so that a refused resume can say what changed: of a function its
    code, each closure value and each global it reads by name, its default arguments; of a
    partial its function's parts and its arguments (of the partial a sweep with `Static` axes
    makes per static point, the user's function's parts and the static values); anything
    else as one part."""
    if isinstance(fn, functools.partial) and fn.func is _drop_placeholder:
        # a static point's function (`_static_sweep`): the parts of the user's fn, named as its own
        user_fn, point, placeholder = fn.args
        return {**_fingerprint_parts(user_fn), "its static values": _part((point, placeholder))}
    if isinstance(fn, functools.partial):
        parts = _fingerprint_parts(fn.func)
        parts.update({f"argument {i} of the partial": _part(a, root=True) for i, a in enumerate(fn.args)})
        parts.update({f"keyword {k!r} of the partial": _part(v, root=True) for k, v in sorted(fn.keywords.items())})
        return parts
    if not isinstance(fn, types.FunctionType):
        return {"the function": _part(fn, root=True)}
    h = hashlib.sha256()
    _digest_code(fn.__code__, h)
    parts = {"its code": h.hexdigest()[:16]}
    with _reading(fn):
        parts.update((label, _part(value)) for label, value in _function_reads(fn))
    return parts


@contextlib.contextmanager
def _reading(fn: types.FunctionType) -> Iterator[None]:
    """Inside: the names ``fn``'s code uses are `_READ_NAMES` (of the objects it reaches, the
    attributes it reads count)."""
    token = _READ_NAMES.set(frozenset(_global_names(fn.__code__)))
    try:
        yield
    finally:
        _READ_NAMES.reset(token)


def _function_reads(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """What ``fn`` reads besides its code, as ``(label, value)``: each closure value, its
    default arguments, each global its code names."""
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        yield f"closure value {name!r}", value
    yield "its default arguments", (fn.__defaults__, fn.__kwdefaults__)
    g = fn.__globals__
    for name in sorted(_global_names(code)):
        if name in g and not name.startswith("__"):
            yield f"global {name!r}", g[name]


_READ_NAMES: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("_READ_NAMES", default=None)
# the names the function being read uses: of an object it reaches (``args``), the attributes its
# code reads (``args.t1``) count, the others (``args.progress``, ``args.shard``) do not

_MAX_DEPTH = 10  # how deep the fingerprint follows values (a function's globals, an object's attributes, ...)


def _digest(obj: Any, h: Any, depth: int, seen: dict[Any, tuple[int, Any]], root: bool = False) -> None:
    """Feed ``obj`` into the hash ``h``. ``seen``: the functions, classes and objects already
    digested, by ``id``, each with its number (and kept alive, so that no id is reused);
    one met again (a cycle, or shared) counts by that number. ``root``: ``obj`` is the swept
    function (or holds it: a partial, its arguments), read by its code wherever it is defined."""
    if depth > _MAX_DEPTH:
        h.update(b"<deep>")
        return
    if id(obj) in seen and not isinstance(obj, type):  # a class: its settings are read per set of names below
        h.update(f"<ref {seen[id(obj)][0]}>".encode())
        return
    if isinstance(obj, (np.ndarray, jax.Array, np.generic)):
        if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
            obj = jax.random.key_data(obj)  # a typed key: its bits
        if isinstance(obj, (np.ndarray, jax.Array)) and obj.size > 1:
            seen[id(obj)] = (len(seen), obj)  # an array read by several functions is hashed once
        arr = np.asarray(obj)
        h.update(f"{arr.shape}{arr.dtype}".encode())
        if arr.dtype.hasobject:  # an array of objects holds addresses: its elements instead
            _digest(arr.ravel().tolist(), h, depth + 1, seen)
        else:
            h.update(np.ascontiguousarray(arr).tobytes())
        return
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
        return
    if isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for x in obj:
            _digest(x, h, depth + 1, seen, root)
        return
    if isinstance(obj, os._Environ):
        # os.environ (os.environb) reached through an alias (``ENV = os.environ``, or its method
        # ``G = os.environ.get``): by name, as through the module ``os``. Its content is not a
        # setting of ``fn``: it differs between the shards of one job (SLURM_ARRAY_TASK_ID)
        h.update(f"<os.{'environb' if obj is getattr(os, 'environb', None) else 'environ'}>".encode())
        return
    if isinstance(obj, Mapping):
        h.update(b"map")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _digest(obj[k], h, depth + 1, seen, root)
        return
    if isinstance(obj, (set, frozenset)):
        # in a fixed order: a set's own order follows the (salted) hashes of strings; each element
        # with its own copy of `seen`, so that no numbering follows that order either
        parts = []
        for x in obj:
            sub = hashlib.sha256()
            _digest(x, sub, depth + 1, dict(seen))
            parts.append(sub.hexdigest())
        h.update(f"set{len(parts)}{''.join(sorted(parts))}".encode())
        return
    if isinstance(obj, types.ModuleType):
        h.update(f"<module {obj.__name__}>".encode())
        read_names = _READ_NAMES.get()
        if read_names is not None and not _is_library(obj.__name__):
            # the user's own module (a config.py): the attributes the function's code names
            # (``cfg.T1``) are settings like an object's; a library's module counts by name.
            # Seen per set of names: another function reading another attribute reads it again
            module_key = (id(obj), read_names)
            if module_key in seen:
                h.update(f"<ref {seen[module_key][0]}>".encode())
                return
            seen[module_key] = (len(seen), obj)
            _digest(
                {k: v for k, v in vars(obj).items() if k in read_names and not k.startswith("__")},
                h,
                depth + 1,
                seen,
            )
        return
    if isinstance(obj, pathlib.PurePath):  # its text (a Path's slots hold caches and a salted hash)
        h.update(f"<path {os.fspath(obj)}>".encode())
        return
    if isinstance(obj, type):
        name = f"{obj.__module__}.{obj.__qualname__}"
        h.update(f"<class {name}>".encode())
        if _named_only(obj.__module__, obj.__qualname__):
            return
        if id(obj) in seen:
            h.update(f"<ref {seen[id(obj)][0]}>".encode())
        else:
            seen[id(obj)] = (len(seen), obj)
            for key, member in sorted(vars(obj).items()):  # the user's own class: the code of its methods
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    member = (member.fget, member.fset)
                if isinstance(member, (types.FunctionType, tuple)):
                    h.update(f"method {key}".encode())
                    _digest(member, h, depth + 1, seen)
        # and its settings (``class Cfg: t1 = 4.0``, read as ``Cfg.t1`` or as an instance's
        # default), its own and those of the user's classes it derives from; reached from a
        # function, the ones its code names, seen per set of names as a module's attributes are
        read_names = _READ_NAMES.get()
        settings_key = ("class settings", id(obj), read_names)
        if settings_key in seen:
            h.update(f"<ref {seen[settings_key][0]}>".encode())
            return
        seen[settings_key] = (len(seen), obj)
        names = None if read_names is None else read_names | _method_names(obj)
        settings: dict[str, Any] = {}
        for base in reversed(obj.__mro__):
            if not _named_only(base.__module__, base.__qualname__):
                settings.update(
                    (k, v)
                    for k, v in vars(base).items()
                    if not k.startswith("_")
                    and (names is None or k in names)
                    and not isinstance(v, (types.FunctionType, staticmethod, classmethod, property))
                )
        if settings:
            h.update(b"settings")
            _digest(settings, h, depth + 1, seen)
        return
    if isinstance(obj, types.FunctionType):
        if not root and _named_only(obj.__module__, obj.__qualname__):
            h.update(f"<function {obj.__module__}.{obj.__qualname__}>".encode())
            return
        seen[id(obj)] = (len(seen), obj)
        h.update(b"<function>")
        _digest_code(obj.__code__, h)
        with _reading(obj):
            for what, value in _function_reads(obj):
                h.update(what.encode())
                _digest(value, h, depth + 1, seen)
        return
    if isinstance(obj, functools.partial):
        _digest((obj.func, obj.args, obj.keywords), h, depth + 1, seen, root)
        return
    if isinstance(obj, types.MethodType):
        _digest((obj.__func__, obj.__self__), h, depth + 1, seen, root)
        return
    if isinstance(obj, (types.BuiltinFunctionType, np.ufunc)):  # compiled code: by name
        label = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")
        h.update(f"<builtin {getattr(obj, '__module__', None)}.{label}>".encode())
        return
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    if not (treedef.num_leaves == 1 and leaves[0] is obj):  # type: ignore[attr-defined]
        # a pytree (an Equinox module, a Setup): its nodes with their static data, and its leaves
        _digest_treedef(treedef, h, depth + 1, seen)
        for leaf in leaves:
            _digest(leaf, h, depth + 1, seen)
        return
    cls = type(obj)
    if isinstance(obj, enum.Enum):  # a member: by its class and name (its attributes are private)
        h.update(f"<enum {cls.__module__}.{cls.__qualname__}.{obj.name}>".encode())
        _digest(obj.value, h, depth + 1, seen)
        return
    holder = (
        isinstance(obj, (argparse.Namespace, types.SimpleNamespace))
        or dataclasses.is_dataclass(obj)
        or not _named_only(cls.__module__, cls.__qualname__)
    )
    read_names = _READ_NAMES.get()  # reached from a function: only the attributes its code names
    # a holder of settings is seen per set of names read (another function reading another
    # attribute of it reads it again); any other object once
    seen_key: Any = (id(obj), read_names) if holder else id(obj)
    if seen_key in seen:
        h.update(f"<ref {seen[seen_key][0]}>".encode())
        return
    seen[seen_key] = (len(seen), obj)
    try:
        wrapped = getattr(obj, "__wrapped__", None) if callable(obj) else None
    except Exception:  # an object whose attribute lookup fails: read as an opaque object
        wrapped = None
    if callable(wrapped):  # a jax.jit or functools.wraps wrapper: the function it wraps
        h.update(f"<{type(obj).__module__}.{type(obj).__qualname__} of>".encode())
        _digest(wrapped, h, depth + 1, seen, root)
        return
    # another object: its class, and the public attributes of a holder of settings (an
    # argparse.Namespace, a dataclass, an object of the user's own class). A library's other
    # objects (a logger, a file) count by class: their state changes by itself
    _digest(type(obj), h, depth + 1, seen)
    attrs = _attributes(obj) if holder else None
    if attrs:
        # of an object of the user's class, what its methods read (``self.t1`` in ``run``) too
        names = None if read_names is None else read_names | _method_names(cls)
        _digest(
            {k: v for k, v in attrs.items() if not k.startswith("_") and (names is None or k in names)},
            h,
            depth + 1,
            seen,
        )


def _named_only(module: str | None, qualname: str) -> bool:
    """True for a module-level function or class of a library, which a fingerprint names
    instead of reading; a nested one (``<locals>``, a ``<lambda>``) holds values of its own."""
    return "<" not in qualname and _is_library(module or "")


@functools.lru_cache(maxsize=512)
def _is_library(module: str) -> bool:
    """True for a module of attnflow, of the standard library or of an installed package (in
    site-packages); False for the user's own code (``__main__``, a script's modules)."""
    if module == "__main__":  # a script, even one of an installed package run with python -m
        return False
    top = module.partition(".")[0]
    if top in ("attnflow", "builtins"):
        return True
    file = getattr(sys.modules.get(module), "__file__", None)
    if not isinstance(file, str):  # a built-in module, or one not imported: by its name
        return top in sys.stdlib_module_names
    # by where it lives: the user's own module named like a standard one (test.py) is the user's
    path = os.path.realpath(file)
    return any(path.startswith(root + os.sep) for root in _library_roots())


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """The folders that installed packages and the standard library live in."""
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths]
    with contextlib.suppress(AttributeError):  # site's functions are absent in some embedded interpreters
        roots += [*site.getsitepackages(), site.getusersitepackages()]
    return tuple(sorted({os.path.realpath(r) for r in roots if r}))


def _attributes(obj: Any) -> dict[str, Any] | None:
    """The attributes an object holds: a dataclass's fields, its ``__dict__``, or the values
    of its ``__slots__``; None when none can be read."""
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
    try:
        held = vars(obj)
    except TypeError:
        held = None
    if isinstance(held, dict) and held:
        return dict(held)
    slots: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        names = getattr(cls, "__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name not in ("__dict__", "__weakref__") and name not in slots:
                with contextlib.suppress(AttributeError):  # an unset slot
                    slots[name] = getattr(obj, name)
    return slots or None


def _digest_treedef(treedef: Any, h: Any, depth: int, seen: dict[Any, tuple[int, Any]]) -> None:
    """A pytree's structure: each node's class and static data, read as values (so a static
    function field counts by its code; the structure's ``str`` shows it by address only)."""
    data = treedef.node_data()
    if data is None:  # a leaf
        h.update(b"*")
        return
    kind, aux = data
    h.update(f"<node {treedef.num_nodes}>".encode())
    _digest(kind, h, depth, seen)  # the user's own class (an Equinox model) by its methods' code too
    _digest(aux, h, depth, seen)
    for child in treedef.children():
        _digest_treedef(child, h, depth, seen)


def _method_names(cls: type) -> frozenset[str]:
    """The names the methods of ``cls`` and of the user's classes it derives from use (the
    attributes they may read from ``self``); none for a library's class."""
    names: set[str] = set()
    for base in cls.__mro__:
        if _named_only(base.__module__, base.__qualname__):
            continue
        for member in vars(base).values():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                names |= _global_names(member.__code__)
    return frozenset(names)


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` (and the code nested in it) may read as globals."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _digest_code(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        _digest_const(c, h)


def _digest_const(c: Any, h: Any) -> None:
    """A constant of compiled code: nested code, tuples and frozensets (of ``x in {...}``, in
    a fixed order) element by element, anything else by its repr."""
    if isinstance(c, types.CodeType):
        _digest_code(c, h)
    elif isinstance(c, tuple):
        h.update(f"tuple{len(c)}".encode())
        for x in c:
            _digest_const(x, h)
    elif isinstance(c, frozenset):
        h.update(f"frozenset{sorted(repr(x) for x in c)}".encode())
    else:
        h.update(f"{type(c).__name__}:{c!r}".encode())


def _load_chunk(path: Path, leaves_struct, chunk_size: int) -> list[np.ndarray] | None:
    if not path.exists():
        return None
    try:
        with np.load(path) as data:
            leaves = [data[f"arr_{j}"] for j in range(len(leaves_struct))]
    except Exception:  # a corrupt file is recomputed, never trusted
        return None
    for leaf, s in zip(leaves, leaves_struct):
        if leaf.shape != (chunk_size, *s.shape[1:]):
            return None
    return leaves
