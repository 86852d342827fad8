"""Markov data for focus and dilution (docs/focus.md, "Data" and "Real text").

`MarkovChain(pi, P)` is the data model of every run: a first-order chain with stationary law
``pi`` and transition matrix ``P``. It validates concrete input and accepts traced arrays (a
chain built inside a `attnflow.sweep` over ``lam``, ``delta`` or a key), so a chain can be a
sweep axis. Constructors: the lazy chain (`MarkovChain.lazy`), a random reversible chain with
a given ``pi`` (`MarkovChain.reversible`), a ``delta``-perturbed ``pi`` for symmetry breaking
(`perturbed_pi`), and chains estimated from plain text (`CorpusChain`), whose tokenizer is an
object (`Characters`, `Words`, or any `Tokenizer`).
"""

from __future__ import annotations

import abc
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._errors import check_traced, recording
from .._io import data_path

__all__ = [
    "CHAIN_TOL",
    "SYNTHETIC_PI",
    "Characters",
    "CorpusChain",
    "MarkovChain",
    "Tokenizer",
    "Words",
    "check_pi",
    "lazy_lam_min",
    "perturbed_pi",
    "random_windows",
]

SYNTHETIC_PI = (0.75, 0.19, 0.05, 0.01)
"""The synthetic stationary law of the reference configuration (four tokens)."""

CHAIN_TOL = 1e-12
"""Tolerance of the checks of a chain: row sums of ``P`` and stationarity ``pi^T P = pi^T``."""

REVERSIBLE_TOL = 1e-10
"""Tolerance of the checks of a chain built by `MarkovChain.reversible` (Sinkhorn iterations)."""

CORPUS_TOL = 1e-9
"""Tolerance of the checks of a chain estimated from text (the Perron vector of ``P``)."""


def _floats(x: Any) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(float))


def _precision(tol: float, d: int) -> float:
    """``tol``, or the rounding of JAX's default float when that is coarser: without 64-bit
    mode a chain is stored in float32, and its rows sum to 1 only to about ``d`` float32 ulps
    (the theory verbs then say that they need `attnflow.enable_x64`)."""
    return max(tol, 10.0 * d * float(jnp.finfo(jnp.result_type(float)).eps))


_ROUNDING_MISS = 1e-6
"""A sum of ``pi`` this close to 1 (but outside the tolerance) is a rounding miss: `check_pi`'s
message then states the tolerance and says to normalise ``pi``."""


def check_pi(pi: Any, tol: float = CHAIN_TOL) -> None:
    """Raise ``ValueError`` naming the entry unless ``pi`` is a 1-D probability vector of length
    ``>= 2`` with positive entries summing to 1 within ``tol`` (or the rounding of JAX's default
    float, when coarser); a sum within `_ROUNDING_MISS` of 1 gets the tolerance and the advice to
    normalise ``pi`` in the message."""
    single = getattr(pi, "dtype", None) == np.float32  # made while JAX's 64-bit mode was off
    pi = np.asarray(pi, dtype=float)
    tol = _precision(tol, pi.size)
    if pi.ndim != 1 or pi.size < 2:
        raise ValueError(f"pi must be a 1-D probability vector of length >= 2, got shape {pi.shape}")
    bad = np.flatnonzero(~np.isfinite(pi) | (pi <= 0))
    if bad.size:
        raise ValueError(f"pi must be strictly positive; entry {int(bad[0])} is {float(pi[bad[0]]):g}")
    if abs(pi.sum() - 1.0) > tol:
        if single:
            hint = "; pi is float32, rounded to 1e-7: build it (or the Setup holding it) after attnflow.enable_x64()"
        elif abs(pi.sum() - 1.0) < _ROUNDING_MISS:
            hint = "; normalise pi first (pi / pi.sum())"
        else:
            hint = ""
        raise ValueError(f"pi must sum to 1 within {tol:g}, got sum {float(pi.sum()):.15g} (pi = {pi.tolist()}){hint}")


