"""The derived order-parameter ODE of online SGD (docs page "Your own model").

With ``lambda = W x / sqrt(D)``, ``nu = W* x / sqrt(D)``, ``y = teacher(nu) + sigma xi`` and the
per-sample loss ``l = loss(student(lambda, v), y)``, online SGD ``W <- W - eta grad_W l``,
``v <- v - (eta_v / D) grad_v l`` on the clock ``t = steps / D`` has, as ``D -> infinity``, the
deterministic limit (Saad & Solla 1995; Goldt et al. 2019)

    dR_km/dt = eta E[delta_k nu_m],                                                  (2)
    dQ_kl/dt = eta E[delta_k lambda_l + delta_l lambda_k] + eta^2 E[delta_k delta_l],  (3)
    dv/dt    = -eta_v E[d l / d v],                                                  (4)

with ``delta_k = -d l / d lambda_k`` (autodiff of the user's functions) and the expectations over
``(lambda, nu) ~ N(0, [[Q, R], [R^T, T]])`` and ``xi ~ N(0, 1)`` (quadrature of the `Setup`).
The generalisation error is ``error = E[loss(student(lambda, v), teacher(nu))]`` (5), noise-free.

With the single-location data model (`attnflow.derive.SingleLocation`) the fields carry a
location axis, ``lambda_kl = w_k . x_l / sqrt(D)``, and a step moves ``w_k`` by
``(eta / sqrt(D)) sum_l delta_kl x_l`` with ``x_l . x_l' / D -> delta_ll'``, so (2)-(3) hold
with every product summed over locations (docs page, eq. (6)):
``dR_km/dt = eta E[sum_l delta_kl nu_ml]``, ``dQ_kl/dt = eta E[sum_l' (delta_kl' lambda_ll' +
delta_ll' lambda_kl')] + eta^2 E[sum_l' delta_kl' delta_ll']``, over independent locations
``N(0, [[Q, R], [R^T, T]])`` shifted by ``(R theta, T theta)`` at the signal location.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..ode import ODE, crossing_time, require_x64
from ..options import LogGrid, SaveGrid, SolverOptions, _caller_outside_attnflow
from ..trajectory import Trajectory
from .setup import Setup, check_realisable, realisability_gap

__all__ = [
    "escape_time",
    "NODE_CHUNK",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "Rule",
    "rule",
    "covariance",
    "expectations",
    "vector_field",
    "generalisation_error",
    "field",
    "initial_state",
    "solve",
    "Plateau",
    "plateau",
    "symmetrised",
]

Rule = tuple[jax.Array, jax.Array]
"""A quadrature rule, as `rule` returns it and the ``rule=`` arguments take it: nodes ``(n, d)``
and weights ``(n,)``. The nodes are points of ``N(0, I_d)`` with ``d`` = `Setup.dim`; with
`SingleLocation` data each node also carries its amplitudes ``theta`` and signal location
(`DataModel.nodes`)."""


def rule(setup: Setup) -> Rule:
    """The nodes and weights of ``setup.quadrature`` in ``setup.dim`` dimensions, as arrays (data,
    so a jitted field does not bake them in); with `SingleLocation` data each node also carries
    its amplitudes ``theta`` and signal location (`attnflow.derive.DataModel.nodes`)."""
    # a rule of the user's own may predate the noise argument: it is passed only with label noise
    if setup.noise is None:
        z, w = setup.quadrature.rule(setup.dim)
    else:
        z, w = setup.quadrature.rule(setup.dim, True)
    return setup.data.nodes(z, w, setup.quadrature)


_rule_of = rule  # the functions below take a ``rule=`` argument that shadows `rule`


def covariance(R: jax.Array, Q: jax.Array, T: jax.Array) -> jax.Array:
    """The covariance ``[[Q, R], [R^T, T]]`` of ``(lambda, nu)`` (at each location)."""
    return jnp.block([[Q, R], [R.T, T]])


def _fields(setup: Setup, R, Q, nodes):
    """``(lambda, nu, context, xi)`` at every node (`attnflow.derive.DataModel.fields`): with
    `GaussianInputs`, ``(lambda, nu) = S z`` with ``S`` the symmetric root of the covariance."""
    lam, nu, ctx = setup.data.fields(R, Q, setup.T, nodes)
    if setup.noise is not None:
        xi = nodes[:, setup.data.dim(setup.K, setup.M)]
    else:
        xi = jnp.zeros(nodes.shape[0], lam.dtype)
    return lam, nu, ctx, xi


NODE_CHUNK = 2**16
"""Rules with more nodes are evaluated in chunks of this many (a `lax.scan` summing each chunk's
weighted products), so memory stays bounded for sparse grids of millions of nodes."""


def expectations(setup: Setup, R: Any, Q: Any, v: Any, rule: Rule) -> dict[str, Any]:
    """The Gaussian expectations of eqs. (2)-(5) at the overlaps ``(R, Q)`` and readout ``v``:
    ``{"delta_nu": E[delta nu^T] (K, M), "delta_lam": E[delta lambda^T] (K, K),
    "delta_delta": E[delta delta^T] (K, K), "grad_v": E[d l / d v], "error": E[l_clean]}``.
    With `SingleLocation` data ``delta``, ``lambda`` and ``nu`` carry a location axis, summed
    over in the products (``E[sum_l delta_kl nu_ml]`` etc.). Rules of more than `NODE_CHUNK`
    nodes are summed chunk by chunk."""
    nodes, weights = rule
    R, Q = jnp.asarray(R), jnp.asarray(Q)
    n = nodes.shape[0]
    if n <= NODE_CHUNK:
        return _weighted_sums(setup, R, Q, v, nodes, weights)
    chunks = -(-n // NODE_CHUNK)
    pad = chunks * NODE_CHUNK - n
    # padding repeats the first node with weight 0, so every padded term is finite
    nodes = jnp.concatenate([nodes, jnp.broadcast_to(nodes[:1], (pad,) + nodes.shape[1:])])
    weights = jnp.concatenate([weights, jnp.zeros(pad, weights.dtype)])
    nodes = nodes.reshape((chunks, NODE_CHUNK) + nodes.shape[1:])
    weights = weights.reshape(chunks, NODE_CHUNK)

    def add(total, chunk):
        part = _weighted_sums(setup, R, Q, v, *chunk)
        return jax.tree.map(jnp.add, total, part), None

    first = _weighted_sums(setup, R, Q, v, nodes[0], weights[0])
    total, _ = jax.lax.scan(add, first, (nodes[1:], weights[1:]))
    return total


def _weighted_sums(setup: Setup, R: jax.Array, Q: jax.Array, v: Any, nodes: jax.Array, weights: jax.Array):
    """`expectations` over one set of nodes (all of a rule, or one chunk of it)."""
    lam, nu, ctx, xi = _fields(setup, R, Q, nodes)
    sigma = 0.0 if setup.noise is None else setup.noise

    def one(lam_i, nu_i, ctx_i, xi_i):
        y_star = setup.data.label(setup.teacher, nu_i, ctx_i)
        y = y_star + sigma * xi_i

        def loss(lam_, v_):
            return jnp.sum(setup.loss(setup.student(lam_, v_), y))

        if v is None:
            g_lam, g_v = jax.grad(loss)(lam_i, None), None
        else:
            g_lam, g_v = jax.grad(loss, argnums=(0, 1))(lam_i, v)
        return -g_lam, g_v, jnp.sum(setup.loss(setup.student(lam_i, v), y_star))

    delta, g_v, clean = jax.vmap(one)(lam, nu, ctx, xi)
    wd = weights.reshape((-1,) + (1,) * (delta.ndim - 1)) * delta
    return {
        "delta_nu": jnp.einsum("nk...,nm...->km", wd, nu),
        "delta_lam": jnp.einsum("nk...,nm...->km", wd, lam),
        "delta_delta": jnp.einsum("nk...,nm...->km", wd, delta),
        "grad_v": None if g_v is None else jnp.tensordot(weights, g_v, axes=1),
        "error": weights @ clean,
    }


def _rates(setup: Setup, E: dict) -> dict[str, Any]:
    # one rate per student unit (a number broadcasts): row k of W steps at eta_k
    eta = jnp.broadcast_to(jnp.asarray(setup.eta), (setup.K,))[:, None]
    drift = eta * E["delta_lam"]
    # a step's mean gradient over `minibatch` fresh samples: same drift, 1/B of the variance term
    dQ = drift + drift.T + (eta * eta.T) * E["delta_delta"] / setup.minibatch
    out = {"R": eta * E["delta_nu"], "Q": dQ}
    if E["grad_v"] is not None:
        out["v"] = -setup.rate_v * E["grad_v"]
    return out


def vector_field(setup: Setup, R: Any, Q: Any, v: Any = None, rule: Rule | None = None) -> dict[str, jax.Array]:
    """Eqs. (2)-(4): ``{"R": dR/dt, "Q": dQ/dt[, "v": dv/dt]}`` at ``(R, Q, v)`` (``v`` only when
    the setup has a readout). ``rule`` (nodes and weights) defaults to the setup's,
    `attnflow.derive.rule`. Compiled once per model (functions, sizes, quadrature); new numbers
    reuse it."""
    R, Q, v = _state(setup, R, Q, v, "derive.vector_field")
    return _vector_field(setup, R, Q, v, _rule_of(setup) if rule is None else rule)


def generalisation_error(setup: Setup, R: Any, Q: Any, v: Any = None, rule: Rule | None = None) -> jax.Array:
    """Eq. (5): the population loss ``E[loss(student(lambda, v), teacher(nu))]`` (noise-free label)."""
    R, Q, v = _state(setup, R, Q, v, "derive.generalisation_error")
    return _error(setup, R, Q, v, _rule_of(setup) if rule is None else rule)


def _state(setup: Setup, R: Any, Q: Any, v: Any, where: str) -> tuple[Any, Any, Any]:
    """``(R, Q, v)`` as float arrays of the setup's shapes, or ``ValueError`` naming the argument;
    ``RuntimeError`` while JAX's 64-bit mode is off (the theory runs in float64, as `solve` does)."""
    require_x64(where)
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.derive.Setup, got {setup!r:.80}")
    R = V.floats("R", R)
    Q = V.floats("Q", Q)
    if R.shape != setup.R0.shape:
        raise ValueError(f"R must have shape (K, M) = {setup.R0.shape}, got {R.shape}")
    if Q.shape != setup.Q0.shape:
        raise ValueError(f"Q must have shape (K, K) = {setup.Q0.shape}, got {Q.shape}")
    if (v is None) != (setup.v0 is None):
        raise ValueError(f"v must be given exactly when the setup has a readout v0; got v = {V.show(v)}")
    if v is not None:
        v = V.floats("v", v)
        if v.shape != setup.v0.shape:
            raise ValueError(f"v must have the shape of the setup's v0, {setup.v0.shape}, got {v.shape}")
    if not V.any_traced((R, Q, setup.T)):
        # NaN passes the realisability test (eigvalsh of NaN is NaN, and NaN < tol is False)
        V.finite_tree("R", R)
        V.finite_tree("Q", Q)
        # as the setup's R0, Q0 (else the quadrature returns numbers for fields no weights have)
        check_realisable(R, Q, setup.T, where=where)
    if v is not None:
        V.finite_tree("v", v)
    return R, Q, v


