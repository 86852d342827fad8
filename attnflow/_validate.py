"""Validation helpers used at the public edges of the package.

Every public constructor and entry point checks its inputs here and raises
``ValueError`` with the offending value, so that bad input never reaches a trace.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import check_traced


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def any_traced(tree: Any) -> bool:
    """True if any leaf of ``tree`` is a JAX tracer (we are inside jit/vmap/grad)."""
    return any(_is_traced(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def show(value: Any) -> str:
    """A value for an error message: numbers as numbers, small arrays as lists."""
    try:
        arr = np.asarray(value)
    except Exception:
        return repr(value)
    if arr.dtype.kind in "biuf" and arr.size <= 16:
        return repr(arr.item()) if arr.ndim == 0 else repr(arr.tolist())
    return repr(value)


def _dtype_kind(x: Any) -> str:
    """The dtype kind of ``x`` (``"b"``, ``"c"``, ``"f"``, ...), read without computing on a
    traced value; ``""`` when ``x`` is not array-like."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return np.dtype(x.dtype).kind
    try:
        return np.asarray(x).dtype.kind
    except Exception:
        return ""


def _refuse_bool_complex(name: str, value: Any) -> None:
    # True would become 1.0 and 1+0j would lose its imaginary part with only a warning: both are
    # mistakes for a real parameter (the dtype is known even for a traced value)
    kind = _dtype_kind(value)
    if kind in ("b", "c"):
        what = "a boolean" if kind == "b" else "a complex number"
        raise ValueError(f"{name} must be a real number or array of them, got {what}: {show(value)}")


def reals(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array, or ``ValueError`` naming ``name`` (strings, None, ragged lists,
    objects, booleans, complex numbers)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"{name} must be a real number or array of them, got {show(value)}")
    _refuse_bool_complex(name, value)
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number or array of them, got {show(value)}") from None


def floats(name: str, value: Any, dtype: Any = None) -> Any:
    """``value`` as a JAX array of ``dtype`` (default: JAX's float); traced values pass through
    converted; anything that is not an array of reals raises ``ValueError`` naming ``name``."""
    kind = jnp.result_type(float) if dtype is None else dtype
    if _is_traced(value):
        _refuse_bool_complex(name, value)
        return jnp.asarray(value, dtype=kind)
    return jnp.asarray(reals(name, value), dtype=kind)


