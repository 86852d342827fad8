"""Metrics of focus and dilution (docs/focus.md, "Metrics"): functions of ``(theta, pi)`` and of
trajectories. Generic trajectory tools (growth rates, plateaus, fits) are the core's
`attnflow.analysis`; the ones here are specific to the stages of this theory.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..analysis import growth_rate
from ..trajectory import Trajectory
from .data import MarkovChain
from .model import OneLayerAttention, _mean_by_query_type, composites
from .theory import attention_rate, centred_log_pi

__all__ = [
    "condensation",
    "cosine",
    "RANK_KINDS",
    "effective_rank",
    "embedding_pca",
    "kl_to_pi",
    "local_attention_rate",
    "participation_ratio",
    "positional_entropy",
    "redistribution",
    "singular_values",
    "stage_one_rate",
    "stage_sequence",
    "stage_two_rate",
    "token_entropy",
]


def token_entropy(A: jax.Array, weights: Any = None) -> jax.Array:
    """Token-level attention entropy ``H_q = -sum_k A_qk log A_qk`` of each query row of ``A``
    (shape ``(..., d)``), or, with ``weights`` ``w`` (d,), the aggregate ``sum_q w_q H_q``:
    ``weights=pi`` is the ``pi``-weighted entropy (the reference metric), ``weights=ones/d``
    the uniform average. At initialisation (``A_q = pi``) the ``pi``-weighted value is ``H(pi)``."""
    A = jnp.asarray(A)
    H = -jnp.sum(jnp.where(A > 0, A * jnp.log(jnp.where(A > 0, A, 1.0)), 0.0), axis=-1)
    return H if weights is None else jnp.sum(jnp.asarray(weights) * H, axis=-1)


def positional_entropy(model: OneLayerAttention, seqs: jax.Array) -> jax.Array:
    """The direct positional entropy ``H_q`` (d,): the mean over contexts ``seqs[:, :-1]`` whose
    query (last token) is of type ``q`` of ``-sum_i a_i log a_i``, the entropy of the attention
    over the ``s`` positions (`token_entropy` of each context's attention; NaN for query types
    never seen). At finite ``s`` it tends to ``log s - KL(A_q || pi)`` (`kl_to_pi`)."""
    return _mean_by_query_type(model, seqs, lambda a, ctx: token_entropy(a))


def kl_to_pi(A: jax.Array, pi: Any) -> jax.Array:
    """``KL(A_q || pi)`` per query row (d,): at context length ``s`` the positional attention
    entropy tends to ``log s - KL(A_q || pi)``."""
    return jnp.sum(A * (jnp.log(A) - jnp.log(jnp.asarray(pi))[None]), axis=-1)


def cosine(u: Any, v: Any, signed: bool = False) -> jax.Array:
    """Cosine between vectors or (flattened, Frobenius) matrices; its absolute value unless
    ``signed`` (singular vectors have no sign)."""
    u, v = jnp.ravel(jnp.asarray(u)), jnp.ravel(jnp.asarray(v))
    c = u @ v / (jnp.linalg.norm(u) * jnp.linalg.norm(v))
    return c if signed else jnp.abs(c)


def singular_values(W: Any, k: int | None = None) -> jax.Array:
    """Singular values of ``W``, largest first (the top ``k`` if given)."""
    s = jnp.linalg.svd(jnp.asarray(W), compute_uv=False)
    return s if k is None else s[:k]


RANK_KINDS = ("entropy", "participation", "threshold")
"""The definitions `effective_rank` offers (spec: effective rank [open], default entropy)."""


def effective_rank(W: Any, kind: str = "entropy", rtol: float = 1e-2) -> jax.Array:
    """Effective rank of ``W`` from its singular values ``s_i`` (spec: [open], `RANK_KINDS`):
    ``"entropy"`` (default) ``exp(-sum p_i log p_i)``, ``p_i = s_i / sum_j s_j``;
    ``"participation"`` ``(sum_i s_i)^2 / sum_i s_i^2`` (`participation_ratio`);
    ``"threshold"`` the number of ``s_i > rtol * s_max`` (a float, so that the kinds share a
    dtype)."""
    kind = V.choice("kind", kind, RANK_KINDS)
    if kind == "participation":
        return participation_ratio(W)
    s = jnp.linalg.svd(jnp.asarray(W), compute_uv=False)
    if kind == "threshold":
        V.positive("rtol", rtol)
        return jnp.sum(s > rtol * jnp.max(s)).astype(s.dtype)
    p = s / jnp.sum(s)
    return jnp.exp(-jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)))


def participation_ratio(W: Any) -> jax.Array:
    """``(sum_i s_i)^2 / sum_i s_i^2`` over the singular values of ``W``."""
    s = jnp.linalg.svd(jnp.asarray(W), compute_uv=False)
    return jnp.sum(s) ** 2 / jnp.sum(s**2)


def condensation(theta: dict, pi: Any) -> dict[str, jax.Array]:
    """Sign-invariant condensation cosines (Stage I and II): ``cos_W0_pi`` (``u1(W0)`` vs ``pi``),
    ``cos_W1_centred_pi`` (``v1(W1)`` vs ``pi - 1/d``), ``cos_W1_ell`` (``v1(W1)`` vs ``ell``),
    ``cos_Phi_pipi`` (signed, ``Phi`` vs ``pi pi^T``), ``cos_WQ_alpha1`` and ``cos_WK_alpha1``
    (``u1(WQ)``, ``u1(WK)`` vs ``alpha1 = v1(W0)``)."""
    pi = jnp.asarray(pi)
    d = pi.shape[0]
    U0, _, V0 = jnp.linalg.svd(theta["W0"], full_matrices=False)
    _, _, V1 = jnp.linalg.svd(theta["W1"], full_matrices=False)
    alpha1 = V0[0]
    _, Phi = composites(theta)
    uq = jnp.linalg.svd(theta["WQ"], full_matrices=False)[0][:, 0]
    uk = jnp.linalg.svd(theta["WK"], full_matrices=False)[0][:, 0]
    return {
        "cos_W0_pi": cosine(U0[:, 0], pi),
        "cos_W1_centred_pi": cosine(V1[0], pi - 1.0 / d),
        "cos_W1_ell": cosine(V1[0], centred_log_pi(pi)),
        "cos_Phi_pipi": cosine(Phi, jnp.outer(pi, pi), signed=True),
        "cos_WQ_alpha1": cosine(uq, alpha1),
        "cos_WK_alpha1": cosine(uk, alpha1),
    }


def redistribution(theta: dict, pi: Any) -> dict[str, jax.Array]:
    """Stage II and III coordinates (R6) of the rank-one part of ``theta``.

    ``gamma = s1 u1(W0)`` signed so that ``pi^T gamma > 0``, ``alpha1 = v1(W0)`` with the same
    sign, and, with ``rho = (1 - pi_1)/(d - 1)``:

    - ``D_token`` (d - 1,): ``rho gamma_1 - pi_1 gamma_i`` for each rare token ``i >= 2``;
    - ``D``: their sum, ``(1 - pi_1) gamma_1 - pi_1 sum_{i>=2} gamma_i``. With symmetric rare
      tokens (all ``gamma_i`` equal) ``D = (d - 1) (rho gamma_1 - pi_1 gamma_i)``: ``(d - 1)``
      times the per-token coordinate. Both vanish on the ``pi`` ray;
    - ``kappa = (alpha1^T WQ) . (alpha1^T WK)``, so ``Phi ~ kappa gamma gamma^T``;
    - ``q = |alpha1^T WQ| + |alpha1^T WK|``; ``q_plus = |alpha1^T (WQ + WK)|/sqrt 2`` and
      ``q_minus = |alpha1^T (WQ - WK)|/sqrt 2``, the amplitudes of the unstable (``+c``) and
      stable (``-c``) attention modes at ``theta_c^1``.

    ``D`` grows like ``kappa``, i.e. at rate ``2c`` (the rate of ``Phi``) when ``q_plus`` grows at
    rate ``c``.
    """
    pi = jnp.asarray(pi)
    U, s, Vt = jnp.linalg.svd(theta["W0"], full_matrices=False)
    gamma = s[0] * U[:, 0]
    sign = jnp.where(pi @ gamma < 0, -1.0, 1.0)
    gamma = gamma * sign
    alpha1 = Vt[0] * sign
    rho = (1 - pi[0]) / (pi.shape[0] - 1)
    D_token = rho * gamma[0] - pi[0] * gamma[1:]
    aq, ak = alpha1 @ theta["WQ"], alpha1 @ theta["WK"]
    return {
        "gamma": gamma,
        "D": jnp.sum(D_token),
        "D_token": D_token,
        "kappa": aq @ ak,
        "q": jnp.linalg.norm(aq) + jnp.linalg.norm(ak),
        "q_plus": jnp.linalg.norm(aq + ak) / jnp.sqrt(2.0),
        "q_minus": jnp.linalg.norm(aq - ak) / jnp.sqrt(2.0),
    }


def local_attention_rate(theta: dict, chain: MarkovChain, tau: Any = 1.0, eta: Any = 1.0) -> jax.Array:
    """The general Stage II rate (R3) at the current rank-one part ``gamma = W0 a1``,
    ``beta = W1^T a1`` (``a1 = v1(W0)``, sign with ``pi^T gamma > 0``): the prediction for
    wherever near the critical manifold the flow actually sits. On the clock of a flow with
    learning rate ``eta`` (times ``eta``, as `stage_predictions`' ``c`` and the rate
    `stage_two_rate` measures): pass the setup's ``eta``."""
    a1 = jnp.linalg.svd(theta["W0"], full_matrices=False)[2][0]
    gamma = theta["W0"] @ a1
    s = jnp.where(chain.pi @ gamma < 0, -1.0, 1.0)
    return eta * attention_rate(chain.pi, chain.P, tau, gamma * s, (theta["W1"].T @ a1) * s)


