"""Saddle tools: fixed points, Jacobian spectra, unstable modes and escape times.

For a vector field ``field(t, y, args)`` on a pytree state ``y``, or a theory's `attnflow.ODE`
(``P.ode(setup)``, which carries its ``args``):

- `fixed_point`: a root of the field (Optimistix root find);
- `jacobian`: the Jacobian ``d field / d y`` as a matrix on the flattened state;
- `spectrum`: eigenvalues sorted by real part (largest first) with eigenvectors mapped
  back to the pytree shape;
- `fixed_point_branch`: fixed points followed along a parameter (natural continuation), with
  the spectrum at each;
- `escape_time`: the linearised estimate ``log(r / eps) / lambda_max`` for leaving an
  unstable fixed point from a perturbation of size ``eps``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
from jax.flatten_util import ravel_pytree

from . import _validate as V
from ._errors import check_traced, fail_if

if TYPE_CHECKING:
    from .ode import ODE

__all__ = [
    "fixed_point",
    "fixed_point_branch",
    "FixedPointBranch",
    "jacobian",
    "spectrum",
    "Spectrum",
    "unstable_subspace",
    "escape_time",
]


def _default_root_finder(rtol: float = 1e-10, atol: float = 1e-12) -> optx.Newton:
    """The default of `fixed_point`: Optimistix Newton whose linear step is a least-squares (SVD)
    solve, so that a Jacobian with null directions (a state that holds both ``q_12`` and
    ``q_21`` of a symmetric matrix, a continuous family of roots) takes the minimum-norm step
    instead of failing on a singular matrix."""
    return optx.Newton(rtol=rtol, atol=atol, linear_solver=lx.AutoLinearSolver(well_posed=False))


def fixed_point(
    field: Callable[[Any, Any, Any], Any] | ODE,
    y_guess: Any,
    args: Any = None,
    *,
    t: Any = 0.0,
    solver: optx.AbstractRootFinder | optx.AbstractLeastSquaresSolver | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    max_steps: int = 256,
    throw: bool = True,
) -> Any:
    """A state ``y*`` with ``field(t, y*, args) = 0``, found from ``y_guess``.

    Default solver: Optimistix Newton with least-squares (SVD) linear steps: null directions
    of the Jacobian do not stop it. Any Optimistix root finder, or least-squares solver
    (``optx.LevenbergMarquardt``, ``optx.Dogleg``: damped steps that do not overshoot, and
    robust to null directions of the Jacobian), can be passed through ``solver``.
    Calling it again with the same ``field`` function and solver settings reuses the
    compiled solve (floats in ``args`` are data).
    """
    from .ode import as_data, field_and_args, require_x64

    require_x64("fixed_point")  # rtol 1e-10 is below float32's resolution: a float32 root "converges" anywhere near
    field, args = field_and_args("fixed_point", field, args)
    V.finite_tree("y_guess", y_guess)
    y_guess = _as_float64(y_guess)
    if not callable(field):
        raise ValueError(f"field must be callable (t, y, args) -> dy/dt, got {field!r:.80}")
    _check_field_shape("fixed_point", field, y_guess, args, t)
    solver = solver if solver is not None else _default_root_finder(rtol, atol)
    if not isinstance(solver, (optx.AbstractRootFinder, optx.AbstractLeastSquaresSolver)):
        raise ValueError(f"solver must be an Optimistix root finder or least-squares solver, got {solver!r}")
    fn = _Residual(field)
    targs = (jnp.asarray(t, dtype=float), as_data(args))
    sol: Any
    # derivatives of the root (implicit function theorem) through the pseudo-inverse: at a root
    # with null directions (a symmetric plateau, a state holding q_12 and q_21) the Jacobian is
    # singular, and the well-posed default returned derivatives of 1e12
    adjoint = optx.ImplicitAdjoint(linear_solver=lx.AutoLinearSolver(well_posed=False))
    if isinstance(solver, optx.AbstractLeastSquaresSolver):
        sol = optx.least_squares(fn, solver, y_guess, args=targs, max_steps=max_steps, throw=False, adjoint=adjoint)
    else:
        sol = optx.root_find(fn, solver, y_guess, args=targs, max_steps=max_steps, throw=False, adjoint=adjoint)
    if throw and V.any_traced((sol.value, y_guess, args)):
        # the residual cannot be looked at: fail as integrate's traced solve does (an error under
        # jit / vmap, the point marked failed inside a sweep), not hand back the last iterate
        res_leaves = jax.tree_util.tree_leaves(fn(sol.value, targs))
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in res_leaves]))
        not_root = (sol.result != optx.RESULTS.successful) | ~finite
        return fail_if(sol.value, not_root, _NOT_CONVERGED_TRACED)
    if throw:
        res = fn(sol.value, targs)
        size = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(res))
        if sol.result != optx.RESULTS.successful or not np.isfinite(size):
            # the last iterate's size too: a field that decays far out (|field| tiny) is not a root
            y_max = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(sol.value))
            guess = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(y_guess))
            raise RuntimeError(
                f"fixed_point: root find did not converge (result: {sol.result}); at its last iterate "
                f"|field| = {size:.3g} and max |y| = {y_max:.3g} (the guess had {guess:.3g}"
                f"{'; the iterates ran away from it, where the field decays' if y_max > 10 * (guess + 1) else ''}); "
                "try another initial guess, more max_steps, or a damped solver (optx.LevenbergMarquardt)"
            )
    return sol.value


_NOT_CONVERGED_TRACED = (
    "fixed_point: root find did not converge (traced: the residual is not shown; call it outside jit "
    "for the numbers); try another initial guess, more max_steps, or a damped solver (optx.LevenbergMarquardt)"
)


class _Residual(eqx.Module):
    """``(y, (t, args)) -> field(t, y, args)``; equal for the same field function, so repeated
    root finds hit Optimistix's compilation cache."""

    field: Callable = eqx.field(static=True)

    def __call__(self, y, targs):
        t, args = targs
        return self.field(t, y, args)


