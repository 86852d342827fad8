"""Solvers for flows that turn stiff: `KrylovW` and the automatic switch `AutoStiff`.

Late in training, gradient flows of attention models are stiff: one or a few directions of
the loss are very sharp (the top Hessian eigenvalue of the focus-and-dilution flow grows to
about 260 while the next is about 3), so an explicit solver's step is capped by stability,
not accuracy, and it takes hundreds of thousands of steps. An implicit solver takes few
steps but rebuilds and factors a dense Jacobian at each of them.

`KrylovW` is a Rosenbrock-W method, ROS34PW2 (Rang and Angermann 2005: four stages, order 3
with an embedded order-2 error estimate, L-stable). A W-method keeps its order with *any*
matrix ``A`` in place of the Jacobian ``J`` in its linear solves ``(I - h gamma A) k = r``.
Here ``A = V H V^T`` is the projection of ``J`` on a ``rank``-dimensional subspace that
holds its largest eigenvalues: the few sharp, stiff directions, found by subspace
iteration with Jacobian-vector products (``jax.linearize``). Each stage then solves a
``rank x rank`` system, ``(I - c A)^{-1} = (I - V V^T) + V (I - c H)^{-1} V^T``, and the
subspace is advanced by one iteration every ``refresh`` accepted steps (``2 rank``
Jacobian-vector products), never built as a dense matrix. Values between steps (save
points, event root finds) come from a continuous extension built from the stages
(`_dense_coeffs`), not from a Hermite interpolant through ``f(y)``, whose slopes carry
``h |lambda|`` times the error of ``y`` in a stiff direction.

`AutoStiff` follows a solution into stiffness on its own, as LSODA does: it takes Tsit5
steps (the same steps and values as `attnflow.UnrolledTsit5`) while the problem is not
stiff, watching Hairer's estimate ``h rho`` of the largest eigenvalue along the step (from
Tsit5's last two stages, both at the end of the step); after 15 steps at Tsit5's stability
limit it switches to `KrylovW`, and back when ``h ||H||`` shows that an explicit step of
that size would be stable again.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["KrylovW", "AutoStiff", "PolynomialInterpolation", "ROS34PW2"]


class _RosWTableau(eqx.Module):
    gamma: float = eqx.field(static=True)
    alpha: tuple = eqx.field(static=True)  # strictly lower triangular, rows of the stage arguments
    gammas: tuple = eqx.field(static=True)  # strictly lower triangular, couplings through A
    b: tuple = eqx.field(static=True)
    b_hat: tuple = eqx.field(static=True)
    dense: tuple = eqx.field(static=True)  # per stage, the coefficients of theta, theta^2, theta^3 of b_i(theta)
    dense_stiff: tuple = eqx.field(static=True)  # the same for the weights the dense output tends to when stiff


ROS34PW2 = _RosWTableau(
    gamma=4.3586652150845900e-01,
    alpha=((), (8.7173304301691801e-01,), (8.4457060015369423e-01, -1.1299064236484185e-01), (0.0, 0.0, 1.0)),
    gammas=(
        (),
        (-8.7173304301691801e-01,),
        (-9.0338057013044082e-01, 5.4180672388095326e-02),
        (2.4212380706095346e-01, -1.2232505839045147e00, 5.4526025533510214e-01),
    ),
    b=(2.4212380706095346e-01, -1.2232505839045147e00, 1.5452602553351020e00, 4.3586652150845900e-01),
    b_hat=(3.7810903145819369e-01, -9.6042292212423178e-02, 0.5, 2.1793326075422950e-01),
    dense=(
        (1.0564298455794094, -1.3864882699759573, 0.5721822314575016),
        (2.296429974281067, -8.262611700275677, 4.742931142090097),
        (-1.307599564525376, 7.250979895056055, -4.398120075195578),
        (-1.045260255335102, 2.398120075195581, -0.9169932983520199),
    ),
    dense_stiff=(
        (-0.9002235337625588, 1.5750641449455278, -0.4327168041220223),
        (-13.922655025121104, 16.28627920443342, -3.5868747632168283),
        (13.732358048213488, -15.51320678133071, 3.326108988452317),
        (2.0905205106701716, -2.3481365680482416, 0.6934825788865231),
    ),
)
"""Coefficients of ROS34PW2 (Rang & Angermann, BIT 45 (2005) 761-787), in the form
``(I - h gamma A) k_i = h f(y0 + sum_j alpha_ij k_j) + h A sum_j gamma_ij k_j``,
``y1 = y0 + sum_i b_i k_i``, error ``sum_i (b_i - b_hat_i) k_i``; ``dense`` and ``dense_stiff``
are the weights of the dense output (see `_dense_coeffs`)."""


class PolynomialInterpolation(diffrax.AbstractLocalInterpolation):
    """Dense output as a polynomial in ``theta = (t - t0) / (t1 - t0)``: ``coeffs`` holds, per
    leaf of the state, the coefficients of degree 4 down to 0 (``polyval`` order)."""

    t0: Any  # type: ignore[misc]  # a field, as in Diffrax's own interpolations
    t1: Any  # type: ignore[misc]
    coeffs: Any

    def evaluate(self, t0, t1=None, left=True):
        del left
        if t1 is not None:
            return jax.tree_util.tree_map(lambda a, b: b - a, self.evaluate(t0), self.evaluate(t1))
        theta = (t0 - self.t0) / (self.t1 - self.t0)
        return jax.tree_util.tree_map(lambda c: jnp.polyval(c, theta.astype(c.dtype)), self.coeffs)


def _dense_coeffs(tab: _RosWTableau, x0, ks, solve: Callable):
    """Dense output of a W-step from its stages ``ks (s, n)``, as degree-4 coefficients in ``theta``
    (``polyval`` order; the ``theta^4`` one is zero)::

        y(theta) = y0 + sum_i b_i(theta) k_i - (I - (I - h gamma A)^{-1}) sum_i d_i(theta) k_i,

    ``b_i(theta)`` the cubics ``tab.dense``, ``d_i = b_i - s_i`` with ``s_i(theta)`` the cubics
    ``tab.dense_stiff``, and ``solve`` applying ``(I - h gamma A)^{-1}``. Here ``c_i = sum_j
    alpha_ij``, ``g_i = gamma + sum_j gamma_ij``, ``B = alpha + Gamma`` (``Gamma`` with ``gamma`` on
    its diagonal), ``R_theta(z)`` the interpolant's growth factor on ``y' = lambda y`` with
    ``A = lambda``, ``z = h lambda``, and the stiff limit ``z -> -inf``, in which the interpolant
    is ``(1 - sum_i w_i) y0 + sum_i w_i Y_i``, ``w = B^{-T} b(theta)``, ``Y_i`` the stage values.

    - ``b(theta)`` is the continuous extension PETSc ships for this method (``TSROSWRA34PW2``):
      the only cubic weights with ``b_i(1) = b_i`` that meet the W-method's order conditions to
      order 2 at every ``theta`` (``sum b_i = theta``, ``sum b_i c_i = theta^2 / 2``,
      ``sum b_i g_i = 0``: for any ``A``) and the bushy order-3 one ``sum b_i c_i^2 =
      theta^3 / 3``; ``|R_theta(z)| <= 1.002`` on the closed left half plane. In the stiff limit
      it is second order on a slow manifold, with defect ``max_theta |sum w_i c_i^3 - theta^3| =
      0.085``.
    - ``s(theta)``: of the cubic weights that meet the same order-2 conditions with ``s_i(1) =
      b_i`` (a two-parameter family), those with the smallest stiff-limit defect, ``0.045``,
      subject to ``|R_theta(-inf)| <= 1`` for all ``theta`` (the dense output never amplifies the
      error of ``y0`` in a stiff direction); found numerically. The weights with zero defect
      exist, but reach ``|R_theta(-inf)| = 2.2``.
    - ``I - (I - h gamma A)^{-1} = -h gamma A (I - h gamma A)^{-1}`` blends the two: it is
      ``O(h A)`` where ``h A`` is small, and ``d(theta)`` meets the order-2 conditions with zero
      right-hand sides (``sum_i d_i k_i = O(h^3)``), so the correction is ``O(h^4)`` there and
      ``b(theta)``'s accuracy stands; it tends to the identity in the stiff directions of ``A``,
      where the weights become ``s(theta)``. ``|R_theta(z)| <= 1.01`` on the left half plane.

    Why not the cubic Hermite through ``(y0, h f(y0))`` and ``(y1, h f(y1))``: in a stiff
    direction an ``O(tol)`` error of ``y1`` makes an ``O(h |lambda| tol)`` error of the slope
    ``f(y1)``; on Robertson's problem at ``rtol = 1e-6`` the saved ``y2`` was 6 and 15 % off at
    ``t = 4000`` and ``4e4``, with accurate steps. Linear interpolation in the stiff directions
    (Hermite in the others) is only first order there (300 to 500 rtol on Robertson at
    ``rtol = 1e-8``). ``b(theta)`` alone leaves interior errors of ``9 rtol`` on the
    Prothero-Robinson problem ``y' = -L (y - sin t) + cos t`` at ``L = 1e6``, this blend ``5 rtol``
    (tested in ``tests/test_stiff_dense.py``). Costs three ``rank x rank`` solves per step.
    """
    P = jnp.asarray(tab.dense, x0.dtype)  # (s, 3): coefficients of theta, theta^2, theta^3
    D = P - jnp.asarray(tab.dense_stiff, x0.dtype)
    cd = D.T @ ks
    c = P.T @ ks - cd + jax.vmap(solve)(cd)  # (3, n)
    return jnp.concatenate([jnp.zeros_like(x0)[None], c[::-1], x0[None]])


def _tsit5_matrix() -> np.ndarray:
    """``(7, 4)``: the coefficients of ``theta^4 .. theta^1`` of Tsit5's interpolation weights."""
    with jax.ensure_compile_time_eval():  # may be first needed while tracing a solve
        interp = diffrax.Tsit5.interpolation_cls(t0=0.0, t1=1.0, y0=jnp.zeros(7), y1=jnp.zeros(7), k=jnp.eye(7))
        thetas = np.linspace(0.1, 1.0, 9)
        vals = np.stack([np.asarray(interp.evaluate(float(t))) for t in thetas])  # (9, 7)
    V = np.stack([thetas**p for p in (4, 3, 2, 1)], axis=1)
    coef, *_ = np.linalg.lstsq(V, vals, rcond=None)  # (4, 7): exact, the weights are quartics without constant
    return coef.T


