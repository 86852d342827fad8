"""Observables of the QK/OV theory, recorded alike by `solve` and `train`, and the readouts of
full matrices (eq. (10) of the qkov docs page).

Readouts act on the product matrices, so collapsed and factorised models are read the same
way. On the invariant manifold the two ``mu_OV`` readouts agree, and so do the three
``mu_QK`` readouts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .data import TheoryTask
from .metrics import relevant_mass
from .model import QKOVModel, factor_conserved
from .setup import Setup
from .theory import alpha, loss

__all__ = [
    "OBSERVABLES",
    "conserved_quantities",
    "OV_READOUTS",
    "QK_READOUTS",
    "model_observables",
    "mu_ov_difference",
    "mu_ov_projection",
    "mu_qk_distinct",
    "mu_qk_from_attention",
    "mu_qk_gap",
    "state_observables",
]

OBSERVABLES = MappingProxyType(
    {
        "mu_ov": "OV margin mu_OV: W_OV = mu_OV D_OV (projection readout of W_OV on D_OV)",
        "mu_qk": "QK score gap mu_QK = c (W_QK[q, d] - W_QK[q, k]), q, d distinct, k common (gap readout)",
        "alpha": "attention mass on the m distinct positions, m e^mu_QK / (m e^mu_QK + n) (train under online "
        "SGD: measured on held-out sequences)",
        "loss": "population cross-entropy (mean-embedding form, exact on the invariant manifold; train under "
        "online SGD: the network's own, on held-out sequences)",
    }
)
"""What `attnflow.qkov.solve` and `attnflow.qkov.train` both record."""


def state_observables(state: dict, setup: Any) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a reduced state ``{mu_ov, mu_qk}`` (eq. (2))."""
    return {
        "mu_ov": state["mu_ov"],
        "mu_qk": state["mu_qk"],
        "alpha": alpha(state["mu_qk"], setup),
        "loss": loss(state, setup),
    }


OV_READOUTS = ("projection", "difference")
"""Readouts of ``mu_OV`` (`mu_ov_projection`, the default, and `mu_ov_difference`); equal on the manifold."""

QK_READOUTS = ("gap", "distinct", "attention")
"""Readouts of ``mu_QK`` (`mu_qk_gap`, the default; `mu_qk_distinct`; `mu_qk_from_attention` of
the measured attention, which needs held-out sequences); equal on the manifold while the common
scores stay at 0."""


def model_observables(
    model: QKOVModel,
    setup: Setup | TheoryTask,
    *,
    eval_set: tuple | None = None,
    ov_readout: str = "projection",
    qk_readout: str = "gap",
) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a model (the one `train` returns with ``return_model=True``) of the task of
    ``setup`` (its `Setup`, or the `TheoryTask` itself): ``mu_ov`` by `mu_ov_projection`,
    ``mu_qk`` by `mu_qk_gap`; ``alpha = sigmoid(gap + log(m / n))`` from the score gap (`mu_qk_gap`,
    whatever ``qk_readout`` says: the gap sets the attention) and ``loss`` the mean-embedding
    population loss (both exact on the invariant manifold), or, given ``eval_set`` (``(tokens, labels,
    relevant)`` of `TheoryTask.sample`: what `train` uses off the manifold, under online SGD),
    the network's own mean cross-entropy and mean attention mass on the ``m`` distinct positions
    over those sequences. ``ov_readout`` (`OV_READOUTS`) and ``qk_readout`` (`QK_READOUTS`) pick
    the readouts of ``mu_OV`` and ``mu_QK`` (``"attention"`` needs ``eval_set``). What `train`
    records."""
    task = setup.task if isinstance(setup, Setup) else setup
    if not isinstance(task, TheoryTask):
        raise ValueError(f"setup must be an attnflow.qkov.Setup (or its TheoryTask), got {setup!r:.80}")
    V.choice("ov_readout", ov_readout, OV_READOUTS)
    V.choice("qk_readout", qk_readout, QK_READOUTS)
    if qk_readout == "attention" and eval_set is None:
        raise ValueError('qk_readout="attention" reads mu_QK from the measured attention: give eval_set')
    W_qk, W_ov = model.W_QK(), model.W_OV()
    gap = mu_qk_gap(W_qk, task, model.score_scale)
    mu_ov = mu_ov_projection(W_ov, task) if ov_readout == "projection" else mu_ov_difference(W_ov, task)
    if eval_set is not None:
        _, logp, _, mass = _held_out(model, eval_set)
        alpha_measured = jnp.mean(mass)
        mq = {
            "gap": gap,
            "distinct": mu_qk_distinct(W_qk, task, model.score_scale),
            "attention": mu_qk_from_attention(alpha_measured, task.m, task.n),
        }[qk_readout]
        return {"mu_ov": mu_ov, "mu_qk": mq, "alpha": alpha_measured, "loss": -jnp.mean(logp)}
    mq = gap if qk_readout == "gap" else mu_qk_distinct(W_qk, task, model.score_scale)
    return {
        "mu_ov": mu_ov,
        "mu_qk": mq,
        "alpha": jax.nn.sigmoid(gap + np.log(task.m / task.n)),
        "loss": task.mean_embedding_loss(W_qk, W_ov, model.score_scale),
    }


def _held_out(model: Any, eval_set: tuple) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(logits, log-probability of each label, attention, attention mass on the relevant
    positions)`` of ``model`` on ``eval_set = (tokens, labels, relevant)``: what `model_observables`
    and `attnflow.qkov.train_on_generator` measure on held-out sequences. A model that does not
    attend to its last token (the query, in the theory) gives attention over the positions
    before it, which ``relevant`` is cut to."""
    tokens, y, rel = eval_set
    z, a = model(tokens)
    logp = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), y[:, None], axis=1)[:, 0]
    return z, logp, a, relevant_mass(a, rel[:, : a.shape[-1]])


