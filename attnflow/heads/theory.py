"""Multi-head single-location attention: activations, model, risk and order-parameter ODEs
(spec `heads.md` sections 2-7).

Order parameters ``M = K K*^T / D`` (H x F), ``Q = K K^T / D`` (H x H), ``P = Q - M M^T``.
Local fields (location 1 by exchangeability): ``chi*_l = delta_{l1} theta + zeta_l``,
``chi_l = M chi*_l + P^{1/2} w_l``; half-risk ``R(M, Q) = E 1/2 |e_1 - a(chi)|^2``.

Online-SGD order-parameter ODE (5.1), ``G = d loss / d chi`` per sample, ``t = n / D``:

    dm_hf/dt = -eta E[sum_l G_hl chi*_fl],
    dq_hh'/dt = -eta E[sum_l (G_hl chi_h'l + G_h'l chi_hl)] + eta^2 E[sum_l G_hl G_h'l],

evaluated in one of three equivalent forms (5.2): ``"expectation"`` (as written),
``"stein"`` (Gaussian integration by parts) or ``"autodiff"`` (``jax.grad`` of the Monte Carlo
risk in ``M`` and ``Q``). Learned activation parameters follow ``db/dt = -eta_b E[d loss / db]``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from .. import _validate as V
from ..expect import psd_sqrt
from ..ode import DivergenceError, integrate
from ..saddle import fixed_point, jacobian
from ..trajectory import Trajectory
from .data import Prior

__all__ = ["Activation", "Softmax", "Softmax1", "BayesSoftmax", "MultiHead", "FieldBank", "HeadsDynamics", "risk",
           "order_parameter_field", "solve_order_parameters", "from_finite_D", "keys_from_overlaps", "symmetric_seed", "specialisation",
           "symmetrise", "unspecialised_point", "specialisation_spectrum", "predicted_escape_time", "feature_escape_times",
           "prune", "oracle_config", "softmax_floor", "overlaps", "sample_loss", "sgd_optimizer", "online_sgd"]


# ----------------------------------------------------------------------------- activations
class Activation(eqx.Module):
    """Maps scores ``chi (H, L)`` to per-head weights ``head_weights(chi) (H, L)``; the aggregate
    attention is their sum over heads, ``a = sum_h head_weights(chi)[h]``."""

    def head_weights(self, chi: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, chi: jax.Array) -> jax.Array:
        return jnp.sum(self.head_weights(chi), axis=0)

    @property
    def learned(self) -> tuple[str, ...]:
        """Names of the parameters the dynamics learns."""
        return ()

    def params(self) -> dict:
        return {n: getattr(self, n) for n in self.learned}

    def with_params(self, params: dict) -> "Activation":
        names = self.learned
        if not names:
            return self
        return eqx.tree_at(lambda a: [getattr(a, n) for n in names], self, [params[n] for n in names])

    def restrict(self, keep: Any, H: int, rule: str = "mask") -> "Activation":
        """The activation of the sub-model keeping heads ``keep`` out of ``H`` (pruning, section 10)."""
        return self


class Softmax(Activation):
    """``a = (1/H) sum_h softmax_l(chi_h)``."""

    def head_weights(self, chi):
        return jax.nn.softmax(chi, axis=-1) / chi.shape[0]


def _per_head(x: jax.Array, H: int) -> jax.Array:
    return jnp.broadcast_to(x, (H,))


class Softmax1(Activation):
    """``a = (1/H) sum_h c_h e^{chi_hl} / (e^{b_h} + sum_l' e^{chi_hl'})``: the bias ``b`` switches heads
    off, the scale ``c`` restores mass. ``b``, ``c`` are global scalars, or per head with
    ``per_head=H`` (or arrays of shape ``(H,)``); learned by default (``learn_b``, ``learn_c``)."""

    b: jax.Array
    c: jax.Array
    learn_b: bool = eqx.field(static=True)
    learn_c: bool = eqx.field(static=True)

    def __init__(self, b: Any = 0.0, c: Any = 1.0, learn_b: bool = True, learn_c: bool = True, per_head: int | None = None):
        b, c = jnp.asarray(b, dtype=float), jnp.asarray(c, dtype=float)
        if not V.any_traced((b, c)):
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

    def head_weights(self, chi):
        H = chi.shape[0]
        b, c = _per_head(self.b, H), _per_head(self.c, H)
        lse = jnp.logaddexp(b, jax.scipy.special.logsumexp(chi, axis=-1))
        return c[:, None] * jnp.exp(chi - lse[:, None]) / H

    def restrict(self, keep, H, rule="mask"):
        V.choice("rule", rule, ("mask", "renormalise"))
        keep = np.asarray(keep)
        b = self.b[keep] if self.b.ndim else self.b
        c = self.c[keep] if self.c.ndim else self.c
        if rule == "mask":  # keep the 1/H of the full model: (1/H) sum_S c s_h = (1/H') sum_S (c H'/H) s_h
            c = c * keep.size / H
        return eqx.tree_at(lambda a: (a.b, a.c), self, (b, c))


class BayesSoftmax(Activation):
    """Joint normalisation over heads and tokens (spec 2.3):
    ``a_l = sum_h e^{chi_hl + b_h} / sum_{h',l'} e^{chi_h'l' + b_h'}``; ``b_h`` learned by default."""

    b: jax.Array
    learn_b: bool = eqx.field(static=True)

    def __init__(self, b: Any, learn_b: bool = True):
        b = jnp.asarray(b, dtype=float)
        if b.ndim != 1:
            raise ValueError(f"BayesSoftmax needs one bias per head (shape (H,)), got shape {b.shape}")
        if not V.any_traced(b):
            V.finite_tree("b", b)
        self.b, self.learn_b = b, bool(learn_b)

    @property
    def learned(self):
        return ("b",) if self.learn_b else ()

    def head_weights(self, chi):
        logits = chi + self.b[:, None]
        return jax.nn.softmax(logits.reshape(-1)).reshape(chi.shape)

    def restrict(self, keep, H, rule="mask"):
        return eqx.tree_at(lambda a: a.b, self, self.b[np.asarray(keep)])


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
        """Keys ``k_h ~ N(0, sigma0^2 I_D)``."""
        H = V.positive_int("H", H)
        V.positive("sigma0", sigma0)
        key = V.prng_key(key)
        return cls(sigma0 * jax.random.normal(key, (H, D)), activation)

    def attention(self, X: jax.Array) -> jax.Array:
        chi = X @ self.K.T / jnp.sqrt(X.shape[-1])  # (L, H)
        return self.activation(chi.T)

    def __call__(self, X: jax.Array) -> jax.Array:
        return self.attention(X) @ X


def sample_loss(model: MultiHead, batch: tuple) -> jax.Array:
    """Mean over the batch of ``|y - y_hat|^2 / (2 D)`` (token target), or of ``(y - sum_l a_l z_l)^2 / 2`` for
    the scalar target (batch ``(X, y (B,), eps, z (B, L))``, spec 5.3)."""
    X, y = batch[0], batch[1]
    if y.ndim == 1:
        a = jax.vmap(model.attention)(X)
        return 0.5 * jnp.mean((y - jnp.sum(a * batch[3], axis=-1)) ** 2)
    yhat = jax.vmap(model)(X)
    return jnp.mean(jnp.sum((y - yhat) ** 2, axis=-1)) / (2 * X.shape[-1])


def overlaps(K: jax.Array, spikes: jax.Array) -> dict:
    """``M = K K*^T / D`` and ``Q = K K^T / D``."""
    D = K.shape[1]
    return {"M": K @ spikes.T / D, "Q": K @ K.T / D}


# ----------------------------------------------------------------------------- Monte Carlo bank
class FieldBank(eqx.Module):
    """Fixed draws ``theta (B, F)``, ``zeta (B, L, F)``, ``w (B, L, H)`` with weights (spec section 6).

    - ``n`` base draws (default ``2^14``) of ``(zeta, w)``; ``theta`` drawn too, or, for a prior with
      finite support and ``enumerate_support=True``, enumerated with its weights on shared ``(zeta, w)``.
    - ``antithetic``: append ``(-theta, -zeta, +w)`` (sign-symmetric priors; default on for them,
      refused otherwise), so the field is exactly equivariant under ``M -> -M``.
    - ``permutations``: ``"cyclic"`` (default, H copies), ``"full"`` (H! copies) or ``"none"``:
      copies with the head index of ``w`` permuted, so the field is permutation-equivariant.
    - ``sqrt``: ``"symmetric"`` (``psd_sqrt`` with its Sylvester JVP; default) or ``"cholesky"``.
    """

    theta: jax.Array
    zeta: jax.Array
    w: jax.Array
    weights: jax.Array
    sqrt: str = eqx.field(static=True)

    def __init__(self, prior: Prior, L: int, H: int, n: int = 2**14, key: Any = 0, antithetic: bool | None = None,
                 permutations: str = "cyclic", enumerate_support: bool = True, sqrt: str = "symmetric"):
        if not isinstance(prior, Prior):
            raise ValueError(f"prior must be a Prior, got {prior!r}")
        L = V.positive_int("L", L, minimum=2)
        H = V.positive_int("H", H)
        n = V.positive_int("n (bank size)", n)
        V.choice("permutations", permutations, ("cyclic", "full", "none"))
        self.sqrt = V.choice("sqrt", sqrt, ("symmetric", "cholesky"))
        key = V.prng_key(key)
        k1, k2, k3 = jax.random.split(key, 3)
        zeta = jax.random.normal(k2, (n, L, prior.F))
        w = jax.random.normal(k3, (n, L, H))
        support = prior.support() if enumerate_support else None
        if support is not None:
            pts, pw = support
            J = pts.shape[0]
            theta = jnp.repeat(pts[None], n, axis=0).reshape(n * J, prior.F)
            weights = jnp.tile(pw, n) / n
            zeta, w = jnp.repeat(zeta, J, axis=0), jnp.repeat(w, J, axis=0)
        else:
            theta = prior.sample(k1, n)
            weights = jnp.full(n, 1.0 / n)
        if antithetic is None:
            antithetic = prior.sign_symmetric
        if antithetic:
            if not prior.sign_symmetric:
                raise ValueError(f"antithetic copies need a sign-symmetric prior; {type(prior).__name__} is not")
            theta, zeta, w = jnp.concatenate([theta, -theta]), jnp.concatenate([zeta, -zeta]), jnp.concatenate([w, w])
            weights = jnp.concatenate([weights, weights]) / 2
        if permutations != "none" and H > 1:
            if permutations == "cyclic":
                perms = [np.roll(np.arange(H), s) for s in range(H)]
            else:
                if H > 6:
                    raise ValueError(f"permutations='full' has H! copies; use 'cyclic' for H = {H} > 6")
                perms = [np.asarray(p) for p in itertools.permutations(range(H))]
            k = len(perms)
            theta, zeta = jnp.concatenate([theta] * k), jnp.concatenate([zeta] * k)
            w = jnp.concatenate([w[..., p] for p in perms])
            weights = jnp.concatenate([weights] * k) / k
        self.theta, self.zeta, self.w, self.weights = theta, zeta, w, weights

    @property
    def size(self) -> int:
        return self.weights.shape[0]

    def mean(self, x: jax.Array) -> jax.Array:
        """Bank average of per-draw values ``x (B, ...)``."""
        return jnp.tensordot(self.weights, x, axes=1)

    def fields(self, M: jax.Array, Q: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``chi (B, H', L)`` and ``chi* (B, L, F)`` for order parameters ``(M, Q)`` with ``H' <= H``."""
        P = Q - M @ M.T
        if self.sqrt == "symmetric":
            R = psd_sqrt(P)
        else:
            P = 0.5 * (P + P.T)
            R = jnp.linalg.cholesky(P + 1e-14 * jnp.trace(Q) * jnp.eye(P.shape[0]))
        chi_star = self.zeta.at[:, 0].add(self.theta)
        Hs = M.shape[0]
        chi = jnp.einsum("hf,blf->bhl", M, chi_star) + jnp.einsum("hg,blg->bhl", R, self.w[..., :Hs])
        return chi, chi_star


def _half_loss(activation: Activation, chi: jax.Array) -> jax.Array:
    a = activation(chi)
    return 0.5 * jnp.sum((jax.nn.one_hot(0, chi.shape[1], dtype=a.dtype) - a) ** 2)


def risk(M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank) -> jax.Array:
    """Half-risk ``R(M, Q)``; the generalisation error is ``E = 2 R`` (section 3)."""
    chi, _ = bank.fields(M, Q)
    return bank.mean(jax.vmap(lambda c: _half_loss(activation, c))(chi))


# ----------------------------------------------------------------------------- dynamics
class HeadsDynamics(eqx.Module):
    """Everything the order-parameter field needs besides the state (section 5).

    ``noise`` is 1.0 (online SGD, the ``eta^2`` term on) or 0.0 (gradient flow); ``minibatch``
    divides the ``eta^2`` term; ``weight_decay`` adds ``-eta gamma M`` and ``-2 eta gamma Q``;
    learned activation parameters move at ``eta_b``. ``escape`` is the threshold of the
    specialisation event (``inf``: no event). ``target="scalar"`` with label noise ``Delta`` (spec 5.3)
    keeps the drifts and replaces the ``eta^2`` term by
    ``eta^2 E[(|r|^2 + Delta) <J^h, J^h'>_F + 2 sum_l G_hl G_h'l]``, ``J^h_{l'l} = d a_l' / d chi_hl``."""

    activation: Activation
    bank: FieldBank
    eta: jax.Array
    eta_b: jax.Array
    noise: jax.Array
    minibatch: jax.Array
    weight_decay: jax.Array
    escape: jax.Array
    Delta: jax.Array
    form: str = eqx.field(static=True)
    target: str = eqx.field(static=True)

    def __init__(self, activation: Activation, bank: FieldBank, eta: Any, *, eta_b: Any = None, sgd_noise: bool = True,
                 minibatch: int = 1, weight_decay: Any = 0.0, escape: Any = None, form: str = "expectation",
                 target: str = "token", Delta: Any = 0.0):
        if not isinstance(activation, Activation):
            raise ValueError(f"activation must be Softmax(), Softmax1(...) or BayesSoftmax(...), got {activation!r}")
        if not isinstance(bank, FieldBank):
            raise ValueError(f"bank must be a FieldBank, got {bank!r}")
        V.positive("eta", eta)
        if eta_b is not None:
            V.positive("eta_b", eta_b)
        V.nonnegative("weight_decay", weight_decay)
        self.activation, self.bank = activation, bank
        self.eta = jnp.asarray(eta, dtype=float)
        self.eta_b = self.eta if eta_b is None else jnp.asarray(eta_b, dtype=float)
        self.noise = jnp.asarray(1.0 if sgd_noise else 0.0)
        self.minibatch = jnp.asarray(float(V.positive_int("minibatch", minibatch)))
        self.weight_decay = jnp.asarray(weight_decay, dtype=float)
        if escape is not None:
            V.positive("escape threshold", escape)
        self.escape = jnp.asarray(jnp.inf if escape is None else escape, dtype=float)
        self.form = V.choice("form", form, ("expectation", "stein", "autodiff"))
        self.target = V.choice("target", target, ("token", "scalar"))
        V.nonnegative("Delta", Delta)
        if target == "token" and not V.any_traced(Delta) and float(Delta) != 0:
            raise ValueError(f"Delta (label noise) needs target='scalar', got Delta = {Delta!r} with the token target")
        self.Delta = jnp.asarray(Delta, dtype=float)

    def state(self, M: Any, Q: Any) -> dict:
        """The ODE state ``{"M", "Q", "act"}`` (``act``: the learned activation parameters)."""
        return {"M": jnp.asarray(M, float), "Q": jnp.asarray(Q, float), "act": self.activation.params()}


def _stein_matrix(act: Activation, chi: jax.Array) -> jax.Array:
    """``J_hg = sum_l d^2 loss / d chi_hl d chi_gl`` for one draw."""
    hess = jax.hessian(lambda c: _half_loss(act, c))(chi)  # (H, L, H, L)
    return jnp.einsum("hlgl->hg", hess)


def order_parameter_field(t: Any, y: dict, dyn: HeadsDynamics) -> dict:
    """Right-hand side of the order-parameter ODE (5.1) on ``{"M", "Q", "act"}``, in the form ``dyn.form``."""
    M, Q, p = y["M"], y["Q"], y["act"]
    act0, bank, eta = dyn.activation, dyn.bank, dyn.eta
    act = act0.with_params(p)
    chi, chi_star = bank.fields(M, Q)
    loss = lambda c, q: _half_loss(act0.with_params(q), c)  # noqa: E731
    G, gp = jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None))(chi, p)  # G (B, H, L)
    if dyn.form == "expectation":
        dM = -eta * bank.mean(jnp.einsum("bhl,blf->bhf", G, chi_star))
        A = bank.mean(jnp.einsum("bhl,bgl->bhg", G, chi))
        dQ = -eta * (A + A.T)
    elif dyn.form == "stein":
        Jbar = bank.mean(jax.vmap(lambda c: _stein_matrix(act, c))(chi))
        g1 = bank.mean(jnp.einsum("bh,bf->bhf", G[:, :, 0], bank.theta))  # E[G_h1 theta_f]
        dM = -eta * (g1 + Jbar @ M)
        A = g1 @ M.T + Jbar @ Q
        dQ = -eta * (A + A.T)
    else:  # autodiff: treat the H^2 entries of Q as independent, S = dR/dQ + (dR/dQ)^T
        gM, gQ = jax.grad(risk, argnums=(0, 1))(M, Q, act, bank)
        S = gQ + gQ.T
        dM = -eta * (gM + S @ M)
        dQ = -eta * (gM @ M.T + M @ gM.T + S @ Q + Q @ S)
    GG = jnp.einsum("bhl,bgl->bhg", G, G)
    if dyn.target == "scalar":  # E[e^2 z_i z_j] = (|r|^2 + Delta) delta_ij + 2 r_i r_j
        def jj(c):
            J = jax.jacfwd(act)(c)  # (L, H, L)
            return 2 * _half_loss(act, c), jnp.einsum("ihl,igl->hg", J, J)

        r2, JJ = jax.vmap(jj)(chi)
        GG = (r2 + dyn.Delta)[:, None, None] * JJ + 2 * GG
    dQ = dQ + dyn.noise * eta**2 / dyn.minibatch * bank.mean(GG)
    dM = dM - eta * dyn.weight_decay * M
    dQ = dQ - 2 * eta * dyn.weight_decay * Q
    dp = jax.tree_util.tree_map(lambda g: -dyn.eta_b * bank.mean(g), gp)
    return {"M": dM, "Q": dQ, "act": dp}


def specialisation(M: jax.Array) -> jax.Array:
    """``|(I - 11^T / H) M|_F``: how far the heads are from one another (0 on the equal-rows manifold)."""
    return jnp.sqrt(jnp.sum((M - jnp.mean(M, axis=0, keepdims=True)) ** 2))


def _escape_cond(t, y, dyn):
    return dyn.escape - specialisation(y["M"])


def _observe(t, y, dyn):
    M, Q = y["M"], y["Q"]
    out = {"M": M, "Q": Q, "error": 2 * risk(M, Q, dyn.activation.with_params(y["act"]), dyn.bank) + dyn.Delta,
           "specialisation": specialisation(M), "p_min": jnp.linalg.eigvalsh(0.5 * (Q + Q.T) - M @ M.T)[0]}
    out.update(y["act"])
    return out


def _check_psd(name: str, M: jax.Array, Q: jax.Array, tol: float = 1e-10) -> None:
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    if M.ndim != 2 or Q.shape != (M.shape[0], M.shape[0]):
        raise ValueError(f"{name}: M must be (H, F) and Q (H, H), got {M.shape} and {Q.shape}")
    if not (np.all(np.isfinite(M)) and np.all(np.isfinite(Q))):
        raise ValueError(f"{name}: M and Q must be finite")
    if not np.allclose(Q, Q.T, atol=1e-12 * (1 + np.abs(Q).max())):
        raise ValueError(f"{name}: Q must be symmetric")
    ev = np.linalg.eigvalsh(Q - M @ M.T)
    if ev[0] < -tol * max(1.0, float(np.trace(Q))):
        raise ValueError(f"{name}: Q - M M^T must be positive semidefinite; its smallest eigenvalue is {ev[0]:.3g}")


def solve_order_parameters(M0: Any, Q0: Any, activation: Activation, bank: FieldBank, eta: float, t1: float, *,
                           sgd_noise: bool = True, eta_b: Any = None, minibatch: int = 1, weight_decay: float = 0.0,
                           form: str = "expectation", target: str = "token", Delta: float = 0.0,
                           escape: float | None = None, ts: Any = None, n_save: int = 100,
                           spacing: str = "linear", t_min: Any = None, rtol: float = 1e-6, atol: float = 1e-9, solver: Any = None,
                           dt0: Any = None, stepsize_controller: Any = None, max_steps: int = 100_000,
                           psd_tol: float | None = None, progress: bool = False) -> Trajectory:
    """Integrate the order-parameter ODE (5.1) from ``(M0, Q0)`` and the activation's initial parameters.

    ``target="scalar"`` with label noise ``Delta`` is the scalar-target variant (spec 5.3).
    Observables: ``M``, ``Q``, ``error`` (``E = 2 R``, plus ``Delta`` for the scalar target), ``specialisation`` (`specialisation`),
    ``p_min`` (smallest eigenvalue of ``Q - M M^T``) and the learned parameters (``b``, ``c``).
    ``escape``: stop when ``specialisation`` reaches this threshold (the time is
    ``traj.meta["escape_time"]``, ``None`` when not reached). Raises `DivergenceError` when
    ``Q - M M^T`` loses positive semidefiniteness beyond ``psd_tol * tr Q`` (default
    ``max(1e-8, 10 rtol)``) or a value is not finite.
    """
    _check_psd("initial condition", M0, Q0)
    dyn = HeadsDynamics(activation, bank, eta, eta_b=eta_b, sgd_noise=sgd_noise, minibatch=minibatch,
                        weight_decay=weight_decay, escape=escape, form=form, target=target, Delta=Delta)
    y0 = dyn.state(M0, Q0)
    traj = integrate(order_parameter_field, y0, t1, args=dyn, ts=ts, n_save=n_save, spacing=spacing, t_min=t_min, rtol=rtol, atol=atol,
                     solver=solver, dt0=dt0, stepsize_controller=stepsize_controller, max_steps=max_steps,
                     event=_escape_cond if escape is not None else None, progress=progress, observe=_observe,
                     meta={"eta": float(eta), "form": form, "sgd_noise": bool(sgd_noise), "bank": bank.size,
                           "activation": type(activation).__name__})
    if psd_tol is None:  # the spec's 1e-8, loosened to the solver's own error level
        psd_tol = max(1e-8, 10 * float(rtol))
    trQ = np.asarray(jnp.trace(traj["Q"], axis1=1, axis2=2))
    bad = np.flatnonzero(np.asarray(traj["p_min"]) < -psd_tol * np.maximum(trQ, 1.0))
    if bad.size:
        i = int(bad[0])
        raise DivergenceError(f"Q - M M^T lost positive semidefiniteness at t = {float(traj.ts[i]):.4g} "
                              f"(smallest eigenvalue {float(traj['p_min'][i]):.3g}); lower rtol or eta")
    if escape is not None:
        reached = float(traj["specialisation"][-1]) >= escape * (1 - 1e-6)
        traj = Trajectory(traj.ts, traj.ys, {**traj.meta, "escape_time": float(traj.ts[-1]) if reached else None})
    return traj


# ----------------------------------------------------------------------------- initial conditions
def from_finite_D(D: int, H: int, F: int, sigma0: float = 0.5, key: Any = 0) -> tuple[jax.Array, jax.Array]:
    """Overlaps ``(M0, Q0)`` of a finite-``D`` draw ``k_h ~ N(0, sigma0^2 I_D)`` against ``F`` orthonormal
    spikes (section 7): ``m_hf ~ N(0, sigma0^2 / D)``, ``q_hh ~ sigma0^2``, ``q_hh' ~ N(0, sigma0^4 / D)``.

    Only the spike-aligned coordinates and the ``H x H`` Gram matrix of the rest are drawn, so the
    cost is ``O(H D)`` at any ``D``. To share the draw with an SGD run use `overlaps` on the model.
    """
    D = V.positive_int("D", D, minimum=2)
    H = V.positive_int("H", H)
    F = V.positive_int("F", F)
    V.positive("sigma0", sigma0)
    if F >= D:
        raise ValueError(f"need F < D, got F = {F}, D = {D}")
    key = V.prng_key(key)
    K = sigma0 * jax.random.normal(key, (H, D))  # coordinates in a basis whose first F vectors are the spikes / sqrt D
    M = K[:, :F] / jnp.sqrt(D)
    return M, K @ K.T / D


def keys_from_overlaps(M: Any, Q: Any, spikes: Any, key: Any = 0) -> jax.Array:
    """Keys ``K (H, D)`` with exactly ``K K*^T / D = M`` and ``K K^T / D = Q``: ``K = sqrt(D) (M U^T + P^{1/2} Z^T)``
    with ``U = K*^T / sqrt(D)`` and ``Z`` a random orthonormal ``(D, H)`` frame orthogonal to the spikes.
    Starts an SGD run from a chosen ODE initial condition (e.g. `symmetric_seed`)."""
    M, Q, spikes = jnp.asarray(M, float), jnp.asarray(Q, float), jnp.asarray(spikes, float)
    _check_psd("keys_from_overlaps", M, Q)
    (H, F), D = M.shape, spikes.shape[1]
    if spikes.shape[0] != F or D < F + H:
        raise ValueError(f"spikes must be (F = {F}, D >= F + H = {F + H}), got {spikes.shape}")
    key = V.prng_key(key)
    U = spikes.T / jnp.sqrt(D)
    Z = jax.random.normal(key, (D, H))
    Z = Z - U @ (U.T @ Z)
    Z, _ = jnp.linalg.qr(Z)
    return jnp.sqrt(D) * (M @ U.T + psd_sqrt(Q - M @ M.T) @ Z.T)


def symmetric_seed(M_bar: Any, Q_bar: Any, kappa: float, D: int, direction: Any = None) -> tuple[jax.Array, jax.Array]:
    """A symmetric point plus an antisymmetric seed of size ``kappa / sqrt(D)`` (section 7):
    ``M = M_bar + kappa / sqrt(D) u w^T`` with ``u = (1, -1, 1, ...)`` centred and normalised, ``w`` =
    ``direction`` (default the first feature axis)."""
    M_bar, Q_bar = jnp.asarray(M_bar, float), jnp.asarray(Q_bar, float)
    H, F = M_bar.shape
    if H < 2:
        raise ValueError("an antisymmetric seed needs H >= 2 heads")
    D = V.positive_int("D", D)
    u = jnp.where(jnp.arange(H) % 2 == 0, 1.0, -1.0)
    u = u - jnp.mean(u)
    u = u / jnp.linalg.norm(u)
    w = jnp.eye(F)[0] if direction is None else jnp.asarray(direction, float)
    M = M_bar + kappa / math.sqrt(D) * jnp.outer(u, w)
    # keep P = Q - M M^T fixed so the seed does not change the noise part of the fields
    Q = Q_bar + M @ M.T - M_bar @ M_bar.T
    return M, Q


# ----------------------------------------------------------------------------- phases (section 9)
def _symmetric_coords(y: dict) -> jax.Array:
    """Coordinates of a permutation-invariant state: row mean of ``M``, mean diagonal and mean
    off-diagonal of ``Q``, and the head-mean of each learned parameter."""
    M, Q = y["M"], y["Q"]
    H = M.shape[0]
    parts = [jnp.mean(M, axis=0), jnp.mean(jnp.diag(Q))[None]]
    if H > 1:
        parts.append(((jnp.sum(Q) - jnp.trace(Q)) / (H * (H - 1)))[None])
    parts += [jnp.mean(x)[None] for x in jax.tree_util.tree_leaves(y["act"])]
    return jnp.concatenate(parts)


def _symmetric_state(z: jax.Array, like: dict) -> dict:
    H, F = like["M"].shape
    M = jnp.broadcast_to(z[:F], (H, F))
    d, k = z[F], F + 1
    off = z[k] if H > 1 else 0.0
    k += H > 1
    Q = off * jnp.ones((H, H)) + (d - off) * jnp.eye(H)
    leaves, tdef = jax.tree_util.tree_flatten(like["act"])
    vals = [jnp.broadcast_to(z[k + i], x.shape) for i, x in enumerate(leaves)]
    return {"M": M, "Q": Q, "act": jax.tree_util.tree_unflatten(tdef, vals)}


def symmetrise(y: dict) -> dict:
    """Projection onto the permutation-invariant states: equal rows of ``M``, equal diagonal and
    equal off-diagonal entries of ``Q``, equal per-head parameters."""
    return _symmetric_state(_symmetric_coords(y), y)


def unspecialised_point(dyn: HeadsDynamics, y_guess: dict, max_steps: int = 256) -> dict:
    """The fixed point of the order-parameter ODE on the permutation-invariant manifold (equal heads),
    from ``symmetrise(y_guess)``: a Newton root find in the manifold's own coordinates, which the
    field maps to themselves (section 9, phase 1)."""
    like = symmetrise(y_guess)
    fn = lambda t, z, a: _symmetric_coords(order_parameter_field(t, _symmetric_state(z, like), a))  # noqa: E731
    z = fixed_point(fn, _symmetric_coords(like), dyn, max_steps=max_steps)
    return _symmetric_state(z, like)


class SpecialisationSpectrum(eqx.Module):
    """Eigenvalues of the Jacobian restricted to the antisymmetric sector (complement of the
    permutation-invariant states), largest real part first, with pytree eigenvectors."""

    values: jax.Array
    vectors: list

    @property
    def rate(self) -> jax.Array:
        """The escape rate ``lambda`` (largest real part)."""
        return jnp.real(self.values[0])


def specialisation_spectrum(dyn: HeadsDynamics, y: dict) -> SpecialisationSpectrum:
    """Linearisation of the full right-hand side at ``y`` (``jax.jacfwd``) projected on the
    antisymmetric sector of ``(M, Q, act)`` (section 9, general case)."""
    flat, unravel = ravel_pytree(y)

    def sym_Q(x):  # physical states have symmetric Q: q_hh' - q_h'h is not a direction of the dynamics
        s = unravel(x)
        return ravel_pytree({**s, "Q": 0.5 * (s["Q"] + s["Q"].T)})[0]

    Pq = jax.jacfwd(sym_Q)(flat)
    Ps = jax.jacfwd(lambda x: ravel_pytree(symmetrise(unravel(x)))[0])(flat)
    evals, evecs = jnp.linalg.eigh(Pq - 0.5 * (Ps + Ps.T))
    B = evecs[:, evals > 0.5]  # orthonormal basis of the antisymmetric sector
    J = jacobian(order_parameter_field, y, dyn)
    w, v = np.linalg.eig(np.asarray(B.T @ J @ B))
    order = np.argsort(-np.real(w), kind="stable")
    w, v = w[order], np.asarray(B) @ v[:, order]
    vecs = [unravel(jnp.asarray(np.real(v[:, i]))) for i in range(v.shape[1])]
    return SpecialisationSpectrum(jnp.asarray(w), vecs)


def predicted_escape_time(lam: Any, D: Any, t0: Any = 0.0) -> Any:
    """``t_spec = t0 + ln D / (2 lambda)``: antisymmetric components start at ``O(D^{-1/2})`` and grow
    as ``e^{lambda t}`` (section 9)."""
    V.positive("lambda (escape rate)", lam)
    return t0 + np.log(D) / (2 * lam)


def feature_escape_times(traj: Trajectory, threshold: float = 0.5) -> np.ndarray:
    """Per feature ``f``, the first saved time at which ``|(I - 11^T/H) M[:, f]|`` exceeds ``threshold``
    (``inf`` if never): the order in which features are learned by specialised heads."""
    M = np.asarray(traj["M"])
    spread = np.sqrt(np.sum((M - M.mean(axis=1, keepdims=True)) ** 2, axis=1))  # (T, F)
    out = np.full(M.shape[2], np.inf)
    for f in range(M.shape[2]):
        hit = np.flatnonzero(spread[:, f] > threshold)
        if hit.size:
            out[f] = float(traj.ts[hit[0]])
    return out


# ----------------------------------------------------------------------------- pruning (section 10)
def prune(M: Any, Q: Any, activation: Activation, bank: FieldBank, order: Any = "greedy", rule: str = "mask",
          key: Any = 0) -> dict:
    """Remove heads one at a time and re-evaluate the error ``E`` on the kept sub-matrices.

    ``order``: ``"greedy"`` (smallest increase of ``E`` first), ``"mass"`` (lowest mean attention
    mass first), ``"random"``, or an explicit sequence of head indices. ``rule`` (softmax-1 only):
    ``"mask"`` keeps the ``1/H`` and ``c`` of the full model, ``"renormalise"`` averages over the kept
    heads. Returns ``{"removed": [h...], "error": E after 0..H-1 removals}``.
    """
    M, Q = jnp.asarray(M, float), jnp.asarray(Q, float)
    _check_psd("prune", M, Q)
    H = M.shape[0]
    V.choice("rule", rule, ("mask", "renormalise"))

    def err(keep):
        keep = np.asarray(sorted(keep))
        return float(2 * risk(M[keep], Q[np.ix_(keep, keep)], activation.restrict(keep, H, rule), bank))

    kept = list(range(H))
    if isinstance(order, str):
        V.choice("order", order, ("greedy", "mass", "random"))
        if order == "random":
            rng = np.random.default_rng(key if isinstance(key, int) else 0)
            order = list(rng.permutation(H)[: H - 1])
        elif order == "mass":
            chi, _ = bank.fields(M, Q)
            mass = np.asarray(bank.mean(jax.vmap(lambda c: jnp.sum(activation.head_weights(c), axis=1))(chi)))
            order = list(np.argsort(mass, kind="stable")[: H - 1])
    else:
        order = [int(h) for h in order]
        if len(set(order)) != len(order) or any(not 0 <= h < H for h in order) or len(order) >= H:
            raise ValueError(f"order must list distinct head indices in [0, {H}) and keep at least one head, got {order}")
    errors, removed = [err(kept)], []
    for step in range(H - 1):
        if order == "greedy":
            trials = {h: err([k for k in kept if k != h]) for h in kept}
            h = min(trials, key=trials.get)
        elif step < len(order):
            h = int(order[step])
        else:
            break
        kept.remove(h)
        removed.append(int(h))
        errors.append(err(kept))
    return {"removed": removed, "error": np.asarray(errors)}


# ----------------------------------------------------------------------------- closed forms (section 8)
def oracle_config(prior: Prior) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(M, Q, b)`` at which Bayes-softmax is Bayes-optimal for a prior with finite support (section 8):
    ``M = Theta``, ``Q = Theta Theta^T``, ``b_h = log pi_h - |theta_h|^2 / 2``."""
    support = prior.support() if isinstance(prior, Prior) else None
    if support is None:
        raise ValueError(f"the oracle configuration needs a prior with finite support (Discrete, FlippedSpike), got {prior!r}")
    Th, pw = support
    return Th, Th @ Th.T, jnp.log(pw) - 0.5 * jnp.sum(Th**2, axis=1)


def softmax_floor(L: int, p: float = 0.5, n_plus: int | None = None, H: int | None = None) -> float:
    """Infinite-signal softmax floor (section 8): ``L / (4 (L - 1))`` for an even split and ``p = 1/2``;
    ``L/(L-1) [p (1 - n/H)^2 + (1 - p)(n/H)^2]`` with ``n`` of ``H`` heads on ``+``."""
    L = V.positive_int("L", L, minimum=2)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    if n_plus is None:
        return L / (4 * (L - 1))
    H = V.positive_int("H", H)
    if not 0 <= n_plus <= H:
        raise ValueError(f"n_plus must be in [0, H = {H}], got {n_plus!r}")
    f = n_plus / H
    return L / (L - 1) * (p * (1 - f) ** 2 + (1 - p) * f**2)


# ----------------------------------------------------------------------------- finite-D online SGD
def sgd_optimizer(model: MultiHead, eta: Any, D: int, eta_b: Any = None) -> optax.GradientTransformation:
    """Online SGD on the clock ``t = n / D`` (section 5): keys at ``eta``, learned activation
    parameters at ``eta_b / D`` (default ``eta_b = eta``), parameters not learned frozen."""
    learned = set(model.activation.learned)
    params = eqx.filter(model, eqx.is_inexact_array)

    def label(path, _):
        s = jax.tree_util.keystr(path)
        if s.startswith(".K"):
            return "keys"
        return "act" if s.split(".")[-1] in learned else "frozen"

    labels = jax.tree_util.tree_map_with_path(label, params)
    eta_b = eta if eta_b is None else eta_b
    return optax.multi_transform({"keys": optax.sgd(eta), "act": optax.sgd(jnp.asarray(eta_b) / D),
                                  "frozen": optax.set_to_zero()}, lambda _params: labels)  # the labels tree is callable: wrap it


def online_sgd(task: Any, model: MultiHead, eta: Any, t1: float, key: Any = 0, *, eta_b: Any = None, n_save: int = 60,
               spacing: str = "linear", minibatch: int = 1, eval_samples: int = 0, eval_key: Any = 12345,
               progress: bool = False) -> Trajectory:
    """Finite-``D`` online SGD of ``model`` on ``task`` up to ``t1 = n / D`` (``attnflow.simulate``), recording the
    order parameters ``M``, ``Q``, `specialisation` and the learned activation parameters; vmappable over ``key``.

    With ``eval_samples > 0`` it also records, on one fixed held-out batch, ``error`` (``|y - y_hat|^2 / D``, the
    finite-D estimate of ``E``) and ``a_signal`` (mean attention on the signal token, ``E[a_eps]``)."""
    from ..simulate import OnlineSGD, simulate

    D = task.D
    steps = max(1, int(round(t1 * D / minibatch)))
    if eval_samples:
        batch_ev = task.sample(V.prng_key(eval_key), V.positive_int("eval_samples", eval_samples))
        X_ev, eps_ev = batch_ev[0], batch_ev[2]

    def observe(m):
        ov = overlaps(m.K, task.spikes)
        out = {**ov, "specialisation": specialisation(ov["M"]), **m.activation.params()}
        if eval_samples:
            a = jax.vmap(m.attention)(X_ev)
            out["error"] = 2 * sample_loss(m, batch_ev)
            out["a_signal"] = jnp.mean(jnp.take_along_axis(a, eps_ev[:, None], axis=1))
        return out

    return simulate(sample_loss, model, sgd_optimizer(model, eta, D, eta_b), steps, mode=OnlineSGD(task.sample, minibatch),
                    key=key, clock=minibatch / D, observe=observe, n_save=n_save, spacing=spacing, progress=progress,
                    meta={"D": D, "eta": eta if V.any_traced(eta) else float(eta)})
