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
sweep: the manifest holds a fingerprint of ``fn`` (its code, closure values and default
arguments) and its output structure, and a rerun with another function refuses, saying
what changed.

A grid point whose run fails inside the compiled call (an ODE that used up ``max_steps`` or
diverged, an SGD run that diverged) does not stop the sweep: its values are NaN, and
`SweepResult.status` and `SweepResult.failures` say which points failed and why
(``on_error="raise"`` raises instead, naming the first failing point).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._errors import collecting, status_code
from ._io import atomic_write
from ._jit import cpu_compiler_options

__all__ = ["sweep", "SweepResult", "SweepError", "use_cpu_cores"]


class SweepError(RuntimeError):
    """Grid points of a sweep failed (raised with ``on_error="raise"``); the message names them."""


class SweepResult:
    """Values on a labelled grid.

    ``dims``: axis names in order; ``coords[name]``: the axis values; ``values``: the
    pytree returned by ``fn`` with every leaf of shape ``grid_shape + leaf_shape``;
    ``status``: an integer array of shape ``grid_shape``, 0 where the point ran, else
    ``1 +`` the index of its failure in ``messages`` (the point's values are then NaN).
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
        """Boolean array of shape ``grid_shape``: True where the point ran without failure."""
        return self.status == 0

    def failures(self) -> list[tuple[dict[str, Any], str]]:
        """``[(coordinates, message)]`` of the failed points, in grid order."""
        out = []
        for idx in zip(*np.nonzero(self.status), strict=True):
            point = {d: self.coords[d][i].item() for d, i in zip(self.dims, idx, strict=True)}
            code = int(self.status[idx])
            out.append((point, self.messages[code - 1] if 0 < code <= len(self.messages) else f"failure {code}"))
        return out

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def index(self, **point: Any) -> tuple[int, ...]:
        """Grid index of the point whose coordinates are closest to ``point`` (per named axis)."""
        idx: list[Any] = []
        for d in self.dims:
            if d in point:
                c = self.coords[d]
                i = (
                    int(np.argmin(np.abs(c - np.asarray(point[d]))))
                    if c.dtype.kind in "fiu"
                    else int(np.flatnonzero(c == point[d])[0])
                )
                idx.append(i)
            else:
                idx.append(slice(None))
        unknown = set(point) - set(self.dims)
        if unknown:
            raise ValueError(f"unknown sweep axis {sorted(unknown)}; axes are {self.dims}")
        return tuple(idx)

    def sel(self, **point: Any) -> Any:
        """The values at (the nearest) given coordinates; unnamed axes are kept."""
        idx = self.index(**point)
        return jax.tree_util.tree_map(lambda x: x[idx], self.values)

    def __repr__(self) -> str:
        return f"SweepResult(dims={self.dims}, shape={self.shape})"

    def to_xarray(self):
        """An ``xarray.Dataset`` on the grid dimensions ``dims`` with their ``coords``: one
        variable per leaf of ``values`` (named by its path: ``"loss"``, ``"[0]"``, ``"ts"``
        for a `Trajectory`'s times, ...), extra axes named ``<variable>_dim<i>``; ``meta`` in
        ``attrs``. A `Trajectory` leaf keeps its time axis as ``t`` when its save times are
        the same at every grid point.

        Needs the optional dependency xarray (``pip install "attnflow[xarray]"``).
        """
        from ._io import optional_import
        from .trajectory import Trajectory

        xr = optional_import("xarray", "SweepResult.to_xarray")
        data: dict[str, Any] = {}
        coords: dict[str, Any] = {d: self.coords[d] for d in self.dims}
        grid = len(self.dims)

        def add(name, arr, extra_dims=()):
            arr = np.asarray(arr)
            n_extra = arr.ndim - grid - len(extra_dims)
            dims = self.dims + tuple(extra_dims) + tuple(f"{name}_dim{j}" for j in range(n_extra))
            data[name] = (dims, arr)

        def visit(prefix, value):
            if isinstance(value, Trajectory):
                ts = np.asarray(value.ts)
                flat = ts.reshape(-1, ts.shape[-1])
                if bool(np.all(flat == flat[0])):
                    coords[f"{prefix}t" if prefix else "t"] = flat[0]
                    tdim = (f"{prefix}t" if prefix else "t",)
                else:
                    add(f"{prefix}ts", ts)
                    tdim = (f"{prefix}ts_dim0",)
                for k, v in value.ys.items():
                    add(f"{prefix}{k}", v, tdim)
                if value.t_event is not None:
                    add(f"{prefix}t_event", value.t_event)
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
        return xr.Dataset(data, coords=coords, attrs={"meta": json.dumps(self.meta, default=str)})


def use_cpu_cores(n: int | None = None) -> int:
    """Expose ``n`` CPU devices to JAX (default: the cores this process may run on), so that
    `sweep` shards its grid points over the cores, one device per core.

    JAX shows a CPU as one device, and XLA then spreads each operation over the cores
    (intra-op threads), with a synchronisation per operation; small operations, as in
    online SGD, leave cores idle. One device per core runs independent grid points side
    by side: 1.6x at D = 1024 and at D = 4096 for the 8-seed heads SGD on 2 cores,
    medians of `benchmarks/heads_sgd.py` runs. Sets ``jax_num_cpu_devices``, which JAX
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


def _grid(axes: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, np.ndarray], dict[str, np.ndarray]]:
    if not axes:
        raise ValueError("sweep needs at least one axis")
    dims = tuple(axes)
    coords = {}
    for d in dims:
        c = np.asarray(axes[d])
        if c.ndim == 0:
            c = c[None]
        if c.ndim != 1 or c.size == 0:
            raise ValueError(f"sweep axis {d!r} must be a non-empty 1-D array, got shape {c.shape}")
        if c.dtype.kind == "f" and not np.all(np.isfinite(c)):
            raise ValueError(f"sweep axis {d!r} has non-finite values: {c[~np.isfinite(c)]}")
        coords[d] = c
    mesh = np.meshgrid(*(coords[d] for d in dims), indexing="ij")
    flat = {d: m.reshape(-1) for d, m in zip(dims, mesh)}
    return dims, coords, flat