@filter_jit
def _vector_field(setup, R, Q, v, rl):
    return _rates(setup, expectations(setup, R, Q, v, rl))


@filter_jit
def _error(setup, R, Q, v, rl):
    return expectations(setup, R, Q, v, rl)["error"]


def initial_state(setup: Setup) -> dict[str, Any]:
    """The ODE state at ``t = 0``: ``{"R": R0, "Q": Q0[, "v": v0]}`` (`Setup.initial_state`)."""
    return setup.initial_state()


def field(t: Any, y: dict, args: tuple[Setup, Rule]) -> dict:
    """Eqs. (2)-(4) as an `attnflow.integrate` field on ``y = {"R", "Q"[, "v"]}``,
    ``args = (setup, rule)``."""
    setup, rl = args
    return _rates(setup, expectations(setup, y["R"], y["Q"], y.get("v"), rl))


def _observe(t, y, args):
    from .observe import state_observables

    setup, rl = args
    return state_observables(y, setup, rl)


DEFAULT_SAVE = LogGrid(120, 0.1, fit_span=True)
"""`solve`'s save grid when none is given (log-spaced: plateaus last decades)."""

DEFAULT_SOLVER = SolverOptions(rtol=1e-7, atol=1e-9, max_steps=100_000)
"""`solve`'s solver options when none are given."""


