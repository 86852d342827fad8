"""A fast Gaussian sampler for online SGD: Box-Muller on both words of a Threefry-2x32 hash.

``jax.random.normal`` turns one 32-bit word into one normal through ``erf_inv``. Its
32-bit words are the XOR of the two output words of a Threefry-2x32 hash, so each
normal costs a whole hash plus the two ``erf_inv`` polynomials and a log. `normal` uses
both words of a hash for a Box-Muller pair instead: the first gives the radius
``sqrt(-2 log u)``, the second a uniform angle, whose sine and cosine come from short
polynomials on one octant (no range reduction) and two bits choose the sector.

The hash itself is `threefry2x32`: Threefry-2x32 with 20 rounds (Salmon et al. 2011), the
generator of ``jax.random``, written in ``jax.numpy`` with its rounds unrolled. It gives
the same bits as JAX's own primitive (tested); on CPU, where JAX lowers the primitive as a
rolled 5-trip loop that XLA cannot fuse, the unrolled form fuses with the Gaussian
transform into one loop over the output. Nothing in JAX is changed or patched.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["normal", "threefry2x32"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA  # Threefry's key-schedule constant


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter words ``(x0, x1)`` under the key ``(k0, k1)``.

    All inputs are ``uint32`` (the counters of any equal shape); returns the two output words.
    Bit-identical to ``jax.extend.random.threefry2x32_p`` (the hash behind ``jax.random``).
    """
    u32 = jnp.uint32
    k0, k1, x0, x1 = (jnp.asarray(v, u32) for v in (k0, k1, x0, x1))
    ks = (k0, k1, k0 ^ k1 ^ u32(_PARITY))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + u32(i + 1)
    return x0, x1


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
    On an AVX-512 CPU, attnflow's own top-level compiled calls vectorise it at 512 bits
    (`attnflow._jit`).
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
    # Entry j takes the pair j >> 1 and its coordinate j & 1: XLA:CPU computes every output
    # entry on its own anyway (the hash once per entry), and this layout needs no
    # concatenation, whose branches keep loop-invariant key hashes inside the loop.
    j = jnp.arange(n, dtype=jnp.uint32).reshape(shape)
    pair = j >> 1
    w_r, w_phi = threefry2x32(data[0], data[1], jnp.zeros_like(pair), pair)
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