def lazy_lam_min(pi: Any) -> float:
    """The smallest ``lam`` of a lazy chain on ``pi`` (`MarkovChain.lazy`): ``-min_k pi_k / (1 - pi_k)``,
    where a diagonal entry of ``P`` reaches 0."""
    pi = np.asarray(pi, dtype=float)
    return float(-np.min(pi / (1 - pi)))


def _check_lazy_lam(pi: Any, lam: Any) -> jax.Array | None:
    """``ValueError`` unless every entry of ``lam`` lies in the range of the lazy chain (D1) on
    ``pi``, ``[lazy_lam_min(pi), 1]``. Traced (a sweep over ``lam`` or ``pi``): a point outside
    fails with the message (`attnflow._errors.check_traced`), and the boolean mask of the entries
    outside is returned; ``None`` for concrete input."""
    if V.any_traced((pi, lam)):
        pi, lam = jnp.asarray(pi), jnp.asarray(lam)  # a list or tuple holding tracers
        bad = ~((lam >= -jnp.min(pi / (1 - pi))) & (lam <= 1.0))
        check_traced(lambda: jnp.any(bad), "lam must lie in [-min_k pi_k / (1 - pi_k), 1] (a lazy chain on pi)")
        return bad
    arr = V.reals("lam", lam)
    V.finite_tree("lam", arr)
    lo = lazy_lam_min(pi)
    if not np.all((arr >= lo) & (arr <= 1.0)):
        shown = f"{float(arr):.15g}" if arr.ndim == 0 else V.show(arr)
        raise ValueError(f"lam must lie in [{lo:.6g}, 1] for this pi (a lazy chain), got {shown}")
    return None


def _check_chain(pi: np.ndarray, P: np.ndarray, tol: float) -> None:
    check_pi(pi, tol)
    d = pi.size
    tol = _precision(tol, d)
    if P.shape != (d, d):
        raise ValueError(f"P must have shape ({d}, {d}) to match pi, got {P.shape}")
    neg = np.argwhere(~np.isfinite(P) | (-tol > P))
    if neg.size:
        i, j = map(int, neg[0])
        raise ValueError(f"P must be nonnegative and finite; entry ({i}, {j}) is {float(P[i, j]):g}")
    rows = np.abs(P.sum(axis=1) - 1.0)
    if np.any(rows > tol):
        i = int(np.argmax(rows))
        raise ValueError(f"rows of P must sum to 1 within {tol:g}; row {i} sums to {float(P[i].sum()):.15g}")
    stat = np.abs(pi @ P - pi)
    if np.any(stat > tol):
        k = int(np.argmax(stat))
        raise ValueError(
            f"pi is not stationary for P: (pi^T P)_{k} = {float((pi @ P)[k]):.15g} but pi_{k} = {float(pi[k]):.15g}"
        )


def _check_chain_traced(pi: jax.Array, P: jax.Array, tol: float) -> jax.Array:
    """`_check_chain` for traced ``pi`` and ``P``, through `attnflow._errors.check_traced` (a sweep
    point fails with the message); returns whether any check failed (traced)."""
    tol = _precision(tol, pi.shape[-1])
    checks = [
        (~jnp.all(jnp.isfinite(pi) & (pi > 0)), "pi must be strictly positive and finite"),
        (jnp.abs(jnp.sum(pi) - 1.0) > tol, f"pi must sum to 1 within {tol:g} (normalise pi first: pi / pi.sum())"),
        (~jnp.all(jnp.isfinite(P) & (-tol <= P)), "P must be nonnegative and finite"),
        (jnp.any(jnp.abs(jnp.sum(P, axis=1) - 1.0) > tol), "rows of P must sum to 1"),
        (jnp.any(jnp.abs(pi @ P - pi) > tol), "pi must be stationary for P (pi^T P = pi^T)"),
    ]
    for bad, message in checks:
        check_traced(lambda bad=bad: bad, message)
    return jnp.any(jnp.stack([bad for bad, _ in checks]))


