"""The two tasks of `attnflow.qkov`.

- `TheoryTask`: the theory's data model (``M`` classes, ``b`` distinct tokens per class, a
  common set ``C``, ``m`` distinct and ``n`` common context positions, a query token), with
  the mean-embedding population loss (eq. (9) of the qkov docs page; exact on the invariant
  manifold) and a Monte Carlo estimator of the exact population loss on sampled sequences.
- `CodeGenerator`: the synthetic generator of the authors' code (``V = 50``), on which the
  paper's SGD experiments run (`attnflow.qkov.train_on_generator`).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V

__all__ = ["COUNTS", "QUERY_MODES", "CodeGenerator", "TheoryTask"]

QUERY_MODES = ("distinct_uniform", "dedicated")
"""How the query token is drawn: uniformly from the class's distinct set, or one dedicated
query token per class."""

COUNTS = ("fixed", "binomial")
"""How many context positions a sequence gives its class's distinct tokens (spec 3.2, [open]):
``m`` and ``n`` fixed in every sequence (the theory's model, default), or each of the ``m + n``
positions distinct with probability ``m / (m + n)`` (``m`` binomial with mean ``m``, as the
authors' generator draws it)."""


class TheoryTask(eqx.Module):
    """The theory's data model on one-hot tokens.

    Token ids: class ``c`` owns ``c b .. c b + b - 1``; the common set is
    ``M b .. M b + |C| - 1``; with ``query_mode="dedicated"`` class ``c`` has its own query
    id ``M b + |C| + c``. Outputs are the ``M`` classes (``n_out = M``). ``counts``
    (`COUNTS`): ``m``, ``n`` fixed per sequence, or drawn binomially around them.
    """

    m: int = eqx.field(static=True)
    n: int = eqx.field(static=True)
    b: int = eqx.field(static=True)
    M: int = eqx.field(static=True)
    n_common: int = eqx.field(static=True)
    query_mode: str = eqx.field(static=True)
    counts: str = eqx.field(static=True)

    def __init__(
        self,
        m: int = 5,
        n: int = 50,
        b: int = 50,
        M: int = 20,
        n_common: int = 50,
        query_mode: str = "distinct_uniform",
        counts: str = "fixed",
    ):
        self.m = V.positive_int("m", m)
        self.n = V.positive_int("n", n)
        self.b = V.positive_int("b", b)
        self.M = V.positive_int("M", M, minimum=2)
        self.n_common = V.positive_int("n_common", n_common)
        self.query_mode = V.choice("query_mode", query_mode, QUERY_MODES)
        self.counts = V.choice("counts", counts, COUNTS)

    @property
    def V(self) -> int:
        return self.M * self.b + self.n_common + (self.M if self.query_mode == "dedicated" else 0)

    @property
    def common_ids(self) -> np.ndarray:
        return np.arange(self.M * self.b, self.M * self.b + self.n_common)

    def distinct_ids(self, c: int) -> np.ndarray:
        return np.arange(c * self.b, (c + 1) * self.b)

    # -- the invariant manifold (eq. (10)) ----------------------------------------------------------
    def distinct_embeddings(self) -> jax.Array:
        """Rows ``1_{D_c} / b`` (M, V)."""
        E = np.zeros((self.M, self.V))
        for c in range(self.M):
            E[c, self.distinct_ids(c)] = 1.0 / self.b
        return jnp.asarray(E)

    def common_embedding(self) -> jax.Array:
        e = np.zeros(self.V)
        e[self.common_ids] = 1.0 / self.n_common
        return jnp.asarray(e)

    def query_embeddings(self) -> jax.Array:
        if self.query_mode == "distinct_uniform":
            return self.distinct_embeddings()
        Q = np.zeros((self.M, self.V))
        for c in range(self.M):
            Q[c, self.M * self.b + self.n_common + c] = 1.0
        return jnp.asarray(Q)

    def D_ov(self) -> jax.Array:
        """``sum_c (e_c - 1/M) 1_{D_c}^T`` (M, V): the OV direction; ``||D_ov||_F^2 = b (M - 1)``."""
        return (jnp.eye(self.M) - 1.0 / self.M) @ (self.distinct_embeddings() * self.b)

    def D_qk(self) -> jax.Array:
        """``sum_c 1_{Q_c} 1_{D_c}^T`` (V, V): the QK direction (query rows, distinct columns)."""
        Q = self.query_embeddings() * (self.b if self.query_mode == "distinct_uniform" else 1.0)
        return Q.T @ (self.distinct_embeddings() * self.b)

    def on_manifold(self, mu_ov: Any, mu_qk: Any, s_common: Any = 0.0, score_scale: Any = 1.0) -> dict:
        """Full matrices on the invariant manifold: ``W_OV = mu_OV D_ov``, distinct scores
        ``s_d = mu_QK + s_C`` and common scores ``s_C`` (score units, divided by ``c``)."""
        Q = self.query_embeddings() * (self.b if self.query_mode == "distinct_uniform" else 1.0)
        qc = Q.T @ (jnp.ones((self.M, 1)) * self.common_embedding()[None] * self.n_common)
        W_qk = ((mu_qk + s_common) * self.D_qk() + s_common * qc) / score_scale
        return {"W_ov": mu_ov * self.D_ov(), "W_qk": W_qk}

    # -- population loss --------------------------------------------------------------------
    def mean_embedding_loss(self, W_qk: jax.Array, W_ov: jax.Array, score_scale: Any = 1.0) -> jax.Array:
        """Mean-embedding population loss (eq. (9)): query and distinct (common) tokens
        replaced by their class means; attention over ``m`` copies of the distinct score and
        ``n`` of the common score. Equals the exact population loss, with its gradient, on the
        invariant manifold."""
        Q, Kd, Kc = self.query_embeddings(), self.distinct_embeddings(), self.common_embedding()
        s_d = score_scale * jnp.einsum("cv,vw,cw->c", Q, W_qk, Kd)
        s_c = score_scale * (Q @ W_qk @ Kc)
        a = jax.nn.sigmoid(s_d - s_c + jnp.log(self.m / self.n))
        h = a[:, None] * Kd + (1.0 - a)[:, None] * Kc[None]
        z = h @ W_ov.T
        return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(z, axis=-1)))

    def population_loss(self, model: Any) -> jax.Array:
        """Mean-embedding population loss of a `QKOVModel` (any parametrisation)."""
        return self.mean_embedding_loss(model.W_QK(), model.W_OV(), model.score_scale)

    def monte_carlo_loss(self, model: Any, key: jax.Array, n_samples: int = 4096) -> jax.Array:
        """Monte Carlo estimate of the exact population loss on sampled one-hot sequences
        (the model must not attend to the query, as in the theory)."""
        tokens, y, _ = self.sample(key, n_samples)
        z, _ = model(tokens)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), y[:, None], axis=1))

    def sample(self, key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sequences ``(tokens (B, m + n + 1), labels (B,), relevant mask (B, m + n + 1))``.

        Context: ``m`` iid distinct tokens of the class, ``n`` iid common tokens (``counts =
        "fixed"``; with ``"binomial"`` each of the ``m + n`` positions is distinct with
        probability ``m / (m + n)``), then the query token last (it queries; it is not attended
        in the theory model)."""
        k1, k2, k3, k4 = jax.random.split(key, 4)
        c = jax.random.randint(k1, (batch_size,), 0, self.M)
        if self.query_mode == "distinct_uniform":
            q = c * self.b + jax.random.randint(k4, (batch_size,), 0, self.b)
        else:
            q = self.M * self.b + self.n_common + c
        if self.counts == "fixed":
            d = c[:, None] * self.b + jax.random.randint(k2, (batch_size, self.m), 0, self.b)
            com = self.M * self.b + jax.random.randint(k3, (batch_size, self.n), 0, self.n_common)
            tokens = jnp.concatenate([d, com, q[:, None]], axis=1)
            rel = jnp.concatenate([jnp.ones((batch_size, self.m), bool), jnp.zeros((batch_size, self.n + 1), bool)], 1)
            return tokens, c, rel
        # binomial: a distinct and a common draw at every position, one of them kept
        L = self.m + self.n
        d = c[:, None] * self.b + jax.random.randint(k2, (batch_size, L), 0, self.b)
        com = self.M * self.b + jax.random.randint(k3, (batch_size, L), 0, self.n_common)
        is_d = jax.random.bernoulli(jax.random.fold_in(key, 1), self.m / L, (batch_size, L))
        tokens = jnp.concatenate([jnp.where(is_d, d, com), q[:, None]], axis=1)
        return tokens, c, jnp.concatenate([is_d, jnp.zeros((batch_size, 1), bool)], axis=1)


class CodeGenerator(eqx.Module):
    """Synthetic generator of the authors' code (not an instance of the theory model).

    ``V = 50``; common ids ``0..9``; class ``k`` in ``0..3`` owns ids ``10(k+1) .. 10(k+1)+9``;
    context tokens iid with weight 1 per common id and ``0.1 (i+1)`` on id ``10(k+1)+i``;
    a sequence is ``L_seq - 2`` context tokens, the query id ``5 + k``, the label id ``1 + k``.
    Inputs are the first ``L_seq - 1`` tokens (the query attends, itself included); the
    target is the label. Relevant (distinct) tokens are ids > 9.
    """

    seq_len: int = eqx.field(static=True, default=64)
    n_classes: int = eqx.field(static=True, default=4)
    vocab: int = eqx.field(static=True, default=50)

    def __check_init__(self):
        V.positive_int("seq_len", self.seq_len, minimum=3)
        V.positive_int("n_classes", self.n_classes, minimum=2)
        if 10 * (self.n_classes + 1) > self.vocab:
            raise ValueError(f"vocab {self.vocab} too small for {self.n_classes} classes of 10 ids plus 10 common ids")

    def context_logits(self) -> jax.Array:
        """Log-weights (n_classes, V) of the context law."""
        W = np.zeros((self.n_classes, self.vocab))
        W[:, :10] = 1.0
        for k in range(self.n_classes):
            W[k, 10 * (k + 1) : 10 * (k + 1) + 10] = 0.1 * (np.arange(10) + 1)
        with np.errstate(divide="ignore"):
            return jnp.asarray(np.log(W))

    def sample(self, key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(inputs (B, L_seq - 1), targets (B,), relevant mask (B, L_seq - 1))``."""
        k1, k2 = jax.random.split(key)
        k = jax.random.randint(k1, (batch_size,), 0, self.n_classes)
        # Inverse-CDF sampling: one uniform per token (Gumbel-max would need V per token,
        # and the random bits dominate the step time on CPU).
        cdf = jnp.cumsum(jax.nn.softmax(self.context_logits(), axis=-1), axis=-1)
        u = jax.random.uniform(k2, (batch_size, self.seq_len - 2), dtype=cdf.dtype)
        ctx = jax.vmap(lambda c, uu: jnp.searchsorted(c, uu, side="right"))(cdf[k], u)
        ctx = jnp.minimum(ctx, self.vocab - 1)
        tokens = jnp.concatenate([ctx, (5 + k)[:, None]], axis=1)
        return tokens, 1 + k, tokens > 9
