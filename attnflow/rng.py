"""Fast random draws on CPU: JAX's threefry without its rolled CPU loop, and a Gaussian
sampler with a cheaper transform than ``erf_inv``.

Unrolled threefry
-----------------

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

Gaussians (`normal`)
--------------------

``jax.random.normal`` turns one 32-bit word into one normal through ``erf_inv``. Its
32-bit words are the XOR of the two output words of a Threefry-2x32 hash, so each
normal costs a whole hash plus the two ``erf_inv`` polynomials and a log. `normal` uses
both words of a hash for a Box-Muller pair instead: the first gives the radius
``sqrt(-2 log u)``, the second a uniform angle, whose sine and cosine come from short
polynomials on one octant (no range reduction) and two bits choose the sector. XLA:CPU
evaluates each output element on its own, so the hash is still computed once per normal,
but the transform is cheaper, and it vectorises at 512 bits where ``erf_inv`` does not
(attnflow compiles its calls with 512-bit vectors on AVX-512 CPUs, `attnflow._jit`):
the 8 x 8 x 4096 draws of one heads-SGD step take 0.38 ms instead of 0.79 ms on the
2-core AVX-512 development machine.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["unroll_threefry_on_cpu", "normal"]

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


# sin and cos on [-pi/4, pi/4): Taylor polynomials of degree 9 and 10, truncation error
# below 2e-9, far under float32 resolution.
_SIN = (1.0, -1 / 6, 1 / 120, -1 / 5040, 1 / 362880)
_COS = (1.0, -1 / 2, 1 / 24, -1 / 720, 1 / 40320, -1 / 3628800)


def _poly(x2, coeffs):
    acc = jnp.asarray(coeffs[-1], x2.dtype)
    for c in coeffs[-2::-1]:
        acc = acc * x2 + c
    return acc


def normal(key: jax.Array, shape: tuple[int, ...] | int = (), dtype=jnp.float32) -> jax.Array:
    """Standard normal draws of ``shape`` and ``dtype`` from ``key`` (Box-Muller, see the module doc).

    For ``float32``, ``float16`` and ``bfloat16`` each Threefry-2x32 hash of the counter
    ``(0, i)`` under ``key`` gives the pair ``(z_2i, z_2i+1)``:

    - ``r = sqrt(-2 log u)`` with ``u = 1 - k 2^-24`` from the top 24 bits of the first word
      (``u`` in ``[2^-24, 1]``, so ``|z| <= 5.77``, as ``jax.random.normal`` stops near 5.4);
    - the angle is ``phi = (f - 1/2) pi/2`` with ``f`` from 23 bits of the second word, and two
      more bits put ``(cos phi, sin phi)`` in one of the four quarter-turn sectors
      ``(c, s), (-c, s), (s, c), (s, -c)``, which together cover the circle uniformly.

    Entries ``2i`` and ``2i + 1`` (in C order) are the pair from counter ``i``.
    ``float64`` (and a key whose generator is not threefry) falls back to
    ``jax.random.normal``, which draws 64-bit words. Works under ``jit`` and ``vmap``
    (over keys too). The numbers differ from ``jax.random.normal``'s for the same key.
    """
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"normal: dtype must be a floating type, got {dtype}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    if dtype.itemsize > 4 or data.shape != (2,) or data.dtype != jnp.uint32:
        return jax.random.normal(key, shape, dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if n >= 2**32:
        raise ValueError(f"normal: at most 2^32 draws per key, got shape {shape}")
    from jax.extend.random import threefry2x32_p

    # Entry j takes the pair j >> 1 and its coordinate j & 1: XLA:CPU computes every output
    # entry on its own anyway (the hash once per entry), and this layout needs no
    # concatenation, whose branches keep loop-invariant key hashes inside the loop.
    j = jnp.arange(n, dtype=jnp.uint32).reshape(shape)
    pair = j >> 1
    w_r, w_phi = threefry2x32_p.bind(data[0], data[1], jnp.zeros_like(pair), pair)
    f32 = jnp.float32
    u = 1.0 - (w_r >> 8).astype(f32) * f32(2.0**-24)
    r = jnp.sqrt(-2.0 * jnp.log(u))
    phi = (((w_phi >> 9) & 0x7FFFFF).astype(f32) * f32(2.0**-23) - 0.5) * f32(np.pi / 2)
    phi2 = phi * phi
    c, s = _poly(phi2, _COS), phi * _poly(phi2, _SIN)
    # sector: bit 1 flips the sign of the cosine (right <-> left), bit 0 swaps the pair (-> top/bottom)
    c = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(c, jnp.uint32) ^ ((w_phi & 2) << 30), f32)
    use_s = ((w_phi ^ j) & 1) == 1  # first coordinate: s if swapped; second: c if swapped
    z = r * jnp.where(use_s, s, c)
    return z.astype(dtype)
