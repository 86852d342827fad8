"""The multi-head single-location model: activations, `MultiHead`, losses.

Head ``h`` has one key ``k_h`` in ``R^D`` and scores ``chi_hl = x_l . k_h / sqrt(D)``. An
activation maps the scores ``chi (H, L)`` to per-head weights ``s_h`` whose sum over heads is
the attention ``a (L,)``; the output is ``sum_l a_l x_l`` (equations (3)-(5) of the heads page).
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .data import Target, TokenTarget

__all__ = ["Activation", "BayesSoftmax", "MultiHead", "Softmax", "Softmax1", "half_loss", "sample_loss"]


# ----------------------------------------------------------------------------- activations
class Activation(eqx.Module):
    """Maps scores ``chi (H, L)`` to per-head weights `head_weights` ``(H, L)``; the attention
    is their sum over heads, ``a = sum_h head_weights(chi)[h]`` (abstract).

    Concrete activations: `Softmax`, `Softmax1`, `BayesSoftmax`.
    """

    @abc.abstractmethod
    def head_weights(self, chi: jax.Array) -> jax.Array:
        """Per-head weights ``s (H, L)`` of the scores ``chi (H, L)``."""

    @property
    @abc.abstractmethod
    def learned(self) -> tuple[str, ...]:
        """Names of the parameters that training moves (at the rate ``eta_b``)."""

    @abc.abstractmethod
    def check_heads(self, H: int) -> None:
        """Raise ``ValueError`` if the per-head parameters do not fit ``H`` heads."""

    @abc.abstractmethod
    def restrict(self, keep: Any, H: int, renormalise: bool = False) -> Activation:
        """The activation of the sub-model that keeps heads ``keep`` out of ``H`` (pruning, equation (16))."""

    def __call__(self, chi: jax.Array) -> jax.Array:
        """The attention ``a (L,)``."""
        return jnp.sum(self.head_weights(chi), axis=0)

    def params(self) -> dict[str, jax.Array]:
        """``{name: value}`` of the `learned` parameters."""
        return {n: getattr(self, n) for n in self.learned}

    def with_params(self, params: dict[str, Any]) -> Activation:
        """A copy with the `learned` parameters replaced by ``params``."""
        names = self.learned
        if not names:
            return self
        return eqx.tree_at(lambda a: [getattr(a, n) for n in names], self, [params[n] for n in names])


def _per_head(x: jax.Array, H: int) -> jax.Array:
    return jnp.broadcast_to(x, (H,))


class Softmax(Activation):
    """Uniform average of softmax heads: ``a = (1/H) sum_h softmax_l(chi_h)`` (equation (3))."""

    def head_weights(self, chi):
        return jax.nn.softmax(chi, axis=-1) / chi.shape[0]

    @property
    def learned(self):
        return ()

    def check_heads(self, H):
        pass

    def restrict(self, keep, H, renormalise=False):
        return self


class Softmax1(Activation):
    """Softmax-1 with bias ``b`` and scale ``c`` (equation (4)):
    ``a = (1/H) sum_h c_h e^{chi_hl} / (e^{b_h} + sum_l' e^{chi_hl'})``.

    The bias switches a head off when all its scores are far below ``b``; the scale lets the
    active heads restore unit mass. ``b = 0, c = 1`` is the off-by-one softmax, ``b -> -inf`` the
    softmax. ``b`` and ``c`` are global scalars, or per head with ``per_head=H`` (or arrays of
    shape ``(H,)``); learned by default (``learn_b``, ``learn_c``).
    """

    b: jax.Array
    c: jax.Array
    learn_b: bool = eqx.field(static=True)
    learn_c: bool = eqx.field(static=True)

    def __init__(
        self, b: Any = 0.0, c: Any = 1.0, learn_b: bool = True, learn_c: bool = True, per_head: int | None = None
    ):
        b, c = V.floats("b", b), V.floats("c", c)
        V.finite_tree("b", b)
        V.positive("c", c)
        if per_head is not None:
            H = V.positive_int("per_head (number of heads)", per_head)
            b, c = _per_head(b, H), _per_head(c, H)
        if b.ndim > 1 or c.ndim > 1:
            raise ValueError(f"b and c must be scalars or per-head vectors, got shapes {b.shape} and {c.shape}")
        self.b, self.c, self.learn_b, self.learn_c = b, c, bool(learn_b), bool(learn_c)

    @property
    def learned(self):
        return tuple(n for n, on in (("b", self.learn_b), ("c", self.learn_c)) if on)

    def check_heads(self, H):
        for name, x in (("b", self.b), ("c", self.c)):
            if x.ndim == 1 and x.shape[0] != H:
                raise ValueError(f"Softmax1.{name} has {x.shape[0]} per-head values for H = {H} heads")

    def head_weights(self, chi):
        H = chi.shape[0]
        b, c = _per_head(self.b, H), _per_head(self.c, H)
        lse = jnp.logaddexp(b, jax.scipy.special.logsumexp(chi, axis=-1))
        return c[:, None] * jnp.exp(chi - lse[:, None]) / H

    def restrict(self, keep, H, renormalise=False):
        """Kept heads; by default the ``1/H`` and ``c`` of the full model stay (removed heads are masked:
        ``(1/H) sum_S c s_h = (1/H') sum_S (c H'/H) s_h``); ``renormalise=True`` averages over the kept heads."""
        keep = np.asarray(keep)
        b = self.b[keep] if self.b.ndim else self.b
        c = self.c[keep] if self.c.ndim else self.c
        if not renormalise:
            c = c * keep.size / H
        return eqx.tree_at(lambda a: (a.b, a.c), self, (b, c))


class BayesSoftmax(Activation):
    """Bayes-softmax, one joint normalisation over heads and tokens (equation (5)):
    ``a_l = sum_h e^{chi_hl + b_h} / sum_{h',l'} e^{chi_h'l' + b_h'}``; ``b_h`` learned by default.

    ``b`` is one bias per head (shape ``(H,)``); ``BayesSoftmax.zeros(H)`` starts them at 0.
    """

    b: jax.Array
    learn_b: bool = eqx.field(static=True)

    def __init__(self, b: Any = None, learn_b: bool = True):
        if b is None:
            raise ValueError(
                "BayesSoftmax needs its biases b, one per head (shape (H,)): BayesSoftmax.zeros(H) starts them at 0, "
                "the start of the spec"
            )
        b = V.floats("b", b)
        if b.ndim != 1:
            raise ValueError(f"BayesSoftmax b needs one bias per head (shape (H,)), got shape {b.shape}")
        V.finite_tree("b", b)
        self.b, self.learn_b = b, bool(learn_b)

    @classmethod
    def zeros(cls, H: int, learn_b: bool = True) -> BayesSoftmax:
        """``H`` heads with biases 0."""
        return cls(jnp.zeros(V.positive_int("H", H)), learn_b)

    @property
    def learned(self):
        return ("b",) if self.learn_b else ()

    def check_heads(self, H):
        if self.b.shape[0] != H:
            raise ValueError(f"BayesSoftmax.b has {self.b.shape[0]} biases for H = {H} heads")

    def head_weights(self, chi):
        logits = chi + self.b[:, None]
        return jax.nn.softmax(logits.reshape(-1)).reshape(chi.shape)

    def restrict(self, keep, H, renormalise=False):
        """Kept heads, dropped from the joint normaliser (``renormalise`` has no effect)."""
        return eqx.tree_at(lambda a: a.b, self, self.b[np.asarray(keep)])


# ----------------------------------------------------------------------------- model and losses
class MultiHead(eqx.Module):
    """``H`` keys ``K (H, D)``; scores ``chi_hl = x_l . k_h / sqrt(D)``; output ``sum_l a_l x_l``."""

    K: jax.Array
    activation: Activation

    def __init__(self, K: Any, activation: Activation):
        # keys keep a floating dtype they come with (float32 SGD under x64), anything else becomes float
        floating = hasattr(K, "dtype") and jnp.issubdtype(K.dtype, jnp.floating)
        K = V.floats("K", K, dtype=K.dtype if floating else None)
        if K.ndim != 2 or K.shape[0] < 1:
            raise ValueError(f"K must have shape (H >= 1, D), got {K.shape}")
        V.finite_tree("K", K)
        if not isinstance(activation, Activation):
            raise ValueError(f"activation must be Softmax(), Softmax1(...) or BayesSoftmax(...), got {activation!r}")
        activation.check_heads(K.shape[0])
        self.K, self.activation = K, activation

    @classmethod
    def init(cls, key: Any, H: int, D: int, activation: Activation, sigma0: float = 0.5) -> MultiHead:
        """Keys ``k_h ~ N(0, sigma0^2 I_D)``."""
        H = V.positive_int("H", H)
        D = V.positive_int("D", D)
        V.positive("sigma0", sigma0)
        return cls(sigma0 * jax.random.normal(V.prng_key(key), (H, D)), activation)

    def attention(self, X: jax.Array) -> jax.Array:
        """Attention ``a (L,)`` on the tokens ``X (L, D)``."""
        chi = X @ self.K.T / jnp.sqrt(X.shape[-1])  # (L, H)
        return self.activation(chi.T)

    def __call__(self, X: jax.Array) -> jax.Array:
        return self.attention(X) @ X


def half_loss(activation: Activation, chi: jax.Array) -> jax.Array:
    """Effective per-sample loss ``|e_1 - a(chi)|^2 / 2`` of scores ``chi (H, L)`` with the signal on
    token 1: the large-``D`` limit of the loss (equation (6))."""
    a = activation(chi)
    return 0.5 * jnp.sum((jax.nn.one_hot(0, chi.shape[1], dtype=a.dtype) - a) ** 2)


def sample_loss(model: MultiHead, batch: tuple, target: Target = TokenTarget()) -> jax.Array:  # noqa: B008 - immutable
    """Mean loss over a batch of the `attnflow.heads.SingleLocationTask` with this ``target``:
    ``|y - y_hat|^2 / (2 D)`` (token) or ``(y - sum_l a_l z_l)^2 / 2`` (scalar)."""
    return target.loss(jax.vmap(model.attention)(batch[0]), batch)