def positive(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless every entry of ``value`` is finite and > 0.

    Traced values cannot be inspected: at a point of `attnflow.sweep` a bad value marks the
    point failed (NaN values, named in `SweepResult.failures`); elsewhere they are let through
    (checked at the edge where they were created).
    """
    if _is_traced(value):
        check_traced(
            lambda: ~(jnp.all(jnp.isfinite(value)) & jnp.all(value > 0)), f"{name} must be finite and positive"
        )
        return
    arr = reals(name, value)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise ValueError(f"{name} must be finite and positive, got {show(value)}")


def positive_values(name: str, values: Any) -> None:
    """The list option ``name`` holds at least one value, all finite and > 0 (``ValueError``
    naming it otherwise)."""
    if len(values) == 0:
        raise ValueError(f"{name} must hold at least one value, got []")
    positive(name, values)


def covariance(name: str, cov: Any) -> None:
    """Raise ``ValueError`` unless the concrete matrix ``cov`` is square, symmetric and positive
    semidefinite, up to rounding (``1e-8`` of its largest entry); traced values pass."""
    if _is_traced(cov):
        return
    c = reals(name, cov)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {c.shape}")
    scale = 1e-8 * max(float(np.max(np.abs(c))), 1e-300)
    asym = float(np.max(np.abs(c - c.T)))
    if asym > scale:
        raise ValueError(f"{name} must be symmetric, but |cov - cov^T| reaches {asym:.3g}")
    low = float(np.min(np.linalg.eigvalsh(c))) if np.all(np.isfinite(c)) else float("nan")
    if not low >= -scale:
        raise ValueError(f"{name} must be positive semidefinite, but its smallest eigenvalue is {low:.3g}")


def abstract_call(failure: str, fn: Any, *args: Any) -> Any:
    """``jax.eval_shape(fn, *args)``: the shapes ``fn`` gives, computing nothing; a call that
    fails (a wrong number of arguments, a missing key) raises ``ValueError`` starting with
    ``failure``."""
    try:
        return jax.eval_shape(fn, *args)
    except (TypeError, AttributeError, KeyError, IndexError) as err:
        raise ValueError(f"{failure}: {type(err).__name__}: {err}") from None


def one_number(what: str, out: Any, allow_bool: bool = False) -> None:
    """``ValueError`` unless the shape ``out`` (from `abstract_call`) is one real number (or a
    boolean, with ``allow_bool``)."""
    kinds = (jnp.floating, jnp.bool_) if allow_bool else (jnp.floating,)
    if getattr(out, "shape", None) != () or not any(jnp.issubdtype(out.dtype, k) for k in kinds):
        raise ValueError(f"{what} must return one real number{' (or a boolean)' if allow_bool else ''}, got {out}")


def matches_state(who: str, out: Any, state: Any) -> None:
    """``ValueError`` unless the shapes ``out`` have the pytree structure and leaf shapes of
    ``state`` (what a vector field ``dy/dt`` must return)."""
    have = jax.eval_shape(lambda y: y, state)
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(have) or any(  # type: ignore[operator]
        a.shape != b.shape for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(have))
    ):
        raise ValueError(f"{who}field returns {out}, which does not match the state {have}")


def scalar(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a scalar (shape ``()``; traced values too: their
    shape is known)."""
    shape = np.shape(value) if not _is_traced(value) else value.shape
    if len(shape) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {tuple(shape)}")


def nonnegative(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless every entry of ``value`` is finite and >= 0 (traced: as `positive`)."""
    if _is_traced(value):
        check_traced(
            lambda: ~(jnp.all(jnp.isfinite(value)) & jnp.all(value >= 0)), f"{name} must be finite and non-negative"
        )
        return
    arr = reals(name, value)
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
            where = jax.tree_util.keystr(path)
            if arr.ndim == 0:
                raise ValueError(f"{name}{where} must be finite, got {arr.item()}")
            first = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
            raise ValueError(f"{name}{where} must be finite; entry {first} is {arr[first].item()}")


def _static_but_traced(name: str, value: Any) -> None:
    """``ValueError`` for a traced value where a Python number is needed (a size, a step count):
    inside `attnflow.sweep` that axis must be an ``af.Static`` one."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"{name} must be a concrete number here (it fixes array shapes, a step count or a code path), "
            f"got a traced value ({type(value).__name__}): to sweep it, give its axis as af.Static([...]) "
            "(one compilation per value)"
        )


def positive_int(name: str, value: Any, minimum: int = 1, maximum: int = 2**31 - 1) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (whole floats accepted), else ``ValueError``
    naming ``name`` (a size beyond ``2^31 - 1`` cannot be allocated anyway)."""
    _static_but_traced(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
            value = int(value)
        elif isinstance(value, (np.ndarray, jax.Array)):
            # a size or a seed fixed at trace time: an array (even an integer one) is not hashable
            raise ValueError(
                f"{name} must be a Python integer >= {minimum} (it is fixed when the program is traced), "
                f"got an array {show(value)}: pass int(...)"
            )
        else:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {show(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {show(value)}")
    if value > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum}, got {show(value)}")
    return int(value)


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, allowed))}")
    return value


def finite_scalar(name: str, value: Any) -> float:
    """``value`` as a finite float, or ``ValueError`` naming ``name``."""
    _static_but_traced(name, value)
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise ValueError(f"{name} must be a real number, got {show(value)}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number, got {show(value)}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {show(value)}")
    return v


def prng_key(key: Any) -> Any:
    """A PRNG key from an integer seed (possibly traced, for vmap over seeds) or a key (returned
    as is); anything else raises ``ValueError`` naming ``key``."""
    if _is_traced(key):
        return jax.random.PRNGKey(key) if jnp.ndim(key) == 0 and jnp.issubdtype(key.dtype, jnp.integer) else key
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, bool) or key is None or isinstance(key, (str, bytes, float)):
        raise ValueError(f"key must be an integer seed or a JAX PRNG key, got {key!r:.60}")
    if isinstance(key, (int, np.integer)):
        if not 0 <= int(key) < 2**63:
            raise ValueError(f"key (a seed) must be an integer in [0, 2^63), got {key!r}")
        return jax.random.PRNGKey(int(key))
    try:
        arr = np.asarray(key)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"key must be an integer seed or a JAX PRNG key, got {key!r:.60}") from None
    if arr.dtype == np.uint32 and arr.shape[-1:] == (2,):
        return jnp.asarray(arr)  # raw key data, as jax.random.PRNGKey makes
    if arr.ndim == 0 and arr.dtype.kind in "iu":
        return prng_key(int(arr))
    if arr.ndim >= 1 and arr.dtype.kind in "iu":
        raise ValueError(
            f"key must be one integer seed or a JAX PRNG key, got an array of shape {arr.shape}: for several "
            "seeds in one compiled call, jax.vmap(lambda k: train(setup, t1, key=k))(seeds), or "
            'attnflow.sweep(..., {"seed": seeds})'
        )
    raise ValueError(f"key must be an integer seed or a JAX PRNG key, got {key!r:.60}")


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
        raise ValueError(
            f"{what} needs about {n_bytes / 2**30:.3g} GiB, more than {fraction:.0%} of the "
            f"{avail / 2**30:.3g} GiB available; reduce the sizes"
        )


_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint")


def clamped_index(fn: Any, *args: Any) -> str | None:
    """Where ``fn(*args)`` indexes past the end of an array, or ``None``.

    JAX clamps an out-of-range index (``nu[1]`` of an array of length 1 reads ``nu[0]``), so a
    model written for more fields than it is given runs and silently computes something else.
    An index known when tracing becomes a ``dynamic_slice`` whose start is computed from
    constants (an index array, ``x[jnp.array([0, 2])]`` or ``jnp.take``, a ``gather``):
    ``fn`` is traced on ``args`` (zeros of the shapes it will get) and its program is
    evaluated, checking the start of every such slice. Best effort: a program this walk cannot
    evaluate gives ``None``.
    """
    import jax.extend.core as jc
    from jax import lax

    def run(jaxpr: Any, consts: list, inputs: list) -> list:
        env: dict = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jc.Literal) else env[v]

        for var, value in zip(jaxpr.constvars, consts, strict=True):
            env[var] = value
        for var, value in zip(jaxpr.invars, inputs, strict=True):
            env[var] = value
        for eqn in jaxpr.eqns:
            vals = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name == "dynamic_slice":
                shape = np.shape(vals[0])
                for axis, (start, size) in enumerate(zip(vals[1:], eqn.params["slice_sizes"], strict=False)):
                    start = int(np.asarray(start))
                    if start < 0 or start + size > shape[axis]:
                        raise _Clamped(f"index {start} on axis {axis} of an array of shape {shape}")
            elif name == "gather" and eqn.params.get("mode") != lax.GatherScatterMode.CLIP:
                # an index array (x[jnp.array([0, 2])], jnp.take): clamped or NaN-filled unasked;
                # mode="clip" asks for the clamping
                shape = np.shape(vals[0])
                idx = np.asarray(vals[1])
                sizes = eqn.params["slice_sizes"]
                for k, axis in enumerate(eqn.params["dimension_numbers"].start_index_map):
                    col = idx[..., k]
                    bad = (col < 0) | (col + sizes[axis] > shape[axis])
                    if np.any(bad):
                        first = int(col[bad].reshape(-1)[0])
                        raise _Clamped(f"index {first} on axis {axis} of an array of shape {shape}")
            sub = next((eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params), None)
            if name in _CALLS and sub is not None:
                closed = sub if hasattr(sub, "consts") else None
                out = run(closed.jaxpr if closed else sub, list(closed.consts) if closed else [], vals)
            else:
                out = eqn.primitive.bind(*vals, **eqn.params)
                out = list(out) if eqn.primitive.multiple_results else [out]
            for var, value in zip(eqn.outvars, out, strict=True):
                env[var] = value
        return [read(v) for v in jaxpr.outvars]

    try:
        with jax.ensure_compile_time_eval():
            closed = jax.make_jaxpr(fn)(*args)
            run(closed.jaxpr, list(closed.consts), jax.tree_util.tree_leaves(args))
    except _Clamped as err:
        return str(err)
    except Exception:  # a program the walk cannot evaluate: no verdict
        return None
    return None


class _Clamped(Exception):
    pass
