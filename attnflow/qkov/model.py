"""One-layer attention models in the four parametrisations (eq. (1) of the qkov docs page).

Tokens are one-hot in ``R^V``; only the last position's attention row is computed:

    s_i = c x_T^T W_QK x_i,  a = softmax(s),  z = W_OV sum_i a_i x_i (+ bias),  L = CE(z, y).

| class | W_QK | W_OV |
|---|---|---|
| `CACO` | ``W_qk`` | ``W_ov`` |
| `FACO` | ``W_q^T W_k`` | ``W_ov`` |
| `CAFO` | ``W_qk`` | ``W_o W_v`` |
| `FAFO` | ``W_q^T W_k`` | ``W_o W_v`` |

Token ids become one-hot matrices inside the forward pass, so every contraction is a dense
product (``A = onehot(x_T) W_QK``, ``s_i = A . onehot(x_i)``, the attended histogram
``h = sum_i a_i onehot(x_i)`` and ``z = W_OV h``): for V ~ 50 as fast as gathers for one run
and, unlike gathers (whose batched scatter-add gradients XLA:CPU runs serially), fast under
``vmap``. Factorised circuits form their product first; the gradient reaches each factor
by the chain rule.

`make_model` builds a model with the theory's conventions (score scale 1, float64, query
not attended); `code_model` is the authors' code preset (``V = 50``, score scale
``1/sqrt(V)``, float32, query attended). `make_aligned` puts a model of the theory task on
the invariant manifold with weighted-balanced factors.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, final

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..ode import require_x64
from ..optim import label_by_path, weighted_balance
from .data import TheoryTask

__all__ = [
    "CACO",
    "CAFO",
    "CODE_SCORE_SCALE",
    "CODE_VOCAB",
    "FACO",
    "FAFO",
    "MODEL_CLASSES",
    "PAPER_EPS",
    "PARAMETRISATIONS",
    "EpsIdentity",
    "Init",
    "QKOVModel",
    "TorchDefault",
    "Zeros",
    "balance_diagnostic",
    "balanced_factorise",
    "circuit_labels",
    "code_model",
    "cross_entropy",
    "factor_conserved",
    "make_aligned",
    "make_model",
]

PARAMETRISATIONS = ("CACO", "FACO", "CAFO", "FAFO")
"""The four parametrisations: Collapsed or Factorised Attention (QK), Collapsed or Factorised Output (OV)."""

CODE_VOCAB = 50
"""Vocabulary (and model width, and number of outputs) of the authors' code."""

CODE_SCORE_SCALE = 1.0 / math.sqrt(CODE_VOCAB)
"""Score scale ``c = 1/sqrt(d)`` of the authors' code (the theory uses ``c = 1``)."""

PAPER_EPS = 1e-6
"""``eps`` of the authors' ``eps I`` initialisation."""


# ----------------------------------------------------------------------------- inits
class Init(eqx.Module):
    """How one matrix of shape ``(rows, cols)`` is initialised: `EpsIdentity`, `TorchDefault`, `Zeros`."""

    @abc.abstractmethod
    def __call__(self, key: jax.Array, shape: tuple[int, int]) -> jax.Array:
        """The matrix, drawn from ``key`` where random."""


@final
class EpsIdentity(Init):
    """``eps I`` (rectangular identity); the authors use ``eps = 1e-6`` (`PAPER_EPS`)."""

    eps: float = PAPER_EPS

    def __call__(self, key, shape):
        return self.eps * jnp.eye(*shape)


@final
class TorchDefault(Init):
    """PyTorch ``nn.Linear`` default: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, fan_in = cols."""

    def __call__(self, key, shape):
        bound = 1.0 / math.sqrt(shape[1])
        return jax.random.uniform(key, shape, minval=-bound, maxval=bound)


@final
class Zeros(Init):
    """All zeros (stationary for a factorised circuit)."""

    def __call__(self, key, shape):
        return jnp.zeros(shape)


def _check_init(name: str, x: Any) -> Init:
    if not isinstance(x, Init):
        raise ValueError(
            f"init for {name} must be an Init object (EpsIdentity(eps), TorchDefault(), Zeros()), got {x!r}"
        )
    return x


