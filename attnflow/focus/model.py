"""The one-layer transformer of focus and dilution on finite contexts (spec `focus.md` section 3).

``h_j = W0^T e_{x_j}``, ``S_j = tau h_s^T WQ WK^T h_j``, ``a = softmax_j(S)``,
``f = W1^T sum_{j<=s} a_j h_j``, ``ce = -log softmax(f)_y``: the last token queries all ``s``
positions, itself included; value = embedding; no residual, LayerNorm or positions.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _validate as V
from .theory import init_theta


class OneLayerAttention(eqx.Module):
    """``W0`` (d, m), ``W1`` (m, d), ``WQ``, ``WK`` (m, mk); ``tau`` the score scale (static)."""

    W0: jax.Array
    W1: jax.Array
    WQ: jax.Array
    WK: jax.Array
    tau: float = eqx.field(static=True, default=1.0)

    @classmethod
    def init(cls, key: Any, d: int, m: int = 16, mk: int = 16, eps: float = 1e-3, tau: float = 1.0) -> "OneLayerAttention":
        """``N(0, eps^2)`` initialisation, the same draw as `attnflow.focus.theory.init_theta`."""
        V.positive_int("d", d, minimum=2)
        V.positive("tau", tau)
        th = init_theta(key, d, m, mk, eps)
        return cls(th["W0"], th["W1"], th["WQ"], th["WK"], float(tau))

    @property
    def theta(self) -> dict:
        return {"W0": self.W0, "W1": self.W1, "WQ": self.WQ, "WK": self.WK}

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Logits ``(B, d)`` for the token after each context ``tokens (B, s)``, and attention ``(B, s)``."""
        h = jax.nn.one_hot(tokens, self.W0.shape[0], dtype=self.W0.dtype) @ self.W0  # (B, s, m)
        q = h[:, -1] @ self.WQ  # (B, mk)
        k = h @ self.WK  # (B, s, mk)
        a = jax.nn.softmax(self.tau * jnp.einsum("bk,bsk->bs", q, k), axis=-1)
        f = jnp.einsum("bs,bsm->bm", a, h) @ self.W1
        return f, a


def next_token_loss(model: OneLayerAttention, seqs: jax.Array) -> jax.Array:
    """Mean cross-entropy of predicting ``seqs[:, -1]`` from ``seqs[:, :-1]``."""
    z, _ = model(seqs[:, :-1])
    y = seqs[:, -1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, -1), y[:, None], axis=1))


def empirical_attention(model: OneLayerAttention, seqs: jax.Array, d: int) -> jax.Array:
    """``A^emp_qk``: mean attention mass that type-q queries put on type-k keys (rows: query type)."""
    ctx = seqs[:, :-1]
    _, a = model(ctx)
    mass = jnp.einsum("bs,bsk->bk", a, jax.nn.one_hot(ctx, d, dtype=a.dtype))  # (B, d)
    qoh = jax.nn.one_hot(ctx[:, -1], d, dtype=a.dtype)
    return (qoh.T @ mass) / jnp.maximum(qoh.sum(0)[:, None], 1.0)
