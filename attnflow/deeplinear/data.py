"""The task: a linear teacher ``y = A x`` with ``A = U diag(s) V^T`` on whitened inputs."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V

__all__ = ["Teacher"]


class Teacher(eqx.Module):
    """Teacher map ``A = U diag(s) V^T`` (``U``: n_out x k, ``V``: n_in x k, orthonormal columns).

    Inputs are whitened (``E x x^T = I``), so the population loss depends on the student
    only through ``A - W2 W1`` (Saxe et al. 2014, eq. 2). ``U`` and ``V`` are the Q factors
    of Gaussian draws from ``key``. ``s`` may be traced (a sweep over mode strengths); it is
    checked when concrete.
    """

    U: jax.Array
    s: jax.Array
    Vt: jax.Array

    def __init__(self, s: Any, n_in: int, n_out: int, key: Any = 0):
        if not V.any_traced(s):
            arr = np.asarray(s, dtype=float)
            if arr.ndim != 1 or arr.size == 0:
                raise ValueError(f"s must be a non-empty 1-D array of mode strengths, got {s!r}")
            V.positive("mode strengths s", arr)
        s = jnp.asarray(s, dtype=jnp.result_type(float))
        if s.ndim != 1:
            raise ValueError(f"s must be a 1-D array of mode strengths, got shape {s.shape}")
        n_in = V.positive_int("n_in", n_in, minimum=s.shape[0])
        n_out = V.positive_int("n_out", n_out, minimum=s.shape[0])
        key = V.prng_key(key)
        k1, k2 = jax.random.split(key)
        U, _ = jnp.linalg.qr(jax.random.normal(k1, (n_out, s.shape[0]), dtype=s.dtype))
        Vm, _ = jnp.linalg.qr(jax.random.normal(k2, (n_in, s.shape[0]), dtype=s.dtype))
        self.U, self.s, self.Vt = U, s, Vm.T

    @property
    def A(self) -> jax.Array:
        """The teacher matrix ``U diag(s) V^T`` (n_out x n_in)."""
        return (self.U * self.s) @ self.Vt

    @property
    def n_modes(self) -> int:
        return self.s.shape[0]

    def modes(self, W: jax.Array) -> jax.Array:
        """Mode strengths ``u_i = U_i^T W V_i`` of a product ``W = W2 W1``."""
        return jnp.einsum("oi,oj,ij->i", self.U, W, self.Vt)

    def sample(self, key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array]:
        """Whitened Gaussian inputs ``x`` (batch_size, n_in) and teacher outputs ``A x``, for SGD."""
        x = jax.random.normal(key, (batch_size, self.Vt.shape[1]), dtype=self.s.dtype)
        return x, x @ self.A.T
