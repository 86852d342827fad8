"""`Trajectory`: named observables over time, the one result type of attnflow.

Theory (`integrate`) and simulation (`simulate`) both return a `Trajectory`, so an
overlay or a test is always the same comparison: two sets of named arrays on a clock.

Layout: ``ts`` has shape ``(..., T)`` and every observable ``ys[name]`` has shape
``(..., T, *feature)``; the leading ``...`` are batch axes added by ``vmap`` or `sweep`.
``meta`` is a JSON-serialisable dict (config, seed, versions) carried as static data.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Trajectory", "compare", "versions"]


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
    return json.dumps(dict(meta or {}), sort_keys=True, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, jax.Array)):
        return np.asarray(obj).tolist()
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


@jax.tree_util.register_pytree_node_class
class Trajectory:
    """Times plus a dict of named arrays plus metadata.

    Parameters
    ----------
    ts:
        Save times, shape ``(..., T)``.
    ys:
        Mapping from observable name to array of shape ``(..., T, *feature)``.
    meta:
        JSON-serialisable metadata (config, seed, ...).
    """

    __slots__ = ("ts", "ys", "_meta")

    def __init__(self, ts: Any, ys: Mapping[str, Any], meta: Mapping[str, Any] | None = None):
        if not isinstance(ys, Mapping):
            raise ValueError(f"ys must be a mapping name -> array, got {type(ys).__name__}")
        for k in ys:
            if not isinstance(k, str):
                raise ValueError(f"observable names must be strings, got {k!r}")
        ts = jnp.asarray(ts)
        if ts.ndim < 1:
            raise ValueError(f"ts must have a time axis, got shape {ts.shape}")
        T = ts.shape[-1]
        ys = {k: jnp.asarray(v) for k, v in ys.items()}
        for k, v in ys.items():
            if v.ndim < ts.ndim or v.shape[: ts.ndim] != ts.shape:
                raise ValueError(
                    f"observable {k!r} has shape {v.shape}; its leading axes must match "
                    f"ts.shape {ts.shape} (time axis of length {T})"
                )
        self.ts = ts
        self.ys = ys
        self._meta = _freeze_meta(meta)

    # --- pytree protocol -------------------------------------------------------------
    def tree_flatten(self):
        names = tuple(sorted(self.ys))
        return (self.ts, tuple(self.ys[n] for n in names)), (names, self._meta)

    @classmethod
    def tree_unflatten(cls, aux, children):
        names, meta = aux
        obj = object.__new__(cls)
        obj.ts = children[0]
        obj.ys = dict(zip(names, children[1]))
        obj._meta = meta
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

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.ys.items())
        return f"Trajectory(ts{tuple(self.ts.shape)}, {fields})"

    def select(self, *names: str) -> Trajectory:
        """A trajectory with only the given observables."""
        return Trajectory(self.ts, {n: self[n] for n in names}, self.meta)

    def with_meta(self, **meta: Any) -> Trajectory:
        return Trajectory(self.ts, self.ys, {**self.meta, **meta})

    def with_ys(self, **ys: Any) -> Trajectory:
        """A trajectory with extra (or replaced) observables on the same clock."""
        return Trajectory(self.ts, {**self.ys, **ys}, self.meta)

    def batch(self, index: Any) -> Trajectory:
        """Index the leading batch axes (e.g. one seed or one learning rate of a sweep)."""
        if not self.batch_shape:
            raise ValueError("this trajectory has no batch axes to index")
        ts = self.ts[index]
        ys = {k: v[index] for k, v in self.ys.items()}
        return Trajectory(ts, ys, self.meta)

    def final(self) -> dict[str, jax.Array]:
        """The last saved value of every observable (for event-terminated runs: the event state)."""
        return {k: jnp.take(v, -1, axis=self.ts.ndim - 1) for k, v in self.ys.items()}

    def map(self, fn, *names: str) -> dict[str, jax.Array]:
        """Apply ``fn`` to each named observable."""
        return {n: fn(self[n]) for n in (names or self.names)}

    # --- interpolation -------------------------------------------------------------
    def at(self, t: Any, names: Iterable[str] | None = None, log_time: bool = False) -> dict[str, jax.Array]:
        """Linearly interpolate observables at times ``t`` (1-D), per batch element.

        ``log_time=True`` interpolates in ``log t`` (better on log-spaced saves);
        times must then be positive. Outside the saved range the end values are held.
        """
        t = jnp.atleast_1d(jnp.asarray(t, dtype=self.ts.dtype))
        names = tuple(names) if names is not None else self.names

        def interp1(ts, y):
            x, xp = (jnp.log(t), jnp.log(ts)) if log_time else (t, ts)
            flat = y.reshape(y.shape[0], -1)
            out = jax.vmap(lambda col: jnp.interp(x, xp, col), in_axes=1, out_axes=1)(flat)
            return out.reshape((t.shape[0],) + y.shape[1:])

        fn = interp1
        for _ in range(self.ts.ndim - 1):
            fn = jax.vmap(fn)
        return {n: fn(self.ts, self[n]) for n in names}

    def resample(self, t: Any, log_time: bool = False) -> Trajectory:
        """This trajectory interpolated onto the 1-D time grid ``t``."""
        t = jnp.asarray(t, dtype=self.ts.dtype)
        ts = jnp.broadcast_to(t, self.batch_shape + t.shape)
        return Trajectory(ts, self.at(t, log_time=log_time), self.meta)

    # --- files -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (``.npz``: arrays) and ``path.json`` (metadata), atomically.

        Each file is written to a temporary name in the same folder and renamed, so an
        interrupted save never leaves a half-written result.
        """
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz") if path.suffix else path.with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"__ts__": np.asarray(self.ts)}
        for k, v in self.ys.items():
            arrays[f"y:{k}"] = np.asarray(v)
        meta = {"attnflow_trajectory": 1, "names": list(self.ys), "meta": self.meta, "versions": versions()}
        _atomic_write(path, lambda f: np.savez(f, **arrays))
        _atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(meta, indent=2, default=_json_default).encode()))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trajectory:
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        if not path.exists():
            raise FileNotFoundError(f"no saved trajectory at {path}")
        with np.load(path) as data:
            ts = data["__ts__"]
            ys = {k[2:]: data[k] for k in data.files if k.startswith("y:")}
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text())["meta"] if meta_path.exists() else {}
        return cls(ts, ys, meta)


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compare(
    reference: Trajectory,
    other: Trajectory,
    names: Iterable[str] | None = None,
    log_time: bool = False,
    relative: bool = False,
    floor: float = 1e-12,
) -> dict[str, float]:
    """Maximum discrepancy between two trajectories, observable by observable.

    ``reference`` (usually theory) is interpolated at ``other``'s save times, so a
    theory curve can be compared with simulation snapshots taken on another grid.
    With ``relative=True`` the error is ``|a - b| / max(|a|, floor)``.
    Returns ``{name: max error}`` (over time, batch and feature axes).
    """
    names = tuple(names) if names is not None else tuple(n for n in other.names if n in reference)
    if not names:
        raise ValueError(f"no common observables: {sorted(reference.names)} vs {sorted(other.names)}")
    out = {}
    for n in names:
        if other.ts.ndim != 1:
            raise ValueError("compare needs an unbatched `other`; index it with .batch(i) first")
        a = reference.at(other.ts, [n], log_time=log_time)[n]
        b = other[n]
        err = jnp.abs(a - b)
        if relative:
            err = err / jnp.maximum(jnp.abs(a), floor)
        out[n] = float(jnp.max(err))
    return out