def _as_float64(y: Any) -> Any:
    """A state's real leaves in float64 (a float32 guess would keep the root find in float32)."""

    def cast(x):
        x = jnp.asarray(x)
        return x if jnp.iscomplexobj(x) else x.astype(jnp.result_type(float))

    return jax.tree_util.tree_map(cast, y)


def _check_field_shape(who: str, field: Callable, y: Any, args: Any, t: Any) -> None:
    """``ValueError`` unless ``field(t, y, args)`` has the structure and shapes of ``y``."""
    out = V.abstract_call(f"{who}: field(t, y, args) failed at y", lambda y, a: field(t, y, a), y, args)
    V.matches_state(f"{who}: ", out, y)


def jacobian(field: Callable[[Any, Any, Any], Any] | ODE, y: Any, args: Any = None, t: Any = 0.0) -> jax.Array:
    """Jacobian of the field at ``y`` as an ``(n, n)`` matrix on ``ravel_pytree(y)``."""
    from .ode import field_and_args

    field, args = field_and_args("jacobian", field, args)
    _check_field_shape("jacobian", field, y, args, t)
    flat, unravel = ravel_pytree(y)

    def f(x):
        return ravel_pytree(field(t, unravel(x), args))[0]

    return jax.jacfwd(f)(flat)