_TSIT5 = diffrax.Tsit5.tableau
_TSIT5_POLY = None


def _tsit5_coeffs(y0, ks):
    global _TSIT5_POLY
    if _TSIT5_POLY is None:
        _TSIT5_POLY = _tsit5_matrix()
    c = jnp.tensordot(jnp.asarray(_TSIT5_POLY.T, ks.dtype), ks, axes=1)  # (4, n)
    return jnp.concatenate([c, y0[None]])


def _depends_on_time(fn: Callable, t0, x0) -> bool:
    """Whether ``fn(t, x)`` reads ``t`` (decided once, while tracing)."""
    jaxpr = jax.make_jaxpr(fn)(t0, x0).jaxpr
    t_var = jaxpr.invars[0]
    used = {v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, jax.extend.core.Var)}
    used |= {v for v in jaxpr.outvars if isinstance(v, jax.extend.core.Var)}
    return t_var in used


class _Flat(eqx.Module):
    """The vector field on the flattened state."""

    terms: Any
    args: Any
    unravel: Callable = eqx.field(static=True)

    def __call__(self, t, x):
        return ravel_pytree(self.terms.vf(t, self.unravel(x), self.args))[0]


def _subspace(f: _Flat, t, x, V, iterations: int):
    """Orthonormal ``V (n, k)`` spanning the dominant invariant subspace of ``J = df/dx`` at
    ``(t, x)``, by ``iterations`` steps of subspace iteration from ``V``, and ``H = V^T J V``.

    Subspace iteration (not a single-vector Krylov space) so that a stiff eigenvalue of
    multiplicity up to ``k`` is captured in full; warm-started from the previous basis it
    tracks the stiff directions as they turn. Costs ``(iterations + 1) k`` Jacobian-vector
    products (one batched ``jax.linearize``).

    No derivative passes through ``(V, H)``: a W-method keeps its order with any matrix ``A``, so
    for ``jax.grad``/``jax.jvp`` through a solve ``A`` is a constant of each step, and the
    derivative of ``qr`` is NaN where ``J V`` is rank-deficient (a Jacobian with a zero eigenvalue,
    as every flow with a conserved quantity has, and ``k`` large enough to reach it). The inputs
    are cut (so that neither mode traces the derivative of ``qr``) and the outputs too (a field
    that closes over a traced value still carries one in)."""
    f, t, x, V = jax.tree_util.tree_map(
        lambda a: jax.lax.stop_gradient(a) if eqx.is_inexact_array(a) else a, (f, t, x, V)
    )
    _, jvp = jax.linearize(lambda z: f(t, z), x)
    apply_J = jax.vmap(jvp, in_axes=1, out_axes=1)
    for _ in range(iterations):
        V, _ = jnp.linalg.qr(apply_J(V))
    return jax.lax.stop_gradient((V, V.T @ apply_J(V)))


