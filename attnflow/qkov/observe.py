"""Parameters -> the named observables that `theory.py` evolves (spec `qkov.md` section 5.1).

Readouts act on the full (product) matrices, so collapsed and factorised models are read
the same way.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .. import _validate as V
from .data import TheoryTask

__all__ = ["mu_ov", "mu_qk", "readouts", "flow_readouts"]


def mu_ov(W_ov: jax.Array, task: TheoryTask, readout: str = "projection") -> jax.Array:
    """``projection``: ``<W_OV, D_OV> / ||D_OV||^2``; ``difference``: ``W_OV[c, j] - W_OV[c', j]``
    for ``j`` in ``D_c`` (class 0 against class 1, first distinct token). Equal on the manifold."""
    V.choice("mu_ov_readout", readout, ("projection", "difference"))
    if readout == "projection":
        D = task.D_ov()
        return jnp.sum(W_ov * D) / jnp.sum(D * D)
    j = int(task.distinct_ids(0)[0])
    return W_ov[0, j] - W_ov[1, j]


def mu_qk(W_qk: jax.Array, task: TheoryTask, score_scale: Any = 1.0, readout: str = "gap",
          alpha_measured: Any = None) -> jax.Array:
    """``gap`` (default): ``c (W_QK[q, d] - W_QK[q, k])``, ``q, d`` in ``D_c``, ``k`` in ``C``;
    ``distinct``: ``c W_QK[q, d]``; ``attention``: ``log(n alpha / (m (1 - alpha)))`` from a
    measured ``alpha``. Averaged over the class blocks (exact on the manifold)."""
    V.choice("mu_qk_readout", readout, ("gap", "distinct", "attention"))
    if readout == "attention":
        if alpha_measured is None:
            raise ValueError("the 'attention' readout needs alpha_measured")
        a = jnp.asarray(alpha_measured)
        return jnp.log(task.n * a / (task.m * (1 - a)))
    Q = task.query_embeddings() * (task.b if task.query_mode == "distinct_uniform" else 1.0)
    Qn = Q / jnp.sum(Q, axis=1, keepdims=True)
    s_d = jnp.mean(jnp.einsum("cv,vw,cw->c", Qn, W_qk, task.distinct_embeddings()))
    if readout == "distinct":
        return score_scale * s_d
    s_c = jnp.mean(Qn @ W_qk @ task.common_embedding())
    return score_scale * (s_d - s_c)


def readouts(W_qk: jax.Array, W_ov: jax.Array, task: TheoryTask, score_scale: Any = 1.0,
             mu_qk_readout: str = "gap", mu_ov_readout: str = "projection") -> dict[str, jax.Array]:
    """``mu_ov, mu_qk, alpha, loss`` of full matrices (loss: mean-embedding population loss)."""
    mq = mu_qk(W_qk, task, score_scale, mu_qk_readout)
    return {
        "mu_ov": mu_ov(W_ov, task, mu_ov_readout),
        "mu_qk": mq,
        "alpha": jax.nn.sigmoid(mq + jnp.log(task.m / task.n)),
        "loss": task.mean_embedding_loss(W_qk, W_ov, score_scale),
    }


def flow_readouts(model: Any, task: TheoryTask, eta_qk: Any, eta_ov: Any) -> dict[str, jax.Array]:
    """`readouts` of a model plus, for each factorised circuit, its conserved quantity under
    gradient flow with rates ``eta_qk``, ``eta_ov`` (``conserved_qk``, ``conserved_ov``)."""
    from .theory import factor_conserved

    out = readouts(model.W_QK(), model.W_OV(), task)
    if hasattr(model, "W_q"):
        out["conserved_qk"] = factor_conserved(model.W_q.T, model.W_k, eta_qk, eta_qk)
    if hasattr(model, "W_o"):
        out["conserved_ov"] = factor_conserved(model.W_o, model.W_v, eta_ov, eta_ov)
    return out