class Spectrum(eqx.Module):
    """Eigen-decomposition of a Jacobian (`attnflow.spectrum`): ``values``, the eigenvalues
    sorted by real part, largest first (a complex-conjugate pair: negative imaginary part first,
    inside a trace or not); ``vectors[i]``, the ``i``-th eigenvector as a pytree
    shaped like the state; ``matrix``, the (restricted) Jacobian that was decomposed.
    ``lambda_max`` is the largest real part, ``unstable(tol)`` the unstable pairs.
    """

    values: jax.Array
    vectors: list
    matrix: jax.Array

    @property
    def lambda_max(self) -> jax.Array:
        """The largest real part of the eigenvalues (the growth rate at a saddle)."""
        return jnp.real(self.values[..., 0])  # [..., 0]: a spectrum batched by vmap or a sweep

    def unstable(self, tol: float = 1e-9) -> tuple[jax.Array, list]:
        """Eigenvalues with real part > tol and their eigenvectors."""
        keep = np.flatnonzero(np.real(np.asarray(self.values)) > tol)
        return self.values[keep], [self.vectors[i] for i in keep]


def spectrum(
    field: Callable[[Any, Any, Any], Any] | ODE,
    y: Any,
    args: Any = None,
    t: Any = 0.0,
    symmetric: bool | None = None,
    basis: Any = None,
) -> Spectrum:
    """Eigenvalues and pytree-shaped eigenvectors of the Jacobian of ``field`` at ``y``.

    ``symmetric=None`` detects a symmetric Jacobian (a gradient flow's is) and then uses
    ``eigh`` (real, orthonormal eigenvectors); otherwise ``eig``. Traceable: under ``jit``,
    ``vmap`` or `attnflow.sweep` (where a Jacobian's values cannot be inspected) it uses
    ``eigh`` with ``symmetric=True`` and JAX's ``eig`` otherwise, which JAX implements for the
    CPU; outside any trace a general Jacobian goes to NumPy's ``eig``.

    ``basis``: an ``(n, k)`` matrix with orthonormal columns spanning a subspace of the
    flattened state (``ravel_pytree(y)``); the spectrum is then that of the Jacobian
    restricted to it, ``B^T J B`` (for example the antisymmetric sector of a
    permutation-symmetric state), with eigenvectors mapped back, ``B v``.
    """
    from .ode import require_x64

    # in float32 the Jacobian's rounding (~1e-7 |J|) exceeds the default tol of `unstable`:
    # null directions would count as unstable
    require_x64("spectrum")
    V.finite_tree("spectrum: y", y)
    y = _as_float64(y)
    J = jacobian(field, y, args, t)
    if not V.any_traced(J) and not np.all(np.isfinite(np.asarray(J))):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(np.asarray(J)))[0])
        raise ValueError(f"spectrum: the Jacobian of the field at y is not finite; entry {bad} is {float(J[bad])}")
    _, unravel = ravel_pytree(y)
    B = None if basis is None else jnp.asarray(basis, dtype=J.dtype)
    if B is not None:
        if B.ndim != 2 or B.shape[0] != J.shape[0]:
            raise ValueError(f"basis must have shape ({J.shape[0]}, k) for this state, got {B.shape}")
        if not V.any_traced(basis):  # in NumPy: under a jit, jnp would stage even a constant's check
            Bn = np.asarray(basis, dtype=float)
            off = float(np.max(np.abs(Bn.T @ Bn - np.eye(Bn.shape[1]))))
            if off > 1e-8:
                raise ValueError(f"basis must have orthonormal columns, but |B^T B - I| reaches {off:.3g}")
        J = B.T @ J @ B
    traced = V.any_traced(J)
    if traced:
        symmetric = bool(symmetric)  # the values cannot be looked at: the general eig unless told
        if symmetric:  # checked as it runs: eigh of a non-symmetric matrix is silently another matrix's
            not_symmetric = jnp.max(jnp.abs(J - J.T)) > 1e-8 * (1 + jnp.max(jnp.abs(J)))
            J = fail_if(J, not_symmetric, "spectrum: symmetric=True, but the Jacobian is not symmetric")
    else:
        is_symmetric = bool(jnp.allclose(J, J.T, rtol=1e-10, atol=1e-12 * (1 + float(jnp.max(jnp.abs(J))))))
        if symmetric is None:
            symmetric = is_symmetric
        elif symmetric and not is_symmetric:
            asym = float(jnp.max(jnp.abs(J - J.T)))
            raise ValueError(f"symmetric=True, but the Jacobian is not symmetric (|J - J^T| reaches {asym:.3g})")
    if symmetric:
        w, v = jnp.linalg.eigh(0.5 * (J + J.T))
        order = jnp.argsort(-jnp.real(w), stable=True)
        w, v = w[order], v[:, order]
    elif traced:  # under jit / vmap / sweep: JAX's eig (implemented for the CPU)
        # JAX differentiates eigenvalues but not eigenvectors of a general matrix: the values
        # come from eigvals (so jax.grad of lambda_max works), the vectors from eig of the
        # matrix held constant, each sorted by (-real part, imaginary part) to pair them
        w = jnp.linalg.eigvals(J)
        w_v, v = jnp.linalg.eig(jax.lax.stop_gradient(J))
        w = w[jnp.lexsort((jnp.imag(w), -jnp.real(w)))]
        v = v[:, jnp.lexsort((jnp.imag(w_v), -jnp.real(w_v)))]
    else:
        w_np, v_np = np.linalg.eig(np.asarray(J))
        order_np = np.lexsort((np.imag(w_np), -np.real(w_np)))  # the order under a trace too
        w, v = jnp.asarray(w_np[order_np]), jnp.asarray(v_np[:, order_np])
    if B is not None:
        v = B.astype(v.dtype) @ v
    vectors = [
        unravel(v[:, i])
        if not jnp.iscomplexobj(v)
        else jax.tree_util.tree_map(lambda re, im: re + 1j * im, unravel(jnp.real(v[:, i])), unravel(jnp.imag(v[:, i])))
        for i in range(v.shape[1])
    ]
    return Spectrum(w, vectors, J)