_CACHE: dict[tuple[Any, ...], Any] = {}  # compiled function per (fn, devices, layout)
_STRUCT: dict[tuple[Any, ...], Any] = {}  # output structure per compiled function and input shapes
_NO_SHARD_MAP: dict[tuple[Any, ...], bool] = {}  # layouts whose fn did not trace under shard_map


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
    fn: Callable[..., Any], devices: tuple, dims: tuple, nested_dims: tuple | None = None, local: bool = False
) -> Any:
    """One jitted, sharded, vmapped ``fn`` per (fn, devices, layout), reused across calls.

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
    """

    def make():
        sharding, inputs = _shardings(devices, dims, nested_dims is not None)
        messages: list[str] = []

        def fn_status(**p):
            # each point's failures (attnflow's fail_if) become a status code instead of an error
            with collecting() as sink:
                out = fn(**p)
            messages[:] = [m for _, m in sink]
            return out, status_code(sink)

        if nested_dims is None:

            def batched(point):
                return jax.vmap(lambda p: fn_status(**p))(point)
        else:

            def batched(point):
                def over(i, fixed):
                    if i == len(nested_dims):
                        return fn_status(**fixed)
                    d = nested_dims[i]
                    return jax.vmap(lambda x: over(i + 1, {**fixed, d: x}))(point[d])

                n_inner = math.prod(point[d].shape[0] for d in nested_dims[1:])
                out = over(0, {})
                return jax.tree_util.tree_map(
                    lambda x: x.reshape((x.shape[0] * n_inner,) + x.shape[len(nested_dims) :]), out
                )

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

    return _memo(_CACHE, (fn, devices, dims, nested_dims, local), make)