_INIT_ITERATIONS = 3
"""Subspace-iteration steps from the random start basis (later refreshes take one each)."""


def _start_vectors(n: int, rank: int, dtype) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(20050701), (n, rank), dtype=dtype)


class _WState(eqx.Module):
    V: jax.Array
    H: jax.Array
    age: jax.Array
    f0: jax.Array


def _lower(rows: tuple, s: int) -> np.ndarray:
    """A strictly lower triangular ``(s, s)`` matrix from its rows."""
    M = np.zeros((s, s))
    for i, row in enumerate(rows):
        M[i, : len(row)] = row
    return M


def _w_step(tab: _RosWTableau, f: _Flat, t0, t1, x0, f0, V, H, time_dependent: bool):
    """One ROS34PW2 step with ``A = V H V^T``; returns ``x1, error, f1, dense coefficients``.

    The stages after the first run in a ``fori_loop`` (the field is traced once for them, not
    three times: a large field compiles in a fraction of the time)."""
    h = t1 - t0
    c = h * tab.gamma
    k = H.shape[0]
    s = len(tab.b)
    alpha = jnp.asarray(_lower(tab.alpha, s), x0.dtype)
    gammas = jnp.asarray(_lower(tab.gammas, s), x0.dtype)
    c_stage = alpha.sum(axis=1)
    g_stage = tab.gamma + gammas.sum(axis=1)
    lu = jax.scipy.linalg.lu_factor(jnp.eye(k, dtype=x0.dtype) - c * H)

    def solve(r):
        z = V.T @ r
        return r - V @ z + V @ jax.scipy.linalg.lu_solve(lu, z)

    ft = None
    if time_dependent:
        ft = jax.jvp(lambda tt: f(tt, x0), (t0,), (jnp.ones_like(t0),))[1]

    def rhs(i, fi, ks):
        r = h * fi + h * (V @ (H @ (V.T @ (gammas[i] @ ks))))
        return r if ft is None else r + h * h * g_stage[i] * ft

    ks = jnp.zeros((s, x0.shape[0]), x0.dtype)
    ks = ks.at[0].set(solve(rhs(0, f0, ks)))

    def stage(i, ks):
        fi = f(t0 + c_stage[i] * h, x0 + alpha[i] @ ks)
        return ks.at[i].set(solve(rhs(i, fi, ks)))

    ks = jax.lax.fori_loop(1, s, stage, ks)
    b = jnp.asarray(tab.b, x0.dtype)
    x1 = x0 + b @ ks
    err = (b - jnp.asarray(tab.b_hat, x0.dtype)) @ ks
    f1 = f(t1, x1)
    return x1, err, f1, _dense_coeffs(tab, x0, ks, solve)


