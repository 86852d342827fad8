"""The student: a two-layer linear network ``x -> W2 W1 x`` as an Equinox module."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _validate as V
from ..optim import weighted_balance
from .data import Teacher


def check_fits(model: Any, n_in: int, n_out: int) -> None:
    """``ValueError`` unless ``model`` is a `TwoLayerLinear` with ``W1`` ``(h, n_in)`` and ``W2``
    ``(n_out, h)``: a network of the teacher's sizes (any hidden width ``h``)."""
    if not isinstance(model, TwoLayerLinear) or model.W1.shape[1] != n_in or model.W2.shape[0] != n_out:
        raise ValueError(
            f"model must be a TwoLayerLinear with W1 (h, {n_in}) and W2 ({n_out}, h) for this teacher, "
            f"got {model!r:.120}"
        )


class TwoLayerLinear(eqx.Module):
    """``f(x) = W2 W1 x`` with ``W1``: (hidden, n_in), ``W2``: (n_out, hidden)."""

    W1: jax.Array
    W2: jax.Array

    def __init__(self, W1: Any, W2: Any):
        W1, W2 = jnp.asarray(W1), jnp.asarray(W2)
        if W1.ndim != 2 or W2.ndim != 2 or W2.shape[1] != W1.shape[0]:
            raise ValueError(f"need W1 (h, n_in) and W2 (n_out, h); got {W1.shape} and {W2.shape}")
        V.finite_tree("W1", W1)
        V.finite_tree("W2", W2)
        self.W1, self.W2 = W1, W2

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.W1.T @ self.W2.T

    @property
    def product(self) -> jax.Array:
        return self.W2 @ self.W1

    @classmethod
    def aligned(cls, teacher: Teacher, u0: Any, hidden: int | None = None, layer_ratio: Any = 1.0) -> TwoLayerLinear:
        """Balanced initialisation on the teacher's modes with strength ``u0`` per mode.

        ``W1 = sqrt(u0) R V^T``, ``W2 = U R^T sqrt(u0)`` with ``R`` the first ``k`` columns
        of the identity, so ``W2 W1 = u0 U V^T`` and ``W1 W1^T = W2^T W2``: the setting
        of the closed-form solution. ``layer_ratio = eta_1 / eta_2`` (per-layer rates) weights
        the balance, ``W1 W1^T / eta_1 = W2^T W2 / eta_2`` (`attnflow.weighted_balance`:
        ``W1`` scaled by ``rho^(1/4)``, ``W2`` by ``rho^(-1/4)``).
        """
        k = teacher.n_modes
        hidden = k if hidden is None else V.positive_int("hidden", hidden, minimum=k)
        V.positive("u0", u0)
        a = jnp.sqrt(jnp.broadcast_to(jnp.asarray(u0, dtype=teacher.s.dtype), (k,)))
        R = jnp.eye(hidden, k)
        W2, W1 = weighted_balance(teacher.U @ (R * a).T, (R * a) @ teacher.Vt, 1.0 / jnp.asarray(layer_ratio))
        return cls(W1, W2)

    @classmethod
    def random(cls, key: Any, n_in: int, hidden: int, n_out: int, scale: float = 1e-3) -> TwoLayerLinear:
        V.positive("scale", scale)
        key = V.prng_key(key)
        k1, k2 = jax.random.split(key)
        return cls(scale * jax.random.normal(k1, (hidden, n_in)), scale * jax.random.normal(k2, (n_out, hidden)))
