"""Fast threefry on CPU: the same random bits, without JAX's rolled CPU loop.

JAX hashes counters with Threefry-2x32 (20 rounds, Salmon et al. 2011). On GPU it lowers
the rounds unrolled; on CPU it lowers them as a 5-trip ``fori_loop`` (smaller programs,
faster compiles), which XLA:CPU cannot fuse: every trip streams the whole counter array
through memory with shift amounts read from an array. For the large Gaussian draws of
online SGD (8 x 8 x 4096 numbers per step in the heads benchmark) the hash is the step.

`unroll_threefry_on_cpu` registers JAX's own unrolled lowering (the GPU one) for CPU
too. The algorithm, counters and keys are unchanged, so every key gives bit-identical
numbers (tested); only programs compiled afterwards are affected, and they run the hash
about 7x faster (`jax.random.normal` of 262 144 float32: 0.9 ms against 2.9 ms on the
2-core CI CPU). `attnflow.simulate` and the ``attnflow`` command call it; call it
yourself before jitting other sampling code.
"""

from __future__ import annotations

import warnings

__all__ = ["unroll_threefry_on_cpu"]

_INSTALLED = False


def unroll_threefry_on_cpu() -> bool:
    """Lower ``threefry2x32`` on CPU with its rounds unrolled; idempotent.

    Returns ``True`` when the unrolled lowering is in place. JAX keeps this lowering in a
    private module; if a JAX version moves it, a warning is issued, nothing changes and
    ``False`` is returned (the numbers are the same either way, only slower).
    """
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as _tf

        mlir.register_lowering(_tf.threefry2x32_p, _tf._threefry2x32_lowering_rule, platform="cpu")
    except (ImportError, AttributeError) as err:  # pragma: no cover - depends on the JAX version
        warnings.warn(f"attnflow: could not install the unrolled CPU threefry lowering ({err}); "
                      "random draws keep JAX's slower rolled loop", RuntimeWarning, stacklevel=2)
        return False
    _INSTALLED = True
    return True