def stage_one_rate(traj: Trajectory, start: float = 30.0, stop: float = 1e-2) -> float:
    """Measured Stage I rate: the log-slope of ``norm_M`` while ``|M|`` grows from ``start`` times
    its initial value to ``stop`` (prediction ``2 sigma``, (R1)); the growth is linear while
    ``|M|`` is small. ``ValueError`` when that window is empty (an initial scale ``eps`` so
    large that ``start |M(0)| >= stop``: raise ``stop`` or lower ``start``, at the price of a
    rate less linear)."""
    M = np.asarray(traj["norm_M"])
    lo = start * float(M[0])
    if not lo < stop:
        raise ValueError(
            f"stage_one_rate: the window from start |M(0)| = {start:g} x {float(M[0]):.3g} = {lo:.3g} to "
            f"stop = {stop:g} is empty (a large initial scale eps): give a larger stop or a smaller start"
        )
    return growth_rate(traj.ts, M, lo, stop)


def stage_two_rate(traj: Trajectory, H_pi: float, near: float = 2e-3, q_max: float = 0.1) -> dict[str, Any]:
    """Measured Stage II rate from a flow that passes ``theta_c^1``.

    The log-slope ``c`` of ``q_plus`` (the unstable attention mode) from the first save where the
    loss is within ``near`` of ``H(pi)`` until ``q_plus`` reaches ``q_max``. The flow approaches
    ``theta_c^1`` slowly along a neutral direction, so the general formula (R3) is also averaged
    over that window (``c_path``, needs the observable ``c_local`` = `local_attention_rate` with the
    setup's ``eta``, so that both are on the flow's clock).
    Returns ``{"c", "c_path", "window": (t_a, t_b)}``.
    """
    ts = np.asarray(traj.ts)
    loss, q = np.asarray(traj["loss"]), np.asarray(traj["q_plus"])
    a = int(np.argmax(loss < H_pi + near))
    b = a + int(np.argmax(q[a:] > q_max))
    sl = slice(a, b + 1)
    c = growth_rate(ts[sl], q[sl], 0.0, np.inf) if b - a >= 3 else float("nan")
    c_path = float("nan")
    if "c_local" in traj and b > a:
        c_path = float(np.trapezoid(np.asarray(traj["c_local"])[sl], ts[sl]) / (ts[b] - ts[a]))
    return {"c": c, "c_path": c_path, "window": (float(ts[a]), float(ts[b]))}


