"""Reduced dynamics of QK vs OV learning speeds (spec `qkov.md` sections 5-9).

State: ``{"mu_ov": mu_OV, "mu_qk": mu_QK}`` (scalars or batched arrays).

    alpha = m e^{mu_QK} / (m e^{mu_QK} + n),   E = e^{alpha mu_OV} + M - 1,
    L = log(1 + (M - 1) e^{-alpha mu_OV})                                  (3.3)

    d mu_OV/dt = eta_OV alpha / (b E) * g_OV                                (5.3)
    d mu_QK/dt = kappa c^2 eta_QK (M-1) alpha (1-alpha) mu_OV / (M b^p E) * g_QK

with factorisation multipliers ``g_OV = 2 sqrt(b) mu_OV`` (FO, else 1) and
``g_QK = 2 b mu_QK / c`` (FA, else 1); ``kappa = 1 + b/|C|`` with the common-score
correction (else 1), ``p = 2`` (distinct_uniform query) or 1 (dedicated query).

First integral (section 6): ``Phi(mu_QK) - K Psi(mu_OV)`` is constant, with
``K = kappa c^2 r (M-1) / (M b^(p-1))``, ``r = eta_QK / eta_OV``,
``Phi_CA = mu + (m/n) e^mu``, ``Phi_FA = c (ln mu + (m/n) Ei(mu)) / (2b)``,
``Psi_CO = mu^2 / 2``, ``Psi_FO = mu / (2 sqrt b)``.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..ode import integrate, save_times
from ..trajectory import Trajectory

PARAMETRISATIONS = ("CACO", "FACO", "CAFO", "FAFO")
QUERY_MODES = ("distinct_uniform", "dedicated")

__all__ = [
    "PARAMETRISATIONS", "QKOVParams", "alpha", "loss", "reduced_field", "invariant", "first_integral",
    "state_at_loss", "loss_to_margin", "solve_reduced", "authors_rk4", "upper_bounds", "asymptotics",
    "balanced_factorise", "factor_conserved", "balance_diagnostic", "effective_rate",
]


def _check_parametrisation(p: str) -> str:
    if not isinstance(p, str) or p.upper() not in PARAMETRISATIONS:
        raise ValueError(f"unknown parametrisation {p!r}; expected one of {', '.join(PARAMETRISATIONS)}")
    return p.upper()


class QKOVParams(eqx.Module):
    """Parameters of the reduced ODE. Numeric fields are arrays (vmappable); the
    parametrisation is static.

    Build with `QKOVParams.create`, which validates and applies the spec's options.
    """

    m: jax.Array
    n: jax.Array
    b: jax.Array
    M: jax.Array
    eta_ov: jax.Array
    eta_qk: jax.Array
    kappa: jax.Array
    c: jax.Array
    p: jax.Array
    parametrisation: str = eqx.field(static=True, default="CACO")

    @classmethod
    def create(
        cls,
        m: Any = 5.0,
        n: Any = 50.0,
        b: Any = 50.0,
        M: Any = 20.0,
        eta_ov: Any = 1.0,
        eta_qk: Any = None,
        ratio: Any = None,
        parametrisation: str = "CACO",
        common_correction: bool = False,
        n_common: Any = None,
        query_mode: str = "distinct_uniform",
        score_scale: Any = 1.0,
    ) -> "QKOVParams":
        """Validated parameters.

        Give ``eta_qk`` or ``ratio = eta_QK / eta_OV`` (default ratio 1).
        ``common_correction=True`` uses ``kappa = 1 + b / n_common`` (the exact full-matrix
        rate for the `gap` readout); off by default (the README equations, kappa = 1).
        """
        par = _check_parametrisation(parametrisation)
        V.choice("query_mode", query_mode, QUERY_MODES)
        for name, v in (("m", m), ("n", n), ("b", b), ("eta_ov", eta_ov), ("score_scale", score_scale)):
            V.positive(name, v)
        if not V.any_traced(M):
            V.positive("M", M)
            if np.any(np.asarray(M) < 2):
                raise ValueError(f"M (number of classes) must be >= 2, got {M!r}")
        if eta_qk is not None and ratio is not None:
            raise ValueError("give eta_qk or ratio, not both")
        if eta_qk is None:
            ratio = 1.0 if ratio is None else ratio
            V.positive("ratio", ratio)
            eta_qk = jnp.asarray(ratio) * jnp.asarray(eta_ov)
        V.positive("eta_qk", eta_qk)
        if common_correction:
            if n_common is None:
                raise ValueError("common_correction=True needs n_common (|C|, the number of common tokens)")
            V.positive("n_common", n_common)
            kappa = 1.0 + jnp.asarray(b) / jnp.asarray(n_common)
        else:
            kappa = 1.0
        p = 2.0 if query_mode == "distinct_uniform" else 1.0
        f = lambda x: jnp.asarray(x, dtype=jnp.result_type(float))  # noqa: E731
        return cls(f(m), f(n), f(b), f(M), f(eta_ov), f(eta_qk), f(kappa), f(score_scale), f(p), par)

    @property
    def ratio(self) -> jax.Array:
        return self.eta_qk / self.eta_ov

    @property
    def fa(self) -> bool:
        return self.parametrisation[:2] == "FA"

    @property
    def fo(self) -> bool:
        return self.parametrisation[2:] == "FO"

    @property
    def K(self) -> jax.Array:
        """Coefficient of the first integral: ``kappa c^2 r (M-1) / (M b^(p-1))``."""
        return self.kappa * self.c**2 * self.ratio * (self.M - 1) / (self.M * self.b ** (self.p - 1))


def alpha(mu_qk: Any, params: QKOVParams) -> jax.Array:
    """Attention mass on distinct tokens, ``m e^mu / (m e^mu + n)`` (a logistic, overflow-safe)."""
    return jax.nn.sigmoid(mu_qk + jnp.log(params.m / params.n))


def _inv_E(a_mu: jax.Array, M: jax.Array) -> jax.Array:
    """``1 / E = 1 / (e^{a mu} + M - 1)`` without overflow."""
    e = jnp.exp(-a_mu)
    return e / (1.0 + (M - 1.0) * e)


def loss(state: dict, params: QKOVParams) -> jax.Array:
    """Reduced loss ``log(1 + (M-1) e^{-alpha mu_OV})`` (section 3.3)."""
    a = alpha(state["mu_qk"], params)
    return jnp.log1p((params.M - 1.0) * jnp.exp(-a * state["mu_ov"]))


def loss_to_margin(L: Any, M: Any) -> jax.Array:
    """``ell = alpha mu_OV`` at which the loss equals ``L``: ``-ln((e^L - 1) / (M - 1))`` (section 7)."""
    return -jnp.log(jnp.expm1(jnp.asarray(L)) / (jnp.asarray(M) - 1.0))


def reduced_field(t: Any, state: dict, params: QKOVParams) -> dict:
    """Vector field of section 5.3 (all four parametrisations) in time ``t``."""
    mu_ov, mu_qk = state["mu_ov"], state["mu_qk"]
    a = alpha(mu_qk, params)
    one_minus_a = jax.nn.sigmoid(-(mu_qk + jnp.log(params.m / params.n)))
    invE = _inv_E(a * mu_ov, params.M)
    g_ov = 2.0 * jnp.sqrt(params.b) * mu_ov if params.fo else 1.0
    g_qk = 2.0 * params.b * mu_qk / params.c if params.fa else 1.0
    d_ov = params.eta_ov * a * invE / params.b * g_ov
    d_qk = (params.kappa * params.c**2 * params.eta_qk * (params.M - 1.0) * a * one_minus_a * mu_ov * invE
            / (params.M * params.b**params.p) * g_qk)
    return {"mu_ov": d_ov, "mu_qk": d_qk}


def _Phi(mu_qk, params):
    if params.fa:
        return params.c * (jnp.log(mu_qk) + params.m / params.n * jax.scipy.special.expi(mu_qk)) / (2.0 * params.b)
    return mu_qk + params.m / params.n * jnp.exp(mu_qk)


def _Psi(mu_ov, params):
    if params.fo:
        return mu_ov / (2.0 * jnp.sqrt(params.b))
    return 0.5 * mu_ov**2


def invariant(state: dict, params: QKOVParams) -> jax.Array:
    """``Phi(mu_QK) - K Psi(mu_OV)``, constant along the flow (section 6)."""
    return _Phi(state["mu_qk"], params) - params.K * _Psi(state["mu_ov"], params)


def first_integral(state: dict, params: QKOVParams, initial: dict | None = None) -> jax.Array:
    """Residual of the first integral relative to ``initial`` (default: the origin, CACO/CAFO/FACO
    need ``mu > 0`` for factorised circuits, so pass ``initial`` there).

    For CACO from 0 this is ``mu_QK + (m/n)(e^{mu_QK} - 1) - K mu_OV^2 / 2``.
    """
    if initial is None:
        if params.fa or params.fo:
            raise ValueError(f"{params.parametrisation} starts at mu > 0: pass the initial state")
        initial = {"mu_ov": jnp.zeros_like(state["mu_ov"]), "mu_qk": jnp.zeros_like(state["mu_qk"])}
    return invariant(state, params) - invariant(initial, params)


def state_at_loss(L_target: Any, params: QKOVParams, initial: dict | None = None, iterations: int = 200) -> dict:
    """State ``(mu_OV, mu_QK, alpha)`` where the flow from ``initial`` first reaches loss ``L_target``.

    Section 7: with ``ell = loss_to_margin(L)``, the root of the strictly increasing
    ``F(mu_QK) = Phi(mu_QK) - K Psi(ell / alpha(mu_QK)) - I_0``, bracketed from
    ``mu_QK(0)`` by doubling and refined by bisection (vmappable, no Python loop).
    Valid when the initial loss exceeds ``L_target``.
    """
    dtype = jnp.result_type(float)
    if initial is None:
        initial = {"mu_ov": jnp.zeros((), dtype), "mu_qk": jnp.zeros((), dtype)}
    ell = loss_to_margin(L_target, params.M)
    I0 = invariant(initial, params)
    lo0 = jnp.asarray(initial["mu_qk"], dtype)

    def F(mu):
        return _Phi(mu, params) - params.K * _Psi(ell / alpha(mu, params), params) - I0

    def grow(c):
        lo, step = c
        return lo, 2.0 * step

    _, step = jax.lax.while_loop(lambda c: (F(c[0] + c[1]) < 0) & (c[1] < 1e6), grow, (lo0, jnp.asarray(1.0, dtype)))
    lo, hi = lo0, lo0 + step

    def bisect(_, c):
        lo, hi = c
        mid = 0.5 * (lo + hi)
        neg = F(mid) < 0
        return jnp.where(neg, mid, lo), jnp.where(neg, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iterations, bisect, (lo, hi))
    mu_qk = 0.5 * (lo + hi)
    a = alpha(mu_qk, params)
    return {"mu_ov": ell / a, "mu_qk": mu_qk, "alpha": a}


def _tau_scale(params: QKOVParams) -> jax.Array:
    return jnp.minimum(params.eta_ov, params.eta_qk)


def observables(state: dict, params: QKOVParams) -> dict:
    return {"mu_ov": state["mu_ov"], "mu_qk": state["mu_qk"], "alpha": alpha(state["mu_qk"], params),
            "loss": loss(state, params)}


def solve_reduced(
    params: QKOVParams,
    *,
    initial: dict | None = None,
    loss_target: Any = 1e-4,
    horizon: Any = 5e7,
    n_save: int = 300,
    rtol: Any = 1e-10,
    atol: Any = 1e-12,
    max_steps: int = 200_000,
    progress: bool = False,
) -> Trajectory:
    """Adaptive solve (Tsit5 + PID) of the reduced ODE in the authors' clock
    ``tau = t min(eta_OV, eta_QK)``, stopping at the first time the loss reaches
    ``loss_target`` (a terminating event). Save times are log-spaced in ``tau``.

    The trajectory has observables ``mu_ov, mu_qk, alpha, loss``; ``traj.ts[-1]`` is the
    event time ``tau_end`` (or ``horizon``).
    """
    dtype = jnp.result_type(float)
    if initial is None:
        initial = {"mu_ov": jnp.zeros((), dtype), "mu_qk": jnp.zeros((), dtype)}
    y0 = {k: jnp.asarray(v, dtype) for k, v in initial.items()}
    ts = save_times(0.0, horizon, n_save, "log", t_min=1e-2)
    # module-level field, observe and event: repeated calls reuse one compilation
    return integrate(
        _field_tau, y0, horizon, args={"params": params, "target": jnp.asarray(loss_target, dtype)}, ts=ts,
        rtol=rtol, atol=atol, max_steps=max_steps, observe=_observe_tau, event=_loss_event, progress=progress,
        meta={"clock": "tau = t * min(eta_ov, eta_qk)", "parametrisation": params.parametrisation},
    )


def _field_tau(tau, y, args):
    p = args["params"]
    d = reduced_field(tau, y, p)
    return {k: v / _tau_scale(p) for k, v in d.items()}


def _observe_tau(tau, y, args):
    return observables(y, args["params"])


def _loss_event(tau, y, args):
    return loss(y, args["params"]) - args["target"]


def authors_rk4(
    params: QKOVParams,
    *,
    d_tau: float = 10.0,
    loss_target: float = 1e-4,
    horizon: float = 5e7,
    clip: float = 60.0,
    clamp: float = 1e6,
    denominator_eps: float = 1e-12,
    n_save: int = 300,
    initial: dict | None = None,
) -> Trajectory:
    """Replica of the authors' fixed-step RK4 (section 5.4), compiled as one ``while_loop``.

    Steps of ``d_tau`` in ``tau = t min(eta_OV, eta_QK)``; exponentials clipped to
    ``+-clip``, ``denominator_eps`` added to the alpha and rate denominators, ``mu``
    clamped to ``[0, clamp]`` after each step; stops at the first step whose loss is
    ``<= loss_target`` or at ``horizon`` (the authors double a 2e5 horizon up to 5e7,
    which for a fixed-step scheme is the same as running to 5e7). Saves at log-spaced
    step indices; unreached save slots hold the final state.
    """
    dtype = jnp.result_type(float)
    scale = _tau_scale(params)
    m, n, b, M = params.m, params.n, params.b, params.M
    eps = denominator_eps
    ex = lambda x: jnp.exp(jnp.clip(x, -clip, clip))  # noqa: E731

    def rates(y):
        mu_ov, mu_qk = y[0], y[1]
        em = ex(mu_qk)
        a = m * em / (m * em + n + eps)
        E = ex(a * mu_ov) + M - 1.0 + eps
        g_ov = 2.0 * jnp.sqrt(b) * mu_ov if params.fo else 1.0
        g_qk = 2.0 * b * mu_qk / params.c if params.fa else 1.0
        d_ov = params.eta_ov * a / (b * E + eps) * g_ov
        d_qk = (params.kappa * params.c**2 * params.eta_qk * (M - 1.0) * a * (1.0 - a) * mu_ov
                / (M * b**params.p * E + eps) * g_qk)
        return jnp.stack([d_ov, d_qk]) / scale

    def loss_of(y):
        em = ex(y[1])
        a = m * em / (m * em + n + eps)
        return jnp.log(1.0 + (M - 1.0) * ex(-a * y[0]))

    max_steps = int(np.ceil(horizon / d_tau))
    save_idx = jnp.asarray(np.unique(np.concatenate([[0], np.round(np.geomspace(1, max_steps, n_save - 1))])).astype(np.int64))
    ns = save_idx.shape[0]
    if initial is None:
        y0 = jnp.zeros(2, dtype)
    else:
        y0 = jnp.asarray([initial["mu_ov"], initial["mu_qk"]], dtype)

    def cond(c):
        k, y, buf, ptr = c
        return (k < max_steps) & (loss_of(y) > loss_target)

    def body(c):
        k, y, buf, ptr = c
        h = d_tau
        k1 = rates(y)
        k2 = rates(y + 0.5 * h * k1)
        k3 = rates(y + 0.5 * h * k2)
        k4 = rates(y + h * k3)
        y = jnp.clip(y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), 0.0, clamp)
        k = k + 1
        hit = save_idx[jnp.minimum(ptr, ns - 1)] == k
        buf = jnp.where(hit, buf.at[jnp.minimum(ptr, ns - 1)].set(jnp.concatenate([k[None] * d_tau, y])), buf)
        return k, y, buf, ptr + hit.astype(ptr.dtype)

    buf0 = jnp.zeros((ns, 3), dtype).at[0].set(jnp.concatenate([jnp.zeros(1, dtype), y0]))
    k, y, buf, ptr = jax.lax.while_loop(cond, body, (jnp.asarray(0), y0, buf0, jnp.asarray(1)))
    final = jnp.concatenate([k[None] * d_tau, y])
    filled = jnp.where((jnp.arange(ns) < ptr)[:, None], buf, final[None])
    filled = filled.at[-1].set(final)
    ts = filled[:, 0]
    state = {"mu_ov": filled[:, 1], "mu_qk": filled[:, 2]}
    return Trajectory(ts, observables(state, params),
                      {"integrator": "authors_rk4", "d_tau": d_tau, "clock": "tau = t * min(eta_ov, eta_qk)",
                       "parametrisation": params.parametrisation})


def upper_bounds(t: Any, params: QKOVParams) -> dict:
    """CACO upper bounds (section 8, kappa = c = 1): with ``alpha_0 = m / (m + n)``,
    ``mu_OV <= ln(1 + alpha_0 eta_OV t / b) / alpha_0`` and ``mu_QK <= r (M-1) mu_OV^2 / (2 M b)``
    (the latter evaluated at the bound on ``mu_OV``)."""
    a0 = params.m / (params.m + params.n)
    mu_ov = jnp.log1p(a0 * params.eta_ov * jnp.asarray(t) / params.b) / a0
    return {"mu_ov": mu_ov, "mu_qk": params.ratio * (params.M - 1) / (2 * params.M * params.b) * mu_ov**2}


def asymptotics(t: Any, params: QKOVParams) -> dict:
    """Sharp large-t asymptotics of CACO (section 8): ``mu_OV ~ ln(eta_OV t / b)``,
    ``e^{mu_QK} ~ n r (M-1) mu_OV^2 / (2 M b m)``, ``1 - alpha ~ 2 M b / (r (M-1) mu_OV^2)``,
    ``L ~ (M-1) b / (eta_OV t)``."""
    t = jnp.asarray(t)
    mu_ov = jnp.log(params.eta_ov * t / params.b)
    r = params.ratio
    return {
        "mu_ov": mu_ov,
        "mu_qk": jnp.log(params.n * r * (params.M - 1) * mu_ov**2 / (2 * params.M * params.b * params.m)),
        "one_minus_alpha": 2 * params.M * params.b / (r * (params.M - 1) * mu_ov**2),
        "loss": (params.M - 1) * params.b / (params.eta_ov * t),
    }


def balanced_factorise(W: Any, eta_A: Any = 1.0, eta_B: Any = 1.0, rank: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Weighted-balanced factors of ``W = A B`` (section 9):
    ``A = U S^{1/2} (eta_A/eta_B)^{1/4}``, ``B = (eta_B/eta_A)^{1/4} S^{1/2} V^T``,
    so that ``A^T A / eta_A = B B^T / eta_B``. ``rank`` keeps the top singular values."""
    V.positive("eta_A", eta_A)
    V.positive("eta_B", eta_B)
    U, s, Vt = jnp.linalg.svd(jnp.asarray(W), full_matrices=False)
    if rank is not None:
        U, s, Vt = U[:, :rank], s[:rank], Vt[:rank]
    w = (jnp.asarray(eta_A) / jnp.asarray(eta_B)) ** 0.25
    r = jnp.sqrt(s)
    return U * r * w, (r / w)[:, None] * Vt


def factor_conserved(A: Any, B: Any, eta_A: Any = 1.0, eta_B: Any = 1.0) -> jax.Array:
    """``A^T A / eta_A - B B^T / eta_B``: conserved by gradient flow on ``W = A B`` (section 9)."""
    return A.T @ A / eta_A - B @ B.T / eta_B


def balance_diagnostic(W_O: Any, W_V: Any) -> jax.Array:
    """Authors' imbalance ``||W_O^T W_O - W_V W_V^T||_F / max(||W_O^T W_O||_F, ||W_V W_V^T||_F, 1e-8)``."""
    a, b = W_O.T @ W_O, W_V @ W_V.T
    return jnp.linalg.norm(a - b) / jnp.maximum(jnp.maximum(jnp.linalg.norm(a), jnp.linalg.norm(b)), 1e-8)


def effective_rate(eta_A: Any, eta_B: Any, sigma: Any) -> jax.Array:
    """Implicit learning rate of a weighted-balanced factorised circuit: ``2 sqrt(eta_A eta_B) sigma(W)``."""
    return 2.0 * jnp.sqrt(jnp.asarray(eta_A) * jnp.asarray(eta_B)) * jnp.asarray(sigma)