class MarkovChain(eqx.Module):
    """A first-order Markov chain: stationary law ``pi`` (all entries positive) and transition
    matrix ``P`` (rows sum to 1, ``pi^T P = pi^T``).

    Concrete input is checked to ``tol`` (default `CHAIN_TOL`); a ``ValueError`` names the
    offending row or entry. Traced input is checked the same way at a point of `attnflow.sweep`:
    a chain that is not one fails that point with the message (NaN values, named in
    ``SweepResult.failures``) and the point goes on with the uniform chain, so that it costs no
    more than a good point. Elsewhere (inside the user's own ``jit`` or ``vmap``) traced input
    is let through as given.
    """

    pi: jax.Array
    P: jax.Array

    def __init__(self, pi: Any, P: Any, tol: float = CHAIN_TOL):
        if V.any_traced((pi, P)):
            pi, P = _floats(pi), _floats(P)
            bad = _check_chain_traced(pi, P, tol)
            # a sweep point that is no chain learns the uniform one instead (its values are NaN anyway):
            # a solve of a non-chain can take every step max_steps allows, which its chunk would wait for
            if recording():
                d = pi.shape[-1]
                pi = jnp.where(bad, jnp.full_like(pi, 1.0 / d), pi)
                P = jnp.where(bad, jnp.full_like(P, 1.0 / d), P)
            self.pi, self.P = pi, P
            return
        pi_np, P_np = V.reals("pi", pi), V.reals("P", P)
        _check_chain(pi_np, P_np, tol)
        self.pi = _floats(pi_np)
        self.P = _floats(np.clip(P_np, 0.0, None))

    @property
    def d(self) -> int:
        """Vocabulary size."""
        return self.pi.shape[0]

    # ---------------------------------------------------------------- constructors
    @classmethod
    def lazy(cls, pi: Any = SYNTHETIC_PI, lam: Any = 0.5) -> MarkovChain:
        """The lazy chain (D1) ``P = lam I + (1 - lam) 1 pi^T``: stay with probability ``lam``,
        else redraw from ``pi``. Valid for ``-min_k pi_k / (1 - pi_k) <= lam <= 1``.

        ``pi`` and ``lam`` may be traced (a sweep over ``lam`` or over a perturbed ``pi``).
        """
        if not V.any_traced((pi, lam)):
            check_pi(np.asarray(pi, dtype=float), CHAIN_TOL)
            V.finite_scalar("lam", lam)
        bad_lam = _check_lazy_lam(pi, lam)  # on the inputs as given: float32 rounding would refuse the edge
        pi = _floats(pi)
        lam = _floats(lam)
        if bad_lam is not None and recording():  # a failed sweep point learns the chain of lam = 0 (see __init__)
            lam = jnp.where(bad_lam, jnp.zeros_like(lam), lam)
        d = pi.shape[0]
        return cls(pi, lam * jnp.eye(d, dtype=pi.dtype) + (1 - lam) * jnp.outer(jnp.ones(d, dtype=pi.dtype), pi))

    @classmethod
    def reversible(cls, pi: Any = SYNTHETIC_PI, key: Any = 0, iterations: int = 2000) -> MarkovChain:
        """A random reversible chain with stationary law ``pi`` (D2): a random symmetric
        ``K >= 0`` (``K = B + B^T``, ``B`` uniform on ``[0, 1]`` drawn from ``key``), the symmetric
        Sinkhorn iteration ``x <- sqrt(x pi / (K x))`` run ``iterations`` times so that
        ``x (K x) = pi``, the joint law ``J = diag(x) K diag(x)`` of ``(X_t, X_{t+1})`` and
        ``P = Pi^{-1} J``. Checked to `REVERSIBLE_TOL` when concrete; ``key`` may be traced
        (a sweep over random chains)."""
        iterations = V.positive_int("iterations", iterations)
        if not V.any_traced(pi):
            check_pi(np.asarray(pi, dtype=float), CHAIN_TOL)
        pi = _floats(pi)
        B = jax.random.uniform(V.prng_key(key), (pi.shape[0], pi.shape[0]), dtype=pi.dtype)
        K = B + B.T
        x = jax.lax.fori_loop(0, iterations, lambda _, x: jnp.sqrt(x * pi / (K @ x)), jnp.sqrt(pi))
        J = x[:, None] * K * x[None, :]
        J = 0.5 * (J + J.T)
        P = J / pi[:, None]
        P = P / jnp.sum(P, axis=1, keepdims=True)
        return cls(pi, P, tol=REVERSIBLE_TOL)

    # ---------------------------------------------------------------- statistics
    def entropy(self) -> jax.Array:
        """Unigram entropy ``H(pi)`` (S2): the loss on the condensation plateau."""
        return -jnp.sum(self.pi * jnp.log(self.pi))

    def bayes_floor(self) -> jax.Array:
        """The Bayes floor ``L_* = sum_q pi_q H(P_q)`` (S1): the lowest reachable loss."""
        P = self.P
        logP = jnp.log(jnp.where(P > 0, P, 1.0))
        return -jnp.sum(self.pi * jnp.sum(jnp.where(P > 0, P * logP, 0.0), axis=1))

    def lag_one_cov(self, f: Any, g: Any) -> jax.Array:
        """``Cov_{pi,P}(f(X_t), g(X_{t+1})) = sum_q pi_q f_q (P g)_q - E_pi f E_pi g`` (S3)."""
        f, g = jnp.asarray(f), jnp.asarray(g)
        return jnp.sum(self.pi * f * (self.P @ g)) - jnp.sum(self.pi * f) * jnp.sum(self.pi * g)

    # ---------------------------------------------------------------- sampling
    def sample(
        self, key: Any, batch_size: int, length: int, start: Literal["uniform", "pi"] = "uniform", burn_in: int = 0
    ) -> jax.Array:
        """Token sequences of shape ``(batch_size, length)``: ``x_1`` uniform on the ``d`` tokens
        (``start="uniform"``) or drawn from ``pi`` (``start="pi"``), then ``x_{j+1} ~ P[x_j]``;
        with ``burn_in`` (default 0, the spec's) the chain first runs that many steps, which are
        dropped (a start closer to ``pi``).

        The start law is a validated string: it picks one of two distributions (no code path
        beyond the first token's logits), so an object would add a class for one line.
        """
        V.positive_int("batch_size", batch_size)
        V.positive_int("length", length)
        V.choice("start", start, ("uniform", "pi"))
        burn_in = V.positive_int("burn_in", burn_in, minimum=0)
        length = length + burn_in
        k0, k1 = jax.random.split(V.prng_key(key))
        logits0 = jnp.zeros(self.d, dtype=self.pi.dtype) if start == "uniform" else jnp.log(self.pi)
        x0 = jax.random.categorical(k0, logits0, shape=(batch_size,))
        cdf = jnp.cumsum(self.P, axis=1)
        u = jax.random.uniform(k1, (length - 1, batch_size), dtype=cdf.dtype)

        def step(x, uu):
            # inverse-CDF draw: the number of cumulative row entries at or below u
            nxt = jnp.minimum(jnp.sum(cdf[x] <= uu[:, None], axis=1), self.d - 1).astype(x.dtype)
            return nxt, nxt

        _, rest = jax.lax.scan(step, x0, u)
        return jnp.concatenate([x0[:, None], rest.T], axis=1)[:, burn_in:]


