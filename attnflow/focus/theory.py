"""Long-context population loss, its gradient flow, the rank-one reduced ODE and the
stage-wise rates (spec `focus.md` sections 4-5).

Parameters: ``theta = {"W0": (d, m), "W1": (m, d), "WQ": (m, mk), "WK": (m, mk)}``;
composites ``M = W0 W1`` and ``Phi = W0 WQ WK^T W0^T``.

    A = softmax_row(tau Phi + 1 log(pi)^T),   Z = A M,
    L(theta) = -<Pi P, log softmax_row(Z)>                                           (4.1)

    G_Z = Pi (softmax_row(Z) - P),  G_M = A^T G_Z,  G_A = G_Z M^T,
    G_Phi = tau A * (G_A - (A * G_A) 1 1^T)                                           (4.2)
    grad W1 = W0^T G_M,  grad W0 = G_M W1^T + G_Phi W0 WK WQ^T + G_Phi^T W0 WQ WK^T,
    grad WQ = W0^T G_Phi W0 WK,  grad WK = W0^T G_Phi^T W0 WQ.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..ode import integrate
from ..trajectory import Trajectory
from .data import MarkovChain

__all__ = [
    "init_theta", "composites", "attention", "population_loss", "population_grads", "flow_field", "population_flow",
    "reduced_field", "reduced_conserved", "conserved", "sigma", "attention_rate", "attention_rate_lazy",
    "critical_point_c1", "centred_log_pi", "reduced_from_theta", "theta_from_reduced", "transverse_rate",
    "stage_predictions", "gradient_blocks", "reduced_loss", "rank_one_part", "degenerate_point", "refine_critical_point",
    "jacobian_blocks",
]


def init_theta(key: Any, d: int, m: int = 16, mk: int = 16, eps: float = 1e-3) -> dict:
    """Gaussian initialisation ``N(0, eps^2)`` of all four matrices (spec section 3)."""
    V.positive("eps", eps)
    key = V.prng_key(key)
    k = jax.random.split(key, 4)
    f = jnp.result_type(float)
    return {"W0": eps * jax.random.normal(k[0], (d, m), f), "W1": eps * jax.random.normal(k[1], (m, d), f),
            "WQ": eps * jax.random.normal(k[2], (m, mk), f), "WK": eps * jax.random.normal(k[3], (m, mk), f)}


def composites(theta: dict) -> tuple[jax.Array, jax.Array]:
    """``M = W0 W1`` and ``Phi = W0 WQ WK^T W0^T``."""
    W0 = theta["W0"]
    return W0 @ theta["W1"], W0 @ theta["WQ"] @ theta["WK"].T @ W0.T


def attention(theta: dict, pi: jax.Array, tau: Any = 1.0) -> jax.Array:
    """Long-context attention ``A_qk = pi_k e^{tau Phi_qk} / sum_l pi_l e^{tau Phi_ql}``."""
    _, Phi = composites(theta)
    return jax.nn.softmax(tau * Phi + jnp.log(pi)[None, :], axis=-1)


def population_loss(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> jax.Array:
    """Eq. (4.1): ``-<Pi P, log softmax_row(A M)>``."""
    M, _ = composites(theta)
    Z = attention(theta, chain.pi, tau) @ M
    return -jnp.sum(chain.pi[:, None] * chain.P * jax.nn.log_softmax(Z, axis=-1))


def population_grads(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> dict:
    """Closed-form gradients (4.2) of `population_loss` (tested against ``jax.grad``)."""
    W0, W1, WQ, WK = theta["W0"], theta["W1"], theta["WQ"], theta["WK"]
    M, _ = composites(theta)
    A = attention(theta, chain.pi, tau)
    Z = A @ M
    G_Z = chain.pi[:, None] * (jax.nn.softmax(Z, axis=-1) - chain.P)
    G_M = A.T @ G_Z
    G_A = G_Z @ M.T
    G_Phi = tau * A * (G_A - jnp.sum(A * G_A, axis=1, keepdims=True))
    return {
        "W0": G_M @ W1.T + G_Phi @ W0 @ WK @ WQ.T + G_Phi.T @ W0 @ WQ @ WK.T,
        "W1": W0.T @ G_M,
        "WQ": W0.T @ G_Phi @ W0 @ WK,
        "WK": W0.T @ G_Phi.T @ W0 @ WQ,
    }


def gradient_blocks(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> tuple[jax.Array, jax.Array]:
    """``(G_M, G_Phi)``: the loss gradients with respect to the composites."""
    M, _ = composites(theta)
    A = attention(theta, chain.pi, tau)
    G_Z = chain.pi[:, None] * (jax.nn.softmax(A @ M, axis=-1) - chain.P)
    G_A = G_Z @ M.T
    return A.T @ G_Z, tau * A * (G_A - jnp.sum(A * G_A, axis=1, keepdims=True))


def flow_field(t: Any, theta: dict, args: dict) -> dict:
    """Population gradient flow ``d theta/dt = -grad L`` with the closed-form gradients (4.2)."""
    chain, tau = args["chain"], args["tau"]
    g = population_grads(theta, chain, tau)
    return jax.tree_util.tree_map(lambda x: -x, g)


def conserved(theta: dict) -> dict:
    """``C_m = W0^T W0 - W1 W1^T - WQ WQ^T - WK WK^T`` and ``C_k = WQ^T WQ - WK^T WK`` (section 4)."""
    W0, W1, WQ, WK = theta["W0"], theta["W1"], theta["WQ"], theta["WK"]
    return {"C_m": W0.T @ W0 - W1 @ W1.T - WQ @ WQ.T - WK @ WK.T, "C_k": WQ.T @ WQ - WK.T @ WK}


def population_flow(theta0: dict, chain: MarkovChain, t1: float = 5000.0, *, tau: Any = 1.0, observe=None,
                    n_save: int = 400, spacing: str = "log", rtol: float = 1e-9, atol: float = 1e-12,
                    max_steps: int = 1_000_000, progress: bool = False, ts: Any = None) -> Trajectory:
    """Integrate the population flow from ``theta0`` (Tsit5 + PID; spec default tolerances are
    looser, 1e-7/1e-10: the tighter ones here keep the loss monotone on the save grid)."""
    return integrate(flow_field, theta0, t1, args={"chain": chain, "tau": tau}, observe=observe, n_save=n_save,
                     spacing=spacing, t_min=1e-2, rtol=rtol, atol=atol, max_steps=max_steps, progress=progress, ts=ts)


# ----------------------------------------------------------------------------- rank-one reduction
def theta_from_reduced(y: dict) -> dict:
    """``W0 = gamma (d x 1)``, ``W1 = beta^T``, ``WQ = lambda_Q``, ``WK = lambda_K`` (m = mk = 1)."""
    return {"W0": y["gamma"][:, None], "W1": y["beta"][None, :], "WQ": y["lam_q"].reshape(1, 1), "WK": y["lam_k"].reshape(1, 1)}


def reduced_from_theta(theta: dict) -> dict:
    return {"gamma": theta["W0"][:, 0], "beta": theta["W1"][0], "lam_q": theta["WQ"][0, 0], "lam_k": theta["WK"][0, 0]}


def reduced_field(t: Any, y: dict, args: dict) -> dict:
    """Rank-one reduced ODE (section 5.3), ``2d + 2`` unknowns ``(gamma, beta, lambda_Q, lambda_K)``:
    ``gamma' = -G_M beta - kappa (G_Phi + G_Phi^T) gamma``, ``beta' = -G_M^T gamma``,
    ``lambda_Q' = -(gamma^T G_Phi gamma) lambda_K``, ``lambda_K' = -(gamma^T G_Phi gamma) lambda_Q``."""
    G_M, G_Phi = gradient_blocks(theta_from_reduced(y), args["chain"], args["tau"])
    g, b, lq, lk = y["gamma"], y["beta"], y["lam_q"], y["lam_k"]
    kappa = lq * lk
    s = g @ G_Phi @ g
    return {"gamma": -G_M @ b - kappa * (G_Phi + G_Phi.T) @ g, "beta": -G_M.T @ g, "lam_q": -s * lk, "lam_k": -s * lq}


def reduced_conserved(y: dict) -> dict:
    """``lambda_Q^2 - lambda_K^2`` and ``|gamma|^2 - |beta|^2 - lambda_Q^2 - lambda_K^2``."""
    return {"qk": y["lam_q"] ** 2 - y["lam_k"] ** 2,
            "norms": y["gamma"] @ y["gamma"] - y["beta"] @ y["beta"] - y["lam_q"] ** 2 - y["lam_k"] ** 2}


# ----------------------------------------------------------------------------- rates and critical points
def centred_log_pi(pi: Any) -> jax.Array:
    """``ell = log pi - mean(log pi)``."""
    lp = jnp.log(jnp.asarray(pi))
    return lp - jnp.mean(lp)


def sigma(pi: Any) -> jax.Array:
    """Stage I rate ``sigma = ||pi|| ||pi - 1/d||`` (``||M||`` grows at ``2 sigma``)."""
    pi = jnp.asarray(pi)
    return jnp.linalg.norm(pi) * jnp.linalg.norm(pi - 1.0 / pi.shape[0])


def critical_point_c1(pi: Any, alpha: Any) -> dict:
    """``theta_c^1``: ``W0 = gamma alpha^T``, ``W1 = alpha beta^T``, ``W_{Q,K} = 0`` with
    ``gamma = a pi/|pi|``, ``beta = a ell/|ell|``, ``a^2 = |ell|/|pi|``; ``alpha`` a unit vector in R^m."""
    pi = jnp.asarray(pi)
    alpha = jnp.asarray(alpha, dtype=pi.dtype)
    alpha = alpha / jnp.linalg.norm(alpha)
    ell = centred_log_pi(pi)
    a = jnp.sqrt(jnp.linalg.norm(ell) / jnp.linalg.norm(pi))
    gamma = a * pi / jnp.linalg.norm(pi)
    beta = a * ell / jnp.linalg.norm(ell)
    return {"W0": jnp.outer(gamma, alpha), "W1": jnp.outer(alpha, beta),
            "WQ": jnp.zeros((alpha.shape[0], alpha.shape[0])), "WK": jnp.zeros((alpha.shape[0], alpha.shape[0])),
            "gamma": gamma, "beta": beta, "a2": a**2}


def attention_rate(pi: Any, P: Any, tau: Any, gamma: Any, beta: Any) -> jax.Array:
    """General Stage II rate ``c = tau Var_pi(gamma) Cov_{pi,P}(gamma(X_t), beta(X_{t+1}))``."""
    pi, P, gamma, beta = map(jnp.asarray, (pi, P, gamma, beta))
    var = jnp.sum(pi * gamma**2) - jnp.sum(pi * gamma) ** 2
    cov = jnp.sum(pi * gamma * (P @ beta)) - jnp.sum(pi * gamma) * jnp.sum(pi * beta)
    return tau * var * cov


def attention_rate_lazy(pi: Any, lam: Any, tau: Any = 1.0) -> jax.Array:
    """Lazy-chain closed form ``c = tau lam |ell| Var_pi(pi) Cov_pi(pi, log pi) / |pi|^5``."""
    pi = jnp.asarray(pi)
    ell = centred_log_pi(pi)
    var = jnp.sum(pi**3) - jnp.sum(pi**2) ** 2
    cov = jnp.sum(pi**2 * jnp.log(pi)) - jnp.sum(pi**2) * jnp.sum(pi * jnp.log(pi))
    return tau * lam * jnp.linalg.norm(ell) * var * cov / jnp.linalg.norm(pi) ** 5


def transverse_rate(G_M: jax.Array) -> jax.Array:
    """Stage IV rate ``mu_perp = sigma_max(G_M)`` at the perturbed degenerate point."""
    return jnp.linalg.svd(G_M, compute_uv=False)[0]


def stage_predictions(chain: MarkovChain, tau: Any = 1.0, eps: float = 1e-3) -> dict:
    """Predicted plateaus and rates: ``log d``, ``H(pi)``, ``L_*``, ``sigma``, ``c`` (general formula
    at ``theta_c^1``) and the escape times ``log(1/eps)/rate``."""
    pi = chain.pi
    c1 = critical_point_c1(pi, jnp.eye(1, 1)[0])
    c = attention_rate(pi, chain.P, tau, c1["gamma"], c1["beta"])
    s = sigma(pi)
    return {"log_d": float(np.log(chain.d)), "H_pi": float(chain.entropy()), "L_star": float(chain.bayes_floor()),
            "sigma": float(s), "c": float(c), "T_I": float(np.log(1 / eps) / s),
            "T_II": float(np.log(1 / eps) / c) if float(c) > 0 else float("inf")}


def reduced_loss(y: dict, chain: Any, tau: Any = 1.0) -> jax.Array:
    """Population loss of the rank-one (m = mk = 1) model."""
    return population_loss(theta_from_reduced(y), chain, tau)


def rank_one_part(theta: dict) -> dict:
    """Project a full state on the rank-one manifold: ``a1 = v1(W0)``, ``gamma = W0 a1``,
    ``beta = W1^T a1``, ``lambda_Q = a1^T WQ u``, ``lambda_K = a1^T WK u`` with ``u`` the top right
    singular vector of ``WQ``."""
    _, _, Vt = jnp.linalg.svd(theta["W0"], full_matrices=False)
    a1 = Vt[0]
    u = jnp.linalg.svd(theta["WQ"], full_matrices=False)[2][0]
    return {"gamma": theta["W0"] @ a1, "beta": theta["W1"].T @ a1, "lam_q": a1 @ theta["WQ"] @ u,
            "lam_k": a1 @ theta["WK"] @ u}


def degenerate_point(chain: Any, tau: Any = 1.0, warm_start: dict | None = None, max_steps: int = 2000) -> dict:
    """Critical point of the rank-one model (section 5.4): ``grad L_red = 0`` solved by
    Levenberg-Marquardt on the gradient (a pseudo-inverse Newton method, robust to the
    symmetry null directions), warm-started from ``warm_start`` (a reduced state, e.g. the
    `rank_one_part` of a flowed state on the Stage IV plateau)."""
    import optimistix as optx

    if warm_start is None:
        raise ValueError("degenerate_point needs a warm_start (e.g. rank_one_part of a state on the Stage IV plateau)")
    y0 = jax.tree_util.tree_map(jnp.asarray, warm_start)
    res = lambda y, a: jax.grad(reduced_loss)(y, chain, tau)  # noqa: E731
    sol = optx.least_squares(res, optx.LevenbergMarquardt(rtol=1e-12, atol=1e-14), y0, max_steps=max_steps, throw=False)
    g = res(sol.value, None)
    size = max(float(jnp.max(jnp.abs(v))) for v in jax.tree_util.tree_leaves(g))
    if not np.isfinite(size) or size > 1e-8:
        raise RuntimeError(f"degenerate_point: Levenberg-Marquardt stopped with |grad L| = {size:.3g}; try another warm start")
    return sol.value


def refine_critical_point(theta: dict, chain: Any, tau: Any = 1.0, max_steps: int = 200) -> dict:
    """Refine an approximate critical point of the population flow by a Levenberg-Marquardt root
    find on the gradient (core `attnflow.fixed_point`; robust to the rotation symmetries)."""
    import optimistix as optx

    from ..saddle import fixed_point

    return fixed_point(flow_field, theta, {"chain": chain, "tau": tau},
                       solver=optx.LevenbergMarquardt(rtol=1e-12, atol=1e-14), max_steps=max_steps)


def jacobian_blocks(theta: dict, chain: Any, tau: Any = 1.0) -> dict:
    """Jacobian of the flow at ``theta`` split into the outer ``(W0, W1)`` block, the attention
    ``(WQ, WK)`` block and the coupling between them (section 5.2: block-diagonal at theta_c^1)."""
    from ..saddle import jacobian

    J = jacobian(flow_field, theta, {"chain": chain, "tau": tau})
    n_outer = theta["W0"].size + theta["W1"].size
    return {"outer": J[:n_outer, :n_outer], "attention": J[n_outer:, n_outer:], "coupling": J[:n_outer, n_outer:], "full": J}
