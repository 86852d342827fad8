"""Attention metrics of the QK/OV paper: relevant-token mass, DTAP histograms, separability,
AC / ACMC, ERASER comprehensiveness and sufficiency, attention rollout."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V

__all__ = [
    "CONFIDENCES",
    "DTAP_EDGES",
    "attention_concentration",
    "comprehensiveness_sufficiency",
    "confident_concentration",
    "dtap",
    "relevant_mass",
    "rollout",
    "separability",
]

DTAP_EDGES = MappingProxyType(
    {
        "synthetic": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        "hatexplain": (0.0, 0.33, 0.66, 1.1),
        "sva": (0.0, 0.1, 0.5, 1.1),
        "squad": (0.0, 0.05, 0.1, 0.5, 1.001),
    }
)
"""DTAP bin edges of the paper per dataset (`dtap` uses the same edges on both axes by default)."""


def _keys_mask(a: jax.Array, keys: Any) -> jax.Array:
    if keys is None:
        return jnp.ones(a.shape, bool)
    keys = jnp.asarray(keys)
    if keys.shape != a.shape:
        raise ValueError(f"keys must have the shape of the attention {a.shape}, got {keys.shape}")
    return keys.astype(bool)


def relevant_mass(a: jax.Array, relevant: jax.Array, keys: Any = None) -> jax.Array:
    """``A_rel = sum_{i in keys} r_i a_i`` per example: the attention mass on the relevant
    positions, each weighted by its relevance ``r_i`` in ``[0, 1]`` (a boolean mask gives
    ``sum_{i in R} a_i``; HateXplain's mean rationale masks give fractional weights).

    ``a``, ``relevant`` and ``keys`` have shape (..., L); ``keys`` (bool, default: every
    position) marks the real tokens, so padding never counts. An example without relevant
    tokens has ``A_rel = 0``. `attnflow.qkov.evaluate_text` averages this over the examples
    that have relevant tokens. Concrete relevances outside ``[0, 1]`` (annotator counts, say)
    raise ``ValueError`` naming the first."""
    if not V.any_traced(relevant):
        given = np.asarray(relevant, dtype=float)
        bad = np.argwhere(~((given >= 0.0) & (given <= 1.0)))
        if bad.size:
            at = tuple(int(i) for i in bad[0])
            raise ValueError(
                f"relevant must hold relevances in [0, 1] (a mask or fractions; divide counts by the number of "
                f"annotators); entry {at} is {given[at]:g}"
            )
    a = jnp.asarray(a)
    r = jnp.asarray(relevant).astype(a.dtype)
    return jnp.sum(jnp.where(_keys_mask(a, keys), r * a, 0.0), axis=-1)


def _edges(e: Any) -> np.ndarray:
    if isinstance(e, str):
        raise ValueError(f"bin edges must be a sequence of numbers (e.g. DTAP_EDGES[{e!r}]), got {e!r}")
    e = np.asarray(e, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError(f"bin edges must be increasing with at least two entries, got {e!r}")
    return e


def _bin(x: jax.Array, edges: np.ndarray) -> jax.Array:
    """Bin index, left-closed bins with the last bin closed; -1 when out of range."""
    e = jnp.asarray(edges)
    i = jnp.searchsorted(e, x, side="right") - 1
    i = jnp.where(x == e[-1], e.size - 2, i)
    return jnp.where((x < e[0]) | (x > e[-1]) | (i > e.size - 2), -1, i)


def dtap(a_rel: Any, p_true: Any, edges_attention: Any = DTAP_EDGES["synthetic"], edges_prob: Any = None) -> jax.Array:
    """DTAP histogram (distinct-token attention vs probability): percent of examples per
    (attention bin, probability bin).

    Rows: bins of ``A_rel``; columns: bins of ``p_true``. Bins are left-closed, the last
    closed; out-of-range values are dropped (but still count in the denominator, as the
    authors normalise by the number of examples). ``a_rel``/``p_true`` may carry a leading
    seed axis: per-seed percentages are then averaged.
    """
    ea = _edges(edges_attention)
    ep = _edges(edges_attention if edges_prob is None else edges_prob)
    a_rel, p_true = jnp.asarray(a_rel), jnp.asarray(p_true)
    if a_rel.shape != p_true.shape:
        raise ValueError(f"a_rel and p_true must have the same shape, got {a_rel.shape} and {p_true.shape}")

    def one(ar, pt):
        ia, ip = _bin(ar, ea), _bin(pt, ep)
        ok = (ia >= 0) & (ip >= 0)
        flat = jnp.where(ok, ia * (ep.size - 1) + ip, 0)
        counts = jnp.zeros((ea.size - 1) * (ep.size - 1)).at[flat].add(ok.astype(float))
        return 100.0 * counts.reshape(ea.size - 1, ep.size - 1) / ar.shape[0]

    if a_rel.ndim == 1:
        return one(a_rel, p_true)
    return jnp.mean(jax.vmap(one)(a_rel.reshape(-1, a_rel.shape[-1]), p_true.reshape(-1, p_true.shape[-1])), axis=0)


def _separability_per_example(a: jax.Array, relevant: jax.Array, keys: Any = None) -> jax.Array:
    """``max_{i in R} a_i - min_{i in keys, i not in R} a_i`` per example, ``R`` the positions
    with ``relevant > 0`` (padding, outside ``keys``, is in neither set); NaN for an example
    without a relevant position or without a non-relevant key."""
    a = jnp.asarray(a)
    k = _keys_mask(a, keys)
    rel = (jnp.asarray(relevant) > 0) & k
    mx = jnp.max(jnp.where(rel, a, -jnp.inf), axis=-1)
    mn = jnp.min(jnp.where(k & ~rel, a, jnp.inf), axis=-1)
    ok = jnp.any(rel, axis=-1) & jnp.any(k & ~rel, axis=-1)
    return jnp.where(ok, mx - mn, jnp.nan)


def separability(a: jax.Array, relevant: jax.Array, keys: Any = None) -> jax.Array:
    """Mean of ``max_{i in R} a_i - min_{i in keys, i not in R} a_i`` (``R``: the positions with
    ``relevant > 0``) over the examples that have both a relevant position and a non-relevant
    key; NaN when none has. ``keys`` (bool, shape of ``a``, default: every
    position) marks the real tokens: padding is never the minimum."""
    s = _separability_per_example(a, relevant, keys)
    ok = jnp.isfinite(s)
    n = jnp.sum(ok)
    return jnp.where(n > 0, jnp.sum(jnp.where(ok, s, 0.0)) / jnp.maximum(n, 1), jnp.nan)


def _threshold(name: str, value: float) -> None:
    if not V.any_traced(value) and not (0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")


def attention_concentration(a_rel: Any, tau_a: float = 0.1, strict: bool = False) -> jax.Array:
    """AC: fraction of examples with ``A_rel >= tau_a`` (``>`` if strict). The paper describes AC only
    in words; this is the attention-only reading."""
    _threshold("tau_a", tau_a)
    a_rel = jnp.asarray(a_rel)
    return jnp.mean(a_rel > tau_a if strict else a_rel >= tau_a)


CONFIDENCES = ("true_prob", "pred_prob", "correct")
"""What `confident_concentration` can take as an example's confidence (spec section 10.6, an
open choice): the true class's probability (default), the predicted class's, or correctness."""


def confident_concentration(
    a_rel: Any,
    probs: Any,
    tau_a: float = 0.1,
    tau_p: float = 0.1,
    strict: bool = False,
    *,
    confidence: str = "true_prob",
    labels: Any = None,
) -> jax.Array:
    """ACMC (spec section 10.6): fraction of examples with ``A_rel >= tau_a`` and confidence
    ``>= tau_p`` (both ``>`` if strict); defaults ``tau_a = tau_p = 0.1``.

    ``confidence`` (`CONFIDENCES`) says what an example's confidence is: ``"true_prob"`` (default)
    ``p_y``, the true class's probability; ``"pred_prob"`` ``max_c p_c``, the predicted class's;
    ``"correct"`` 1 if ``argmax_c p_c = y`` else 0 (then ``tau_p`` must lie in ``(0, 1]``, or
    ``[0, 1)`` if strict, where it means "correct"). ``probs`` is either the class probabilities,
    shape ``a_rel.shape + (classes,)`` (with ``labels``, shape of ``a_rel``, for ``"true_prob"``
    and ``"correct"``), or the confidence itself per example, shape of ``a_rel`` (``p_true`` for
    ``"true_prob"``, 0/1 for ``"correct"``), used as given."""
    V.choice("confidence", confidence, CONFIDENCES)
    _threshold("tau_a", tau_a)
    _threshold("tau_p", tau_p)
    if confidence == "correct" and not V.any_traced(tau_p) and float(tau_p) == (1.0 if strict else 0.0):
        raise ValueError(
            f"tau_p = {float(tau_p):g} with confidence='correct' counts "
            f"{'no' if strict else 'every'} example as confident: use tau_p in {'[0, 1)' if strict else '(0, 1]'}"
        )
    a_rel, probs = jnp.asarray(a_rel), jnp.asarray(probs)
    if probs.shape == a_rel.shape:
        conf = probs
    elif probs.shape[:-1] == a_rel.shape and probs.ndim == a_rel.ndim + 1:
        if confidence == "pred_prob":
            conf = jnp.max(probs, axis=-1)
        else:
            if labels is None:
                raise ValueError(f"confidence={confidence!r} from class probabilities needs labels (the true classes)")
            labels = jnp.asarray(labels)
            if labels.shape != a_rel.shape:
                raise ValueError(f"labels must have the shape of a_rel {a_rel.shape}, got {labels.shape}")
            if confidence == "true_prob":
                conf = jnp.take_along_axis(probs, labels[..., None], axis=-1)[..., 0]
            else:
                conf = (jnp.argmax(probs, axis=-1) == labels).astype(probs.dtype)
    else:
        raise ValueError(
            f"probs must have the shape of a_rel {a_rel.shape} (one confidence per example) or {a_rel.shape} + "
            f"(classes,) (class probabilities), got {probs.shape}"
        )
    if strict:
        return jnp.mean((a_rel > tau_a) & (conf > tau_p))
    return jnp.mean((a_rel >= tau_a) & (conf >= tau_p))


def rollout(attn: jax.Array, alpha_r: float = 1.0) -> jax.Array:
    """Attention rollout of per-layer attention ``(layers, B, L, L)`` (heads averaged):
    ``A~ = alpha_r A + (1 - alpha_r) I`` row-normalised, last row of ``A~_L ... A~_1``."""
    L = attn.shape[-1]
    At = alpha_r * attn + (1 - alpha_r) * jnp.eye(L)
    At = At / jnp.sum(At, axis=-1, keepdims=True)
    out = At[0]
    for layer in range(1, At.shape[0]):
        out = At[layer] @ out
    return out[..., -1, :]


def comprehensiveness_sufficiency(
    model: Any, tokens: jax.Array, top_percent: float = 5.0, lengths: jax.Array | None = None
) -> dict[str, jax.Array]:
    """ERASER comprehensiveness and sufficiency with top-k% deletion, one-layer model
    (rollout = the attention row). ``k = ceil(top_percent/100 * len)`` tokens with the
    largest attention; deletion keeps order (a masked key). ``y^`` = predicted class.

    Returns means over examples: ``comprehensiveness`` = p(y^|x) - p(y^|x without top-k)
    (higher is better) and ``sufficiency`` = p(y^|x) - p(y^|top-k only) (lower is better).
    """
    if not 0 < top_percent <= 100:
        raise ValueError(f"top_percent must be in (0, 100], got {top_percent!r}")
    z, a = model(tokens)
    Lk = a.shape[-1]
    n = jnp.full((a.shape[0],), Lk) if lengths is None else jnp.asarray(lengths)
    k = jnp.ceil(top_percent / 100.0 * n).astype(int)
    rank = jnp.argsort(jnp.argsort(-a, axis=-1), axis=-1)
    top = rank < k[:, None]
    p = jax.nn.softmax(z, axis=-1)
    yhat = jnp.argmax(z, axis=-1)
    p_full = jnp.take_along_axis(p, yhat[:, None], 1)[:, 0]
    z_del, _ = model(tokens, key_mask=~top)
    z_top, _ = model(tokens, key_mask=top)
    p_del = jnp.take_along_axis(jax.nn.softmax(z_del, -1), yhat[:, None], 1)[:, 0]
    p_top = jnp.take_along_axis(jax.nn.softmax(z_top, -1), yhat[:, None], 1)[:, 0]
    return {"comprehensiveness": jnp.mean(p_full - p_del), "sufficiency": jnp.mean(p_full - p_top)}
