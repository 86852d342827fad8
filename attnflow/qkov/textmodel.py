"""One-layer attention models of real text (spec section 12), at CPU scale.

A sequence of word ids ``t_1 .. t_L`` is embedded as ``x_i = E[t_i] + P[i]`` (learned token
and position embeddings). Only the row of the read-out position ``q`` is computed (one layer:
the other rows do not reach the output), with a query that may pool other positions (the
question of a SQuAD item):

    x_q' = x_q + mean_{j in pool} x_j
    s^h_i = (x_q' W_Q^h) . (x_i W_K^h) / sqrt(d_head)        (i in keys; -inf elsewhere)
    a^h = softmax(s^h),   o = sum_h (sum_i a^h_i x_i W_V^h) W_O^h
    y = x_q' + o,   y = y + MLP(y) (GELU, optional)

Collapsed variants replace ``W_Q^h W_K^h^T`` by one ``d x d`` matrix ``W_QK^h`` and
``W_V^h W_O^h`` by ``W_OV^h`` (the paper's FAFO / FACO / CAFO / CACO names). The read-out
depends on the task (`TASKS`):

- ``classify`` (HateXplain): the words, then ``<cls>``, the query, whose keys are the words;
  read-out ``y W + b`` over classes; relevant: the rationale weights.
- ``agree`` (SVA): the prefix, then ``<verb>``, the query, whose keys are every position up to
  it (causal); read-out ``y . U[form]`` for the correct and the wrong verb form; relevant:
  the subject (and, optionally, the verb position).
- ``span`` (SQuAD): the question, ``<sep>`` (the query, pooling the question), then the
  context (the keys); read-out: start and end pointers ``(y W_s) . x_i``, ``(y W_e) . x_i``
  over the context; relevant: the answer span.

Padding is never a key: attention falls only on real tokens. `encode_text` turns `TextRecord` lists
(from `attnflow.qkov.realdata`) into a `TextBatch` of fixed length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..optim import label_by_path

__all__ = [
    "CIRCUIT_GROUPS",
    "SPECIALS",
    "TASKS",
    "TextAttention",
    "TextBatch",
    "encode_text",
    "make_text_model",
    "text_circuit_labels",
    "text_loss",
]

TASKS = ("classify", "agree", "span")
"""Read-outs of `TextAttention`: class logits, a choice between two verb forms, an answer span."""

SPECIALS = MappingProxyType({"classify": "<cls>", "agree": "<verb>", "span": "<sep>"})
"""The word placed at the read-out position of each task (add it to the vocabulary's specials)."""

CIRCUIT_GROUPS = ("qk", "ov", "embed", "head")
"""Parameter groups of `text_circuit_labels`: query-key, value-output, token and position
embeddings, everything after attention (MLP and read-out)."""

_PARAMETRISATIONS = ("FAFO", "FACO", "CAFO", "CACO")
_MASKED = -1e9  # a finite "minus infinity": masked scores keep finite gradients


class TextBatch(eqx.Module):
    """Encoded examples, batch axis first (``B`` examples of length ``L``).

    ``tokens`` (B, L) int ids (0 = padding); ``keys`` (B, L) bool, the positions the read-out
    row may attend to; ``query`` (B,) the read-out position; ``pool`` (B, L) bool, positions
    averaged into the query (the question of a span item; else none); ``relevant`` (B, L)
    float weights in [0, 1] (zero off the keys); ``label`` (B,) class, or the answer's start
    position (span); ``end`` (B,) the answer's end position (span; else 0); ``candidates``
    (B, 2) ids of the correct and the wrong verb form (agree; else 0); ``gold`` (B, G, 2) the
    start and end positions of every gold answer that fits (span: the first is ``label``,
    ``end``; rows past an example's own answers repeat its first; else ``label``, 0).
    """

    tokens: jax.Array
    keys: jax.Array
    query: jax.Array
    pool: jax.Array
    relevant: jax.Array
    label: jax.Array
    end: jax.Array
    candidates: jax.Array
    gold: jax.Array

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def take(self, index: Any) -> TextBatch:
        """The examples at ``index`` (an index array, possibly traced)."""
        return jax.tree_util.tree_map(lambda a: a[index], self)


def encode_text(
    records: Sequence[Any],
    vocab: Any,
    task: str,
    length: int,
    question_length: int = 16,
    verb_relevant: bool = False,
) -> TextBatch:
    """`TextBatch` of ``records`` (`attnflow.qkov.realdata.TextRecord`) for ``task`` at ``length``.

    ``classify``: the first ``length - 1`` words, then ``<cls>``. ``agree``: the last
    ``length - 1`` words of the prefix, then ``<verb>``; relevant = the record's subject
    weights, and 1 at the verb position with ``verb_relevant`` (the paper's definition, made
    for inputs that contain the verb; here the verb position holds only the placeholder, so
    by default only the subject counts). ``span``: the first ``question_length`` question words,
    ``<sep>``, then the context (a first answer that does not fit is an error: crop the context
    with the loader's ``window``); ``gold`` holds every answer of ``meta["spans"]`` that fits.
    ``vocab`` must hold the task's `SPECIALS` word.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    length = V.positive_int("length", length)
    if length < 2:
        raise ValueError(f"length must be at least 2 (one word and the read-out position), got {length}")
    special = SPECIALS[task]
    if special not in vocab.words:
        raise ValueError(f"the vocabulary lacks {special!r}: build it with specials={list(SPECIALS.values())}")
    if not len(records):
        raise ValueError("no records to encode")
    n = len(records)
    tokens = np.zeros((n, length), np.int32)
    keys = np.zeros((n, length), bool)
    pool = np.zeros((n, length), bool)
    relevant = np.zeros((n, length))
    query = np.zeros(n, np.int32)
    label = np.zeros(n, np.int32)
    end = np.zeros(n, np.int32)
    candidates = np.zeros((n, 2), np.int32)
    golds: list[list[tuple[int, int]]] = []
    sid = vocab.id(special)
    for b, rec in enumerate(records):
        words, rel = list(rec.words), np.asarray(rec.relevant, float)
        if task == "classify":
            w = words[: length - 1]
            k = len(w)
            tokens[b, :k] = vocab.encode(w)
            tokens[b, k] = sid
            keys[b, :k] = True
            relevant[b, :k] = rel[:k]
            query[b], label[b] = k, rec.label
        elif task == "agree":
            cut = max(0, len(words) - (length - 1))
            w = words[cut:]
            k = len(w)
            tokens[b, :k] = vocab.encode(w)
            tokens[b, k] = sid
            keys[b, : k + 1] = True  # causal: the verb position sees itself and everything before
            relevant[b, :k] = rel[cut:]
            relevant[b, k] = 1.0 if verb_relevant else 0.0
            query[b] = k
            candidates[b] = (vocab.id(rec.meta["correct"]), vocab.id(rec.meta["wrong"]))
        else:
            qw = list(rec.query_words)[:question_length]
            q = len(qw)
            room = length - q - 1
            s, e = int(rec.meta["start"]), int(rec.meta["end"])
            if e >= room:
                raise ValueError(
                    f"record {rec.id!r}: the answer ends at context word {e}, beyond the {room} words that fit in "
                    f"length {length} after a {q}-word question; load with a smaller window or raise length"
                )
            w = words[:room]
            tokens[b, :q] = vocab.encode(qw)
            tokens[b, q] = sid
            tokens[b, q + 1 : q + 1 + len(w)] = vocab.encode(w)
            pool[b, :q] = True
            keys[b, q + 1 : q + 1 + len(w)] = True
            relevant[b, q + 1 : q + 1 + len(w)] = rel[: len(w)]
            query[b], label[b], end[b] = q, q + 1 + s, q + 1 + e
            # the other gold answers that fit (SQuAD scores the best match over all of them)
            spans = [(int(s2), int(e2)) for s2, e2 in rec.meta.get("spans", ()) if 0 <= int(s2) <= int(e2) < len(w)]
            golds.append([(label[b], end[b])] + [(q + 1 + s2, q + 1 + e2) for s2, e2 in spans if (s2, e2) != (s, e)])
    width = max((len(g) for g in golds), default=1)
    gold = np.zeros((n, width, 2), np.int32)
    gold[:, :, 0] = label[:, None]
    gold[:, :, 1] = end[:, None]
    for b, g in enumerate(golds):
        gold[b, : len(g)] = g
    return TextBatch(
        tokens=jnp.asarray(tokens),
        keys=jnp.asarray(keys),
        query=jnp.asarray(query),
        pool=jnp.asarray(pool),
        relevant=jnp.asarray(relevant, jnp.float32),
        label=jnp.asarray(label),
        end=jnp.asarray(end),
        candidates=jnp.asarray(candidates),
        gold=jnp.asarray(gold),
    )


class TextAttention(eqx.Module):
    """One attention layer over learned word and position embeddings with a task read-out
    (the module docstring gives the equations). Unused matrices of a parametrisation are
    ``None``; build with `make_text_model`."""

    embed: jax.Array  # (V, d)
    position: jax.Array  # (L, d)
    W_Q: jax.Array | None  # (H, d, d_head)
    W_K: jax.Array | None
    W_QK: jax.Array | None  # (H, d, d)
    W_V: jax.Array | None  # (H, d, d_head)
    W_O: jax.Array | None  # (H, d_head, d)
    W_OV: jax.Array | None  # (H, d, d)
    mlp_in: jax.Array | None  # (d, f)
    mlp_in_bias: jax.Array | None
    mlp_out: jax.Array | None  # (f, d)
    mlp_out_bias: jax.Array | None
    read: jax.Array  # classify: (d, C); agree: U (V, d); span: (2, d, d)
    read_bias: jax.Array | None  # classify: (C,)
    task: str = eqx.field(static=True)
    d_head: int = eqx.field(static=True)

    def _one(self, ex: TextBatch, key_mask: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(y, attention (H, L), x)`` of one example."""
        x = self.embed[ex.tokens] + self.position[: ex.tokens.shape[0]]
        pooled = jnp.sum(jnp.where(ex.pool[:, None], x, 0.0), 0) / jnp.maximum(jnp.sum(ex.pool), 1)
        xq = x[ex.query] + pooled
        if self.W_QK is None:
            q = jnp.einsum("d,hde->he", xq, self.W_Q)
            k = jnp.einsum("ld,hde->hle", x, self.W_K)
            s = jnp.einsum("he,hle->hl", q, k)
        else:
            s = jnp.einsum("d,hde,le->hl", xq, self.W_QK, x)
        keys = ex.keys if key_mask is None else ex.keys & key_mask
        s = jnp.where(keys, s / math.sqrt(self.d_head), _MASKED)
        # an example whose keys were all deleted (sufficiency with k = 0) attends to nothing
        a = jnp.where(jnp.any(keys), jax.nn.softmax(s, axis=-1), 0.0)
        h = jnp.einsum("hl,ld->hd", a, x)
        if self.W_OV is None:
            o = jnp.einsum("hd,hde,hef->f", h, self.W_V, self.W_O)
        else:
            o = jnp.einsum("hd,hdf->f", h, self.W_OV)
        y = xq + o
        if self.mlp_in is not None:
            assert self.mlp_in_bias is not None and self.mlp_out is not None and self.mlp_out_bias is not None
            y = y + jax.nn.gelu(y @ self.mlp_in + self.mlp_in_bias) @ self.mlp_out + self.mlp_out_bias
        return y, a, x

    def _logits(self, ex: TextBatch, key_mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        y, a, x = self._one(ex, key_mask)
        if self.task == "classify":
            assert self.read_bias is not None
            z = y @ self.read + self.read_bias
        elif self.task == "agree":
            z = self.read[ex.candidates] @ y
        else:
            ctx = ex.keys  # the pointers range over the context, whatever attention was allowed
            z = jnp.stack([jnp.where(ctx, x @ (self.read[j].T @ y), _MASKED) for j in (0, 1)])
        return z, jnp.mean(a, axis=0)

    def __call__(self, batch: TextBatch, key_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """``(logits, attention)`` of a batch: logits (B, C) for ``classify``, (B, 2) for
        ``agree`` (correct form first), (B, 2, L) start and end pointers for ``span``;
        attention (B, L) of the read-out row, averaged over heads. ``key_mask`` (B, L)
        further restricts the keys (ERASER deletions)."""
        km = None if key_mask is None else jnp.asarray(key_mask, bool)
        return jax.vmap(lambda ex, m: self._logits(ex, m), in_axes=(0, None if km is None else 0))(batch, km)


def make_text_model(
    task: str,
    vocab_size: int,
    length: int,
    *,
    key: Any,
    n_classes: int = 3,
    d_model: int = 64,
    heads: int = 4,
    d_head: int | None = None,
    mlp: int | None = 256,
    parametrisation: str = "FAFO",
    init_std: float = 0.02,
) -> TextAttention:
    """`TextAttention` for ``task`` with every weight drawn from ``N(0, init_std^2)`` (the
    paper's init; biases zero), in float32. ``d_head`` defaults to ``d_model / heads``; ``mlp`` is the
    hidden width of the GELU MLP (``None``: attention only, the SVA model);
    ``parametrisation`` FAFO (factorised QK and OV, the paper's real-data models), FACO,
    CAFO or CACO. ``key``: a PRNG key or an integer seed."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if parametrisation not in _PARAMETRISATIONS:
        raise ValueError(f"parametrisation must be one of {_PARAMETRISATIONS}, got {parametrisation!r}")
    Vn, L = V.positive_int("vocab_size", vocab_size), V.positive_int("length", length)
    d, H = V.positive_int("d_model", d_model), V.positive_int("heads", heads)
    dh = d // H if d_head is None else V.positive_int("d_head", d_head)
    if dh < 1:
        raise ValueError(f"d_model = {d} is smaller than heads = {H}: pass d_head")
    C = V.positive_int("n_classes", n_classes)
    if mlp is not None:
        mlp = V.positive_int("mlp", mlp)
    V.positive("init_std", init_std)
    if not isinstance(key, jax.Array) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.PRNGKey(key) if np.ndim(key) == 0 else key
    ks = iter(jax.random.split(key, 12))

    def draw(*shape: int) -> jax.Array:  # float32 whatever the JAX configuration: these are networks, not theory
        return init_std * jax.random.normal(next(ks), shape, jnp.float32)

    fa_qk, fa_ov = parametrisation[:2] == "FA", parametrisation[2:] == "FO"
    read = {"classify": (d, C), "agree": (Vn, d), "span": (2, d, d)}[task]
    return TextAttention(
        embed=draw(Vn, d),
        position=draw(L, d),
        W_Q=draw(H, d, dh) if fa_qk else None,
        W_K=draw(H, d, dh) if fa_qk else None,
        W_QK=None if fa_qk else draw(H, d, d),
        W_V=draw(H, d, dh) if fa_ov else None,
        W_O=draw(H, dh, d) if fa_ov else None,
        W_OV=None if fa_ov else draw(H, d, d),
        mlp_in=None if mlp is None else draw(d, mlp),
        mlp_in_bias=None if mlp is None else jnp.zeros(mlp, jnp.float32),
        mlp_out=None if mlp is None else draw(mlp, d),
        mlp_out_bias=None if mlp is None else jnp.zeros(d, jnp.float32),
        read=draw(*read),
        read_bias=jnp.zeros(C, jnp.float32) if task == "classify" else None,
        task=task,
        d_head=dh,
    )


_GROUP_OF = {
    "W_Q": "qk",
    "W_K": "qk",
    "W_QK": "qk",
    "W_V": "ov",
    "W_O": "ov",
    "W_OV": "ov",
    "embed": "embed",
    "position": "embed",
}


def text_circuit_labels(model: TextAttention) -> Any:
    """Labels for `attnflow.per_circuit`: ``qk`` (W_Q, W_K or W_QK), ``ov`` (W_V, W_O or W_OV),
    ``embed`` (token and position embeddings) and ``head`` (MLP and read-out), `CIRCUIT_GROUPS`."""
    return label_by_path(model, lambda path: _GROUP_OF.get(path.lstrip(".").split("[")[0], "head"))


def _nll(z: jax.Array, target: jax.Array) -> jax.Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), target[..., None], axis=-1)[..., 0]


def text_loss(model: TextAttention, batch: TextBatch) -> jax.Array:
    """Mean cross-entropy: over classes (classify), over the two verb forms with the correct
    one as target (agree), or of the start and end pointers, averaged (span)."""
    z, _ = model(batch)
    if model.task == "classify":
        return jnp.mean(_nll(z, batch.label))
    if model.task == "agree":
        return jnp.mean(_nll(z, jnp.zeros_like(batch.label)))
    return 0.5 * jnp.mean(_nll(z[:, 0], batch.label) + _nll(z[:, 1], batch.end))
