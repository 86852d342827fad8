"""Observables of the heads model, recorded alike by `attnflow.heads.solve` and `attnflow.heads.train`."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

from .model import Activation, MultiHead, half_loss

__all__ = ["OBSERVABLES", "model_observables", "order_parameter_observables", "overlaps", "specialisation"]

OBSERVABLES = MappingProxyType(
    {
        "M": "overlaps m_hf = k_h . k*_f / D with the spikes, shape (H, F)",
        "Q": "overlaps q_hh' = k_h . k_h' / D between the keys, shape (H, H)",
        "specialisation": "|(I - 11^T/H) M|_F, the spread of the heads' rows of M (0 when all heads are equal)",
        "error": "generalisation error E = E|y - y_hat|^2 / D (token target); E(y - y_hat)^2 = E + Delta (scalar)",
        "attention": "mean attention on the signal token, E[a_eps]",
        "b": "bias of Softmax1 / BayesSoftmax (only when the activation learns it)",
        "c": "scale of Softmax1 (only when learned)",
    }
)
"""What `attnflow.heads.solve` and `attnflow.heads.train` both record. ``solve`` takes the
expectations on its Monte Carlo bank (equation (7)); ``train`` estimates ``error`` and
``attention`` on a fixed held-out batch."""


def overlaps(K: jax.Array, spikes: jax.Array) -> dict[str, jax.Array]:
    """``M = K K*^T / D`` (H, F) and ``Q = K K^T / D`` (H, H) of keys ``K (H, D)`` and spikes ``K* (F, D)``."""
    D = K.shape[1]
    return {"M": K @ spikes.T / D, "Q": K @ K.T / D}


def specialisation(M: jax.Array) -> jax.Array:
    """``|(I - 11^T / H) M|_F``: the Frobenius norm of ``M`` minus its mean row. Zero on the
    equal-heads manifold; for ``H = 2`` and ``F = 1`` it is ``|m_1 - m_2| / sqrt(2)``. The escape
    event of `attnflow.heads.solve` fires when it reaches its threshold (equation (15))."""
    return jnp.sqrt(jnp.sum((M - jnp.mean(M, axis=-2, keepdims=True)) ** 2, axis=(-2, -1)))


def order_parameter_observables(
    M: jax.Array, Q: jax.Array, activation: Activation, bank: Any, Delta: Any = 0.0
) -> dict[str, jax.Array]:
    """`OBSERVABLES` of the order parameters ``(M, Q)`` with the (trained) ``activation``, as
    expectations over the Monte Carlo ``bank`` (an `attnflow.heads.FieldBank`); ``Delta`` is the
    label noise of the scalar target."""
    chi, _ = bank.fields(M, Q)
    per_draw = jax.vmap(lambda c: (half_loss(activation, c), activation(c)[0]))(chi)
    half_risk, a1 = (bank.mean(x) for x in per_draw)
    out = {"M": M, "Q": Q, "specialisation": specialisation(M), "error": 2 * half_risk + Delta, "attention": a1}
    out.update(activation.params())
    return out


def model_observables(model: MultiHead, spikes: jax.Array, loss: Any, batch: tuple) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a finite-``D`` model: overlaps with the spikes, and ``error`` (twice the
    mean ``loss(a, batch)``, as `attnflow.heads.Target.loss`) and ``attention`` on the held-out ``batch``."""
    ov = overlaps(model.K, spikes)
    a = jax.vmap(model.attention)(batch[0])
    eps = batch[2]
    out = {
        **ov,
        "specialisation": specialisation(ov["M"]),
        "error": 2 * loss(a, batch),
        "attention": jnp.mean(jnp.take_along_axis(a, eps[:, None], axis=1)),
    }
    out.update(model.activation.params())
    return out
