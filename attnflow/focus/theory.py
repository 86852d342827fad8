"""Long-context population loss, its gradient flow (`solve`), the rank-one reduced ODE and the
stage-wise rates and critical points (docs/focus.md, "Population theory" and "Stages").

Parameters ``theta = {"W0": (d, m), "W1": (m, d), "WQ": (m, mk), "WK": (m, mk)}``;
composites ``M = W0 W1`` and ``Phi = W0 WQ WK^T W0^T``. As the context grows, key counts
become proportional to ``pi`` and the last token's own weight vanishes, so

    A = softmax_row(tau Phi + 1 log(pi)^T),   Z = A M,                                     (P1)
    L(theta) = -<Pi P, log softmax_row(Z)>,                                                (P2)

    G_Z = Pi (softmax_row(Z) - P),  G_M = A^T G_Z,  G_A = G_Z M^T,
    G_Phi = tau A * (G_A - (A * G_A) 1 1^T),                                               (P3)
    grad W1 = W0^T G_M,  grad W0 = G_M W1^T + G_Phi W0 WK WQ^T + G_Phi^T W0 WQ WK^T,
    grad WQ = W0^T G_Phi W0 WK,  grad WK = W0^T G_Phi^T W0 WQ,                             (P4)

and the population flow is ``d theta/dt = -eta grad L`` (P6).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .. import _validate as V
from .._errors import check_traced
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..ode import ODE, require_x64
from ..options import LogGrid, SaveGrid, SolverOptions
from ..saddle import fixed_point, jacobian
from ..stiff import AutoStiff
from ..trajectory import Trajectory
from .data import MarkovChain, _check_lazy_lam, check_pi
from .model import PARAMETERS, composites
from .setup import Setup, _check_weights

__all__ = [
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEGENERATE_TOL",
    "attention",
    "attention_rate",
    "attention_rate_lazy",
    "centred_log_pi",
    "conserved",
    "critical_point_c1",
    "degenerate_point",
    "flow_field",
    "gradient_blocks",
    "jacobian_blocks",
    "population_grads",
    "population_loss",
    "rank_one_part",
    "reduced_conserved",
    "reduced_field",
    "reduced_from_theta",
    "reduced_gradient",
    "reduced_loss",
    "refine_critical_point",
    "sigma",
    "solve",
    "stage_predictions",
    "theta_from_reduced",
    "transverse_rate",
]


# ----------------------------------------------------------------------------- input checks
# The public formulas below check concrete input before computing, naming the argument: a value
# that is no array of reals (a string, a boolean, a complex number), NaN or Inf, a shape that does
# not fit the chain's d, a tau that is not positive (as `Setup`'s), a lam outside the lazy range.
# Traced input (jit, vmap, a sweep) is checked by shape and dtype; at a point of `attnflow.sweep`
# a bad tau or lam fails the point with the message (`attnflow._errors.check_traced`), as the
# same value does in `Setup` and `MarkovChain.lazy`.
_WIDTHS = "the widths of theta['W0'] and theta['WQ']"


def _real(name: str, value: Any) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an array of reals (no string, boolean or
    complex number), finite where concrete; traced values are checked by dtype."""
    if V.any_traced(value):
        V.floats(name, value)  # refuses a boolean or complex dtype
        return
    V.finite_tree(name, V.reals(name, value))


def _shaped(name: str, value: Any, shape: tuple[int, ...], d: int) -> None:
    """`_real`, and ``ValueError`` unless ``value`` has ``shape`` (that of the chain's ``d``)."""
    got = jnp.shape(value)
    if got != shape:
        raise ValueError(f"{name} must have shape {shape} to match pi (d = {d}), got shape {got}")
    _real(name, value)


def _tau(tau: Any, scalar: bool = True) -> None:
    """The score scale ``tau``: a (scalar) finite positive real, as `Setup` takes it."""
    if scalar:
        V.scalar("tau", tau)
    if V.any_traced(tau):
        V.floats("tau", tau)
    V.positive("tau", tau)


def _chain(chain: Any) -> MarkovChain:
    if not isinstance(chain, MarkovChain):
        raise ValueError(f"chain must be an attnflow.focus.MarkovChain, got {chain!r:.80}")
    return chain