def conserved_quantities(model: QKOVModel, factor_ratios: tuple[Any, Any] = (1.0, 1.0)) -> dict[str, jax.Array]:
    """``{"conserved_qk": ..., "conserved_ov": ...}``: for each factorised circuit ``W = A B``
    (`QKOVModel.factors`) with factor-rate ratio ``rho = eta_A / eta_B`` (``factor_ratios =
    (rho_qk, rho_ov)``, as `Setup.qk_factor_ratio`, `Setup.ov_factor_ratio`),
    ``eta_c (A^T A / eta_A - B B^T / eta_B) = A^T A / sqrt(rho) - sqrt(rho) B B^T``: the
    quantity gradient flow conserves (eq. (8)), in units free of the circuit rate ``eta_c``
    (``A^T A - B B^T`` at equal factor rates). Zero at the start `make_aligned` builds with the
    same ratios; `attnflow.qkov.train` records it with ``conserved=True``. Empty for `CACO`."""
    ratios = {"qk": factor_ratios[0], "ov": factor_ratios[1]}
    out = {}
    for c, (A, B) in model.factors().items():
        root = jnp.sqrt(jnp.asarray(ratios[c], A.dtype))
        out[f"conserved_{c}"] = factor_conserved(A, B, root, 1.0 / root)
    return out


def mu_ov_projection(W_ov: jax.Array, task: TheoryTask) -> jax.Array:
    """``<W_OV, D_OV> / ||D_OV||_F^2``: the coordinate of ``W_OV`` along ``D_OV``."""
    D = task.D_ov()
    return jnp.sum(W_ov * D) / jnp.sum(D * D)


def mu_ov_difference(W_ov: jax.Array, task: TheoryTask) -> jax.Array:
    """``W_OV[c, j] - W_OV[c', j]`` for ``j`` in ``D_c`` (class 0 against class 1, first distinct token)."""
    j = int(task.distinct_ids(0)[0])
    return W_ov[0, j] - W_ov[1, j]


def _query_rows(task: TheoryTask) -> jax.Array:
    Q = task.query_embeddings()
    return Q / jnp.sum(Q, axis=1, keepdims=True)


def mu_qk_gap(W_qk: jax.Array, task: TheoryTask, score_scale: Any = 1.0) -> jax.Array:
    """``c (W_QK[q, d] - W_QK[q, k])`` with ``q, d`` in ``D_c`` and ``k`` in ``C``, averaged
    over the class blocks: the score gap that sets the attention."""
    Qn = _query_rows(task)
    s_d = jnp.mean(jnp.einsum("cv,vw,cw->c", Qn, W_qk, task.distinct_embeddings()))
    s_c = jnp.mean(Qn @ W_qk @ task.common_embedding())
    return score_scale * (s_d - s_c)


def mu_qk_distinct(W_qk: jax.Array, task: TheoryTask, score_scale: Any = 1.0) -> jax.Array:
    """``c W_QK[q, d]`` with ``q, d`` in ``D_c``, averaged over the class blocks (equals the gap
    while the common scores stay at 0)."""
    Qn = _query_rows(task)
    return score_scale * jnp.mean(jnp.einsum("cv,vw,cw->c", Qn, W_qk, task.distinct_embeddings()))


def mu_qk_from_attention(alpha_measured: Any, m: Any, n: Any) -> jax.Array:
    """``log(n alpha / (m (1 - alpha)))``: the ``mu_QK`` that gives a measured distinct
    attention mass ``alpha`` (inverts eq. (2); usable on any model, e.g. the code generator's)."""
    a = jnp.asarray(alpha_measured)
    return jnp.log(n * a / (m * (1 - a)))