def perturbed_pi(pi1: Any = 0.75, d: int = 4, delta: Any = 0.0, direction: Any = None) -> jax.Array:
    """The ``delta``-perturbed stationary law (D3) ``pi = (pi_1, rho + delta c_2, ..., rho + delta c_d)``
    with ``rho = (1 - pi_1) / (d - 1)`` and ``c = (0, +1, 0, ..., 0, -1)``, or a user
    ``direction`` ``c`` with ``c_1 = 0`` and ``sum c = 0``. For ``d = 4``:
    ``(pi_1, rho + delta, rho, rho - delta)``. ``pi1`` and ``delta`` may be traced."""
    d = V.positive_int("d", d, minimum=3)
    if direction is None:
        c = np.zeros(d)
        c[1], c[-1] = 1.0, -1.0
    else:
        c = np.asarray(direction, dtype=float)
        if c.shape != (d,) or abs(c[0]) > 1e-15 or abs(c.sum()) > 1e-12:
            raise ValueError(f"direction must have shape ({d},), first entry 0 and sum 0, got {direction!r}")
    if not V.any_traced((pi1, delta)):
        p1, dl = V.finite_scalar("pi1", pi1), V.finite_scalar("delta", delta)
        if not 0 < p1 < 1:
            raise ValueError(f"pi1 must be in (0, 1), got {p1:g}")
        pi_np = np.concatenate([[p1], np.full(d - 1, (1 - p1) / (d - 1))]) + dl * c
        if np.any(pi_np <= 0):
            raise ValueError(f"delta = {dl:g} makes an entry of pi non-positive: {[float(f'{x:.6g}') for x in pi_np]}")
    pi1, delta = _floats(pi1), _floats(delta)
    rho = (1 - pi1) / (d - 1)
    pi = jnp.concatenate([pi1[None], jnp.full(d - 1, rho)]) + delta * jnp.asarray(c, dtype=pi1.dtype)
    if V.any_traced((pi1, delta)):  # a sweep point: fails with the message, and goes on uniform (see MarkovChain)
        bad = ~((pi1 > 0) & (pi1 < 1) & jnp.all(pi > 0))
        check_traced(lambda: bad, "pi1 must be in (0, 1) and delta must keep every entry of pi positive (perturbed_pi)")
        if recording():
            pi = jnp.where(bad, jnp.full_like(pi, 1.0 / d), pi)
    return pi