def _out_struct(compiled: Any, example: dict) -> Any:
    """``compiled.eval_shape(example)``, cached per compiled function and input shapes."""
    return _memo(
        _STRUCT,
        (compiled, tuple((d, e.shape, e.dtype) for d, e in example.items())),
        lambda: compiled.eval_shape(example),
    )


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
) -> SweepResult:
    """Evaluate ``fn(**point)`` on the cartesian grid of ``axes``.

    Parameters
    ----------
    fn:
        Function of the axis names (keyword arguments, each a scalar array) returning a
        pytree of arrays. It is traced once per chunk shape: keep everything that varies
        an argument.
    axes:
        ``{name: 1-D values}``; the grid is their cartesian product in this order.
    chunk_size:
        Points per compiled call (default: all points up to 4096), rounded up to a
        multiple of the device count (nested: to whole rows of the first axis, a multiple
        of the device count of them). Bounds memory for large grids.
    out_dir:
        If given, each finished chunk is saved there (``chunk_00000.npz``) with a
        ``sweep.json`` manifest; rerunning the same sweep loads finished chunks.
    devices:
        Devices to shard the point axis over (default: all, ``jax.devices()``).
    progress:
        tqdm progress bar over chunks.
    on_chunk:
        ``on_chunk(i, n_chunks)`` called after chunk ``i`` is computed (and saved).
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
    """
    if on_error not in ("nan", "raise"):
        raise ValueError(f"on_error must be 'nan' or 'raise', got {on_error!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable (the function of the axis names), got {fn!r}")
    dims, coords, flat = _grid(axes)
    n = len(next(iter(flat.values())))
    devices = list(devices) if devices is not None else jax.devices()
    n_dev = len(devices)
    if chunk_size is None:
        chunk_size = min(n, 4096)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r:.60}")
    chunk_size = min(int(chunk_size), n)  # a chunk never holds more than the grid
    if nest not in (None, True, False):
        raise ValueError(f"nest must be True, False or None, got {nest!r}")
    n_inner = n // len(coords[dims[0]])  # points in one row of the first axis
    if nest is None:
        nest = len(dims) >= 2 and chunk_size >= n_inner
    if nest:
        rows = max(1, chunk_size // n_inner)
        rows = int(math.ceil(rows / n_dev) * n_dev)
        chunk_size = rows * n_inner
    else:
        chunk_size = int(math.ceil(chunk_size / n_dev) * n_dev)
    n_chunks = int(math.ceil(n / chunk_size))

    # more than one device: shard_map (no cross-device step), unless fn does not trace under
    # it (equinox's closure conversion, used by Diffrax's event root find, compares
    # shardings that shard_map changes); one device needs no shard_map
    layout = (fn, tuple(devices), dims, dims if nest else None)
    local = n_dev > 1 and layout not in _NO_SHARD_MAP
    compiled, messages = _compiled(*layout, local)

    def chunk_points(i):
        if nest:
            # a block of rows of the first axis (the last block padded by repetition) and the
            # other axes whole
            first = coords[dims[0]]
            lo = i * rows
            idx = np.minimum(np.arange(lo, lo + rows), len(first) - 1)
            return {d: (first[idx] if j == 0 else coords[d]) for j, d in enumerate(dims)}
        lo = i * chunk_size
        idx = np.minimum(np.arange(lo, lo + chunk_size), n - 1)  # pad the last chunk by repetition
        return {d: flat[d][idx] for d in dims}

    example = {
        d: jax.ShapeDtypeStruct(v.shape, jax.dtypes.canonicalize_dtype(v.dtype)) for d, v in chunk_points(0).items()
    }
    try:
        out_struct = _out_struct(compiled, example)
    except Exception as err:
        if not local:
            raise
        compiled, messages = _compiled(*layout, False)
        out_struct = _out_struct(compiled, example)  # fn's own errors surface here
        local = False
        _memo(_NO_SHARD_MAP, layout, lambda: True)  # warned once; later sweeps of this fn go straight to jit sharding
        first = (str(err).strip().splitlines() or [""])[0][:160]
        warnings.warn(
            f"sweep: fn does not trace under shard_map ({type(err).__name__}: {first}); using jit "
            "sharding instead, under which a vmapped adaptive solve synchronises the devices at every step",
            RuntimeWarning,
            stacklevel=2,
        )
    leaves_struct, treedef = jax.tree_util.tree_flatten(out_struct)

    out_path = Path(out_dir) if out_dir is not None else None
    if out_path is not None:
        _check_manifest(out_path, dims, coords, chunk_size, treedef, leaves_struct, meta, _fingerprint(fn))

    results: list[list[np.ndarray] | None] = [None] * n_chunks
    if out_path is not None:
        for i in range(n_chunks):
            results[i] = _load_chunk(out_path / f"chunk_{i:05d}.npz", leaves_struct)
    todo = [i for i in range(n_chunks) if results[i] is None]

    devices_used = 0
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_chunks, initial=n_chunks - len(todo), desc="sweep", unit="chunk")
    try:
        for i in todo:
            # host arrays go straight into the jitted call, which places them by its
            # in_shardings (about 15 us; a device_put first costs about 100 us)
            out = compiled(chunk_points(i))
            out_leaves = jax.tree_util.tree_leaves(out)
            if out_leaves:
                devices_used = max(devices_used, len(out_leaves[0].sharding.device_set))
            leaves = [np.asarray(x) for x in out_leaves]
            results[i] = leaves
            if out_path is not None:
                atomic_write(out_path / f"chunk_{i:05d}.npz", functools.partial(_save_leaves, leaves=leaves))
            if bar is not None:
                bar.update(1)
            if on_chunk is not None:
                on_chunk(i, n_chunks)
    finally:
        if bar is not None:
            bar.close()

    grid_shape = tuple(len(coords[d]) for d in dims)
    gathered: list[Any] = []
    for j in range(len(leaves_struct)):
        done = [r for r in results if r is not None]
        full = (done[0][j] if n_chunks == 1 else np.concatenate([r[j] for r in done]))[:n]
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
        "computed_chunks": len(todo),
        **dict(meta or {}),
    }
    result = SweepResult(dims, coords, values, info, status=np.asarray(status), messages=list(messages))
    failed = result.failures()
    if failed:
        shown = "; ".join(f"{', '.join(f'{k}={v!r}' for k, v in p.items())}: {m}" for p, m in failed[:3])
        more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        text = f"sweep: {len(failed)} of {n} grid points failed: {shown}{more}"
        if on_error == "raise":
            raise SweepError(text)
        warnings.warn(
            text + "; their values are NaN (SweepResult.status, SweepResult.failures())", RuntimeWarning, stacklevel=2
        )
    return result