def _tsit5_step(f: _Flat, t0, t1, x0, f0):
    """One Tsit5 step (the tableau of ``diffrax.Tsit5``; stages 2..7 in a ``fori_loop``), with
    Hairer's stiffness estimate ``h rho = |k7 - k6| / |x7 - x6|`` from the last two stages, both
    at the end of the step. Returns ``x1, error, f1, dense coefficients, h rho``."""
    h = t1 - t0
    s = len(_TSIT5.c) + 1
    A = jnp.asarray(_lower(((),) + tuple(_TSIT5.a_lower), s)[1:], x0.dtype)  # rows of stages 2..7
    c = jnp.asarray(_TSIT5.c, x0.dtype)
    ks = jnp.zeros((s, x0.shape[0]), x0.dtype).at[0].set(h * f0)

    def stage(i, carry):
        ks, _ = carry
        xi = x0 + A[i - 1] @ ks
        fi = f(t0 + c[i - 1] * h, xi)
        return ks.at[i].set(h * fi), fi

    ks, f1 = jax.lax.fori_loop(1, s, stage, (ks, f0))
    x1 = x0 + A[-1] @ ks  # FSAL: the last stage is the new point
    x6 = x0 + A[-2] @ ks
    err = jnp.asarray(_TSIT5.b_error, x0.dtype) @ ks
    h_rho = jnp.linalg.norm(ks[-1] - ks[-2]) / (jnp.linalg.norm(x1 - x6) + jnp.finfo(x0.dtype).tiny)
    return x1, err, f1, _tsit5_coeffs(x0, ks), h_rho


