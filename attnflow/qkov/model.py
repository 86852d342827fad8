"""One-layer attention models in the four parametrisations (spec `qkov.md` section 2).

Tokens are one-hot in ``R^V``; only the last position's attention row is computed:

    s_i = c x_T^T W_QK x_i,  a = softmax(s),  z = W_OV sum_i a_i x_i (+ bias),  L = CE(z, y).

| class | W_QK | W_OV |
|---|---|---|
| `CACO` | ``W_qk`` | ``W_ov`` |
| `FACO` | ``W_q^T W_k`` | ``W_ov`` |
| `CAFO` | ``W_qk`` | ``W_o W_v`` |
| `FAFO` | ``W_q^T W_k`` | ``W_o W_v`` |

Token ids become one-hot matrices inside the forward pass, so every contraction is a dense
product: ``A = onehot(x_T) W_QK`` (a matmul), ``s_i = A . onehot(x_i)``, the attended token
histogram ``h = sum_i a_i onehot(x_i)`` and ``z = W_OV h`` (a matmul). For V ~ 50 this is as
fast as gathers for one run (0.37 vs 0.42 ms per SGD step) and, unlike gathers, whose
batched scatter-add gradients XLA:CPU runs serially, it stays fast under ``vmap``: the nested
`attnflow.sweep` of 16 ratios x 4 seeds runs 3.7x a loop of single runs
(``benchmarks/qkov_ratio_sweep.py``), against 0.8x with gathers. Factorised circuits form
their product first; the gradient reaches each factor by the chain rule.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _validate as V
from ..optim import label_by_path
from .theory import PARAMETRISATIONS, _check_parametrisation

__all__ = ["QKOVModel", "CACO", "FACO", "CAFO", "FAFO", "make_model", "Init", "EpsIdentity", "TorchDefault",
           "Zeros", "circuit_labels", "cross_entropy"]


# ----------------------------------------------------------------------------- inits
class Init(eqx.Module):
    """How one matrix of shape ``(rows, cols)`` is initialised."""

    @abc.abstractmethod
    def __call__(self, key: jax.Array, shape: tuple[int, int]) -> jax.Array: ...


class EpsIdentity(Init):
    """``eps I`` (rectangular identity), the paper's eps = 1e-6 initialisation."""

    eps: float = 1e-6

    def __call__(self, key, shape):
        return self.eps * jnp.eye(*shape)


class TorchDefault(Init):
    """PyTorch ``nn.Linear`` default: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, fan_in = cols."""

    def __call__(self, key, shape):
        bound = 1.0 / math.sqrt(shape[1])
        return jax.random.uniform(key, shape, minval=-bound, maxval=bound)


class Zeros(Init):
    def __call__(self, key, shape):
        return jnp.zeros(shape)


_INITS = {"eps_identity": EpsIdentity, "torch_default": TorchDefault, "zeros": Zeros}


def _as_init(x: Any) -> Init:
    if isinstance(x, Init):
        return x
    if isinstance(x, str) and x in _INITS:
        return _INITS[x]()
    raise ValueError(f"unknown init {x!r}; expected an Init object or one of {sorted(_INITS)}")


