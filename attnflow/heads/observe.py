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


def model_observables(
    model: MultiHead, setup: Any, *, eval_samples: int | None = None, location: int | None = None
) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a finite-``D`` network (the `MultiHead` `attnflow.heads.train` returns
    with ``return_model=True``) in the task of ``setup``: the overlaps with the spikes `train`
    draws at this ``D`` (`attnflow.heads.TASK_SEED`), and ``error`` and ``attention`` on the
    held-out batch of ``eval_samples`` samples it evaluates on (`attnflow.heads.EVAL_SEED`;
    default `attnflow.heads.EVAL_SAMPLES`, as `train`'s; none with ``eval_samples=0``): what
    `train` records, with the same ``eval_samples`` and ``location``."""
    from .. import _validate as V
    from .setup import Setup
    from .train import EVAL_SAMPLES, EVAL_SEED, _task_of

    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r:.80}")
    if not isinstance(model, MultiHead) or jnp.shape(model.K)[0] != setup.H:
        raise ValueError(f"model must be a MultiHead of the setup's H = {setup.H} heads, got {model!r:.80}")
    eval_samples = V.positive_int("eval_samples", EVAL_SAMPLES if eval_samples is None else eval_samples, minimum=0)
    D = int(jnp.shape(model.K)[1])
    task = _task_of(setup, D, location, model.K.dtype)
    batch = task.sample(jax.random.PRNGKey(EVAL_SEED), max(eval_samples, 1))
    out = _observables_with_spikes(model, task.spikes, setup.target.loss, batch)
    if not eval_samples:
        return {k: v for k, v in out.items() if k not in ("error", "attention")}
    return out


def _observables_with_spikes(model: MultiHead, spikes: jax.Array, loss: Any, batch: tuple) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a finite-``D`` model with the spikes ``(F, D)`` given: overlaps, and
    ``error`` (twice the mean ``loss(a, batch)``, as `attnflow.heads.Target.loss`) and
    ``attention`` on the held-out ``batch`` (`model_observables` takes them from the setup)."""
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
