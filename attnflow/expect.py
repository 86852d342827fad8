"""Gaussian expectations for order-parameter ODEs.

- `GaussianBank`: a fixed bank of standard normal draws (common random numbers) reused
  at every evaluation, so a Monte Carlo field is a smooth deterministic function of its
  parameters (adaptive solvers and ``jacfwd`` apply). Antithetic copies make every odd
  moment vanish exactly.
- `psd_sqrt`: the symmetric square root of a positive semidefinite matrix, with a
  Sylvester-equation JVP that stays finite at degenerate eigenvalues.
- `gauss_hermite`: tensor-product Gauss-Hermite quadrature for low dimension.
- `antithetic_copies`, `cyclic_permutations`, `all_permutations`, `permuted_copies`: the
  symmetrisation of any Monte Carlo bank (draws with a leading sample axis), so that the
  estimate is exactly even/odd under a sign flip and exactly equivariant under a
  permutation of one axis (the heads of a multi-head model, say).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _validate as V

__all__ = [
    "GaussianBank",
    "psd_sqrt",
    "gauss_hermite",
    "hermite_rule",
    "antithetic_copies",
    "cyclic_permutations",
    "all_permutations",
    "permuted_copies",
]


def antithetic_copies(draws: Any, flip: Any) -> Any:
    """The bank ``draws`` followed by its mirror image: leaves whose ``flip`` entry is ``True`` are
    negated in the copy, the others repeated. Every leaf has a leading sample axis, which doubles.

    ``flip`` is a pytree of booleans with the structure of ``draws``. A Monte Carlo mean over
    the result is exactly invariant under the sign flip of the flipped variables, so odd
    moments of them vanish exactly.
    """
    return jax.tree_util.tree_map(lambda x, f: jnp.concatenate([x, -x if f else x]), draws, flip)


def cyclic_permutations(n: int) -> list[np.ndarray]:
    """The ``n`` cyclic shifts of ``range(n)`` (the cyclic group acting on ``n`` items)."""
    n = V.positive_int("n", n)
    return [np.roll(np.arange(n), s) for s in range(n)]


def all_permutations(n: int, max_n: int = 6) -> list[np.ndarray]:
    """All ``n!`` permutations of ``range(n)``; refused for ``n > max_n`` (``7! = 5040`` copies)."""
    import itertools

    n = V.positive_int("n", n)
    if n > max_n:
        raise ValueError(f"all permutations of {n} items make {n}! copies; use cyclic_permutations for n > {max_n}")
    return [np.asarray(p) for p in itertools.permutations(range(n))]


def permuted_copies(draws: Any, perms: Any, axis: Any) -> Any:
    """One copy of the bank per permutation in ``perms``, concatenated along the sample axis.

    ``axis`` is a pytree (structure of ``draws``) giving, per leaf, the axis the permutation
    acts on, or ``None`` for leaves that are only repeated. A mean over the result is exactly
    equivariant under the permutations (for a group, such as `cyclic_permutations`).
    """

    def copies(x, ax):
        if ax is None:
            return jnp.concatenate([x] * len(perms))
        return jnp.concatenate([jnp.take(x, jnp.asarray(p), axis=ax) for p in perms])

    return jax.tree_util.tree_map(copies, draws, axis, is_leaf=lambda a: a is None)


PSD_ROOT_RTOL = 1e-12
"""Eigenvalues of ``P`` below this times its largest are zeros in `psd_sqrt`'s derivative."""


@jax.custom_jvp
def psd_sqrt(P: jax.Array) -> jax.Array:
    """Symmetric root ``U diag(sqrt(max(lambda, 0))) U^T`` of ``(P + P^T) / 2``.

    A Cholesky factor has the same Gaussian law but is not equivariant under a
    permutation of the coordinates; the symmetric root is. Its JVP solves the Sylvester
    equation ``S dS + dS S = dP``: ``dS = U [(U^T dP U)_ij / (sqrt l_i + sqrt l_j)] U^T``,
    set to zero where the denominator vanishes (autodiff through ``eigh`` would give NaN
    at repeated eigenvalues). Eigenvalues within rounding of zero (below ``1e-12`` times
    the largest in float64, ``n eps`` times it in a lower precision) count as zero there:
    ``eigh`` returns an exact zero as ``+-1e-18``, whose ``1 / sqrt`` would make the
    derivative of a singular ``P`` jump by ``1e9``.
    """
    w, U = jnp.linalg.eigh(0.5 * (P + jnp.swapaxes(P, -1, -2)))
    return (U * jnp.sqrt(jnp.clip(w, 0.0))[..., None, :]) @ jnp.swapaxes(U, -1, -2)