# ----------------------------------------------------------------------------- models
class QKOVModel(eqx.Module):
    """Abstract one-layer attention model; concrete classes fix the parametrisation."""

    score_scale: float = eqx.field(static=True)
    attend_to_query: bool = eqx.field(static=True)
    ov_bias: jax.Array | None

    @abc.abstractmethod
    def W_QK(self) -> jax.Array:
        """The (product) query-key matrix, V x V."""

    @abc.abstractmethod
    def W_OV(self) -> jax.Array:
        """The (product) output-value matrix, n_out x V."""

    def scores(self, query: jax.Array, keys: jax.Array) -> jax.Array:
        """``x_T^T W_QK x_i`` for token ids ``query`` (B,) and ``keys`` (B, L)."""
        W = self.W_QK()
        A = jax.nn.one_hot(query, W.shape[0], dtype=W.dtype) @ W  # row x_T^T W_QK, (B, V)
        return jnp.einsum("blv,bv->bl", jax.nn.one_hot(keys, W.shape[1], dtype=W.dtype), A)

    def readout(self, keys: jax.Array, a: jax.Array) -> jax.Array:
        """``W_OV sum_i a_i x_i`` for key ids (B, L) and attention (B, L)."""
        W = self.W_OV()
        h = jnp.einsum("bl,blv->bv", a, jax.nn.one_hot(keys, W.shape[1], dtype=a.dtype))  # attended histogram
        return h @ W.T

    @property
    def parametrisation(self) -> str:
        return type(self).__name__

    def keys_of(self, tokens: jax.Array) -> jax.Array:
        return tokens if self.attend_to_query else tokens[:, :-1]

    def attention(self, tokens: jax.Array, key_mask: jax.Array | None = None) -> jax.Array:
        """Attention row of the last position over the key positions (B, L_keys).

        ``key_mask`` (B, L_keys) removes positions (deletion with order kept: the model has no
        positions, so removing a token equals masking it out of the softmax)."""
        keys = self.keys_of(tokens)
        s = self.score_scale * self.scores(tokens[:, -1], keys)
        if key_mask is not None:
            s = jnp.where(key_mask, s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1)

    def __call__(self, tokens: jax.Array, key_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Logits (B, n_out) and attention (B, L_keys) for token ids (B, L)."""
        a = self.attention(tokens, key_mask)
        z = self.readout(self.keys_of(tokens), a)
        if self.ov_bias is not None:
            z = z + self.ov_bias
        return z, a


class CACO(QKOVModel):
    W_qk: jax.Array
    W_ov: jax.Array

    def W_QK(self):
        return self.W_qk

    def W_OV(self):
        return self.W_ov


class FACO(QKOVModel):
    W_q: jax.Array
    W_k: jax.Array
    W_ov: jax.Array

    def W_QK(self):
        return self.W_q.T @ self.W_k

    def W_OV(self):
        return self.W_ov


class CAFO(QKOVModel):
    W_qk: jax.Array
    W_o: jax.Array
    W_v: jax.Array

    def W_QK(self):
        return self.W_qk

    def W_OV(self):
        return self.W_o @ self.W_v


class FAFO(QKOVModel):
    W_q: jax.Array
    W_k: jax.Array
    W_o: jax.Array
    W_v: jax.Array

    def W_QK(self):
        return self.W_q.T @ self.W_k

    def W_OV(self):
        return self.W_o @ self.W_v


_CLASSES = {"CACO": CACO, "FACO": FACO, "CAFO": CAFO, "FAFO": FAFO}
_MATRICES = {"CACO": ("W_qk", "W_ov"), "FACO": ("W_q", "W_k", "W_ov"), "CAFO": ("W_qk", "W_o", "W_v"),
             "FAFO": ("W_q", "W_k", "W_o", "W_v")}


def make_model(
    parametrisation: str,
    vocab: int,
    n_out: int | None = None,
    *,
    hidden: int | None = None,
    init: Any = "torch_default",
    key: Any = 0,
    score_scale: float | None = None,
    ov_bias: bool = False,
    attend_to_query: bool = True,
    dtype: Any = jnp.float32,
) -> QKOVModel:
    """Build a model. ``init`` is one `Init` (or name) for all matrices or a dict
    ``{matrix name: init}`` (names ``W_qk, W_q, W_k, W_ov, W_o, W_v``; missing ones use
    `TorchDefault`). Simulations default to float32 (``dtype``). ``hidden`` is the inner width of factorised circuits (default ``vocab``);
    ``score_scale`` defaults to ``1/sqrt(vocab)`` (the authors' code presets)."""
    par = _check_parametrisation(parametrisation)
    vocab = V.positive_int("vocab", vocab)
    n_out = vocab if n_out is None else V.positive_int("n_out", n_out)
    hidden = vocab if hidden is None else V.positive_int("hidden", hidden)
    score_scale = 1.0 / math.sqrt(vocab) if score_scale is None else score_scale
    V.positive("score_scale", score_scale)
    shapes = {"W_qk": (vocab, vocab), "W_q": (hidden, vocab), "W_k": (hidden, vocab), "W_ov": (n_out, vocab),
              "W_o": (n_out, hidden), "W_v": (hidden, vocab)}
    names = _MATRICES[par]
    if isinstance(init, dict):
        unknown = set(init) - set(names)
        if unknown:
            raise ValueError(f"{par} has no matrix {sorted(unknown)}; its matrices are {names}")
        inits = {k: _as_init(init.get(k, "torch_default")) for k in names}
    else:
        inits = {k: _as_init(init) for k in names}
    key = V.prng_key(key)
    keys = jax.random.split(key, len(names))
    mats = {k: inits[k](kk, shapes[k]).astype(dtype) for k, kk in zip(names, keys)}
    bias = jnp.zeros(n_out, dtype) if ov_bias else None
    return _CLASSES[par](score_scale=float(score_scale), attend_to_query=attend_to_query, ov_bias=bias, **mats)


def circuit_labels(model: QKOVModel, per_factor: bool = False) -> Any:
    """Labels for `attnflow.per_circuit`: ``qk`` / ``ov`` (or ``q, k, v, o`` and ``qk``/``ov``
    for collapsed matrices with ``per_factor=True``); the OV bias is ``ov``."""
    def rule(path: str) -> str:
        name = path.split(".")[-1].split("[")[0]
        if per_factor:
            return {"W_q": "q", "W_k": "k", "W_o": "o", "W_v": "v", "W_qk": "qk", "W_ov": "ov", "ov_bias": "ov"}[name]
        return "qk" if name in ("W_qk", "W_q", "W_k") else "ov"

    return label_by_path(model, rule)


def cross_entropy(model: QKOVModel, batch: tuple) -> jax.Array:
    """Mean cross-entropy of ``model`` on ``(tokens, targets, ...)``."""
    tokens, y = batch[0], batch[1]
    z, _ = model(tokens)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), y[:, None], axis=1))