# ----------------------------------------------------------------------------- models
class QKOVModel(eqx.Module):
    """Abstract one-layer attention model; the final classes `CACO`, `FACO`, `CAFO`, `FAFO`
    fix the parametrisation.

    Every model has a score scale ``c`` (static), whether the query position is attended
    (static), an optional OV bias, the product matrices `W_QK` (V x V) and `W_OV`
    (n_out x V), and its factor pairs (`factors`) whose balance gradient flow conserves.
    """

    score_scale: eqx.AbstractVar[float]
    attend_to_query: eqx.AbstractVar[bool]
    ov_bias: eqx.AbstractVar[jax.Array | None]

    @abc.abstractmethod
    def W_QK(self) -> jax.Array:
        """The (product) query-key matrix, V x V."""

    @abc.abstractmethod
    def W_OV(self) -> jax.Array:
        """The (product) output-value matrix, n_out x V."""

    @abc.abstractmethod
    def factors(self) -> dict[str, tuple[jax.Array, jax.Array]]:
        """``{circuit: (A, B)}`` with ``W = A B`` for each factorised circuit: ``"qk"``:
        ``(W_q^T, W_k)``, ``"ov"``: ``(W_o, W_v)``. Empty for `CACO`."""

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
        """The attended positions: all tokens, or all but the query (the last)."""
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


@final
class CACO(QKOVModel):
    """Collapsed QK (``W_qk``), collapsed OV (``W_ov``)."""

    W_qk: jax.Array
    W_ov: jax.Array
    ov_bias: jax.Array | None = eqx.field(default=None, kw_only=True)
    score_scale: float = eqx.field(static=True, default=1.0, kw_only=True)
    attend_to_query: bool = eqx.field(static=True, default=False, kw_only=True)

    def W_QK(self):
        return self.W_qk

    def W_OV(self):
        return self.W_ov

    def factors(self):
        return {}


@final
class FACO(QKOVModel):
    """Factorised QK (``W_q^T W_k``), collapsed OV (``W_ov``)."""

    W_q: jax.Array
    W_k: jax.Array
    W_ov: jax.Array
    ov_bias: jax.Array | None = eqx.field(default=None, kw_only=True)
    score_scale: float = eqx.field(static=True, default=1.0, kw_only=True)
    attend_to_query: bool = eqx.field(static=True, default=False, kw_only=True)

    def W_QK(self):
        return self.W_q.T @ self.W_k

    def W_OV(self):
        return self.W_ov

    def factors(self):
        return {"qk": (self.W_q.T, self.W_k)}


@final
class CAFO(QKOVModel):
    """Collapsed QK (``W_qk``), factorised OV (``W_o W_v``)."""

    W_qk: jax.Array
    W_o: jax.Array
    W_v: jax.Array
    ov_bias: jax.Array | None = eqx.field(default=None, kw_only=True)
    score_scale: float = eqx.field(static=True, default=1.0, kw_only=True)
    attend_to_query: bool = eqx.field(static=True, default=False, kw_only=True)

    def W_QK(self):
        return self.W_qk

    def W_OV(self):
        return self.W_o @ self.W_v

    def factors(self):
        return {"ov": (self.W_o, self.W_v)}


@final
class FAFO(QKOVModel):
    """Factorised QK (``W_q^T W_k``), factorised OV (``W_o W_v``)."""

    W_q: jax.Array
    W_k: jax.Array
    W_o: jax.Array
    W_v: jax.Array
    ov_bias: jax.Array | None = eqx.field(default=None, kw_only=True)
    score_scale: float = eqx.field(static=True, default=1.0, kw_only=True)
    attend_to_query: bool = eqx.field(static=True, default=False, kw_only=True)

    def W_QK(self):
        return self.W_q.T @ self.W_k

    def W_OV(self):
        return self.W_o @ self.W_v

    def factors(self):
        return {"qk": (self.W_q.T, self.W_k), "ov": (self.W_o, self.W_v)}


MODEL_CLASSES: Mapping[str, type[QKOVModel]] = MappingProxyType(
    {"CACO": CACO, "FACO": FACO, "CAFO": CAFO, "FAFO": FAFO}
)
"""Parametrisation name -> model class."""

_MATRICES = {
    "CACO": ("W_qk", "W_ov"),
    "FACO": ("W_q", "W_k", "W_ov"),
    "CAFO": ("W_qk", "W_o", "W_v"),
    "FAFO": ("W_q", "W_k", "W_o", "W_v"),
}


def _check_parametrisation(p: Any) -> str:
    if p not in PARAMETRISATIONS:
        raise ValueError(f"unknown parametrisation {p!r}; expected one of {', '.join(PARAMETRISATIONS)}")
    return p