def _check_count(name: str, value: Any) -> None:
    # a bool is an int to Python, but KrylovW(rank=True) is a slip, not a rank of 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class KrylovW(diffrax.AbstractAdaptiveSolver):
    """Rosenbrock-W method ROS34PW2 with a rank-``rank`` approximation of the Jacobian on its
    dominant subspace, advanced every ``refresh`` accepted steps (see the module documentation).

    For stiff flows whose stiffness lives in a few directions (the sharp directions of a
    loss). Order 3, L-stable in the captured directions; in the others it is as stable as
    an explicit method, so ``rank`` must cover the stiff directions: one per stiff real
    eigenvalue, two per stiff complex pair (a rank-1 subspace cannot hold the rotating plane of
    a pair: on ``y' = M y`` with eigenvalues ``-1e4 +- 5e3 i`` and ``-1``, ``KrylovW(rank=1)``
    took 28,339 steps to ``t = 5`` at ``rtol = 1e-6``, more than Tsit5's 20,978, and
    ``rank=2`` 469). A ``rank`` above the state's size is clipped to it. Costs per step: four
    evaluations of the field (one is the next step's first), a ``rank x rank`` LU, three more
    ``rank x rank`` solves for the dense output (`_dense_coeffs`: stable in the stiff
    directions, unlike a Hermite interpolant through ``f(y)``), and ``2 rank`` Jacobian-vector
    products every ``refresh`` steps. ``jax.grad`` and ``jax.jvp`` through a solve treat ``A`` as
    a constant of each step (a W-method's order does not depend on it).
    """

    rank: int = eqx.field(static=True, default=8)
    refresh: int = eqx.field(static=True, default=10)
    tableau: _RosWTableau = eqx.field(static=True, default=ROS34PW2)

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = PolynomialInterpolation

    def __check_init__(self):
        for name in ("rank", "refresh"):
            _check_count(name, getattr(self, name))

    def order(self, terms):
        return 3

    def error_order(self, terms):
        return 3

    def strong_order(self, terms):
        return None

    def _flat(self, terms, y0, args):
        x0, unravel = ravel_pytree(y0)
        return x0, unravel, _Flat(terms, args, unravel)

    def init(self, terms, t0, t1, y0, args):
        x0, _, f = self._flat(terms, y0, args)
        k = min(self.rank, x0.shape[0])
        V0, _ = jnp.linalg.qr(_start_vectors(x0.shape[0], k, x0.dtype))
        V, H = _subspace(f, t0, x0, V0, _INIT_ITERATIONS)
        return _WState(V, H, jnp.asarray(0, jnp.int32), f(t0, x0))

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        x0, unravel, f = self._flat(terms, y0, args)
        st = solver_state
        f0 = st.f0
        if made_jump is not False:
            f0 = jax.lax.cond(made_jump, lambda: f(t0, x0), lambda: f0)
        V, H = jax.lax.cond(st.age >= self.refresh, lambda: _subspace(f, t0, x0, st.V, 1), lambda: (st.V, st.H))
        age = jnp.where(st.age >= self.refresh, 0, st.age)
        x1, err, f1, coeffs = _w_step(self.tableau, f, t0, t1, x0, f0, V, H, _depends_on_time(f, t0, x0))
        dense = {"coeffs": jax.vmap(unravel)(coeffs)}
        return unravel(x1), unravel(err), dense, _WState(V, H, age + 1, f1), diffrax.RESULTS.successful


class _AutoState(eqx.Module):
    stiff: jax.Array
    n_stiff: jax.Array
    n_calm: jax.Array
    f0: jax.Array
    w: _WState