def _theta(theta: Any, d: int | None = None) -> None:
    """Weights ``theta`` (`attnflow.focus.PARAMETERS`) with shapes that fit ``d`` (default: the
    rows of ``theta["W0"]``) and each other (`Setup.initial_state`'s check, widths read from
    ``theta``)."""
    if d is None:
        if not isinstance(theta, Mapping) or "W0" not in theta:
            _check_weights("theta", theta, -1, whose=_WIDTHS)  # raises, naming the type or the missing key
        W0 = jnp.shape(theta["W0"])
        if len(W0) != 2:
            raise ValueError(f"theta['W0'] must be a (d, m) matrix, got shape {W0}")
        d = W0[0]
    _check_weights("theta", theta, d, whose=_WIDTHS)


def _lam(lam: Any, pi: Any) -> None:
    """The laziness ``lam`` within the range of the lazy chain on ``pi`` (`_check_lazy_lam`),
    entrywise for an array."""
    _real("lam", lam)
    _check_lazy_lam(pi, lam)


# ----------------------------------------------------------------------------- population loss and flow
def _attention(theta: dict, pi: Any, tau: Any) -> jax.Array:
    _, Phi = composites(theta)
    return jax.nn.softmax(tau * Phi + jnp.log(pi)[None, :], axis=-1)


def attention(theta: dict, pi: Any, tau: Any = 1.0) -> jax.Array:
    """(P1): the long-context attention ``A_qk = pi_k e^{tau Phi_qk} / sum_l pi_l e^{tau Phi_ql}``,
    shape (d, d), rows indexed by the query token. Concrete input is checked: ``pi`` a
    probability vector, ``theta`` weights that fit its ``d``, ``tau`` a positive number."""
    pi = _law(pi)
    _theta(theta, pi.shape[0])
    _tau(tau)
    return _attention(theta, pi, tau)


def _population_loss(theta: dict, chain: MarkovChain, tau: Any) -> jax.Array:
    M, _ = composites(theta)
    Z = _attention(theta, chain.pi, tau) @ M
    return -jnp.sum(chain.pi[:, None] * chain.P * jax.nn.log_softmax(Z, axis=-1))


