"""Compilation options for attnflow's own compiled calls (`integrate`, `simulate`, `sweep`).

XLA:CPU generates 256-bit vector code by default, also on CPUs with AVX-512. For the
random draws of online SGD (Threefry hash and Gaussian transform, `attnflow.rng.normal`)
512-bit vectors are about 2x faster. XLA accepts such options per compiled call, but only
on a top-level ``jit``; a call nested in another trace is compiled with its caller's
options. So `filter_jit` keeps two jitted versions of a function and uses the tuned one
only when called from outside any trace. Nothing global changes (no ``XLA_FLAGS``, no
JAX configuration).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

__all__ = ["cpu_compiler_options", "filter_jit"]


@functools.cache
def cpu_compiler_options() -> dict:
    """XLA options for attnflow's own top-level compiled calls.

    On a CPU with AVX-512, ``xla_cpu_prefer_vector_width=512``: XLA:CPU defaults to 256-bit
    vectors, and the hash and Gaussian transform of `attnflow.rng.normal` run about 2x
    faster at 512. Elsewhere, and with ``ATTNFLOW_XLA_DEFAULTS=0`` in the environment, no
    options. Passed per call (``jax.jit(..., compiler_options=...)``), so nothing global
    changes; attnflow passes it only to calls compiled for CPU.
    """
    if os.environ.get("ATTNFLOW_XLA_DEFAULTS", "1") == "0":
        return {}
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        return {}
    return {"xla_cpu_prefer_vector_width": 512} if " avx512f" in flags else {}


def _traced(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


def filter_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``eqx.filter_jit(fn)``, compiled with `cpu_compiler_options` when called at top level on CPU.

    A call with traced arguments is nested in another trace and goes to the plain version;
    a nested call with only concrete arguments is refused by JAX's top-level check (a
    ``ValueError`` raised while tracing, before any compiling) and then goes there too.
    """
    plain = eqx.filter_jit(fn)
    options = cpu_compiler_options()
    if not options:
        return plain
    tuned = eqx.filter_jit(fn, compiler_options=options)  # type: ignore[call-overload]  # passed to jax.jit

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if jax.default_backend() != "cpu" or _traced((args, kwargs)):
            return plain(*args, **kwargs)
        try:
            return tuned(*args, **kwargs)
        except ValueError as err:
            if "compiler_options" not in str(err):
                raise
            return plain(*args, **kwargs)

    return call