@psd_sqrt.defjvp
def _psd_sqrt_jvp(primals, tangents):
    (P,), (dP,) = primals, tangents
    w, U = jnp.linalg.eigh(0.5 * (P + jnp.swapaxes(P, -1, -2)))
    S = (U * jnp.sqrt(jnp.clip(w, 0.0))[..., None, :]) @ jnp.swapaxes(U, -1, -2)
    # the derivative's denominators: an eigenvalue at rounding level is a zero, not a tiny root
    # (relative to the largest: 1e-12 in float64; n eps of the dtype where that is larger, as
    # numpy.linalg.matrix_rank's tolerance, 2.4e-7 for a 2 x 2 float32 P)
    rtol = max(PSD_ROOT_RTOL, w.shape[-1] * float(jnp.finfo(w.dtype).eps))
    floor = rtol * jnp.max(jnp.abs(w), axis=-1, keepdims=True)
    s = jnp.sqrt(jnp.where(w > floor, w, 0.0))
    Ut = jnp.swapaxes(U, -1, -2)
    dPs = 0.5 * (dP + jnp.swapaxes(dP, -1, -2))
    inner = Ut @ dPs @ U
    denom = s[..., :, None] + s[..., None, :]
    safe = denom > 0
    inner = jnp.where(safe, inner / jnp.where(safe, denom, 1.0), 0.0)
    return S, U @ inner @ Ut


_COV_NOT_PSD_TRACED = (
    "cov must be symmetric and positive semidefinite (up to 1e-6 of its largest entry, traced), but a traced "
    "cov (in a jit, vmap, sweep or ODE field) is not; its values are not shown"
)


def _checked_cov(cov: Any) -> Any:
    """``cov`` (a matrix, or a stack of them on leading axes), refused unless symmetric and
    positive semidefinite up to ``1e-8`` of its largest entry, as `attnflow._validate.covariance`
    refuses a concrete one. Traced, through `attnflow._errors.fail_if`: an error when the program
    runs, a failed point inside `attnflow.sweep`, beyond ``1e-6`` of the largest entry: inside an
    ODE field a covariance on the boundary of the cone (a student aligned with its teacher) is
    off it by the solver's error, and clipping that changes the expectation by as little.
    Smaller negative eigenvalues pass (and `psd_sqrt` clips them); beyond that, `psd_sqrt` would
    silently root another matrix."""
    if not V.any_traced(cov):
        if jnp.ndim(cov) == 2:
            V.covariance("cov", cov)
        else:  # a stack: each matrix as one
            for c in np.asarray(cov).reshape((-1,) + np.shape(cov)[-2:]):
                V.covariance("cov", c)
        return cov
    from ._errors import fail_if

    c = jnp.asarray(cov)
    # float32's eigvalsh misses by about d eps |c|: the tolerance grows with it where that is larger
    d = c.shape[-1]
    scale = max(1e-6, 10.0 * d * float(jnp.finfo(c.dtype).eps)) * jnp.maximum(jnp.max(jnp.abs(c)), 1e-300)
    asym = jnp.max(jnp.abs(c - jnp.swapaxes(c, -1, -2)))
    low = jnp.min(jnp.linalg.eigvalsh(0.5 * (c + jnp.swapaxes(c, -1, -2))))
    # a non-finite cov is not this check's to name: the NaN reaches the result, where integrate or
    # the caller names a diverged state
    finite = jnp.all(jnp.isfinite(c))
    return fail_if(c, finite & ((asym > scale) | (low < -scale)), _COV_NOT_PSD_TRACED)


