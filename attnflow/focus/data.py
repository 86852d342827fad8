"""Markov data for focus and dilution (spec `focus.md` sections 2 and 7).

`MarkovChain(pi, P)` validates its input and offers the constructors of the spec: the
lazy chain, a random reversible chain with a given ``pi`` (symmetric Sinkhorn), a
delta-perturbed ``pi`` for symmetry breaking, and `MarkovChain.from_corpus` for plain text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V

__all__ = ["MarkovChain", "CorpusChain", "perturbed_pi", "SYNTHETIC_PI"]

#: The synthetic stationary law of the paper (spec section 2).
SYNTHETIC_PI = (0.75, 0.19, 0.05, 0.01)


def _check_pi(pi: np.ndarray, tol: float) -> None:
    if pi.ndim != 1 or pi.size < 2:
        raise ValueError(f"pi must be a 1-D probability vector of length >= 2, got shape {pi.shape}")
    bad = np.flatnonzero(~np.isfinite(pi) | (pi <= 0))
    if bad.size:
        raise ValueError(f"pi must be strictly positive; entry {int(bad[0])} is {pi[bad[0]]!r}")
    if abs(pi.sum() - 1.0) > tol:
        raise ValueError(f"pi must sum to 1, got sum {pi.sum()!r}")


class MarkovChain(eqx.Module):
    """A first-order Markov chain with stationary law ``pi`` and transition matrix ``P``.

    Rows of ``P`` must be nonnegative and sum to 1, and ``pi^T P = pi^T``, to ``tol``
    (default 1e-12); otherwise ``ValueError`` names the offending row or entry.
    """

    pi: jax.Array
    P: jax.Array

    def __init__(self, pi: Any, P: Any, tol: float = 1e-12):
        pi = np.asarray(pi, dtype=float)
        P = np.asarray(P, dtype=float)
        _check_pi(pi, tol)
        d = pi.size
        if P.shape != (d, d):
            raise ValueError(f"P must have shape ({d}, {d}) to match pi, got {P.shape}")
        neg = np.argwhere(~np.isfinite(P) | (P < -tol))
        if neg.size:
            i, j = map(int, neg[0])
            raise ValueError(f"P must be nonnegative and finite; entry ({i}, {j}) is {P[i, j]!r}")
        rows = np.abs(P.sum(axis=1) - 1.0)
        if np.any(rows > tol):
            i = int(np.argmax(rows))
            raise ValueError(f"rows of P must sum to 1; row {i} sums to {P[i].sum()!r}")
        stat = np.abs(pi @ P - pi)
        if np.any(stat > tol):
            k = int(np.argmax(stat))
            raise ValueError(f"pi is not stationary for P: (pi^T P)_{k} = {(pi @ P)[k]!r} but pi_{k} = {pi[k]!r}")
        self.pi = jnp.asarray(pi)
        self.P = jnp.asarray(np.clip(P, 0.0, None))

    @property
    def d(self) -> int:
        return self.pi.shape[0]

    # ---------------------------------------------------------------- constructors
    @classmethod
    def lazy(cls, pi: Any = SYNTHETIC_PI, lam: float = 0.5) -> "MarkovChain":
        """``P = lam I + (1 - lam) 1 pi^T``: stay with probability lam, else redraw from pi.
        Valid for ``lam >= -min_k pi_k / (1 - pi_k)``."""
        pi = np.asarray(pi, dtype=float)
        _check_pi(pi, 1e-12)
        lo = -np.min(pi / (1 - pi))
        if not (lo <= lam <= 1.0):
            raise ValueError(f"lam must lie in [{lo:.6g}, 1] for this pi, got {lam!r}")
        P = lam * np.eye(pi.size) + (1 - lam) * np.outer(np.ones(pi.size), pi)
        return cls(pi, P)

    @classmethod
    def reversible(cls, pi: Any, key: Any = 0, iterations: int = 2000) -> "MarkovChain":
        """A random reversible chain with stationary law ``pi``: random symmetric ``K >= 0``,
        symmetric Sinkhorn ``x <- sqrt(x pi / (K x))`` so that ``x (K x) = pi``,
        ``J = diag(x) K diag(x)``, ``P = Pi^{-1} J``."""
        pi = np.asarray(pi, dtype=float)
        _check_pi(pi, 1e-12)
        rng = np.random.default_rng(key if isinstance(key, int) else int(np.asarray(jax.random.key_data(key)).ravel()[-1]))
        A = rng.random((pi.size, pi.size))
        K = A + A.T
        x = np.sqrt(pi)
        for _ in range(iterations):
            x = np.sqrt(x * pi / (K @ x))
        J = x[:, None] * K * x[None, :]
        J = 0.5 * (J + J.T)
        P = J / pi[:, None]
        P = P / P.sum(axis=1, keepdims=True)
        return cls(pi, P, tol=1e-10)

    # ---------------------------------------------------------------- statistics
    def entropy(self) -> jax.Array:
        """Unigram entropy ``H(pi)``: the loss on the condensation plateau."""
        return -jnp.sum(self.pi * jnp.log(self.pi))

    def bayes_floor(self) -> jax.Array:
        """``L_* = sum_q pi_q H(P_q)``."""
        P = self.P
        return -jnp.sum(self.pi * jnp.sum(jnp.where(P > 0, P * jnp.log(jnp.where(P > 0, P, 1.0)), 0.0), axis=1))

    def lag_one_cov(self, f: jax.Array, g: jax.Array) -> jax.Array:
        """``Cov_{pi,P}(f(X_t), g(X_{t+1})) = sum_q pi_q f_q (P g)_q - E_pi f E_pi g``."""
        return jnp.sum(self.pi * f * (self.P @ g)) - jnp.sum(self.pi * f) * jnp.sum(self.pi * g)

    # ---------------------------------------------------------------- sampling
    def sample(self, key: jax.Array, batch_size: int, length: int, init: str = "uniform") -> jax.Array:
        """Token sequences ``(batch_size, length)``: ``x_1 ~ Unif`` (or ``pi``), ``x_{j+1} ~ P[x_j]``."""
        V.positive_int("batch_size", batch_size)
        V.positive_int("length", length)
        V.choice("init", init, ("uniform", "pi"))
        k0, k1 = jax.random.split(key)
        logits0 = jnp.zeros(self.d) if init == "uniform" else jnp.log(self.pi)
        x0 = jax.random.categorical(k0, logits0, shape=(batch_size,))
        cdf = jnp.cumsum(self.P, axis=1)
        u = jax.random.uniform(k1, (length - 1, batch_size), dtype=cdf.dtype)

        def step(x, uu):
            nxt = jnp.minimum(jax.vmap(lambda row, v: jnp.searchsorted(row, v, side="right"))(cdf[x], uu), self.d - 1)
            nxt = nxt.astype(x.dtype)
            return nxt, nxt

        _, rest = jax.lax.scan(step, x0, u)
        return jnp.concatenate([x0[:, None], rest.T], axis=1)

    # ---------------------------------------------------------------- corpora
    @classmethod
    def from_corpus(cls, text: str, tokenizer: str = "char", top_k: int = 64, alpha: float = 0.5,
                    estimator: str = "perron") -> "CorpusChain":
        """Estimate ``(pi, P)`` from plain text (spec section 7).

        Tokens: characters (``tokenizer="char"``) or whitespace-separated words (``"word"``).
        The ``top_k`` most frequent tokens are kept (ties broken by first appearance) plus an
        ``<other>`` class (index ``top_k``). ``P_jk = (n_jk + alpha) / (n_j + alpha (K+1))``
        from bigram counts within documents (blank-line separated); ``pi`` is the left Perron
        vector of ``P`` (``estimator="perron"``).
        """
        V.choice("tokenizer", tokenizer, ("char", "word"))
        V.choice("estimator", estimator, ("perron",))
        top_k = V.positive_int("top_k", top_k)
        V.nonnegative("alpha", alpha)
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text must be a non-empty string")
        docs = [d for d in re.split(r"\n\s*\n", text) if d.strip()]
        tok = (lambda s: list(s)) if tokenizer == "char" else (lambda s: s.split())
        docs_tokens = [tok(d) for d in docs]
        counts = Counter(t for d in docs_tokens for t in d)
        first = {}
        for d in docs_tokens:
            for t in d:
                first.setdefault(t, len(first))
        vocab = sorted(counts, key=lambda t: (-counts[t], first[t]))[:top_k]
        index = {t: i for i, t in enumerate(vocab)}
        K = len(vocab)
        other = K
        streams = [np.array([index.get(t, other) for t in d], dtype=np.int64) for d in docs_tokens]
        n = np.zeros((K + 1, K + 1))
        uni = np.zeros(K + 1)
        for s in streams:
            np.add.at(uni, s, 1)
            if s.size > 1:
                np.add.at(n, (s[:-1], s[1:]), 1)
        if alpha == 0 and np.any(n.sum(axis=1) == 0):
            j = int(np.flatnonzero(n.sum(axis=1) == 0)[0])
            name = (vocab + ["<other>"])[j]
            raise ValueError(f"token {name!r} never has a successor, so its row of P is undefined; use alpha > 0")
        P = (n + alpha) / (n.sum(axis=1, keepdims=True) + alpha * (K + 1))
        w, vl = np.linalg.eig(P.T)
        pi = np.real(vl[:, np.argmin(np.abs(w - 1))])
        pi = np.abs(pi) / np.abs(pi).sum()
        pi_uni = uni / uni.sum()
        chain = cls(pi, P, tol=1e-9)
        return CorpusChain(chain=chain, vocab=vocab + ["<other>"], streams=streams, unigram=pi_uni,
                           bigram_counts=n, diagnostics={"l1_pi_vs_unigram": float(np.abs(pi - pi_uni).sum()),
                                                         "tokens": int(uni.sum()), "documents": len(streams)})


@dataclass
class CorpusChain:
    """A chain estimated from text, with its vocabulary, token streams and diagnostics."""

    chain: MarkovChain
    vocab: list
    streams: list
    unigram: np.ndarray
    bigram_counts: np.ndarray
    diagnostics: dict = field(default_factory=dict)

    def stream(self) -> np.ndarray:
        """All documents' token ids concatenated."""
        return np.concatenate(self.streams)

    def windows(self, key: jax.Array, batch_size: int, length: int) -> jax.Array:
        """Random windows of ``length`` tokens from the concatenated stream (for SGD on real text)."""
        s = jnp.asarray(self.stream())
        if s.size <= length:
            raise ValueError(f"corpus has {s.size} tokens, fewer than the window length {length}")
        starts = jax.random.randint(key, (batch_size,), 0, s.size - length)
        return jax.vmap(lambda i: jax.lax.dynamic_slice(s, (i,), (length,)))(starts)


def perturbed_pi(pi1: float = 0.75, d: int = 4, delta: float = 0.0, direction: Any = None) -> np.ndarray:
    """``pi_i = rho + delta c_i`` for ``i >= 2`` with ``rho = (1 - pi_1)/(d - 1)`` and
    ``c = (+1, 0, ..., 0, -1)`` (or a user ``direction`` with ``v_1 = 0``, ``1^T v = 0``)."""
    d = V.positive_int("d", d, minimum=3)
    if not 0 < pi1 < 1:
        raise ValueError(f"pi1 must be in (0, 1), got {pi1!r}")
    rho = (1 - pi1) / (d - 1)
    if direction is None:
        c = np.zeros(d)
        c[1], c[-1] = 1.0, -1.0
    else:
        c = np.asarray(direction, dtype=float)
        if c.shape != (d,) or abs(c[0]) > 1e-15 or abs(c.sum()) > 1e-12:
            raise ValueError(f"direction must have shape ({d},), v_1 = 0 and sum 0, got {direction!r}")
    pi = np.concatenate([[pi1], np.full(d - 1, rho)]) + delta * c
    if np.any(pi <= 0):
        raise ValueError(f"delta={delta!r} makes an entry of pi non-positive: {pi}")
    return pi