def population_loss(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> jax.Array:
    """(P2): ``L = -<Pi P, log softmax_row(A M)>``, the infinite-context next-token loss.
    ``ValueError`` before computing when ``chain`` is no `MarkovChain`, the shapes of ``theta``
    do not fit its ``d`` (or each other), a concrete weight is NaN or Inf, or ``tau`` is not a
    positive number."""
    _theta(theta, _chain(chain).d)
    _tau(tau)
    return _population_loss(theta, chain, tau)


def _gradient_blocks(theta: dict, chain: MarkovChain, tau: Any) -> tuple[jax.Array, jax.Array]:
    M, _ = composites(theta)
    A = _attention(theta, chain.pi, tau)
    G_Z = chain.pi[:, None] * (jax.nn.softmax(A @ M, axis=-1) - chain.P)
    G_A = G_Z @ M.T
    return A.T @ G_Z, tau * A * (G_A - jnp.sum(A * G_A, axis=1, keepdims=True))


def gradient_blocks(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> tuple[jax.Array, jax.Array]:
    """(P3): ``(G_M, G_Phi)``, the gradients of the loss with respect to the composites ``M`` and
    ``Phi`` (each (d, d); ``G_Phi`` includes the factor ``tau``). Both vanish at a critical
    point of the composites (the Stage IV point at ``delta = 0``). Input checked as by
    `population_loss`."""
    _theta(theta, _chain(chain).d)
    _tau(tau)
    return _gradient_blocks(theta, chain, tau)


def population_grads(theta: dict, chain: MarkovChain, tau: Any = 1.0) -> dict[str, jax.Array]:
    """(P4): the closed-form gradients of `population_loss` (equal to ``jax.grad`` to round-off).
    Input checked as by `population_loss`."""
    _theta(theta, _chain(chain).d)
    _tau(tau)
    W0, W1, WQ, WK = (theta[k] for k in PARAMETERS)
    G_M, G_Phi = _gradient_blocks(theta, chain, tau)
    return {
        "W0": G_M @ W1.T + G_Phi @ W0 @ WK @ WQ.T + G_Phi.T @ W0 @ WQ @ WK.T,
        "W1": W0.T @ G_M,
        "WQ": W0.T @ G_Phi @ W0 @ WK,
        "WK": W0.T @ G_Phi.T @ W0 @ WQ,
    }


def flow_field(t: Any, theta: dict, setup: Setup) -> dict[str, jax.Array]:
    """(P6): the population gradient flow ``d theta/dt = -eta grad L`` with the gradients (P4)
    and the chain, ``tau`` and ``eta`` of ``setup``."""
    g = population_grads(theta, setup.chain, setup.tau)
    return {k: -setup.eta * v for k, v in g.items()}


def conserved(theta: dict) -> dict[str, jax.Array]:
    """(P5): ``C_m = W0^T W0 - W1 W1^T - WQ WQ^T - WK WK^T`` (m, m) and
    ``C_k = WQ^T WQ - WK^T WK`` (mk, mk), constant along the flow (P6). ``theta`` is checked
    as by `population_loss` (shapes that fit each other, finite where concrete)."""
    _theta(theta)
    W0, W1, WQ, WK = (theta[k] for k in PARAMETERS)
    return {"C_m": W0.T @ W0 - W1 @ W1.T - WQ @ WQ.T - WK @ WK.T, "C_k": WQ.T @ WQ - WK.T @ WK}


DEFAULT_SAVE = LogGrid(200, t_min=1e-2, fit_span=True)
"""`solve`'s save grid when none is given: log-spaced (plateaus last decades)."""

DEFAULT_SOLVER = SolverOptions(AutoStiff(), rtol=1e-9, atol=1e-12, max_steps=1_000_000)
"""`solve`'s solver options when none are given: `attnflow.AutoStiff` (Tsit5 steps until the
flow turns stiff late in the cycle, where one Hessian direction sharpens, then the
Rosenbrock-W solver `attnflow.KrylovW`) with a PID controller, tolerances tight enough that
the loss is non-increasing on the save grid over a whole cycle. Differentiating a solve
(``jax.grad``) through it compiles the derivatives of both solvers: for flows that end before
they turn stiff, pass ``solver=attnflow.focus.ESCAPE_SOLVER`` (Tsit5)."""


class _SolveArgs(eqx.Module):
    # the user's observe split into its arrays (data) and the rest (static, hashed): a new
    # array value (e.g. held-out data) reuses the compiled solve, a new function compiles
    setup: Setup
    observe_arrays: Any
    observe_static: Any = eqx.field(static=True)


def _solve_field(t: Any, theta: dict, args: _SolveArgs) -> dict:
    return flow_field(t, theta, args.setup)


def _solve_observe(t: Any, theta: dict, args: _SolveArgs) -> dict:
    from .observe import record

    return record(theta, args.setup, eqx.combine(args.observe_arrays, args.observe_static))


def ode(setup: Setup, *, initial: dict | None = None, observe: Callable[[dict, Setup], Mapping] | None = None) -> ODE:
    """The population gradient flow (P6) of ``setup`` as an `attnflow.ODE`: ``ode(t, theta)``
    is `flow_field`, ``ode.y0`` the weights ``setup.theta0()`` (or ``initial``),
    ``ode.observables(theta)`` `attnflow.focus.OBSERVABLES` (plus ``observe(theta, setup)`` if
    given), and ``ode.solve(t1)`` is ``solve(setup, t1)``. Its state is the weights
    ``{"W0", "W1", "WQ", "WK"}``.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.focus.Setup, got {setup!r}")
    if observe is not None and not callable(observe):
        raise ValueError(f"observe must be callable (theta, setup) -> {{name: array}}, got {observe!r}")
    arrays, static = eqx.partition(observe, eqx.is_array)
    return ODE(
        _solve_field,
        _SolveArgs(setup, arrays, static),
        setup.initial_state(initial),
        _solve_observe,
        DEFAULT_SAVE,
        DEFAULT_SOLVER,
        meta=(
            ("theory", "focus"),
            ("equation", "population gradient flow (P6)"),
            ("clock", "t; d theta/dt = -eta grad L"),
        ),
    )


@keyword_hints(
    "focus.solve",
    loss_target="event=lambda t, obs: obs['loss'] - L stops there, and focus.escape_time(setup, L) is its time",
)
def solve(
    setup: Setup,
    t1: Any,
    *,
    initial: dict | None = None,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    observe: Callable[[dict, Setup], Mapping] | None = None,
    event: Callable[[Any, dict], Any] | None = None,
    progress: bool | None = None,
) -> Trajectory:
    """The theory of ``setup``: the population gradient flow (P6) ``d theta/dt = -eta grad L``
    integrated from ``setup.theta0()`` (or the weights ``initial``, a dict like it) to ``t1``.

    Records `attnflow.focus.OBSERVABLES` at the save grid (default `DEFAULT_SAVE`) with the
    solver options ``solver`` (default `DEFAULT_SOLVER`), plus ``observe(theta, setup)`` if
    given: a mapping of extra arrays (nested mappings become dotted names), the same function
    that `attnflow.focus.train` accepts. Compiled once per save-grid size, widths and
    ``observe`` function: new ``tau``, ``eta``, ``eps``, chains (``lam``, ``pi``) and ``t1``
    reuse it, and all of them may be traced (a sweep).

    ``event(t, obs) -> scalar`` on the observables ``obs`` (a dict of `attnflow.focus.OBSERVABLES`
    and those of ``observe`` at time ``t``) stops the solve where it first changes sign, e.g.
    ``lambda t, o: o["loss"] - 1.0``; ``traj.t_event`` is that time (NaN if it never does) and
    the save points after it hold the event state; traceable under ``jit``, ``vmap`` and
    `attnflow.sweep` (`attnflow.ObservableEvent`).
    `attnflow.focus.escape_time` is this event on the loss, with its own solver and threshold.
    ``progress=True`` shows the solve's progress meter with the solver it would use anyway
    (``solver``, else `DEFAULT_SOLVER`), where ``solver=af.SolverOptions(progress=True)`` would
    replace the package's solver and tolerances by the core's defaults.
    """
    return ode(setup, initial=initial, observe=observe).solve(
        t1, save=save, solver=solver, event=event, progress=progress
    )


# ----------------------------------------------------------------------------- rank-one reduction
def theta_from_reduced(y: dict) -> dict[str, jax.Array]:
    """The rank-one state (R5) as weights of width ``m = mk = 1``: ``W0 = gamma`` (d, 1),
    ``W1 = beta^T`` (1, d), ``WQ = lam_q`` and ``WK = lam_k`` (1, 1), so that ``M = gamma beta^T``
    and ``Phi = lam_q lam_k gamma gamma^T``."""
    return {
        "W0": y["gamma"][:, None],
        "W1": y["beta"][None, :],
        "WQ": jnp.reshape(y["lam_q"], (1, 1)),
        "WK": jnp.reshape(y["lam_k"], (1, 1)),
    }


def reduced_from_theta(theta: dict) -> dict[str, jax.Array]:
    """The inverse of `theta_from_reduced` on weights of width 1 (first column / row / entry)."""
    return {"gamma": theta["W0"][:, 0], "beta": theta["W1"][0], "lam_q": theta["WQ"][0, 0], "lam_k": theta["WK"][0, 0]}


def reduced_field(t: Any, y: dict, setup: Setup) -> dict[str, jax.Array]:
    """(R5): the flow on the rank-one manifold, ``2d + 2`` unknowns ``(gamma, beta, lam_q, lam_k)``
    with ``kappa = lam_q lam_k``:
    ``gamma' = -eta (G_M beta + kappa (G_Phi + G_Phi^T) gamma)``, ``beta' = -eta G_M^T gamma``,
    ``lam_q' = -eta (gamma^T G_Phi gamma) lam_k``, ``lam_k' = -eta (gamma^T G_Phi gamma) lam_q``.
    """
    G_M, G_Phi = gradient_blocks(theta_from_reduced(y), setup.chain, setup.tau)
    g, b, lq, lk = y["gamma"], y["beta"], y["lam_q"], y["lam_k"]
    s = g @ G_Phi @ g
    eta = setup.eta
    return {
        "gamma": -eta * (G_M @ b + lq * lk * (G_Phi + G_Phi.T) @ g),
        "beta": -eta * G_M.T @ g,
        "lam_q": -eta * s * lk,
        "lam_k": -eta * s * lq,
    }


def reduced_conserved(y: dict) -> dict[str, jax.Array]:
    """(R5) conserves ``qk = lam_q^2 - lam_k^2`` and ``norms = |gamma|^2 - |beta|^2 - lam_q^2 - lam_k^2``."""
    return {
        "qk": y["lam_q"] ** 2 - y["lam_k"] ** 2,
        "norms": y["gamma"] @ y["gamma"] - y["beta"] @ y["beta"] - y["lam_q"] ** 2 - y["lam_k"] ** 2,
    }


_REDUCED = ("gamma", "beta", "lam_q", "lam_k")


def reduced_loss(y: dict, chain: MarkovChain, tau: Any = 1.0) -> jax.Array:
    """The population loss (P2) of the rank-one state ``y`` (`theta_from_reduced`). ``ValueError``
    before computing unless ``y`` has the keys ``gamma``, ``beta`` (each of shape ``(d,)``, the
    chain's ``d``), ``lam_q`` and ``lam_k`` (numbers), reals and finite where concrete, and
    ``tau`` is a positive number."""
    d = _chain(chain).d
    if not isinstance(y, Mapping) or set(y) != set(_REDUCED):
        got = sorted(map(str, y)) if isinstance(y, Mapping) else type(y).__name__
        raise ValueError(f"y must be a reduced state with keys {sorted(_REDUCED)}, got {got}")
    for name, shape in (("gamma", (d,)), ("beta", (d,)), ("lam_q", ()), ("lam_k", ())):
        _shaped(f"y['{name}']", y[name], shape, d)
    _tau(tau)
    return _population_loss(theta_from_reduced(y), chain, tau)


def reduced_gradient(t: Any, y: dict, setup: Setup) -> dict[str, jax.Array]:
    """``grad_y L_red(y)``: the gradient of `reduced_loss` (with the chain and ``tau`` of
    ``setup``), whose zeros `degenerate_point` finds. A vector-field signature, so it can be
    passed to `attnflow.fixed_point`."""
    return jax.grad(reduced_loss)(y, setup.chain, setup.tau)


def rank_one_part(theta: dict) -> dict[str, jax.Array]:
    """The rank-one coordinates of a full state: ``a1 = v1(W0)`` (top right singular vector),
    ``gamma = W0 a1``, ``beta = W1^T a1``, ``lam_q = a1^T WQ u``, ``lam_k = a1^T WK u`` with
    ``u = v1(WQ)``. Exact on the invariant set ``W0 = gamma alpha^T``, ``W1 = alpha beta^T``,
    ``W_{Q,K} = lam_{q,k} alpha u^T`` (R5); a warm start for `degenerate_point` elsewhere.
    ``theta`` is checked as by `conserved`."""
    _theta(theta)
    a1 = jnp.linalg.svd(theta["W0"], full_matrices=False)[2][0]
    u = jnp.linalg.svd(theta["WQ"], full_matrices=False)[2][0]
    return {
        "gamma": theta["W0"] @ a1,
        "beta": theta["W1"].T @ a1,
        "lam_q": a1 @ theta["WQ"] @ u,
        "lam_k": a1 @ theta["WK"] @ u,
    }


# ----------------------------------------------------------------------------- rates and critical points
def _law(pi: Any) -> jax.Array:
    """``pi`` as an array, checked (`check_pi`) when concrete: the closed forms below are
    formulas in a probability vector and give numbers for anything else."""
    if not V.any_traced(pi):
        check_pi(V.reals("pi", pi))
    return jnp.asarray(pi)


def centred_log_pi(pi: Any) -> jax.Array:
    """``ell = log pi - mean(log pi) 1``: the logits of the unigram law with zero mean."""
    lp = jnp.log(_law(pi))
    return lp - jnp.mean(lp)


def sigma(pi: Any) -> jax.Array:
    """(R1): the Stage I rate ``sigma = |pi| |pi - 1/d|`` (top singular value of ``-G_M`` at the
    origin); ``|M|`` grows as ``e^{2 sigma t}`` (for ``eta = 1``)."""
    pi = _law(pi)
    return jnp.linalg.norm(pi) * jnp.linalg.norm(pi - 1.0 / pi.shape[0])


def _alpha(alpha: Any) -> None:
    """``alpha`` a vector of ``R^m`` that can be normalised: 1-D, real, finite, of nonzero finite
    norm (a traced one fails a sweep point where it is not)."""
    shape = jnp.shape(alpha)
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(
            f"alpha must be a vector of R^m (1-D, m >= 1: theta_c^1 has width m = alpha.size), got shape {shape}"
        )
    _real("alpha", alpha)
    if V.any_traced(alpha):
        check_traced(
            lambda: ~((jnp.linalg.norm(alpha) > 0) & jnp.isfinite(jnp.linalg.norm(alpha))),
            "alpha must be a finite nonzero vector (it is normalised to alpha / |alpha|)",
        )
        return
    norm = float(np.linalg.norm(np.asarray(alpha, dtype=float)))
    if not 0 < norm < np.inf:
        raise ValueError(
            f"alpha must have a nonzero finite norm (it is normalised to alpha / |alpha|), got |alpha| = {norm:g} "
            f"for alpha = {V.show(alpha)}"
        )


def critical_point_c1(pi: Any, alpha: Any) -> dict[str, jax.Array]:
    """(R2): the condensation point ``theta_c^1``: ``W0 = gamma alpha^T``, ``W1 = alpha beta^T``,
    ``W_{Q,K} = 0`` with ``gamma = a pi/|pi|``, ``beta = a ell/|ell|``, ``a^2 = |ell|/|pi|``;
    ``alpha`` is normalised to a unit vector of ``R^m`` (``m = alpha.size``, and ``mk = m``).
    Returns the four matrices and ``gamma``, ``beta``, ``a2``. The output there is the
    unigram law: ``G_M = 0`` and ``L = H(pi)``. ``ValueError`` before computing unless ``pi``
    is a probability vector and ``alpha`` a 1-D real vector of nonzero finite norm."""
    pi = _law(pi)
    _alpha(alpha)
    alpha = jnp.asarray(alpha, dtype=pi.dtype)
    alpha = alpha / jnp.linalg.norm(alpha)
    ell = centred_log_pi(pi)
    a = jnp.sqrt(jnp.linalg.norm(ell) / jnp.linalg.norm(pi))
    gamma = a * pi / jnp.linalg.norm(pi)
    beta = a * ell / jnp.linalg.norm(ell)
    m = alpha.shape[0]
    return {
        "W0": jnp.outer(gamma, alpha),
        "W1": jnp.outer(alpha, beta),
        "WQ": jnp.zeros((m, m), pi.dtype),
        "WK": jnp.zeros((m, m), pi.dtype),
        "gamma": gamma,
        "beta": beta,
        "a2": a**2,
    }


def attention_rate(pi: Any, P: Any, tau: Any, gamma: Any, beta: Any) -> jax.Array:
    """(R3): the general Stage II rate ``c = tau Var_pi(gamma) Cov_{pi,P}(gamma(X_t), beta(X_{t+1}))``
    (the unstable eigenvalue of the attention block at a rank-one critical point).
    ``ValueError`` before computing unless ``pi`` is a probability vector of length ``d``,
    ``P`` a real ``(d, d)`` matrix, ``gamma`` and ``beta`` real vectors of length ``d`` (all
    finite where concrete) and ``tau`` positive (a number or an array)."""
    pi = _law(pi)
    d = pi.shape[0]
    _shaped("P", P, (d, d), d)
    _shaped("gamma", gamma, (d,), d)
    _shaped("beta", beta, (d,), d)
    _tau(tau, scalar=False)
    P, gamma, beta = map(jnp.asarray, (P, gamma, beta))
    var = jnp.sum(pi * gamma**2) - jnp.sum(pi * gamma) ** 2
    cov = jnp.sum(pi * gamma * (P @ beta)) - jnp.sum(pi * gamma) * jnp.sum(pi * beta)
    return tau * var * cov


def attention_rate_lazy(pi: Any, lam: Any, tau: Any = 1.0) -> jax.Array:
    """(R4): the lazy-chain closed form of (R3) at ``theta_c^1``,
    ``c = tau lam |ell| Var_pi(pi) Cov_pi(pi, log pi) / |pi|^5``. ``lam`` (a number or an
    array, entrywise) must lie in the range of the lazy chain on ``pi`` (`MarkovChain.lazy`):
    ``[-min_k pi_k / (1 - pi_k), 1]``; ``tau`` (a number or an array) must be positive.
    ``ValueError`` naming the argument before computing (NaN, booleans, complex numbers
    included); traced values fail a sweep point instead."""
    pi = _law(pi)
    _lam(lam, pi)
    _tau(tau, scalar=False)
    ell = centred_log_pi(pi)
    var = jnp.sum(pi**3) - jnp.sum(pi**2) ** 2
    cov = jnp.sum(pi**2 * jnp.log(pi)) - jnp.sum(pi**2) * jnp.sum(pi * jnp.log(pi))
    return tau * lam * jnp.linalg.norm(ell) * var * cov / jnp.linalg.norm(pi) ** 5


def transverse_rate(G_M: Any) -> jax.Array:
    """(R7): the Stage IV rate ``mu_perp = sigma_max(G_M)`` of a direction orthogonal to the
    rank-one manifold, evaluated at the degenerate point ``theta_delta`` (`degenerate_point`,
    ``G_M`` from `gradient_blocks`); ``Theta(delta)`` for a ``delta``-perturbed ``pi``.
    ``ValueError`` unless ``G_M`` is a real matrix, finite where concrete."""
    if len(jnp.shape(G_M)) != 2:
        raise ValueError(f"G_M must be a (d, d) matrix, got shape {jnp.shape(G_M)}")
    _real("G_M", G_M)
    return jnp.linalg.svd(jnp.asarray(G_M), compute_uv=False)[0]


def stage_predictions(setup: Setup) -> dict[str, jax.Array]:
    """Predicted plateaus and rates of ``setup`` (rates on its clock, i.e. times ``eta``):
    ``log_d``; ``H_pi`` (S2); ``L_star`` (S1); ``sigma`` (R1); ``c`` by the general formula (R3)
    at ``theta_c^1`` (its sign predicts focus); escape times (R8) ``T_I = log(1/eps)/sigma`` and
    ``T_II = log(1/eps)/|c|`` (``inf`` when ``c = 0``). The attention block of the Jacobian at
    ``theta_c^1``, ``(dW_Q, dW_K) -> c alpha alpha^T (dW_K, dW_Q)``, has eigenvalues ``+-c``: for
    ``c > 0`` the symmetric mode ``W_Q = W_K`` grows (focus), for ``c < 0`` the antisymmetric
    ``W_Q = -W_K`` (attention turns away from the frequent tokens), both at ``|c|``, so the
    plateau ends either way. Traceable."""
    require_x64("focus.stage_predictions")
    chain = setup.chain
    c1 = critical_point_c1(chain.pi, jnp.ones(1))
    c = setup.eta * attention_rate(chain.pi, chain.P, setup.tau, c1["gamma"], c1["beta"])
    s = setup.eta * sigma(chain.pi)
    log_eps = jnp.log(1.0 / setup.eps)
    return {
        "log_d": jnp.log(jnp.asarray(float(chain.d))),
        "H_pi": chain.entropy(),
        "L_star": chain.bayes_floor(),
        "sigma": s,
        "c": c,
        "T_I": log_eps / s,
        "T_II": jnp.where(c != 0, log_eps / jnp.where(c != 0, jnp.abs(c), 1.0), jnp.inf),
    }


DEGENERATE_TOL = 1e-8
"""`degenerate_point` raises when the largest entry of ``grad L_red`` stays above this."""


@filter_jit
def _largest_gradient(y: dict, setup: Setup) -> jax.Array:
    g = reduced_gradient(0.0, y, setup)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(v)) for v in jax.tree_util.tree_leaves(g)]))


def degenerate_point(
    warm_start: dict, setup: Setup, *, solver: optx.AbstractLeastSquaresSolver | None = None, max_steps: int = 2000
) -> dict[str, jax.Array]:
    """The Stage IV critical point ``theta_delta`` of the rank-one model (R5): a zero of
    `reduced_gradient` (``G_Phi = 0``, ``G_M beta = 0``, ``G_M^T gamma = 0``; ``G_M`` itself is
    nonzero when ``delta != 0``).

    Found by `attnflow.fixed_point` with a least-squares solver (default
    ``optx.LevenbergMarquardt(rtol=1e-12, atol=1e-14)``: damped steps, robust to the null
    directions of the rescaling symmetries), from ``warm_start``, a reduced state
    ``{gamma, beta, lam_q, lam_k}`` such as the `rank_one_part` of a flowed state on the
    Stage IV plateau (a warm start before the dilution of Stage III can reach ``theta_c^1``,
    where the attention weights vanish and the reduced gradient too). Repeated calls reuse the
    compiled solve. Raises ``RuntimeError`` when the largest gradient entry stays above
    `DEGENERATE_TOL`, or when the solve reached ``theta_c^1`` (``lam_q = lam_k = 0``).
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.focus.Setup, got {setup!r}")
    keys = {"gamma", "beta", "lam_q", "lam_k"}
    if not isinstance(warm_start, Mapping) or set(warm_start) != keys:
        raise ValueError(f"warm_start must be a reduced state with keys {sorted(keys)}, got {warm_start!r}")
    y0 = {k: jnp.asarray(v, dtype=jnp.result_type(float)) for k, v in warm_start.items()}
    solver = optx.LevenbergMarquardt(rtol=1e-12, atol=1e-14) if solver is None else solver
    # fixed_point takes least-squares solvers too (its annotation names root finders only)
    y = fixed_point(reduced_gradient, y0, setup, solver=cast(Any, solver), max_steps=max_steps, throw=False)
    if not V.any_traced((y0, setup)):
        size = float(_largest_gradient(y, setup))
        if not size <= DEGENERATE_TOL:
            raise RuntimeError(
                f"degenerate_point: the solve stopped with max |grad L_red| = {size:.3g} > "
                f"{DEGENERATE_TOL:g}; try another warm start or more max_steps"
            )
        attention = abs(float(y["lam_q"])) + abs(float(y["lam_k"]))
        if not attention > 1e-8:
            # lam_q = lam_k = 0 zeroes the attention part of the reduced gradient: theta_c^1 is a root too
            raise RuntimeError(
                f"degenerate_point: the solve reached the Stage II point theta_c^1 (|lam_q| + |lam_k| = "
                f"{attention:.2g}), not theta_delta; warm-start it after the dilution (Stage III), on the "
                "Stage IV plateau"
            )
    return y


def refine_critical_point(
    theta: dict, setup: Setup, *, solver: Any = None, max_steps: int = 200
) -> dict[str, jax.Array]:
    """A critical point of the full flow (P6) near ``theta``: `attnflow.fixed_point` on
    `flow_field` with a least-squares solver (default ``optx.LevenbergMarquardt(rtol=1e-12,
    atol=1e-14)``, robust to the rotation symmetries of ``theta``)."""
    solver = optx.LevenbergMarquardt(rtol=1e-12, atol=1e-14) if solver is None else solver
    return fixed_point(flow_field, dict(theta), setup, solver=solver, max_steps=max_steps)


def jacobian_blocks(theta: dict, setup: Setup) -> dict[str, jax.Array]:
    """The Jacobian of the flow (P6) at ``theta`` on the flattened state (order ``W0, W1, WK, WQ``),
    split into the ``outer`` ``(W0, W1)`` block, the ``attention`` ``(WK, WQ)`` block, their
    ``coupling`` and the ``full`` matrix. At ``theta_c^1`` the coupling vanishes and the
    attention block has eigenvalues ``+-c`` (R3) with multiplicity ``mk``."""
    J = jacobian(flow_field, dict(theta), setup)
    n_outer = theta["W0"].size + theta["W1"].size
    return {
        "outer": J[:n_outer, :n_outer],
        "attention": J[n_outer:, n_outer:],
        "coupling": J[:n_outer, n_outer:],
        "full": J,
    }