assert set(_CLASSES) == set(PARAMETRISATIONS)


def make_aligned(
    task: Any,
    parametrisation: str,
    mu_ov0: float,
    mu_qk0: float,
    *,
    eta_qk: float = 1.0,
    eta_ov: float = 1.0,
    score_scale: float = 1.0,
) -> QKOVModel:
    """A model of the theory task on the invariant manifold (section 9 init ``aligned``):
    ``W_OV = mu_ov0 D_OV``, ``W_QK = mu_qk0 D_QK / c``; factorised circuits get the
    weighted-balanced, structure-aligned factors of `balanced_factorise` (rank of ``D``),
    which gradient flow keeps balanced. Theory conventions: ``n_out = M``, the query is
    not attended."""
    from .theory import balanced_factorise

    par = _check_parametrisation(parametrisation)
    W = task.on_manifold(mu_ov0, mu_qk0, 0.0, score_scale)
    mats = {}
    if par[:2] == "FA":
        if mu_qk0 <= 0:
            raise ValueError(f"a factorised QK circuit needs mu_qk0 > 0 (W = 0 is stationary), got {mu_qk0!r}")
        A, B = balanced_factorise(W["W_qk"], eta_qk, eta_qk, rank=task.M)
        mats.update(W_q=A.T, W_k=B)
    else:
        mats["W_qk"] = W["W_qk"]
    if par[2:] == "FO":
        if mu_ov0 <= 0:
            raise ValueError(f"a factorised OV circuit needs mu_ov0 > 0 (W = 0 is stationary), got {mu_ov0!r}")
        A, B = balanced_factorise(W["W_ov"], eta_ov, eta_ov, rank=task.M - 1)
        mats.update(W_o=A, W_v=B)
    else:
        mats["W_ov"] = W["W_ov"]
    return _CLASSES[par](score_scale=float(score_scale), attend_to_query=False, ov_bias=None, **mats)