def make_model(
    parametrisation: str,
    vocab: int,
    n_out: int | None = None,
    *,
    hidden: int | None = None,
    init: Init | Mapping[str, Init] | None = None,
    key: Any = 0,
    score_scale: float = 1.0,
    ov_bias: bool = False,
    attend_to_query: bool = False,
    dtype: Any = jnp.float64,
) -> QKOVModel:
    """A model with the theory's conventions by default: score scale ``c = 1``, float64
    (needs `attnflow.enable_x64`), the query position not attended.

    ``init`` is one `Init` for all matrices or ``{matrix name: Init}`` (names ``W_qk, W_q,
    W_k, W_ov, W_o, W_v``; missing ones use `TorchDefault`); default `TorchDefault` for all.
    ``n_out`` defaults to ``vocab``; ``hidden`` (inner width of factorised circuits) to
    ``vocab``. The authors' code preset is `code_model`.
    """
    par = _check_parametrisation(parametrisation)
    vocab = V.positive_int("vocab", vocab)
    n_out = vocab if n_out is None else V.positive_int("n_out", n_out)
    hidden = vocab if hidden is None else V.positive_int("hidden", hidden)
    V.positive("score_scale", score_scale)
    if jnp.dtype(dtype) == jnp.dtype("float64"):
        require_x64("make_model")
    shapes = {
        "W_qk": (vocab, vocab),
        "W_q": (hidden, vocab),
        "W_k": (hidden, vocab),
        "W_ov": (n_out, vocab),
        "W_o": (n_out, hidden),
        "W_v": (hidden, vocab),
    }
    names = _MATRICES[par]
    inits: dict[str, Init]
    if init is None:
        inits = {k: TorchDefault() for k in names}
    elif isinstance(init, Mapping):
        unknown = set(init) - set(names)
        if unknown:
            raise ValueError(f"{par} has no matrix {sorted(unknown)}; its matrices are {names}")
        inits = {k: _check_init(k, init.get(k, TorchDefault())) for k in names}
    else:
        inits = {k: _check_init(k, init) for k in names}
    key = V.prng_key(key)
    keys = jax.random.split(key, len(names))
    mats = {k: inits[k](kk, shapes[k]).astype(dtype) for k, kk in zip(names, keys, strict=True)}
    bias = jnp.zeros(n_out, dtype) if ov_bias else None
    return MODEL_CLASSES[par](score_scale=float(score_scale), attend_to_query=attend_to_query, ov_bias=bias, **mats)


def code_model(
    parametrisation: str,
    *,
    init: Init | Mapping[str, Init] | None = None,
    key: Any = 0,
    vocab: int = CODE_VOCAB,
    dtype: Any = jnp.float32,
) -> QKOVModel:
    """The authors' code preset: ``V = d = n_out = 50`` (`CODE_VOCAB`), no biases, score scale
    ``1/sqrt(V)`` (`CODE_SCORE_SCALE`), the query position attended, float32; PyTorch
    default init unless ``init`` says otherwise."""
    vocab = V.positive_int("vocab", vocab)
    return make_model(
        parametrisation,
        vocab,
        init=init,
        key=key,
        score_scale=1.0 / math.sqrt(vocab),
        attend_to_query=True,
        dtype=dtype,
    )


# ----------------------------------------------------------------------------- invariant manifold
def _ov_basis(M: int) -> np.ndarray:
    """Orthonormal basis (M, M - 1) of the vectors with zero sum (the range of ``I - 11^T/M``)."""
    P = np.eye(M) - 1.0 / M
    w, U = np.linalg.eigh(P)
    return U[:, w > 0.5]