class AutoStiff(diffrax.AbstractAdaptiveSolver):
    """Tsit5 while the problem is not stiff, `KrylovW` once it is, and back (see the module
    documentation). While it never switches it takes exactly Tsit5's steps.

    ``rank`` and ``refresh`` are `KrylovW`'s (``rank`` must cover the stiff directions, two per
    stiff complex eigenvalue pair; one above the state's size is clipped to it); ``threshold``
    (default 3.0; Tsit5's stability interval on the negative real axis ends at -3.51, and its
    controller holds a step at the limit near 3.2) and ``patience`` (15 steps) decide the
    switch to the stiff solver, ``calm`` (2.0) and ``calm_steps`` (6) the switch back (and,
    in explicit mode, ``calm_steps`` steps below the threshold reset the count to the switch).
    Under ``jax.vmap`` both branches are computed at every step (a batched condition becomes
    a select), so batches of stiff flows pay the cost of both solvers.
    """

    rank: int = eqx.field(static=True, default=8)
    refresh: int = eqx.field(static=True, default=10)
    threshold: float = eqx.field(static=True, default=3.0)
    patience: int = eqx.field(static=True, default=15)
    calm: float = eqx.field(static=True, default=2.0)
    calm_steps: int = eqx.field(static=True, default=6)

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = PolynomialInterpolation

    def __check_init__(self):
        for name in ("rank", "refresh", "patience", "calm_steps"):
            _check_count(name, getattr(self, name))
        for name in ("threshold", "calm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    def order(self, terms):
        return 5

    def error_order(self, terms):
        # Tsit5's, so that while it never switches the controller takes Tsit5's very steps
        return 5

    def strong_order(self, terms):
        return None

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def _w(self) -> KrylovW:
        return KrylovW(rank=self.rank, refresh=self.refresh)

    def init(self, terms, t0, t1, y0, args):
        w = self._w().init(terms, t0, t1, y0, args)
        zero = jnp.asarray(0, jnp.int32)
        # the stiff solver's Jacobian is rebuilt when it takes over
        w = _WState(w.V, w.H, jnp.asarray(self.refresh, jnp.int32), w.f0)
        return _AutoState(jnp.asarray(False), zero, zero, w.f0, w)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        x0, unravel = ravel_pytree(y0)
        f = _Flat(terms, args, unravel)
        st = solver_state
        f0 = st.f0
        if made_jump is not False:
            f0 = jax.lax.cond(made_jump, lambda: f(t0, x0), lambda: f0)
        h = t1 - t0
        time_dependent = _depends_on_time(f, t0, x0)
        w_solver = self._w()

        def explicit():
            x1, err, f1, coeffs, h_rho = _tsit5_step(f, t0, t1, x0, f0)
            return x1, err, f1, coeffs, h_rho, st.w

        def implicit():
            V, H = jax.lax.cond(
                st.w.age >= self.refresh, lambda: _subspace(f, t0, x0, st.w.V, 1), lambda: (st.w.V, st.w.H)
            )
            age = jnp.where(st.w.age >= self.refresh, 0, st.w.age)
            x1, err, f1, coeffs = _w_step(w_solver.tableau, f, t0, t1, x0, f0, V, H, time_dependent)
            h_rho = jnp.abs(h) * jnp.linalg.norm(H, ord=2)
            return x1, err, f1, coeffs, h_rho, _WState(V, H, age + 1, f1)

        x1, err, f1, coeffs, h_rho, w_state = jax.lax.cond(st.stiff, implicit, explicit)
        # switch to the stiff solver after `patience` steps at the explicit stability limit,
        # back after `calm_steps` steps at which an explicit step would be stable
        at_limit = h_rho > self.threshold
        n_stiff = jnp.where(st.stiff, 0, jnp.where(at_limit, st.n_stiff + 1, st.n_stiff))
        n_calm_explicit = jnp.where(at_limit, 0, st.n_calm + 1)
        n_stiff = jnp.where(~st.stiff & (n_calm_explicit >= self.calm_steps), 0, n_stiff)
        n_calm = jnp.where(st.stiff, jnp.where(h_rho < self.calm, st.n_calm + 1, 0), n_calm_explicit)
        to_stiff = ~st.stiff & (n_stiff >= self.patience)
        to_explicit = st.stiff & (n_calm >= self.calm_steps)
        stiff = (st.stiff | to_stiff) & ~to_explicit
        w_state = _WState(w_state.V, w_state.H, jnp.where(to_stiff, self.refresh, w_state.age), f1)
        new = _AutoState(
            stiff,
            jnp.where(to_stiff | to_explicit, 0, n_stiff),
            jnp.where(to_stiff | to_explicit, 0, n_calm),
            f1,
            w_state,
        )
        dense = {"coeffs": jax.vmap(unravel)(coeffs)}
        return unravel(x1), unravel(err), dense, new, diffrax.RESULTS.successful