def stage_sequence(plateaus: list[dict], t_end: float, rates: dict | None = None) -> list[list]:
    """Alternating transitions and plateaus ``[stage, t_start, t_end, loss level, measured rate,
    predicted rate]`` from `attnflow.detect_plateaus`. ``rates`` maps a plateau index to the
    ``(measured, predicted)`` growth rate of the unstable mode that grows while the loss sits on
    that plateau (the saddle's escape rate), printed beside each other."""
    rows, prev = [], 0.0
    rates = rates or {}
    for k, p in enumerate([*plateaus, {"t_start": t_end, "t_end": t_end, "level": None}]):
        if p["t_start"] > prev:
            rows.append([f"transition {k + 1}", round(prev, 4), round(p["t_start"], 4), None, None, None])
        if p["level"] is not None:
            meas, pred = rates.get(k, (None, None))
            rows.append(
                [f"plateau {k + 1}", round(p["t_start"], 4), round(p["t_end"], 4), round(p["level"], 5), meas, pred]
            )
        prev = p["t_end"]
    return rows


def embedding_pca(W0_snapshots: Any, n_components: int = 2) -> np.ndarray:
    """Rows of ``W0`` over snapshots ``(T, d, m)`` stacked to ``(T d, m)``, centred and projected
    on their top ``n_components`` principal axes: shape ``(T, d, n_components)``. Compare within
    one run only (rotations of ``R^m`` are symmetries)."""
    W = np.asarray(W0_snapshots)
    T, d, m = W.shape
    X = W.reshape(T * d, m)
    X = X - X.mean(0)
    _, _, Vt = np.linalg.svd(X, full_matrices=False)
    return (X @ Vt[:n_components].T).reshape(T, d, n_components)