def make_aligned(
    task: TheoryTask,
    parametrisation: str,
    mu_ov0: Any,
    mu_qk0: Any,
    *,
    score_scale: float = 1.0,
    factor_ratios: tuple[Any, Any] = (1.0, 1.0),
) -> QKOVModel:
    """A model of ``task`` on the invariant manifold (eq. (10)): ``W_OV = mu_ov0 D_OV``,
    ``W_QK = mu_qk0 D_QK / c``, with the theory's conventions (``n_out = M``, query not
    attended, no bias).

    Factorised circuits get weighted-balanced, structure-aligned factors of the rank of
    ``D`` (inner width ``M`` for QK, ``M - 1`` for OV), the start that gradient flow keeps
    balanced and aligned (eq. (8)); they need ``mu > 0`` (``W = 0`` is stationary there).
    ``factor_ratios = (rho_qk, rho_ov)``, the ratios ``eta_A / eta_B`` of the factors' learning
    rates (`Setup.factor_rates`), weight the balance: ``A^T A / eta_A = B B^T / eta_B`` (``A``
    scaled by ``rho^(1/4)``, ``B`` by ``rho^(-1/4)``). ``mu_ov0``, ``mu_qk0`` and the ratios may
    be traced.
    """
    par = _check_parametrisation(parametrisation)
    c = V.finite_scalar("score_scale", score_scale)
    V.positive("score_scale", c)
    dtype = jnp.result_type(float)
    mu_ov0, mu_qk0 = jnp.asarray(mu_ov0, dtype), jnp.asarray(mu_qk0, dtype)
    mats: dict[str, jax.Array] = {}
    if par[:2] == "FA":
        if not V.any_traced(mu_qk0) and not float(mu_qk0) > 0:
            raise ValueError(f"a factorised QK circuit needs mu_qk0 > 0 (W = 0 is stationary), got {float(mu_qk0)!r}")
        # D_QK = sum_c q_c d_c^T with orthogonal query rows q_c and distinct indicators d_c:
        # singular value |q_c| |d_c|, singular vectors q_c/|q_c| and d_c/|d_c|.
        Q = task.query_embeddings() * (task.b if task.query_mode == "distinct_uniform" else 1.0)
        Kd = task.distinct_embeddings() * task.b
        qn, dn = jnp.linalg.norm(Q, axis=1, keepdims=True), jnp.linalg.norm(Kd, axis=1, keepdims=True)
        root = jnp.sqrt(mu_qk0 * qn * dn / c)  # (M, 1): sqrt of the singular values of W_QK
        W_q, W_k = weighted_balance(root * Q / qn, root * Kd / dn, factor_ratios[0])  # A = W_q^T, B = W_k
        mats.update(W_q=W_q, W_k=W_k)
    else:
        mats["W_qk"] = mu_qk0 * task.D_qk() / c
    if par[2:] == "FO":
        if not V.any_traced(mu_ov0) and not float(mu_ov0) > 0:
            raise ValueError(f"a factorised OV circuit needs mu_ov0 > 0 (W = 0 is stationary), got {float(mu_ov0)!r}")
        # D_OV = P (sqrt(b) E) with P = U U^T (U: zero-sum basis) and E = 1_{D_c}^T / sqrt(b):
        # singular value sqrt(b) (M - 1 times), left vectors U, right vectors U^T E.
        U = jnp.asarray(_ov_basis(task.M), dtype)
        E = task.distinct_embeddings() * math.sqrt(task.b)
        root = jnp.sqrt(mu_ov0 * math.sqrt(task.b))
        W_o, W_v = weighted_balance(root * U, root * (U.T @ E), factor_ratios[1])  # A = W_o, B = W_v
        mats.update(W_o=W_o, W_v=W_v)
    else:
        mats["W_ov"] = mu_ov0 * task.D_ov()
    return MODEL_CLASSES[par](score_scale=c, attend_to_query=False, ov_bias=None, **mats)


# ----------------------------------------------------------------------------- training helpers
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


# ----------------------------------------------------------------------------- factorisation (eq. (8))
def balanced_factorise(
    W: Any, eta_A: Any = 1.0, eta_B: Any = 1.0, rank: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """Weighted-balanced factors of ``W = A B`` (eq. (8)): from ``W = U S V^T``,
    ``A = U S^{1/2} (eta_A/eta_B)^{1/4}``, ``B = (eta_B/eta_A)^{1/4} S^{1/2} V^T``,
    so that ``A^T A / eta_A = B B^T / eta_B``. ``rank`` keeps the top singular values."""
    V.positive("eta_A", eta_A)
    V.positive("eta_B", eta_B)
    U, s, Vt = jnp.linalg.svd(jnp.asarray(W), full_matrices=False)
    if rank is not None:
        U, s, Vt = U[:, :rank], s[:rank], Vt[:rank]
    r = jnp.sqrt(s)
    return weighted_balance(U * r, r[:, None] * Vt, jnp.asarray(eta_A) / jnp.asarray(eta_B))


def factor_conserved(A: Any, B: Any, eta_A: Any = 1.0, eta_B: Any = 1.0) -> jax.Array:
    """``A^T A / eta_A - B B^T / eta_B``: conserved by gradient flow on ``W = A B`` with factor
    rates ``eta_A``, ``eta_B`` (eq. (8))."""
    return A.T @ A / eta_A - B @ B.T / eta_B


def balance_diagnostic(W_O: Any, W_V: Any) -> jax.Array:
    """The authors' imbalance ``||W_O^T W_O - W_V W_V^T||_F / max(||W_O^T W_O||_F, ||W_V W_V^T||_F, 1e-8)``."""
    a, b = W_O.T @ W_O, W_V @ W_V.T
    return jnp.linalg.norm(a - b) / jnp.maximum(jnp.maximum(jnp.linalg.norm(a), jnp.linalg.norm(b)), 1e-8)