def unstable_subspace(field: Callable | ODE, y: Any, args: Any = None, tol: float = 1e-9) -> tuple[jax.Array, list]:
    """Unstable eigenvalues (real part > ``tol``) and their pytree eigenvectors at ``y``."""
    return spectrum(field, y, args).unstable(tol)


class FixedPointBranch(eqx.Module):
    """Fixed points along a parameter (`fixed_point_branch`): at ``values[i]`` the state
    ``states`` (a pytree whose leaves carry a leading axis of the parameter values), the size
    of the field there, ``residual[i] = max |field|`` (a point where the root find failed, at a
    fold or past it, shows as a large residual), and ``eigenvalues[i]`` of the Jacobian,
    sorted by real part, largest first."""

    values: jax.Array
    states: Any
    residual: jax.Array
    eigenvalues: jax.Array

    @property
    def lambda_max(self) -> jax.Array:
        """The largest real part of the eigenvalues at each parameter value: ``> 0`` where the
        fixed point is unstable (a saddle), and a change of sign where it changes stability."""
        return jnp.real(self.eigenvalues[..., 0])

    def converged(self, tol: float = 1e-8) -> jax.Array:
        """Where the root find converged: ``residual <= tol``."""
        return self.residual <= tol


def fixed_point_branch(
    ode_of: Callable[[Any], ODE],
    values: Any,
    y_guess: Any,
    *,
    solver: optx.AbstractRootFinder | optx.AbstractLeastSquaresSolver | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    max_steps: int = 256,
    symmetric: bool = False,
) -> FixedPointBranch:
    """The fixed point of ``ode_of(p)`` followed along the parameter values ``values`` (1-D, in
    the order given): natural continuation, each root find (`fixed_point`) started from the
    secant extrapolation of the two before it (the first from ``y_guess``), with the spectrum
    of the Jacobian there (`spectrum`; ``symmetric=True`` for a gradient flow: ``eigh``).

    ``ode_of(p)`` returns an `attnflow.ODE`: ``lambda eta: P.ode(s.replace(eta=eta))`` for a
    theory, ``lambda mu: af.ODE(field, {"mu": mu}, y0)`` for your own field. One ``lax.scan``
    over the values, compiled once per call (traceable, so it can sit in a sweep). Natural continuation
    cannot turn round a fold: past one, the points do not converge, and ``residual`` says so.
    Along a field with a null direction (a singular Jacobian along a whole family of roots) the
    default Newton takes least-squares steps: it stays on the root it follows when the family
    is a redundancy of the state (``q_12`` and ``q_21`` both held), and otherwise reaches some
    root of the family, which may not be the one you followed.
    """
    from .ode import ODE, field_and_args, require_x64

    require_x64("fixed_point_branch")
    if not callable(ode_of):
        raise ValueError(f"ode_of must be callable (parameter) -> af.ODE, got {ode_of!r:.80}")
    values = jnp.asarray(values, dtype=jnp.result_type(float))
    if values.ndim != 1 or values.shape[0] < 1:
        raise ValueError(f"values must be a 1-D array of parameter values, got shape {values.shape}")
    V.finite_tree("values", values)
    first = ode_of(values[0])
    if not isinstance(first, ODE):
        raise ValueError(
            f"ode_of(value) must return an af.ODE (P.ode(setup) or af.ODE(field, args, y0)), got {first!r:.80}"
        )
    V.finite_tree("y_guess", y_guess)
    field0, args0 = field_and_args("fixed_point_branch", first, None)
    _check_field_shape("fixed_point_branch", field0, y_guess, args0, 0.0)
    y_guess = _as_float64(y_guess)

    def step(carry, p):
        y1, y2, p1, p2, k = carry
        # secant predictor along the branch: y(p) ~ y1 + (y1 - y2) (p - p1) / (p1 - p2)
        slope = jnp.where((k >= 2) & (p1 != p2), (p - p1) / jnp.where(p1 != p2, p1 - p2, 1.0), 0.0)
        guess = jax.tree_util.tree_map(lambda a, b: a + slope * (a - b), y1, y2)
        ode = ode_of(p)
        y = fixed_point(ode, guess, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps, throw=False)
        field, args = field_and_args("fixed_point_branch", ode, None)
        size = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in jax.tree_util.tree_leaves(field(0.0, y, args))]))
        eig = spectrum(ode, y, symmetric=symmetric).values
        return (y, y1, p, p1, k + 1), (y, size, eig.astype(jnp.result_type(eig, 1j)))

    start = (y_guess, y_guess, values[0], values[0], jnp.asarray(0))
    _, (states, residual, eigenvalues) = jax.lax.scan(step, start, values)
    return FixedPointBranch(values, states, residual, eigenvalues)


