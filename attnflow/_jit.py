"""Compilation options for attnflow's own compiled calls (`integrate`, `simulate`, `sweep`).

Two XLA:CPU defaults cost attnflow's programs time:

- XLA:CPU generates 256-bit vector code, also on CPUs with AVX-512. For the random draws
  of online SGD (Threefry hash and Gaussian transform, `attnflow.rng.normal`) 512-bit
  vectors are faster.
- XLA:CPU hands chains of elementwise operations and reductions to the YNNPACK library
  (``xla_cpu_experimental_ynn_fusion_type``). For float64 chains of special functions,
  such as the ``erf`` integrand of a Gauss-Hermite expectation or the heads' Monte Carlo
  field, its kernels are slower than XLA's own loops; attnflow keeps YNNPACK for single
  matrix products only (``LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``).

XLA accepts such options per compiled call, but only on a top-level ``jit``; a call nested
in another trace is compiled with its caller's options. So `filter_jit` keeps two jitted
versions of a function and uses the tuned one only when called from outside any trace.
Nothing global changes (no ``XLA_FLAGS``, no JAX configuration).
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

    - ``xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``: YNNPACK
      runs single matrix products only, XLA's own loops the elementwise chains and
      reductions (where this jaxlib knows the option);
    - on a CPU with AVX-512, ``xla_cpu_prefer_vector_width=512``: XLA:CPU defaults to 256-bit
      vectors, and the hash and Gaussian transform of `attnflow.rng.normal` run faster
      at 512.

    With ``ATTNFLOW_XLA_DEFAULTS=0`` in the environment, no options. Passed per call
    (``jax.jit(..., compiler_options=...)``), so nothing global changes; attnflow passes
    them only to calls compiled for CPU.
    """
    if os.environ.get("ATTNFLOW_XLA_DEFAULTS", "1") == "0":
        return {}
    options: dict = {}
    if _accepted(_YNN_OPTION):
        options.update(_YNN_OPTION)
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        flags = ""
    if " avx512f" in flags:
        options["xla_cpu_prefer_vector_width"] = 512
    return options


_YNN_OPTION = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def _accepted(options: dict) -> bool:
    """Whether this jaxlib's CPU compiler knows ``options`` (an experimental option may be
    renamed or dropped): one trivial program compiled with them."""
    try:
        # an abstract argument on the CPU: works inside another trace too, and on a machine
        # whose default backend is an accelerator
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        x = jax.ShapeDtypeStruct((), jax.numpy.float32, sharding=cpu)
        jax.jit(lambda v: v + 1, compiler_options=options).lower(x).compile()
    except Exception:
        return False
    return True


def _traced(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


def filter_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``eqx.filter_jit(fn)``, compiled with `cpu_compiler_options` when called at top level on CPU.

    A call with traced arguments is nested in another trace and goes to the plain version;
    a nested call with only concrete arguments is refused by JAX's top-level check (a
    ``ValueError`` raised while tracing, before any compiling) and then goes there too.
    """
    plain = eqx.filter_jit(fn)
    # the tuned version is made on the first top-level CPU call, not here at import: looking
    # the options up compiles a probe, which would start a JAX backend
    tuned: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if jax.default_backend() != "cpu" or _traced((args, kwargs)):
            return plain(*args, **kwargs)
        if not tuned:
            options = cpu_compiler_options()
            tuned.append(eqx.filter_jit(fn, compiler_options=options) if options else plain)  # type: ignore[call-overload]
        try:
            return tuned[0](*args, **kwargs)
        except ValueError as err:
            if "compiler_options" not in str(err):
                raise
            return plain(*args, **kwargs)

    return call