class GaussianBank(eqx.Module):
    """A fixed bank of standard normal draws ``z`` of shape ``(n, dim)``.

    ``antithetic=True`` stores ``n/2`` draws and their negatives, so odd moments of
    ``z`` are exactly zero and ``E f`` is exactly even/odd-equivariant.
    """

    z: jax.Array
    antithetic: bool = eqx.field(static=True)

    def __init__(self, key: Any, n: int, dim: int, antithetic: bool = True, dtype: Any = None):
        n = V.positive_int("n (bank size)", n, minimum=2 if antithetic else 1)
        dim = V.positive_int("dim", dim)
        if antithetic and n % 2:
            raise ValueError(f"an antithetic bank needs an even size n, got n={n}")
        V.fits_in_memory(f"a Gaussian bank of n={n} draws in dim={dim}", 8.0 * 4 * n * dim)
        if isinstance(key, int):
            key = jax.random.PRNGKey(key)
        dtype = dtype or jnp.result_type(float)
        half = n // 2 if antithetic else n
        z = jax.random.normal(key, (half, dim), dtype=dtype)
        self.z = jnp.concatenate([z, -z]) if antithetic else z
        self.antithetic = antithetic

    @property
    def size(self) -> int:
        return self.z.shape[0]

    @property
    def dim(self) -> int:
        return self.z.shape[1]

    def samples(self, mean: Any = None, cov: Any = None, sqrt_cov: Any = None) -> jax.Array:
        """``x = mean + S z`` for every bank draw, ``S`` the symmetric root of ``cov``."""
        x = self.z
        if cov is not None:
            shape = jnp.shape(cov)
            if shape == () and self.dim == 1:  # a variance, as gauss_hermite takes for one variable
                cov = jnp.reshape(jnp.asarray(cov), (1, 1))
            elif shape[-2:] != (self.dim, self.dim):
                one = " (or, in dim 1, a variance)" if self.dim == 1 else ""
                raise ValueError(f"cov must have shape ({self.dim}, {self.dim}){one} for this bank, got shape {shape}")
            cov = _checked_cov(cov)
        if mean is not None and jnp.shape(mean)[-1:] != (self.dim,):
            raise ValueError(f"mean must have {self.dim} entries for this bank, got shape {jnp.shape(mean)}")
        if sqrt_cov is None and cov is not None:
            sqrt_cov = psd_sqrt(jnp.asarray(cov))
        if sqrt_cov is not None:
            x = x @ jnp.swapaxes(jnp.asarray(sqrt_cov), -1, -2)
        if mean is not None:
            x = x + jnp.asarray(mean)
        return x

    def expect(self, f: Callable[[jax.Array], Any], mean: Any = None, cov: Any = None, sqrt_cov: Any = None) -> Any:
        """Monte Carlo ``E f(x)``, ``x ~ N(mean, cov)``, on the fixed bank (``f`` maps one sample)."""
        vals = jax.vmap(f)(self.samples(mean, cov, sqrt_cov))
        return jax.tree_util.tree_map(lambda v: jnp.mean(v, axis=0), vals)

    def stderr(self, f: Callable[[jax.Array], Any], mean: Any = None, cov: Any = None) -> Any:
        """Standard error of `expect` (antithetic pairs counted as one draw)."""
        vals = jax.vmap(f)(self.samples(mean, cov))

        def se(v):
            if self.antithetic:
                h = v.shape[0] // 2
                v = 0.5 * (v[:h] + v[h:])
            return jnp.std(v, axis=0, ddof=1) / jnp.sqrt(v.shape[0])

        return jax.tree_util.tree_map(se, vals)


def hermite_rule(n_points: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor-product Gauss-Hermite nodes ``(n_points**dim, dim)`` and weights for N(0, I)."""
    n_points = V.positive_int("n_points", n_points, maximum=1000)
    dim = V.positive_int("dim", dim)
    if n_points**dim > 10_000_000:
        raise ValueError(f"Gauss-Hermite grid of {n_points}**{dim} points is too large; use GaussianBank")
    x, w = np.polynomial.hermite_e.hermegauss(n_points)  # probabilists': weight exp(-x^2/2)
    w = w / np.sqrt(2 * np.pi)
    grids = np.meshgrid(*([x] * dim), indexing="ij")
    wgrids = np.meshgrid(*([w] * dim), indexing="ij")
    nodes = np.stack([g.reshape(-1) for g in grids], axis=1)
    weights = np.prod(np.stack([g.reshape(-1) for g in wgrids], axis=1), axis=1)
    return nodes, weights


def gauss_hermite(f: Callable[[jax.Array], Any], n_points: int, mean: Any, cov: Any) -> Any:
    """``E f(x)`` for ``x ~ N(mean, cov)`` by tensor-product Gauss-Hermite quadrature.

    Exact for polynomials of degree ``< 2 n_points`` in each coordinate; for low ``dim``.
    A scalar ``mean`` (and scalar variance ``cov``) is one Gaussian variable: ``f`` then takes a
    scalar, as ``gauss_hermite(lambda x: x**2, 10, 0.0, 1.0)`` = 1.
    """
    scalar = jnp.ndim(mean) == 0
    given = jnp.shape(cov)
    if scalar and len(given) not in (0, 2):
        raise ValueError(f"cov of a scalar mean must be a variance (a number), got shape {given}")
    mean = jnp.atleast_1d(jnp.asarray(mean, dtype=jnp.result_type(float)))
    d = mean.shape[0]
    if not (given == (d, d) or (given == () and d == 1)):
        one = " (or, for one variable, a variance)" if d == 1 else ""
        shown = jnp.shape(mean)
        raise ValueError(f"cov must have shape ({d}, {d}){one} for a mean of shape {shown}, got shape {given}")
    cov = _checked_cov(jnp.reshape(jnp.asarray(cov, dtype=mean.dtype), (d, d)))
    nodes, weights = hermite_rule(n_points, mean.shape[0])
    x = mean + jnp.asarray(nodes, mean.dtype) @ psd_sqrt(cov).T
    vals = jax.vmap((lambda xi: f(xi[0])) if scalar else f)(x)
    w = jnp.asarray(weights, mean.dtype)
    return jax.tree_util.tree_map(lambda v: jnp.tensordot(w, v, axes=1), vals)
