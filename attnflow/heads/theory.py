"""Multi-head single-location attention: activations, model, risk and order-parameter ODEs
(spec `heads.md` sections 2-7).

Order parameters ``M = K K*^T / D`` (H x F), ``Q = K K^T / D`` (H x H), ``P = Q - M M^T``.
Local fields (location 1 by exchangeability): ``chi*_l = delta_{l1} theta + zeta_l``,
``chi_l = M chi*_l + P^{1/2} w_l``; half-risk ``R(M, Q) = E 1/2 |e_1 - a(chi)|^2``.

Autodiff form of the online-SGD ODE (5.2), with ``S = dR/dQ + (dR/dQ)^T``:

    dM/dt = -eta [dR/dM + S M],
    dQ/dt = -eta [(dR/dM) M^T + M (dR/dM)^T + S Q + Q S] + eta^2 E[sum_l G_l G_l^T],

``G = d loss / d chi`` per sample; ``sgd_noise=False`` drops the eta^2 term (gradient flow).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..expect import psd_sqrt
from ..ode import integrate
from ..trajectory import Trajectory
from .data import Discrete, Prior

__all__ = ["Softmax", "Softmax1", "BayesSoftmax", "MultiHead", "FieldBank", "risk", "order_parameter_field", "solve_order_parameters",
           "oracle_config", "softmax_floor", "overlaps"]


# ----------------------------------------------------------------------------- activations
class Activation(eqx.Module):
    def __call__(self, chi: jax.Array) -> jax.Array:  # chi (H, L) -> a (L,)
        raise NotImplementedError


class Softmax(Activation):
    """``a = mean_h softmax_l(chi_h)``."""

    def __call__(self, chi):
        return jnp.mean(jax.nn.softmax(chi, axis=-1), axis=0)


class Softmax1(Activation):
    """``a = mean_h c e^{chi_hl} / (e^b + sum_l' e^{chi_hl'})``: bias ``b`` switches heads off, scale ``c``
    restores mass (global scalars or per-head arrays)."""

    b: jax.Array = eqx.field(converter=jnp.asarray, default=0.0)
    c: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __call__(self, chi):
        H = chi.shape[0]
        b = jnp.broadcast_to(self.b, (H,))
        c = jnp.broadcast_to(self.c, (H,))
        lse = jnp.logaddexp(b, jax.scipy.special.logsumexp(chi, axis=-1))
        return jnp.mean(c[:, None] * jnp.exp(chi - lse[:, None]), axis=0)


class BayesSoftmax(Activation):
    """Joint normalisation over heads and tokens: ``a_l = sum_h e^{chi_hl + b_h} / sum_{h',l'} e^{chi_h'l' + b_h'}``."""

    b: jax.Array

    def __init__(self, b: Any):
        self.b = jnp.asarray(b, dtype=float)

    def __call__(self, chi):
        logits = chi + self.b[:, None]
        return jnp.sum(jax.nn.softmax(logits.reshape(-1)).reshape(chi.shape), axis=0)


# ----------------------------------------------------------------------------- model
class MultiHead(eqx.Module):
    """``H`` key vectors ``K (H, D)``; scores ``chi_hl = x_l . k_h / sqrt D``; output ``sum_l a_l x_l``."""

    K: jax.Array
    activation: Activation

    def __init__(self, K: Any, activation: Activation):
        K = jnp.asarray(K)
        if K.ndim != 2 or K.shape[0] < 1:
            raise ValueError(f"K must have shape (H >= 1, D), got {K.shape}")
        if not isinstance(activation, Activation):
            raise ValueError(f"activation must be Softmax(), Softmax1(...) or BayesSoftmax(...), got {activation!r}")
        self.K, self.activation = K, activation

    @classmethod
    def init(cls, key: Any, H: int, D: int, activation: Activation, sigma0: float = 0.5) -> "MultiHead":
        H = V.positive_int("H", H)
        V.positive("sigma0", sigma0)
        key = jax.random.PRNGKey(key) if isinstance(key, int) else key
        return cls(sigma0 * jax.random.normal(key, (H, D)), activation)

    def attention(self, X: jax.Array) -> jax.Array:
        chi = X @ self.K.T / jnp.sqrt(X.shape[-1])  # (L, H)
        return self.activation(chi.T)

    def __call__(self, X: jax.Array) -> jax.Array:
        return self.attention(X) @ X


def sample_loss(model: MultiHead, batch: tuple) -> jax.Array:
    """Mean over the batch of ``|y - y_hat|^2 / (2 D)``."""
    X, y = batch[0], batch[1]
    yhat = jax.vmap(model)(X)
    return jnp.mean(jnp.sum((y - yhat) ** 2, axis=-1)) / (2 * X.shape[-1])


def overlaps(K: jax.Array, spikes: jax.Array) -> dict:
    """``M = K K*^T / D`` and ``Q = K K^T / D``."""
    D = K.shape[1]
    return {"M": K @ spikes.T / D, "Q": K @ K.T / D}


# ----------------------------------------------------------------------------- Monte Carlo bank
class FieldBank(eqx.Module):
    """Fixed draws ``theta (B, F)``, ``zeta (B, L, F)``, ``w (B, L, H)`` with antithetic copies
    ``(-theta, -zeta, +w)`` (sign-symmetric priors) and cyclic head-permutation copies of ``w``
    (spec section 6): the Monte Carlo field is then exactly equivariant."""

    theta: jax.Array
    zeta: jax.Array
    w: jax.Array

    def __init__(self, prior: Prior, L: int, H: int, n: int = 4096, key: Any = 0, antithetic: bool | None = None,
                 permutations: str = "cyclic"):
        V.positive_int("n (bank size)", n)
        V.choice("permutations", permutations, ("cyclic", "none"))
        key = jax.random.PRNGKey(key) if isinstance(key, int) else key
        k1, k2, k3 = jax.random.split(key, 3)
        theta = prior.sample(k1, n)
        zeta = jax.random.normal(k2, (n, L, prior.F))
        w = jax.random.normal(k3, (n, L, H))
        if antithetic is None:
            antithetic = prior.sign_symmetric
        if antithetic:
            if not prior.sign_symmetric:
                raise ValueError("antithetic copies need a sign-symmetric prior")
            theta, zeta, w = jnp.concatenate([theta, -theta]), jnp.concatenate([zeta, -zeta]), jnp.concatenate([w, w])
        if permutations == "cyclic" and H > 1:
            theta = jnp.concatenate([theta] * H)
            zeta = jnp.concatenate([zeta] * H)
            w = jnp.concatenate([jnp.roll(w, s, axis=-1) for s in range(H)])
        self.theta, self.zeta, self.w = theta, zeta, w

    def fields(self, M: jax.Array, Q: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``chi (B, H, L)`` and ``chi* (B, L, F)`` for order parameters ``(M, Q)``."""
        P = Q - M @ M.T
        R = psd_sqrt(P)
        chi_star = self.zeta.at[:, 0].add(self.theta)
        chi = jnp.einsum("hf,blf->bhl", M, chi_star) + jnp.einsum("hg,blg->bhl", R, self.w)
        return chi, chi_star


def _half_loss(activation: Activation, chi: jax.Array) -> jax.Array:
    a = activation(chi)
    return 0.5 * jnp.sum((jax.nn.one_hot(0, chi.shape[1], dtype=a.dtype) - a) ** 2)


def risk(M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank) -> jax.Array:
    """Half-risk ``R(M, Q)``; the generalisation error is ``E = 2 R`` (section 3)."""
    chi, _ = bank.fields(M, Q)
    return jnp.mean(jax.vmap(lambda c: _half_loss(activation, c))(chi))


def order_parameter_field(t: Any, y: dict, args: dict) -> dict:
    """Autodiff form (5.2) of the online-SGD order-parameter ODE on ``{"M", "Q"}``.
    ``args``: ``activation``, ``bank``, ``eta``, ``noise`` (1.0 keeps the eta^2 term, 0.0 drops it)."""
    act, bank, eta = args["activation"], args["bank"], args["eta"]
    M, Q = y["M"], y["Q"]
    gM, gQ = jax.grad(risk, argnums=(0, 1))(M, Q, act, bank)
    S = gQ + gQ.T
    dM = -eta * (gM + S @ M)
    dQ = -eta * (gM @ M.T + M @ gM.T + S @ Q + Q @ S)
    # args["noise"] is 1.0 (online SGD) or 0.0 (gradient flow): a number, so it can be traced
    chi, _ = bank.fields(M, Q)
    G = jax.vmap(jax.grad(lambda c: _half_loss(act, c)))(chi)  # (B, H, L)
    dQ = dQ + args["noise"] * eta**2 * jnp.mean(jnp.einsum("bhl,bgl->bhg", G, G), axis=0)
    return {"M": dM, "Q": dQ}


def solve_order_parameters(M0: Any, Q0: Any, activation: Activation, bank: FieldBank, eta: float, t1: float, *,
                           sgd_noise: bool = True, ts: Any = None, n_save: int = 100, rtol: float = 1e-6,
                           atol: float = 1e-9, progress: bool = False) -> Trajectory:
    """Integrate the order-parameter ODE from ``(M0, Q0)``; observables ``M``, ``Q`` and ``error = 2 R``.
    ``Q0 - M0 M0^T`` must be positive semidefinite."""
    M0, Q0 = jnp.asarray(M0, float), jnp.asarray(Q0, float)
    V.positive("eta", eta)
    ev = np.linalg.eigvalsh(np.asarray(Q0 - M0 @ M0.T))
    if ev[0] < -1e-10 * max(1.0, float(np.trace(np.asarray(Q0)))):
        raise ValueError(f"Q0 - M0 M0^T must be positive semidefinite; its smallest eigenvalue is {ev[0]:.3g}")
    args = {"activation": activation, "bank": bank, "eta": eta, "noise": 1.0 if sgd_noise else 0.0}
    return integrate(order_parameter_field, {"M": M0, "Q": Q0}, t1, args=args, ts=ts, n_save=n_save, rtol=rtol, atol=atol,
                     progress=progress,
                     observe=lambda t, y, a: {"M": y["M"], "Q": y["Q"], "error": 2 * risk(y["M"], y["Q"], a["activation"], a["bank"])})


def oracle_config(prior: Discrete) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(M, Q, b)`` at which Bayes-softmax is Bayes-optimal for a discrete prior (section 8):
    ``M = Theta``, ``Q = Theta Theta^T``, ``b_h = log pi_h - |theta_h|^2 / 2``."""
    if not isinstance(prior, Discrete):
        raise ValueError(f"the oracle configuration needs a Discrete prior, got {type(prior).__name__}")
    Th = prior.points
    return Th, Th @ Th.T, jnp.log(prior.weights) - 0.5 * jnp.sum(Th**2, axis=1)


def softmax_floor(L: int, p: float = 0.5, n_plus: int | None = None, H: int | None = None) -> float:
    """Infinite-signal softmax floor (section 8): ``L / (4 (L - 1))`` for an even split and ``p = 1/2``;
    ``L/(L-1) [p (1 - n/H)^2 + (1 - p)(n/H)^2]`` with ``n`` of ``H`` heads on ``+``."""
    L = V.positive_int("L", L, minimum=2)
    if n_plus is None:
        return L / (4 * (L - 1))
    H = V.positive_int("H", H)
    f = n_plus / H
    return L / (L - 1) * (p * (1 - f) ** 2 + (1 - p) * f**2)