def ode(setup: Setup, *, rule: Rule | None = None) -> ODE:
    """The derived ODE (2)-(4) of ``setup`` as an `attnflow.ODE`: ``ode(t, y)`` is `field`,
    ``ode.y0`` the setup's initial overlaps (`initial_state`), ``ode.observables(y)``
    `attnflow.derive.OBSERVABLES`, and ``ode.solve(t1)`` is ``solve(setup, t1)``. Its state is
    ``{"R", "Q"[, "v"]}``; ``args`` is ``(setup, rule)``, the quadrature nodes and weights
    (default `attnflow.derive.rule`) drawn once here.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.derive.Setup, got {setup!r:.80}")
    rl = _rule_of(setup) if rule is None else rule
    return ODE(
        field,
        (setup, rl),
        initial_state(setup),
        _observe,
        DEFAULT_SAVE,
        DEFAULT_SOLVER,
        meta=(
            ("theory", "derive"),
            ("equation", "derived order-parameter ODE (2)-(4)"),
            ("clock", "t = steps / D"),
            ("quadrature", repr(setup.quadrature)),
            ("data", type(setup.data).__name__),
            ("nodes", int(np.shape(rl[0])[0])),
        ),
    )


@keyword_hints(
    "derive.solve",
    initial="the start is the setup's R0, Q0 (and v0): derive.Setup(..., R0=..., Q0=...)",
    loss_target="event=lambda t, obs: obs['error'] - L stops there; derive.escape_time(setup, L, t1=...) is its time",
)
def solve(
    setup: Setup,
    t1: Any,
    *,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    rule: Rule | None = None,
    event: Callable[[Any, dict], Any] | None = None,
    progress: bool | None = None,
) -> Trajectory:
    """The derived ODE (2)-(4) of ``setup`` from its initial overlaps, integrated to ``t1`` on the
    clock ``t = steps / D`` of `attnflow.derive.train`.

    Records `attnflow.derive.OBSERVABLES`. Default save grid `DEFAULT_SAVE`, solver
    `DEFAULT_SOLVER`; ``rule`` overrides the quadrature nodes and weights (default `attnflow.derive.rule`).
    ``event(t, obs) -> scalar`` on the observables ``obs`` (a dict of
    `attnflow.derive.OBSERVABLES`: ``R``, ``Q``[, ``v``], ``error``) stops the solve where it
    first changes sign (e.g. ``lambda t, o: o["R"][0, 0] - 0.5``, the escape from a plateau);
    ``traj.t_event`` is that time (NaN if it never does), traceable under ``jit``, ``vmap``
    and `attnflow.sweep` (`attnflow.ObservableEvent`; ``error``, a second quadrature, is
    computed in the step loop only when the event reads it).
    ``progress=True`` shows the solve's progress meter with the solver it would use anyway
    (``solver``, else `DEFAULT_SOLVER`), where ``solver=af.SolverOptions(progress=True)`` would
    replace the package's solver and tolerances by the core's defaults.
    """
    return ode(setup, rule=rule).solve(t1, save=save, solver=solver, event=event, progress=progress)


class Plateau(NamedTuple):
    """The symmetric fixed point of `plateau`: ``state`` (``{"R", "Q"[, "v"]}``), the
    generalisation ``error`` (5) there and ``lambda_max``, the largest real part of the
    Jacobian's eigenvalues: the rate at which a small specialisation ``r0`` grows, so that the
    escape takes about ``log(1 / r0) / lambda_max``."""

    state: dict
    error: jax.Array
    lambda_max: jax.Array


def symmetrised(setup: Setup) -> Setup:
    """``setup`` with its initial overlaps made symmetric under permutations of the student
    units: each row of ``R0`` the mean row, and, where the teacher is symmetric too (``T = t I
    + s (1 - I)``), every entry the mean; ``Q0 = q I + c (1 - I)`` with ``q`` and ``c`` the
    means of its diagonal and off-diagonal entries, and readouts ``v0`` of one entry per student
    their mean. No student unit is then singled out, and the flow stays on the symmetric
    subspace: the plateau. (An average of overlaps over permutations is again a realisable set
    of overlaps.)"""
    K, M = setup.K, setup.M
    T = setup.T
    # a where, not an if: T may be traced (a sweep); with M = 1 both forms agree
    teacher_symmetric = M == 1 or jnp.allclose(
        T, jnp.mean(jnp.diag(T)) * jnp.eye(M) + (jnp.sum(T) - jnp.trace(T)) / (M * (M - 1)) * (1 - jnp.eye(M))
    )
    R0 = jnp.where(
        teacher_symmetric,
        jnp.mean(setup.R0) * jnp.ones_like(setup.R0),
        jnp.ones((K, 1)) * jnp.mean(setup.R0, axis=0, keepdims=True),
    )
    q = jnp.mean(jnp.diag(setup.Q0))
    c = (jnp.sum(setup.Q0) - jnp.trace(setup.Q0)) / (K * (K - 1)) if K > 1 else 0.0
    v0 = setup.v0
    if v0 is not None and jnp.ndim(v0) >= 1 and jnp.shape(v0)[0] == K:
        v0 = jnp.broadcast_to(jnp.mean(v0, axis=0, keepdims=True), jnp.shape(v0))
    return setup.replace(R0=R0, Q0=q * jnp.eye(K) + c * (1 - jnp.eye(K)), v0=v0)


def plateau(setup: Setup, *, t_guess: float | None = None, rule: Rule | None = None) -> Plateau:
    """The symmetric plateau of ``setup``'s derived ODE (2)-(4): the flow from the symmetrised
    start (`symmetrised`) to ``t_guess`` (default ``60 / eta``) gives the guess, from which a
    Levenberg-Marquardt root find (`attnflow.fixed_point`; damped, because the antisymmetric
    part of ``Q`` is a null direction of the field, ``Q`` entering it symmetrised) converges to
    the fixed point; its `Plateau` holds the state, the error and ``lambda_max`` (the escape
    rate, `attnflow.spectrum`)."""
    import optimistix as optx

    from ..options import LinearGrid
    from ..saddle import fixed_point, spectrum

    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.derive.Setup, got {setup!r:.80}")
    require_x64("derive.plateau")
    eta = setup.eta
    if not V.any_traced(eta) and np.ptp(np.atleast_1d(np.asarray(eta, dtype=float))) > 0:
        raise ValueError(
            f"derive.plateau needs one learning rate for all students, got eta = {V.show(eta)}: unequal rates break "
            "the permutation symmetry of the students, so there is no symmetric plateau (solve the ODE instead)"
        )
    sym = symmetrised(setup)
    rl = _rule_of(sym) if rule is None else rule
    if t_guess is None:
        horizon: Any = 60.0 / jnp.min(sym.eta)  # traced inside jit, vmap or a sweep over eta
    else:
        V.positive("t_guess", t_guess)
        horizon = t_guess
    o = ode(sym, rule=rl)
    guess = o.solve(horizon, save=LinearGrid(2)).final()
    y0 = {k: guess[k] for k in o.y0}
    y = fixed_point(o, y0, solver=optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12))
    lam = jnp.real(spectrum(o, y).lambda_max)
    if V.any_traced((y, lam)):  # the checks below read values; a traced plateau is returned as found
        return Plateau(y, generalisation_error(sym, y["R"], y["Q"], y.get("v"), rl), lam)
    _check_plateau(sym, y)
    if float(lam) <= 0:
        warnings.warn(
            f"derive.plateau: the symmetric point is stable (lambda_max = {float(lam):.3g} <= 0): there is no "
            "plateau to escape from here (with K = 1 or a matched student it is the minimum)",
            stacklevel=_caller_outside_attnflow(),
        )
    return Plateau(y, generalisation_error(sym, y["R"], y["Q"], y.get("v"), rl), lam)


def _check_plateau(sym: Setup, y: dict) -> None:
    """The root of `plateau` must be overlaps some weights have, and symmetric: a damped root find
    can settle on a root of the field past the realisable set (the field is defined there too)."""
    R, Q = np.asarray(y["R"], dtype=float), np.asarray(y["Q"], dtype=float)
    low = realisability_gap(R, Q, sym.T)
    if low < -1e-9 * (1 + np.abs(Q).max()):
        raise ValueError(
            f"derive.plateau: the root find settled at overlaps no weights have (Q - R T^-1 R^T has the eigenvalue "
            f"{low:.3g} < 0; Q = {V.show(Q)}): give a longer t_guess, so that the flow brings the guess to the plateau"
        )
    K = Q.shape[0]
    off = Q[~np.eye(K, dtype=bool)]
    spread = max(np.ptp(R, axis=0).max(), np.ptp(np.diag(Q)), np.ptp(off) if off.size else 0.0)
    if spread > 1e-6 * (1 + np.abs(Q).max()):
        warnings.warn(
            f"derive.plateau: the point found is not permutation-symmetric (entries differ by {spread:.2g}); "
            f"with {type(sym.quadrature).__name__} the field itself breaks the symmetry (a Monte Carlo bank is "
            "not invariant under permutations of the students): use GaussHermite or SparseGaussHermite",
            stacklevel=_caller_outside_attnflow(),
        )


def escape_time(
    setup: Setup,
    threshold: Any,
    *,
    t1: Any,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The first time the generalisation error (5) (the observable ``error``) falls to ``threshold``
    along the derived ODE (2)-(4): the event time of `solve` with the event ``error - threshold`` from the setup's
    start (`attnflow.crossing_time` on `ode`), NaN if it has not by ``t1``. The same verb as
    `attnflow.focus.escape_time` and `attnflow.heads.escape_time`: traceable (``jax.jit``,
    ``jax.vmap``, `attnflow.sweep`) and differentiable with `attnflow.sensitivity` (the event
    time's derivative, eq. (S1) there). ``ValueError`` for a ``threshold`` not below the
    start's ``error``."""
    return crossing_time(ode(setup), "error", threshold, t1, solver=solver, progress=progress)
