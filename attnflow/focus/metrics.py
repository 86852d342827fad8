"""Metrics of focus and dilution (spec `focus.md` section 6): functions of ``(theta, pi)``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .theory import attention, centred_log_pi, composites

__all__ = ["token_entropy", "kl_to_pi", "cosine", "singular_values", "effective_rank", "condensation", "redistribution",
           "growth_rate", "detect_plateaus", "embedding_pca", "observables"]


def token_entropy(A: jax.Array, pi: jax.Array, weighting: str = "pi") -> jax.Array:
    """Token-level attention entropy ``H_q = -sum_k A_qk log A_qk``, aggregated ``pi``-weighted
    (default), ``uniform``, or returned ``per_query``."""
    V.choice("weighting", weighting, ("pi", "uniform", "per_query"))
    H = -jnp.sum(jnp.where(A > 0, A * jnp.log(jnp.where(A > 0, A, 1.0)), 0.0), axis=-1)
    if weighting == "per_query":
        return H
    if weighting == "uniform":
        return jnp.mean(H, axis=-1)
    return jnp.sum(pi * H, axis=-1)


def kl_to_pi(A: jax.Array, pi: jax.Array) -> jax.Array:
    """``KL(A_q || pi)`` per query (positional entropy at finite s is ``log s - KL``)."""
    return jnp.sum(A * (jnp.log(A) - jnp.log(pi)[None]), axis=-1)


def cosine(u: jax.Array, v: jax.Array, signed: bool = False) -> jax.Array:
    """Cosine (absolute value unless ``signed``) between vectors or, flattened, matrices."""
    u, v = jnp.ravel(u), jnp.ravel(v)
    c = u @ v / (jnp.linalg.norm(u) * jnp.linalg.norm(v))
    return c if signed else jnp.abs(c)


def singular_values(W: jax.Array, k: int | None = None) -> jax.Array:
    s = jnp.linalg.svd(W, compute_uv=False)
    return s if k is None else s[:k]


def effective_rank(W: jax.Array, kind: str = "entropy") -> jax.Array:
    """``exp(-sum p_i log p_i)`` with ``p_i = s_i / sum s_j`` (``entropy``, default) or the
    participation ratio ``(sum s)^2 / sum s^2``."""
    V.choice("kind", kind, ("entropy", "participation"))
    s = jnp.linalg.svd(W, compute_uv=False)
    if kind == "participation":
        return jnp.sum(s) ** 2 / jnp.sum(s**2)
    p = s / jnp.sum(s)
    return jnp.exp(-jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)))


def condensation(theta: dict, pi: jax.Array) -> dict:
    """Sign-invariant condensation cosines: ``u1(W0)`` vs ``pi``; ``v1(W1)`` vs ``pi - 1/d`` and vs
    ``ell``; ``Phi`` vs ``pi pi^T``; ``u1(WQ)``, ``u1(WK)`` vs ``alpha_1 = v1(W0)``."""
    d = pi.shape[0]
    U0, _, V0 = jnp.linalg.svd(theta["W0"], full_matrices=False)
    _, _, V1 = jnp.linalg.svd(theta["W1"], full_matrices=False)
    alpha1 = V0[0]
    _, Phi = composites(theta)
    uq = jnp.linalg.svd(theta["WQ"], full_matrices=False)[0][:, 0]
    uk = jnp.linalg.svd(theta["WK"], full_matrices=False)[0][:, 0]
    return {"cos_W0_pi": cosine(U0[:, 0], pi), "cos_W1_centred_pi": cosine(V1[0], pi - 1.0 / d),
            "cos_W1_ell": cosine(V1[0], centred_log_pi(pi)), "cos_Phi_pipi": cosine(Phi, jnp.outer(pi, pi), signed=True),
            "cos_WQ_alpha1": cosine(uq, alpha1), "cos_WK_alpha1": cosine(uk, alpha1)}


def redistribution(theta: dict, pi: jax.Array) -> dict:
    """Stage III quantities: ``gamma = s1 u1(W0)`` with ``pi^T gamma > 0``,
    ``D = (1 - pi_1) gamma_1 - pi_1 sum_{i>=2} gamma_i``, ``kappa = (alpha1^T WQ).(alpha1^T WK)``,
    and the Stage II growth coordinate ``q = |alpha1^T WQ| + |alpha1^T WK|``."""
    U, s, Vt = jnp.linalg.svd(theta["W0"], full_matrices=False)
    gamma = s[0] * U[:, 0]
    sign = jnp.sign(pi @ gamma)
    gamma = gamma * sign
    alpha1 = Vt[0] * sign
    D = (1 - pi[0]) * gamma[0] - pi[0] * jnp.sum(gamma[1:])
    aq, ak = alpha1 @ theta["WQ"], alpha1 @ theta["WK"]
    # (aq + ak) is the unstable Stage II mode (eigenvalue +c), (aq - ak) the stable one (-c)
    return {"gamma": gamma, "D": D, "kappa": aq @ ak, "q": jnp.linalg.norm(aq) + jnp.linalg.norm(ak),
            "q_plus": jnp.linalg.norm(aq + ak) / jnp.sqrt(2.0), "q_minus": jnp.linalg.norm(aq - ak) / jnp.sqrt(2.0)}


def local_attention_rate(theta: dict, chain: Any, tau: Any = 1.0) -> jax.Array:
    """The general Stage II rate ``tau Var_pi(gamma) Cov_{pi,P}(gamma, beta)`` evaluated at the current
    rank-one part ``gamma = W0 a1``, ``beta = W1^T a1`` (``a1 = v1(W0)``, sign with ``pi^T gamma > 0``):
    the prediction for wherever on the critical manifold the flow actually sits."""
    from .theory import attention_rate

    _, _, Vt = jnp.linalg.svd(theta["W0"], full_matrices=False)
    a1 = Vt[0]
    gamma = theta["W0"] @ a1
    s = jnp.sign(chain.pi @ gamma)
    gamma, beta = gamma * s, (theta["W1"].T @ a1) * s
    return attention_rate(chain.pi, chain.P, tau, gamma, beta)


def observables(theta: dict, chain: Any, tau: Any = 1.0) -> dict:
    """Everything `focus` experiments record at a save time (population quantities)."""
    from .theory import population_loss

    A = attention(theta, chain.pi, tau)
    M, Phi = composites(theta)
    red = redistribution(theta, chain.pi)
    out = {"loss": population_loss(theta, chain, tau), "entropy": token_entropy(A, chain.pi),
           "entropy_per_query": token_entropy(A, chain.pi, "per_query"), "kl_to_pi": kl_to_pi(A, chain.pi), "A": A,
           "norm_M": jnp.linalg.norm(M), "norm_Phi": jnp.linalg.norm(Phi), "D": red["D"], "kappa": red["kappa"], "q": red["q"],
           "q_plus": red["q_plus"], "q_minus": red["q_minus"],
           "W0": theta["W0"], "c_local": local_attention_rate(theta, chain, tau)}
    for k in ("W0", "W1", "WQ", "WK"):
        out[f"sv_{k}"] = singular_values(theta[k], 4)
    out.update(condensation(theta, chain.pi))
    return out


def growth_rate(ts: Any, y: Any, lo: float, hi: float) -> float:
    """Least-squares slope of ``log y`` against ``t`` over the first contiguous stretch with
    ``lo <= y <= hi`` (a measured exponential rate)."""
    ts, y = np.asarray(ts), np.asarray(y)
    inside = (y >= lo) & (y <= hi)
    idx = np.flatnonzero(inside)
    if idx.size < 3:
        return float("nan")
    breaks = np.flatnonzero(np.diff(idx) > 1)
    seg = idx[: breaks[0] + 1] if breaks.size else idx
    if seg.size < 3:
        return float("nan")
    return float(np.polyfit(ts[seg], np.log(y[seg]), 1)[0])


def detect_plateaus(ts: Any, loss: Any, rel_tol: float = 1e-3, min_duration: float = 0.0) -> list[dict]:
    """Plateaus of a loss curve: maximal runs of save times where the relative loss change per unit
    log-time stays below ``rel_tol``. Returns ``[{"t_start", "t_end", "level"}]`` in order."""
    ts, loss = np.asarray(ts, dtype=float), np.asarray(loss, dtype=float)
    keep = ts > 0
    t, L = ts[keep], loss[keep]
    rate = np.abs(np.diff(np.log(L))) / np.maximum(np.diff(np.log(t)), 1e-300)
    flat = rate < rel_tol
    out = []
    i = 0
    while i < flat.size:
        if flat[i]:
            j = i
            while j + 1 < flat.size and flat[j + 1]:
                j += 1
            if t[j + 1] - t[i] >= min_duration:
                out.append({"t_start": float(t[i]), "t_end": float(t[j + 1]), "level": float(np.mean(L[i: j + 2]))})
            i = j + 1
        else:
            i += 1
    return out


def stage_sequence(plateaus: list[dict], t_end: float, rates: dict | None = None) -> list[list]:
    """Alternating transitions and plateaus ``[stage, t_start, t_end, loss level, measured rate,
    predicted rate]`` from `detect_plateaus`. ``rates`` maps a plateau index to the ``(measured,
    predicted)`` growth rate of the unstable mode that grows while the loss sits on that plateau
    (the saddle's escape rate), printed beside each other."""
    rows, prev = [], 0.0
    rates = rates or {}
    for k, p in enumerate(plateaus + [{"t_start": t_end, "t_end": t_end, "level": None}]):
        if p["t_start"] > prev:
            rows.append([f"transition {k + 1}", round(prev, 4), round(p["t_start"], 4), None, None, None])
        if p["level"] is not None:
            meas, pred = rates.get(k, (None, None))
            rows.append([f"plateau {k + 1}", round(p["t_start"], 4), round(p["t_end"], 4), round(p["level"], 5), meas, pred])
        prev = p["t_end"]
    return rows


def embedding_pca(W0_snapshots: Any, n_components: int = 2) -> np.ndarray:
    """Stack ``W0`` rows over snapshots ``(T, d, m)``, centre, SVD; returns ``(T, d, n_components)``."""
    W = np.asarray(W0_snapshots)
    T, d, m = W.shape
    X = W.reshape(T * d, m)
    X = X - X.mean(0)
    _, _, Vt = np.linalg.svd(X, full_matrices=False)
    return (X @ Vt[:n_components].T).reshape(T, d, n_components)