def escape_time(lam: Any, eps: Any, r: Any = 1.0) -> jax.Array:
    """Linearised escape time ``log(r / eps) / lam`` from an unstable point.

    ``lam``: top unstable rate (> 0); ``eps``: initial size of the unstable component;
    ``r``: the O(1) distance at which the escape is declared. Concrete values outside these
    ranges raise ``ValueError``; traced ones give NaN there (a failed point in
    `attnflow.sweep`, with the message), not a negative or meaningless time.
    """
    V.positive("lam (unstable rate)", lam)
    V.positive("eps", eps)
    V.positive("r", r)
    if not V.any_traced((eps, r)) and np.any(np.asarray(eps) >= np.asarray(r)):
        raise ValueError(f"eps = {V.show(eps)} must be below r = {V.show(r)}: the escape starts inside the distance r")
    lam, eps, r = jnp.asarray(lam), jnp.asarray(eps), jnp.asarray(r)
    time = jnp.log(r / eps) / lam
    if not V.any_traced((lam, eps, r)):
        return time
    valid = (lam > 0) & (eps > 0) & (eps < r)
    check_traced(lambda: ~jnp.all(valid), "escape_time: lam (unstable rate) and eps must be positive, eps below r")
    return jnp.where(valid, time, jnp.nan)