def random_windows(key: Any, tokens: jax.Array, batch_size: int, length: int) -> jax.Array:
    """``batch_size`` windows of ``length`` consecutive tokens, at uniform random starts in the 1-D
    token stream ``tokens``: shape ``(batch_size, length)``. Traceable (``tokens`` may be data)."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D stream of token ids, got shape {tokens.shape}")
    if tokens.shape[0] <= length:
        raise ValueError(f"the token stream has {tokens.shape[0]} tokens, fewer than the window length {length}")
    starts = jax.random.randint(V.prng_key(key), (batch_size,), 0, tokens.shape[0] - length)
    return jax.vmap(lambda i: jax.lax.dynamic_slice(tokens, (i,), (length,)))(starts)


# ----------------------------------------------------------------------------- real text
class Tokenizer(eqx.Module):
    """How a document becomes tokens. Concrete tokenizers: `Characters`, `Words`; subclass it
    (implementing `split`) for another one."""

    @abc.abstractmethod
    def split(self, document: str) -> list[str]:
        """The tokens of one document, in order."""


class Characters(Tokenizer):
    """Every character is a token (whitespace and newlines included)."""

    def split(self, document: str) -> list[str]:
        return list(document)


class Words(Tokenizer):
    """Whitespace-separated words are tokens (``str.split``)."""

    def split(self, document: str) -> list[str]:
        return document.split()


@dataclass(frozen=True)
class CorpusChain:
    """A chain estimated from text (`from_text`, `from_file`), with what it was estimated from.

    ``chain``: the `MarkovChain` on the ``K + 1`` classes (top ``K`` tokens and ``<other>``);
    ``vocab``: the class names; ``streams``: one array of class ids per document;
    ``unigram``: empirical class frequencies; ``bigram_counts``: within-document bigram counts
    ``n_jk``; ``diagnostics``: ``tokens``, ``documents`` and ``l1_pi_vs_unigram``
    (``|pi - unigram|_1``).
    """

    chain: MarkovChain
    vocab: list
    streams: list
    unigram: np.ndarray
    bigram_counts: np.ndarray
    diagnostics: dict = field(default_factory=dict)

    @classmethod
    def from_text(
        cls, text: str, tokenizer: Tokenizer | None = None, top_k: int = 64, alpha: float = 0.5
    ) -> CorpusChain:
        """Estimate ``(pi, P)`` from plain text (E1-E3).

        Documents are separated by blank lines and split into tokens by ``tokenizer`` (default
        `Characters`). The ``top_k`` most frequent tokens are kept (ties broken by first
        appearance) plus an ``<other>`` class (index ``top_k``).
        ``P_jk = (n_jk + alpha) / (n_j + alpha (K + 1))`` from bigram counts within documents,
        and ``pi`` is the left Perron vector of ``P`` (its stationary law).
        """
        tokenizer = Characters() if tokenizer is None else tokenizer
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"tokenizer must be a Tokenizer (Characters(), Words(), ...), got {tokenizer!r}")
        top_k = V.positive_int("top_k", top_k)
        V.nonnegative("alpha", alpha)
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text must be a non-empty string")
        docs = [d for d in re.split(r"\n\s*\n", text) if d.strip()]
        docs_tokens = [tokenizer.split(d) for d in docs]
        counts = Counter(t for d in docs_tokens for t in d)
        if not counts:
            raise ValueError(f"the tokenizer {tokenizer!r} found no tokens in the text")
        first: dict[str, int] = {}
        for d in docs_tokens:
            for t in d:
                first.setdefault(t, len(first))
        vocab = sorted(counts, key=lambda t: (-counts[t], first[t]))[:top_k]
        index = {t: i for i, t in enumerate(vocab)}
        K = len(vocab)
        streams = [np.array([index.get(t, K) for t in d], dtype=np.int64) for d in docs_tokens]
        n = np.zeros((K + 1, K + 1))
        uni = np.zeros(K + 1)
        for s in streams:
            np.add.at(uni, s, 1)
            if s.size > 1:
                np.add.at(n, (s[:-1], s[1:]), 1)
        if alpha == 0 and np.any(n.sum(axis=1) == 0):
            j = int(np.flatnonzero(n.sum(axis=1) == 0)[0])
            name = [*vocab, "<other>"][j]
            raise ValueError(f"token {name!r} never has a successor, so its row of P is undefined; use alpha > 0")
        P = (n + alpha) / (n.sum(axis=1, keepdims=True) + alpha * (K + 1))
        w, vl = np.linalg.eig(P.T)
        pi = np.real(vl[:, np.argmin(np.abs(w - 1))])
        pi = np.abs(pi) / np.abs(pi).sum()
        pi_uni = uni / uni.sum()
        return cls(
            chain=MarkovChain(pi, P, tol=CORPUS_TOL),
            vocab=[*vocab, "<other>"],
            streams=streams,
            unigram=pi_uni,
            bigram_counts=n,
            diagnostics={
                "l1_pi_vs_unigram": float(np.abs(pi - pi_uni).sum()),
                "tokens": int(uni.sum()),
                "documents": len(streams),
            },
        )

    @classmethod
    def from_file(
        cls,
        name: str,
        data_dir: Any = None,
        tokenizer: Tokenizer | None = None,
        top_k: int = 64,
        alpha: float = 0.5,
        max_chars: int | None = None,
    ) -> CorpusChain:
        """`from_text` on the plain-text file ``name``, found by `attnflow.data_path`: as given,
        else in ``data_dir``, else in the folder named by ``$ATTNFLOW_DATA`` (a
        ``FileNotFoundError`` names both when it is missing). ``max_chars``: read only the
        first characters."""
        path = data_path(name, data_dir)
        text = path.read_text(encoding="utf-8", errors="replace")
        if max_chars is not None:
            text = text[: V.positive_int("max_chars", max_chars)]
        return cls.from_text(text, tokenizer=tokenizer, top_k=top_k, alpha=alpha)

    def stream(self) -> np.ndarray:
        """All documents' class ids, concatenated."""
        return np.concatenate(self.streams)

    def windows(self, key: Any, batch_size: int, length: int) -> jax.Array:
        """`random_windows` of the concatenated stream."""
        return random_windows(key, jnp.asarray(self.stream()), batch_size, length)