def _save_leaves(f: Any, leaves: list[np.ndarray]) -> None:
    np.savez(f, *leaves)


def _manifest(dims, coords, chunk_size, treedef, leaves_struct, meta, fingerprint):
    return {
        "dims": list(dims),
        "coords": {d: coords[d].tolist() for d in dims},
        "chunk_size": int(chunk_size),
        "structure": str(treedef),
        "leaves": [[list(s.shape[1:]), str(s.dtype)] for s in leaves_struct],
        "meta": json.loads(json.dumps(dict(meta or {}), default=str)),
        "fn": fingerprint,
    }


_WHAT = {
    "dims": "the axis names",
    "coords": "the axis values",
    "chunk_size": "the chunk size",
    "structure": "the structure of fn's output",
    "leaves": "the shapes of fn's output",
    "meta": "meta",
    "fn": "the function (its code, closure values or default arguments)",
}


def _check_manifest(out_path: Path, dims, coords, chunk_size, treedef, leaves_struct, meta, fingerprint) -> None:
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"out_dir {str(out_path)!r} is a file, not a folder")
    out_path.mkdir(parents=True, exist_ok=True)
    want = _manifest(dims, coords, chunk_size, treedef, leaves_struct, meta, fingerprint)
    mf = out_path / "sweep.json"
    if mf.exists():
        try:
            have = json.loads(mf.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(
                f"{mf} is not a sweep manifest (invalid JSON: {err}); use a fresh out_dir or delete it"
            ) from None
        if not isinstance(have, dict):
            raise ValueError(f"{mf} is not a sweep manifest; use a fresh out_dir or delete it")
        for key in ("fn", "structure", "leaves", "dims", "coords", "chunk_size", "meta"):
            if have.get(key) != want[key]:
                raise ValueError(
                    f"{out_path} holds a different sweep: {_WHAT[key]} changed (saved {str(have.get(key))[:100]!r}, "
                    f"now {str(want[key])[:100]!r}); its chunks are not reused. "
                    "Use a fresh out_dir or delete the old one"
                )
    else:
        atomic_write(mf, lambda f: f.write(json.dumps(want, indent=1).encode()))


def _fingerprint(fn: Any) -> str:
    """A digest of what ``fn`` computes, as far as it can be read: its code (with nested code
    objects and the names it uses), the values of its closure cells and default arguments
    (arrays by content), recursively through functions it closes over and partials. Globals
    it reads are part of it by name only."""
    h = hashlib.sha256()
    _digest(fn, h, depth=0, seen=set())
    return h.hexdigest()[:32]


def _digest(obj: Any, h: Any, depth: int, seen: set) -> None:
    if depth > 8 or id(obj) in seen:
        h.update(b"<cycle>")
        return
    if isinstance(obj, types.FunctionType):
        seen = seen | {id(obj)}
        _digest_code(obj.__code__, h)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                value = None
            _digest(value, h, depth + 1, seen)
        _digest(obj.__defaults__, h, depth + 1, seen)
        _digest(obj.__kwdefaults__, h, depth + 1, seen)
        return
    if isinstance(obj, functools.partial):
        _digest((obj.func, obj.args, obj.keywords), h, depth + 1, seen)
        return
    if isinstance(obj, types.MethodType):
        _digest((obj.__func__, obj.__self__), h, depth + 1, seen)
        return
    if isinstance(obj, (np.ndarray, jax.Array, np.generic)):
        arr = np.asarray(obj)
        h.update(f"{arr.shape}{arr.dtype}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
        return
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        h.update(repr(obj).encode())
        return
    if isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for x in obj:
            _digest(x, h, depth + 1, seen)
        return
    if isinstance(obj, Mapping):
        h.update(b"map")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _digest(obj[k], h, depth + 1, seen)
        return
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    if treedef.num_leaves == 1 and leaves[0] is obj:  # type: ignore[attr-defined]  # an opaque object: its type only
        h.update(f"<{type(obj).__module__}.{type(obj).__qualname__}>".encode())
        return
    # a pytree (an Equinox module, a Setup): structure, static fields (without memory addresses), leaves
    h.update(re.sub(r"0x[0-9a-fA-F]+", "", str(treedef)).encode())
    for leaf in leaves:
        _digest(leaf, h, depth + 1, seen)


def _digest_code(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _digest_code(c, h)
        else:
            h.update(repr(c).encode())


def _load_chunk(path: Path, leaves_struct) -> list[np.ndarray] | None:
    if not path.exists():
        return None
    try:
        with np.load(path) as data:
            leaves = [data[f"arr_{j}"] for j in range(len(leaves_struct))]
    except Exception:  # a corrupt file is recomputed, never trusted
        return None
    for leaf, s in zip(leaves, leaves_struct):
        if leaf.shape[1:] != s.shape[1:]:
            return None
    return leaves
