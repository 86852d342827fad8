"""The one-layer, single-head attention model of focus and dilution (docs/focus.md, "Model").

Parameters ``theta = {"W0": (d, m), "W1": (m, d), "WQ": (m, mk), "WK": (m, mk)}``, composites
``M = W0 W1`` and ``Phi = W0 WQ WK^T W0^T`` (M2). On a context ``x_1 .. x_s`` (M1):

    h_j = W0^T e_{x_j},  S_j = tau h_s^T WQ WK^T h_j = tau Phi_{x_s x_j},  a = softmax_j(S),
    f = W1^T sum_{j <= s} a_j h_j,  ce = -log softmax(f)_y.

The last token queries all ``s`` positions, itself included; the value is the embedding; no
residual, LayerNorm or positional encoding.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _validate as V

__all__ = [
    "PARAMETERS",
    "OneLayerAttention",
    "composites",
    "empirical_attention",
    "init_theta",
    "next_token_loss",
]

PARAMETERS = ("W0", "W1", "WQ", "WK")
"""The names of the four weight matrices in ``theta``."""


def init_theta(key: Any, d: int, m: int = 16, mk: int = 16, eps: Any = 1e-3) -> dict[str, jax.Array]:
    """Small initialisation: every entry of the four matrices i.i.d. ``N(0, eps^2)``.

    ``key`` (an integer seed or a PRNG key) is split into four, one per matrix in the order
    `PARAMETERS`. ``eps`` may be traced.
    """
    V.positive_int("d", d, minimum=2)
    V.positive_int("m", m)
    V.positive_int("mk", mk)
    V.positive("eps", eps)
    k = jax.random.split(V.prng_key(key), 4)
    f = jnp.result_type(float)
    eps = jnp.asarray(eps, dtype=f)
    return {
        "W0": eps * jax.random.normal(k[0], (d, m), f),
        "W1": eps * jax.random.normal(k[1], (m, d), f),
        "WQ": eps * jax.random.normal(k[2], (m, mk), f),
        "WK": eps * jax.random.normal(k[3], (m, mk), f),
    }


def composites(theta: dict) -> tuple[jax.Array, jax.Array]:
    """(M2): ``M = W0 W1`` (d, d) and ``Phi = W0 WQ WK^T W0^T`` (d, d)."""
    W0 = theta["W0"]
    return W0 @ theta["W1"], W0 @ theta["WQ"] @ theta["WK"].T @ W0.T


class OneLayerAttention(eqx.Module):
    """The network (M1): ``W0`` (d, m), ``W1`` (m, d), ``WQ``, ``WK`` (m, mk) and the score scale
    ``tau`` (an array, so a new value does not recompile; `attnflow.focus.train` does not train
    it)."""

    W0: jax.Array
    W1: jax.Array
    WQ: jax.Array
    WK: jax.Array
    tau: jax.Array

    def __init__(self, W0: Any, W1: Any, WQ: Any, WK: Any, tau: Any = 1.0):
        W0, W1, WQ, WK = (jnp.asarray(w) for w in (W0, W1, WQ, WK))
        d, m = W0.shape if W0.ndim == 2 else (None, None)
        if d is None or W1.shape != (m, d) or WQ.ndim != 2 or WQ.shape[0] != m or WK.shape != WQ.shape:
            raise ValueError(
                f"need W0 (d, m), W1 (m, d), WQ and WK (m, mk); got {W0.shape}, {W1.shape}, {WQ.shape}, {WK.shape}"
            )
        V.positive("tau", tau)
        self.W0, self.W1, self.WQ, self.WK = W0, W1, WQ, WK
        self.tau = jnp.asarray(tau, dtype=W0.dtype)

    @classmethod
    def from_theta(cls, theta: dict, tau: Any = 1.0) -> OneLayerAttention:
        """The network with the weights of ``theta``."""
        return cls(theta["W0"], theta["W1"], theta["WQ"], theta["WK"], tau)

    @property
    def theta(self) -> dict[str, jax.Array]:
        """The weights as ``{"W0", "W1", "WQ", "WK"}``."""
        return {"W0": self.W0, "W1": self.W1, "WQ": self.WQ, "WK": self.WK}

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Logits ``(B, d)`` for the token after each context ``tokens`` ``(B, s)``, and the
        attention weights ``(B, s)`` of the last token on every position."""
        h = jax.nn.one_hot(tokens, self.W0.shape[0], dtype=self.W0.dtype) @ self.W0  # (B, s, m)
        q = h[:, -1] @ self.WQ  # (B, mk)
        k = h @ self.WK  # (B, s, mk)
        a = jax.nn.softmax(self.tau * jnp.einsum("bk,bsk->bs", q, k), axis=-1)
        f = jnp.einsum("bs,bsm->bm", a, h) @ self.W1
        return f, a


def next_token_loss(model: OneLayerAttention, seqs: jax.Array) -> jax.Array:
    """Mean cross-entropy of predicting ``seqs[:, -1]`` from the context ``seqs[:, :-1]`` (M1)."""
    z, _ = model(seqs[:, :-1])
    y = seqs[:, -1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, -1), y[:, None], axis=1))


def empirical_attention(model: OneLayerAttention, seqs: jax.Array) -> jax.Array:
    """``A^emp_qk`` (d, d): the mean attention mass that queries of type ``q`` put on keys of type
    ``k``, over the contexts ``seqs[:, :-1]`` (rows of query types never seen are NaN)."""
    d = model.W0.shape[0]
    return _mean_by_query_type(
        model, seqs, lambda a, ctx: jnp.einsum("bs,bsk->bk", a, jax.nn.one_hot(ctx, d, dtype=a.dtype))
    )


def _mean_by_query_type(model: OneLayerAttention, seqs: jax.Array, per_context: Any) -> jax.Array:
    """The mean of ``per_context(a, ctx)`` (one value per context, leading axis ``B``) over the
    contexts ``ctx = seqs[:, :-1]`` whose query (last token) is of each type ``q``, ``a`` the
    model's attention on them: shape ``(d, ...)``, NaN for query types never seen."""
    d = model.W0.shape[0]
    ctx = seqs[:, :-1]
    _, a = model(ctx)
    value = per_context(a, ctx)
    qoh = jax.nn.one_hot(ctx[:, -1], d, dtype=a.dtype)
    count = qoh.sum(0).reshape((d,) + (1,) * (value.ndim - 1))
    # a mean over no contexts is undefined: NaN, not a zero that reads as a value (zero entropy
    # is a fully focused query)
    return jnp.where(count > 0, jnp.tensordot(qoh.T, value, axes=1) / jnp.maximum(count, 1.0), jnp.nan)
