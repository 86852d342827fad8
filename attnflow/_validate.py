"""Validation helpers used at the public edges of the package.

Every public constructor and entry point checks its inputs here and raises
``ValueError`` with the offending value, so that bad input never reaches a trace.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def any_traced(tree: Any) -> bool:
    """True if any leaf of ``tree`` is a JAX tracer (we are inside jit/vmap/grad)."""
    return any(_is_traced(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def show(value: Any) -> str:
    """A value for an error message: numbers as numbers, small arrays as lists."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything unprintable as an array is shown by repr
        return repr(value)
    if arr.dtype.kind in "biuf" and arr.size <= 16:
        return repr(arr.item()) if arr.ndim == 0 else repr(arr.tolist())
    return repr(value)


def positive(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless every entry of ``value`` is finite and > 0.

    Traced values cannot be inspected and are let through (they are checked at the
    edge where they were created).
    """
    if _is_traced(value):
        return
    arr = np.asarray(value, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise ValueError(f"{name} must be finite and positive, got {show(value)}")


def nonnegative(name: str, value: Any) -> None:
    if _is_traced(value):
        return
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)) or not np.all(arr >= 0):
        raise ValueError(f"{name} must be finite and non-negative, got {show(value)}")


def finite_tree(name: str, tree: Any) -> None:
    """Raise ``ValueError`` if a concrete leaf of ``tree`` holds NaN or Inf."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        if _is_traced(leaf):
            continue
        arr = np.asarray(leaf)
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            where = jax.tree_util.keystr(path) or "(root)"
            bad = np.argwhere(~np.isfinite(arr))
            first = tuple(int(i) for i in bad[0]) if bad.size else ()
            raise ValueError(
                f"{name}{where} must be finite; entry {first} is {arr[first] if first else arr!r}"
            )


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, allowed))}")
    return value


def finite_scalar(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def prng_key(key: Any) -> Any:
    """A PRNG key from an integer seed (possibly traced, for vmap over seeds) or a key (returned as is)."""
    import jax.numpy as jnp

    if np.ndim(key) == 0 and not jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        return jax.random.PRNGKey(key)
    return key


def available_memory() -> int:
    """Bytes of physical memory available to this process (total if the available figure is
    unknown; 2**62 where neither can be read)."""
    import os

    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**62


def fits_in_memory(what: str, n_bytes: float, fraction: float = 0.5) -> None:
    """Raise ``ValueError`` before computing when ``what`` would need more than ``fraction`` of
    the available memory (an estimate: ``n_bytes``)."""
    avail = available_memory()
    if n_bytes > fraction * avail:
        raise ValueError(f"{what} needs about {n_bytes / 2**30:.3g} GiB, more than {fraction:.0%} of the "
                         f"{avail / 2**30:.3g} GiB available; reduce the sizes")
