"""`Setup` of a derived model: student, teacher, loss, initial overlaps, learning rates, data
model, quadrature.

The model (committee-machine family, docs page "Your own model", eq. (1)): inputs
``x ~ N(0, I_D)``; the student sees its ``K`` local fields ``lambda = W x / sqrt(D)`` and owns
readout parameters ``v`` (any array, or none); the fixed teacher sees ``M`` fields
``nu = W* x / sqrt(D)`` with ``W* W*^T / D = T``; the label is ``y = teacher(nu) + sigma xi``
with ``xi ~ N(0, 1)`` (label noise optional); the per-sample loss is ``loss(student(lambda, v), y)``
(summed when it is an array). With ``data=SingleLocation(...)`` the inputs are the ``L`` tokens
of the single-location model of `attnflow.heads` and the fields carry a location axis
(`attnflow.derive.SingleLocation`).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..expect import hermite_rule
from ..options import _caller_outside_attnflow
from ..setup import AbstractSetup
from .data import DataModel, GaussianInputs, SingleLocation

__all__ = [
    "KINK_TOLERANCE",
    "Setup",
    "Quadrature",
    "scaled_rule",
    "GaussHermite",
    "MonteCarlo",
    "QuasiMonteCarlo",
    "squared_loss",
    "soft_committee",
    "erf_activation",
    "HERMITE_BUDGET",
    "NOISE_POINTS",
]

HERMITE_BUDGET = 2**16
"""The largest tensor-product Gauss-Hermite grid the default quadrature uses (``n**d`` nodes)."""

NOISE_POINTS = 8
"""Gauss-Hermite nodes of the label-noise coordinate in `default_quadrature` for a loss other
than `squared_loss` (exact for integrands of degree ``< 16`` in the noise); `squared_loss` makes
every integrand a polynomial of degree ``<= 2`` in it, exact with 2 nodes."""


def squared_loss(y_hat: jax.Array, y: jax.Array) -> jax.Array:
    """``1/2 (y_hat - y)^2``: the loss of Saad & Solla (1995) and Goldt et al. (2019)."""
    return 0.5 * (y_hat - y) ** 2


def erf_activation(x: jax.Array) -> jax.Array:
    """``g(x) = erf(x / sqrt 2)``, the activation of Saad & Solla (1995)."""
    return jax.scipy.special.erf(x / jnp.sqrt(2.0))


def soft_committee(lam: jax.Array, v: Any = None) -> jax.Array:
    """The (soft) committee machine ``sum_k v_k g(lambda_k)`` with ``g = erf(./sqrt 2)``; ``v = None``
    reads out with unit weights (Saad & Solla 1995). Usable as a student or, with ``v = None``,
    as a teacher."""
    g = erf_activation(lam)
    return jnp.sum(g) if v is None else jnp.dot(v, g)


class Quadrature(eqx.Module):
    """How the Gaussian expectations over ``(lambda, nu[, xi])`` are computed: `GaussHermite`,
    `SparseGaussHermite`, `QuasiMonteCarlo` or `MonteCarlo`. ``rule(dim, noise)`` gives nodes of
    ``N(0, I_dim)`` and their weights; ``noise=True`` says the last coordinate is the label noise
    ``xi`` (`GaussHermite` gives it its own number of nodes); ``check(dim, noise)`` refuses, before
    building it, a rule that cannot be built (`Setup` calls it on construction)."""

    def rule(self, dim: int, noise: bool = False) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def check(self, dim: int, noise: bool = False) -> None:
        """Raise ``ValueError`` if this rule cannot be built in ``dim`` dimensions (too many
        nodes, a level below the dimension), without building it: `Setup` calls it on
        construction, so that a rule too large is refused there and not at the first evaluation
        of the field. The default accepts every ``dim``."""


def scaled_rule(z: np.ndarray, w: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A rule for ``N(0, I_d)`` with its nodes compressed by ``scale = s``: nodes ``s z``, weights
    ``w s^d exp(-(s^2 - 1) |z|^2 / 2)``, so that ``E f = E_z[f(s z) s^d phi(s z) / phi(z)]``
    (``phi`` the standard normal density).

    For an integrand that grows like ``exp(c y^2)`` off the real axis, as ``erf(a x / sqrt 2)``
    does with ``c = a^2 / 2``, Gauss-Hermite converges at a rate set by ``c`` against the weight's
    ``1/2``; compressing the nodes trades some of that growth for growth along the real axis,
    and the two balance at ``s^2 = 2 / (a^2 + 2)`` (``s = 0.8`` for fields of variance near 1).
    ``scale = 1`` is the plain rule."""
    if scale == 1.0:
        return z, w
    d = z.shape[1]
    return scale * z, w * scale**d * np.exp(-(scale**2 - 1.0) * np.sum(z * z, axis=1) / 2)


def _scale(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"scale must be a number in (0, 1] (nodes compressed towards 0), got {value!r}")


class GaussHermite(Quadrature):
    """Tensor-product Gauss-Hermite quadrature with ``points`` nodes per dimension
    (`attnflow.expect.hermite_rule`): ``points**d`` nodes, exact for polynomials of degree
    ``< 2 points`` in each coordinate. For small ``d = K + M`` (+1 with label noise).
    ``scale < 1`` compresses the nodes (`scaled_rule`): faster convergence for ``erf``-like units.
    ``noise_points``: nodes of the label-noise coordinate ``xi`` (default ``points``), a plain
    rule (never compressed): ``points**(d - 1) * noise_points`` nodes with label noise."""

    points: int = eqx.field(static=True, default=20)
    scale: float = eqx.field(static=True, default=1.0)
    noise_points: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        V.positive_int("points", self.points, minimum=2)
        _scale(self.scale)
        if self.noise_points is not None:
            V.positive_int("noise_points", self.noise_points, minimum=1)

    def _size(self, dim: int, noise: bool) -> tuple[int, int, int, str]:
        """``(fields, xi_points, count, shape)`` of the rule in ``dim`` dimensions, or
        ``ValueError`` when it has more than ``10^7`` nodes."""
        dim = V.positive_int("dim", dim)
        if noise and dim < 2:
            raise ValueError(f"a rule with label noise needs dim >= 2 (fields and the noise), got {dim}")
        fields = dim - 1 if noise else dim
        xi_points = (self.points if self.noise_points is None else self.noise_points) if noise else 1
        count = self.points**fields * xi_points
        shape = f"{self.points}**{fields}" + (f" * {xi_points} (label noise)" if noise else "")
        if count > 10_000_000:
            raise ValueError(
                f"{self!r} in d = {dim} dimensions makes {shape} nodes; use fewer points or QuasiMonteCarlo"
            )
        return fields, xi_points, count, shape

    def check(self, dim, noise=False):
        self._size(dim, noise)

    def rule(self, dim, noise=False):
        fields, xi_points, count, shape = self._size(dim, noise)
        if count > 2 * HERMITE_BUDGET:
            # every evaluation of the field sums over all nodes: a solve makes hundreds of them
            warnings.warn(
                f"{self!r} in d = {dim} dimensions makes {count:,} nodes ({shape}), "
                f"{count / HERMITE_BUDGET:.1f} times the default budget HERMITE_BUDGET = "
                f"{HERMITE_BUDGET:,}: every evaluation of the field sums over them all. Fewer points with "
                "scale=0.8 (erf-like units), SparseGaussHermite or QuasiMonteCarlo cost less",
                stacklevel=_caller_outside_attnflow(),
            )
        z, w = scaled_rule(*hermite_rule(self.points, fields), self.scale)
        if not noise:
            return z, w
        x, wx = hermite_rule(xi_points, 1)
        return (
            np.concatenate([np.repeat(z, xi_points, axis=0), np.tile(x, (z.shape[0], 1))], axis=1),
            np.outer(w, wx).reshape(-1),
        )


class SparseGaussHermite(Quadrature):
    """Smolyak sparse-grid Gauss-Hermite quadrature of ``level`` ``L >= d`` (the combination
    technique): ``sum_{L-d+1 <= |i| <= L} (-1)^{L-|i|} C(d-1, L-|i|) Q_{i_1} x ... x Q_{i_d}``
    with ``Q_l`` the ``2l - 1``-point Gauss-Hermite rule, coincident nodes merged (weights
    may be negative). For smooth integrands in ``d = 5-7`` it reaches accuracies a tensor grid
    cannot afford: the Saad & Solla field at ``K = M = 3`` to 1.4e-7 with 1.7e6 nodes
    (``level = 16``) and 1.0e-8 with 8.9e6 (``level = 18``), where the tensor grid's 1e6 nodes
    give 3e-4. With the nodes compressed, ``scale = 0.8`` (`scaled_rule`), the same field is
    within 4e-8 along a whole trajectory at ``level = 16`` and 2.3e-9 at ``level = 18``.
    Large rules are evaluated in chunks of `attnflow.derive.NODE_CHUNK` nodes."""

    level: int = eqx.field(static=True, default=14)
    scale: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        V.positive_int("level", self.level, minimum=1)
        _scale(self.scale)

    def check(self, dim, noise=False):
        if self.level < dim:
            raise ValueError(f"SparseGaussHermite(level={self.level}) needs level >= d = {dim}")

    def rule(self, dim, noise=False):
        self.check(dim, noise)
        return scaled_rule(*smolyak_hermite_rule(self.level, dim), self.scale)


@functools.cache
def smolyak_hermite_rule(level: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``(n, dim)`` and weights of `SparseGaussHermite` for ``N(0, I_dim)`` (built once per
    ``(level, dim)``)."""
    L, d = V.positive_int("level", level), V.positive_int("dim", dim)
    # Each 1-D node gets an integer code, 0 for x = 0 (the one node the odd Gauss-Hermite rules
    # share) and a fresh code for every other (level, index): a grid node is then one integer in
    # base `base`, and merging coincident nodes is a 1-D unique over integers, exact (no rounding).
    rules, base = {}, 1
    for lv in range(1, L - d + 2):
        x, w = np.polynomial.hermite_e.hermegauss(2 * lv - 1)
        code = np.insert(np.arange(base, base + x.size - 1, dtype=np.int64), lv - 1, 0)  # x[lv - 1] = 0
        rules[lv] = (x, w / np.sqrt(2 * np.pi), code)
        base += x.size - 1
    if base**d >= 2**62:
        raise ValueError(f"SparseGaussHermite(level={L}) in d = {d} is too large to index; lower the level")
    keys, weights = [], []
    n_total = 0
    for idx in itertools.product(range(1, L - d + 2), repeat=d):
        total = sum(idx)
        if not L - d + 1 <= total <= L:
            continue
        key = np.zeros(1, dtype=np.int64)
        wt = np.full(1, float((-1) ** (L - total) * math.comb(d - 1, L - total)))
        for i in idx:
            key = (key[:, None] * base + rules[i][2][None, :]).reshape(-1)
            wt = (wt[:, None] * rules[i][1][None, :]).reshape(-1)
        n_total += key.size
        if n_total > 40_000_000:
            raise ValueError(f"SparseGaussHermite(level={L}) in d = {d} makes over 4e7 nodes; lower the level")
        keys.append(key)
        weights.append(wt)
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    merged = np.bincount(inverse, weights=np.concatenate(weights), minlength=unique.size)
    keep = merged != 0.0
    unique, merged = unique[keep], merged[keep]
    value = np.zeros(base)
    for x, _, code in rules.values():
        value[code] = x
    nodes = np.empty((unique.size, d))
    for j in range(d - 1, -1, -1):  # decode the base-`base` digits, last coordinate first
        nodes[:, j] = value[unique % base]
        unique = unique // base
    return nodes, merged


class MonteCarlo(Quadrature):
    """A fixed antithetic bank of ``samples`` standard normal draws (``seed``): the field is a
    smooth deterministic function of the overlaps (common random numbers), with error
    ``O(samples^{-1/2})`` (for odd units every integrand is even in ``z``, and the antithetic half
    repeats the first: the error of ``samples / 2`` draws). `QuasiMonteCarlo`, the default for
    ``K + M`` too large for `GaussHermite`, is far more accurate at equal cost."""

    samples: int = eqx.field(static=True, default=2**16)
    seed: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        V.positive_int("samples", self.samples, minimum=2)
        if self.samples % 2:
            raise ValueError(f"samples must be even (antithetic pairs), got {self.samples}")
        V.positive_int("seed", self.seed, minimum=0)

    def rule(self, dim, noise=False):
        z = np.random.default_rng(self.seed).standard_normal((self.samples // 2, dim))
        z = np.concatenate([z, -z])
        return z, np.full(self.samples, 1.0 / self.samples)


class QuasiMonteCarlo(Quadrature):
    """A fixed bank of ``samples`` scrambled Sobol points (Owen scrambling, `scipy.stats.qmc.Sobol`,
    ``seed``) mapped to ``N(0, I_d)`` by the normal quantile, with equal weights: randomised
    quasi-Monte Carlo. Its error falls nearly like ``1 / samples`` for smooth integrands and is
    never worse than `MonteCarlo`'s ``samples^{-1/2}`` for rough ones (a kink, a discontinuous
    teacher), with no negative weights. ``samples`` is a power of 2 (the balance of a Sobol
    sequence). The field is a smooth deterministic function of the overlaps, as with
    `MonteCarlo`."""

    samples: int = eqx.field(static=True, default=2**16)
    seed: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        V.positive_int("samples", self.samples, minimum=2)
        if self.samples & (self.samples - 1):
            raise ValueError(f"samples must be a power of 2 (a balanced Sobol sequence), got {self.samples}")
        V.positive_int("seed", self.seed, minimum=0)

    def rule(self, dim, noise=False):
        from scipy.special import ndtri
        from scipy.stats import qmc

        dim = V.positive_int("dim", dim)
        u = qmc.Sobol(dim, scramble=True, seed=self.seed).random_base2(int(self.samples).bit_length() - 1)
        tiny = np.finfo(float).tiny  # a scrambled point is never 0 or 1 but for a measure-zero event
        return ndtri(np.clip(u, tiny, 1.0 - np.finfo(float).epsneg)), np.full(self.samples, 1.0 / self.samples)


def realisability_gap(R: Any, Q: Any, T: Any) -> float:
    """The smallest eigenvalue of ``Q - R T^-1 R^T``: negative where no weights have the overlaps
    ``(R, Q)`` against a teacher of overlaps ``T`` (the covariance ``[[Q, R], [R^T, T]]`` is
    then not positive semidefinite)."""
    R, Q, T = (np.asarray(a, dtype=float) for a in (R, Q, T))
    P = Q - R @ np.linalg.solve(T, R.T)
    return float(np.linalg.eigvalsh(0.5 * (P + P.T)).min())


def check_realisable(R: Any, Q: Any, T: Any, names: tuple[str, str] = ("R", "Q"), where: str = "") -> None:
    """``ValueError`` unless ``Q`` is symmetric and ``Q - R T^-1 R^T`` positive semidefinite (to
    rounding): overlaps some weights have, so that the covariance of ``(lambda, nu)`` exists.
    ``names`` name ``R`` and ``Q`` in the message, ``where`` prefixes it."""
    r, q = names
    prefix = f"{where}: " if where else ""
    Q = np.asarray(Q)
    if not np.allclose(Q, Q.T):
        raise ValueError(f"{prefix}{q} must be symmetric, got {V.show(Q)}")
    if realisability_gap(R, Q, T) < -1e-10 * (1 + np.abs(Q).max()):
        raise ValueError(
            f"{prefix}{q} - {r} T^-1 {r}^T must be positive semidefinite (no weights have these overlaps), "
            f"got {r} = {V.show(np.asarray(R))}, {q} = {V.show(Q)}"
        )


def default_quadrature(dim: int, noise_points: int | None = None) -> Quadrature:
    """`GaussHermite` with as many points as `HERMITE_BUDGET` allows when that is at least 12 per
    dimension (``d <= 4``: 16 points, about 1e-6 for ``erf`` units), else `QuasiMonteCarlo`
    with ``2^16`` points (for the ``K = 3, M = 2`` erf committee, ``d = 5``: within ``7e-5`` of the
    closed form, where `MonteCarlo` of as many draws is within ``6e-3``; the error grows with
    ``d``: ``6.3e-4`` at ``K = 6, M = 4`` and ``7.3e-3`` at ``K = M = 10``, for fields of size 1
    to 2, where ``QuasiMonteCarlo(2**20)`` is within ``4.6e-5`` and ``8.4e-4``).

    ``noise_points``: with label noise, the nodes of its coordinate (``dim`` counts it); the
    budget left, ``HERMITE_BUDGET / noise_points``, goes to the ``dim - 1`` fields (the setup
    passes 2 for `squared_loss`, exact, else `NOISE_POINTS`)."""
    dim = V.positive_int("dim", dim)
    if noise_points is None:
        n = int(np.floor(HERMITE_BUDGET ** (1.0 / dim) + 1e-9))
        return GaussHermite(min(n, 40)) if n >= 12 else QuasiMonteCarlo()
    noise_points = V.positive_int("noise_points", noise_points)
    if dim < 2:
        raise ValueError(f"a rule with label noise needs dim >= 2 (fields and the noise), got {dim}")
    n = int(np.floor((HERMITE_BUDGET / noise_points) ** (1.0 / (dim - 1)) + 1e-9))
    return GaussHermite(min(n, 40), noise_points=noise_points) if n >= 12 else QuasiMonteCarlo()


_GRADIENT_PROBES = 8
"""How many random inputs `_frozen_model` tries at each of its `_PROBE_SCALES`."""

_PROBE_SCALES = (0.1, 1.0, 10.0, 100.0)
"""Standard deviations of `_frozen_model`'s inputs: a unit that is active only far from the
origin (``relu(lam - 2.5)``, a dead zone) has a nonzero gradient at the larger scales, which
SGD from a large initialisation meets; a step function has none at any."""


@functools.lru_cache(maxsize=256)
def _frozen_model(student: Callable, teacher: Callable, loss: Callable, K: int, M: int, v_shape: tuple | None) -> bool:
    """Whether the per-sample loss has an exactly zero gradient, with respect to the student's
    fields and its readout, at `_GRADIENT_PROBES` Gaussian inputs of each standard deviation of
    `_PROBE_SCALES` (fixed draws): a model SGD cannot train (Gaussian inputs). Cached per model:
    a `Setup.replace` in a loop or a sweep checks it once."""
    rng = np.random.default_rng(0)
    scale = np.repeat(np.asarray(_PROBE_SCALES), _GRADIENT_PROBES)[:, None]
    lam = scale * rng.standard_normal((scale.size, K))
    nu = scale * rng.standard_normal((scale.size, M))
    v = None if v_shape is None else rng.standard_normal(v_shape)

    def sample_loss(lam: Any, v: Any, nu: Any) -> Any:
        return jnp.sum(loss(student(lam, v), teacher(nu)))

    # values are read here, also while a sweep traces the Setup (the inputs are constants)
    with jax.ensure_compile_time_eval():
        grad = jax.vmap(jax.grad(sample_loss, argnums=(0, 1)), in_axes=(0, None, 0))
        g_lam, g_v = grad(jnp.asarray(lam), None if v is None else jnp.asarray(v), jnp.asarray(nu))
        leaves = [g_lam] + ([] if g_v is None else jax.tree.leaves(g_v))
        return bool(all(np.all(np.asarray(g) == 0) for g in leaves))


_FINITE_SCALES = (0.1, 1.0)
"""Standard deviations of `_first_nonfinite`'s inputs: those of `_PROBE_SCALES` at the size of
the fields the derivation meets (unit variance, or less from a small initialisation). The
larger ones are left out: there a model finite at every field the quadrature visits may
overflow (``log cosh`` of a large residual in float32, ``exp(lam^2 / 4)``)."""


def _show_input(x: Any) -> str:
    """An input or output of the model in `_first_nonfinite`'s message, to 4 decimals."""
    return repr(np.round(np.asarray(x, dtype=float), 4).tolist())


@functools.lru_cache(maxsize=256)
def _first_nonfinite(
    student: Callable, teacher: Callable, loss: Callable, K: int, M: int, L: int | None, v: tuple | None
) -> str | None:
    """The message of `Setup`'s ``ValueError`` for a model whose student output, teacher output,
    per-sample loss or loss gradient (with respect to the student's fields and readout) is NaN
    or infinite at one of `_GRADIENT_PROBES` random Gaussian inputs of each standard deviation of
    `_FINITE_SCALES` (fixed draws; with ``L``, the token model's fields ``(K, L)``, ``(M, L)``
    and a one-hot signal location), or ``None`` when all are finite. ``v``: ``(shape, entries)``
    of the initial readout, or ``None``. A value that is not finite on a set of measure zero
    (``log |lambda|`` at ``lambda = 0``) is met by no random input: only a model that is not
    finite on a set of inputs of positive probability is refused, one whose derived field would
    be NaN."""
    rng = np.random.default_rng(3)
    loc = () if L is None else (L,)
    n = _GRADIENT_PROBES * len(_FINITE_SCALES)
    scale = np.repeat(np.asarray(_FINITE_SCALES), _GRADIENT_PROBES).reshape((n,) + (1,) * (1 + len(loc)))
    lam = scale * rng.standard_normal((n, K, *loc))
    nu = scale * rng.standard_normal((n, M, *loc))
    e = np.zeros((n, 0)) if L is None else np.eye(L)[rng.integers(0, L, n)]
    v_value = None if v is None else np.asarray(v[1], dtype=float).reshape(v[0])

    def label(nu_i: Any, e_i: Any) -> Any:
        return teacher(nu_i) if L is None else teacher(nu_i, e_i)

    def sample_loss(lam_i: Any, v_: Any, nu_i: Any, e_i: Any) -> Any:
        return jnp.sum(loss(student(lam_i, v_), label(nu_i, e_i)))

    def finite(x: Any) -> np.ndarray:
        """Per input: whether every entry of ``x`` (an array or a tree of them) is finite."""
        leaves = [np.asarray(a).reshape(n, -1) for a in jax.tree.leaves(x)]
        return np.all(np.concatenate([np.isfinite(a) for a in leaves], axis=1), axis=1) if leaves else np.ones(n, bool)

    with jax.ensure_compile_time_eval():  # values, also while a sweep traces the Setup
        vj = None if v_value is None else jnp.asarray(v_value)
        lam_j, nu_j, e_j = jnp.asarray(lam), jnp.asarray(nu), jnp.asarray(e)
        y_hat = jax.vmap(student, in_axes=(0, None))(lam_j, vj)
        y = jax.vmap(label)(nu_j, e_j)
        values = jax.vmap(lambda a, b: jnp.sum(loss(a, b)))(y_hat, y)
        grad = jax.grad(sample_loss, argnums=(0, 1)) if v is not None else lambda *a: (jax.grad(sample_loss)(*a), None)
        g = jax.vmap(grad, in_axes=(0, None, 0, 0))(lam_j, vj, nu_j, e_j)

    def at_lam(i: int) -> str:
        return f"lam = {_show_input(lam[i])}" + ("" if v is None else " (v = v0)")

    def at_nu(i: int) -> str:
        return f"nu = {_show_input(nu[i])}" + ("" if L is None else f", e = {_show_input(e[i])}")

    def at_outputs(i: int) -> str:
        return f"student output {_show_input(np.asarray(y_hat)[i])}, teacher output {_show_input(np.asarray(y)[i])}"

    what = (
        ("student(lam, v)", y_hat, at_lam),
        ("teacher(nu)" if L is None else "teacher(nu, e)", y, at_nu),
        ("loss(student output, teacher output)", values, at_outputs),
        (
            "the gradient of the loss with respect to the student's fields" + ("" if v is None else " and readout"),
            g,
            lambda i: f"{at_lam(i)}, {at_nu(i)}",
        ),
    )
    for name, value, at in what:
        ok = finite(value)
        if not np.all(ok):
            i = int(np.argmin(ok))  # the first input where it is not finite
            entries = np.concatenate([np.asarray(a).reshape(n, -1)[i] for a in jax.tree.leaves(value)])
            bad = entries[~np.isfinite(entries)][0]
            return (
                f"{name} is {bad} at {at(i)}, one of {n} random Gaussian inputs (standard deviations "
                f"{', '.join(f'{x:g}' for x in _FINITE_SCALES)}): the derived field would be NaN. A model must be "
                "finite for almost every input (log or sqrt of a field is NaN for half of them; a jnp.where "
                "with a NaN branch has a NaN gradient: apply it to a safe argument)"
            )
    return None


@functools.lru_cache(maxsize=256)
def _positional_gap(
    student: Callable, teacher: Callable, loss: Callable, K: int, M: int, L: int, v_shape: tuple | None
) -> float:
    """The largest relative change of the per-sample loss of the token model when its ``L``
    locations are permuted (fields, teacher projections and signal location alike), over
    `_GRADIENT_PROBES` random inputs and permutations (fixed draws; a random readout of shape
    ``v_shape``): 0 up to rounding for a student and loss equivariant under the locations,
    which `SingleLocation`'s ``exchangeable=True`` assumes."""
    rng = np.random.default_rng(1)
    n = _GRADIENT_PROBES
    lam = rng.standard_normal((n, K, L))
    nu = rng.standard_normal((n, M, L))
    e = np.eye(L)[rng.integers(0, L, n)]
    perm = np.stack([rng.permutation(L) for _ in range(n)])
    v = None if v_shape is None else rng.standard_normal(v_shape)

    def sample_loss(lam: Any, nu: Any, e: Any, v: Any) -> Any:
        return jnp.sum(loss(student(lam, v), teacher(nu, e)))

    with jax.ensure_compile_time_eval():  # values, also while a sweep traces the Setup
        one = jax.vmap(sample_loss, in_axes=(0, 0, 0, None))
        vj = None if v is None else jnp.asarray(v)
        a = np.asarray(one(jnp.asarray(lam), jnp.asarray(nu), jnp.asarray(e), vj))
        take = np.arange(n)[:, None]
        b = np.asarray(
            one(jnp.asarray(lam[take, :, perm].transpose(0, 2, 1)), jnp.asarray(nu[take, :, perm].transpose(0, 2, 1)),
                jnp.asarray(e[take, perm]), vj)
        )  # fmt: skip
    scale = np.maximum(np.abs(a), 1e-12)
    return float(np.max(np.abs(a - b) / scale))


_KINK_LINES = 8
"""How many random lines through input space `_kink_excess` follows."""

_KINK_POINTS = 257
"""Points on each line of `_kink_excess` (``t`` in ``[-4, 4]``)."""

KINK_TOLERANCE = 0.05
"""`Setup` warns, for a Gauss-Hermite rule, when the per-sample loss's derivative along a random
line in input space jumps by more than this fraction beyond what its second derivative
accounts for (`_kink_excess`): a kink (a ReLU unit, ``abs``) or a change too sharp for the rule."""


@functools.lru_cache(maxsize=256)
def _kink_excess(student: Callable, teacher: Callable, loss: Callable, K: int, M: int, v_shape: tuple | None) -> float:
    """How much of the variation of the per-sample loss's derivative along random lines in input
    space its second derivative misses: on each of `_KINK_LINES` lines ``(lam, nu) = p + t d``
    (fixed Gaussian draws, a random readout of shape ``v_shape``), ``f(t)`` the loss there, the
    total variation ``J = sum |f'(t_i+1) - f'(t_i)|`` against ``S = int |f''| dt`` (trapezoids),
    both by autodiff on `_KINK_POINTS` points of ``t`` in ``[-4, 4]``. A smooth ``f`` has
    ``J <= S`` up to the grid's error; at a kink ``f'`` jumps while autodiff's ``f''`` is finite
    on both sides, so ``J - S`` is the jumps. Returns the largest ``(J - S) / J`` over the lines
    (0 for a loss that does not vary)."""
    rng = np.random.default_rng(2)
    n = _KINK_LINES
    start = rng.standard_normal((n, K + M))
    step = rng.standard_normal((n, K + M))
    step /= np.linalg.norm(step, axis=1, keepdims=True)
    v = None if v_shape is None else rng.standard_normal(v_shape)
    t = np.linspace(-4.0, 4.0, _KINK_POINTS)

    def f(p: Any, d: Any, tt: Any) -> Any:
        x = p + tt * d
        return jnp.sum(loss(student(x[:K], v), teacher(x[K:])))

    def derivatives(p: Any, d: Any, tt: Any) -> Any:
        df = lambda s: jax.jvp(lambda u: f(p, d, u), (s,), (jnp.ones_like(s),))[1]
        return jax.jvp(df, (tt,), (jnp.ones_like(tt),))

    with jax.ensure_compile_time_eval():  # values, also while a sweep traces the Setup
        on_line = jax.vmap(jax.vmap(derivatives, in_axes=(None, None, 0)), in_axes=(0, 0, None))
        d1, d2 = (np.asarray(a) for a in on_line(jnp.asarray(start), jnp.asarray(step), jnp.asarray(t)))
    jumps = np.sum(np.abs(np.diff(d1, axis=1)), axis=1)
    curvature = np.sum(0.5 * (np.abs(d2[:, 1:]) + np.abs(d2[:, :-1])) * np.diff(t), axis=1)
    excess = np.where(jumps > 1e-12, (jumps - curvature) / np.maximum(jumps, 1e-300), 0.0)
    return float(np.max(excess))


def _per_model(check: Any, *args: Any) -> Any:
    """``check(*args)``, a model check cached per model (`functools.lru_cache`), uncached for a
    callable that cannot be a cache key (unhashable)."""
    try:
        return check(*args)
    except TypeError:
        return check.__wrapped__(*args)


_FUNCTIONS = ("student", "teacher", "loss")
"""The fields of `Setup` that hold functions, which `Setup.record` writes as ``"module:qualname"``."""


def _function_name(f: Any) -> str:
    """``"module:qualname"`` of a function (``"__main__:soft_committee"``,
    ``"attnflow.derive.setup:soft_committee"``; a callable object by its type's)."""
    module = getattr(f, "__module__", None) or type(f).__module__
    qualname = getattr(f, "__qualname__", None) or type(f).__qualname__
    return f"{module}:{qualname}"


def _package_functions() -> dict[str, Callable]:
    """The functions `Setup.from_record` gives back by name: those `attnflow.derive` and
    `attnflow` export and define themselves, by name."""
    import types

    import attnflow
    from attnflow import derive

    out: dict[str, Callable] = {}
    for space in (attnflow, derive):  # derive's own name wins
        for name in dir(space):
            obj = getattr(space, name)
            if isinstance(obj, types.FunctionType) and obj.__module__.startswith("attnflow"):
                out[name] = obj
    return out


def _function_from_record(field: str, name: Any) -> Any:
    """The package function a `Setup.record` entry names (``"module:qualname"``, or a bare name
    as records before the module was written held), or ``ValueError`` when it names none: a
    function of the user's own, which a record cannot give back."""
    if not isinstance(name, str):
        return name  # a function passed in ({**rec, "student": f}), or not a function (refused by Setup)
    own = _package_functions()
    module, colon, qualname = name.rpartition(":")
    f = own.get(qualname)
    if f is not None and (not colon or (f.__module__, f.__qualname__) == (module, qualname)):
        return f
    raise ValueError(
        f"setup.{field}: the record names the function {name!r}, which is not one of attnflow.derive's "
        f"({', '.join(_MODEL_FUNCTIONS)}, ...): a record keeps a function by its name only and gives back only "
        "the package's own, so it cannot give back yours (a lambda, a function of your script or module, even "
        f'one named like a package function). Pass it in: derive.Setup.from_record({{**rec, "{field}": f}}), '
        "f your function"
    )


_MODEL_FUNCTIONS = ("soft_committee", "squared_loss", "erf_activation", "signal_token")
"""The package's functions a model is built of, named in `_function_from_record`'s message."""


def _callable(name: str, f: Any) -> Callable:
    if not callable(f):
        raise ValueError(f"{name} must be a callable, got {f!r:.80}")
    return f


class Setup(AbstractSetup):
    """A student-teacher model whose order-parameter ODE `attnflow.derive.solve` derives.

    Fields (numbers are arrays, so any of them can be a `attnflow.sweep` axis):

    - ``student`` (static): ``student(lam, v) -> output``, ``lam`` the ``K`` local fields and ``v``
      the readout parameters (``None`` when ``v0`` is ``None``); the output is a scalar or an
      array of the teacher's output shape;
    - ``teacher`` (static): ``teacher(nu) -> output``, ``nu`` the ``M`` teacher fields (fixed);
    - ``loss`` (static): ``loss(y_hat, y)``, a scalar, or an array of per-entry losses whose
      entries are summed (default `squared_loss`, entry by entry);
    - ``R0`` ``(K, M)``, ``Q0`` ``(K, K)``: the initial overlaps ``W W*^T / D`` and ``W W^T / D``
      (``Q0 - R0 T^{-1} R0^T`` must be positive semidefinite);
    - ``T`` ``(M, M)``: the teacher overlap ``W* W*^T / D`` (default the identity);
    - ``v0``: the initial readout (any shape), or ``None`` for a student without trained readout;
    - ``eta``: learning rate of ``W`` (SGD step ``W <- W - eta grad_W loss``): a number, or one
      per student unit, shape ``(K,)`` (row ``k`` of ``W`` steps at ``eta_k``; eqs. (2)-(3) then
      read ``eta_k E[delta_k nu_m]`` and ``eta_k E[delta_k lambda_l] + eta_l E[delta_l lambda_k]
      + eta_k eta_l E[delta_k delta_l]``; a readout then needs its own scalar ``eta_v``);
    - ``eta_v``: learning rate of the readout on the ``t = steps / D`` clock (SGD step
      ``v <- v - (eta_v / D) grad_v loss``; ``None``, the default: ``eta``, which it then follows
      through ``replace(eta=...)``; `rate_v` is the rate in use);
    - ``noise``: label-noise standard deviation ``sigma``, or ``None`` for none (a number, even 0,
      adds the noise variable ``xi`` to the quadrature); one ``xi`` per sample, added to every
      entry of a vector-valued label alike (``y = teacher(nu) + sigma xi``, in the ODE and in
      `train`);
    - ``data``: the data model, `GaussianInputs` (default) or `SingleLocation` (the token model
      of `attnflow.heads`: ``student(lam (K, L), v)``, ``teacher(nu (M, L), e (L,))``, ``M`` the
      prior's ``F``; no label noise);
    - ``minibatch`` (static): samples per SGD step (default 1); the step uses their mean
      gradient, which leaves the drift unchanged and divides the ``eta^2`` term of ``dQ/dt`` by
      ``minibatch`` (eq. (3)); the clock stays ``t = steps / D``;
    - ``quadrature`` (static): `GaussHermite`, `SparseGaussHermite`, `QuasiMonteCarlo` or `MonteCarlo` (default:
      `default_quadrature` of
      the dimension `dim`).

    On construction student, teacher and loss are called once on abstract arguments of these
    shapes (`jax.eval_shape`, nothing computed): a call that fails, a student output whose
    shape differs from the teacher's, or a loss that is neither a scalar nor of the outputs'
    shape raises ``ValueError`` naming the call. They are then evaluated at 16 random inputs
    (standard deviations 0.1 and 1; the readout at ``v0``): a student output, teacher output,
    loss or loss gradient that is NaN or infinite at one of them (``v @ log(lam)``) raises
    ``ValueError`` naming the function and the first such input, since the derived field
    would be NaN (a function infinite only on a set of measure zero, ``log |lam|``, is
    accepted). With `GaussianInputs`, a loss whose gradient with respect to the student's
    fields and readout is exactly zero at 32 random inputs of standard deviations 0.1 to 100
    (a ``sign`` student, a 0-1 loss) raises ``ValueError``: SGD would not move and the derived
    field would vanish. A quadrature that cannot be built in `dim` dimensions (a
    `GaussHermite` grid of more than ``10^7`` nodes, a `SparseGaussHermite` level below
    `dim`) raises ``ValueError`` here, with the message `rule` would give
    (`Quadrature.check`).
    """

    student: Callable = eqx.field(static=True)
    teacher: Callable = eqx.field(static=True)
    R0: jax.Array
    Q0: jax.Array
    T: jax.Array
    v0: Any
    eta: jax.Array
    eta_v: jax.Array | None
    noise: Any
    loss: Callable = eqx.field(static=True)
    data: DataModel
    quadrature: Quadrature = eqx.field(static=True)
    minibatch: int = eqx.field(static=True)
    _default_rule: bool = eqx.field(static=True)  # quadrature left out: `replace` lets it follow the model

    def __init__(
        self,
        student: Callable,
        teacher: Callable,
        R0: Any,
        Q0: Any,
        *,
        T: Any = None,
        v0: Any = None,
        eta: Any = 1.0,
        eta_v: Any = None,
        noise: Any = None,
        loss: Callable = squared_loss,
        data: DataModel | None = None,
        quadrature: Quadrature | None = None,
        minibatch: int = 1,
    ):
        self.student = _callable("student", student)
        self.teacher = _callable("teacher", teacher)
        self.loss = _callable("loss", loss)
        self.R0 = V.floats("R0 (initial student-teacher overlap)", R0)
        self.Q0 = V.floats("Q0 (initial student-student overlap)", Q0)
        M = self.R0.shape[-1] if self.R0.ndim == 2 else 1
        self.T = jnp.eye(M) if T is None else V.floats("T (teacher-teacher overlap)", T)
        self.v0 = None if v0 is None else V.floats("v0 (initial readout)", v0)
        self.eta = V.floats("eta (learning rate of W)", eta)
        # kept None: the readout then follows eta, also through replace(eta=...) and sweeps over eta
        self.eta_v = None if eta_v is None else V.floats("eta_v (learning rate of the readout)", eta_v)
        self.noise = None if noise is None else V.floats("noise (label-noise std)", noise)
        data = GaussianInputs() if data is None else data
        if not isinstance(data, DataModel):
            raise ValueError(f"data must be GaussianInputs() or SingleLocation(...), got {data!r:.80}")
        self.data = data
        self._default_rule = quadrature is None
        if quadrature is None:
            if self.R0.ndim != 2:  # refused by validate, naming R0
                quadrature = GaussHermite()
            elif self.noise is None:
                quadrature = default_quadrature(self.dim)
            else:
                quadrature = default_quadrature(self.dim, 2 if self.loss is squared_loss else NOISE_POINTS)
        if not isinstance(quadrature, Quadrature):
            raise ValueError(
                "quadrature must be GaussHermite(...), SparseGaussHermite(...), QuasiMonteCarlo(...) or "
                "MonteCarlo(...), "
                f"got {quadrature!r:.80}"
            )
        self.quadrature = quadrature
        self.minibatch = V.positive_int("minibatch (samples per SGD step)", minibatch)

    def replace(self, **changes: Any) -> Setup:
        """A copy with the named fields replaced, validated (as every package's ``Setup.replace``;
        values may be traced). A ``T`` or ``quadrature`` left to its default follows the new
        model: a ``T`` that is the identity stays the identity of the new ``M``, a quadrature
        left out at construction is the default of the new `dim`, noise and loss
        (`default_quadrature`); a quadrature given is kept."""
        fields = [name for name in self.__dataclass_fields__ if not name.startswith("_")]
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"Setup has no field {unknown}; fields: {sorted(fields)}")
        given = {name: getattr(self, name) for name in fields}
        T = self.T
        if not V.any_traced(T) and np.array_equal(np.asarray(T), np.eye(T.shape[0])):
            given["T"] = None
        if self._default_rule:
            given["quadrature"] = None
        given.update(changes)
        return Setup(**given)

    def record(self) -> dict[str, Any]:
        """`attnflow.setup.AbstractSetup.record`, with student, teacher and loss as
        ``"module:qualname"`` (``"attnflow.derive.setup:soft_committee"``,
        ``"__main__:<lambda>"``), so that a function of one's own is never taken for a package
        function of the same name, and with ``"quadrature_default": True`` after the
        quadrature when it was left out at construction: `from_record` then gives it back as
        the default of the recorded model, which `replace` lets follow the model, as the
        original does."""
        out = super().record()
        for name in _FUNCTIONS:
            if isinstance(out[name], str):  # a function (a callable module is recorded as its fields)
                out[name] = _function_name(getattr(self, name))
        if self._default_rule:
            items = list(out.items())
            at = [k for k, _ in items].index("quadrature") + 1
            out = dict(items[:at] + [("quadrature_default", True)] + items[at:])
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Setup:
        """`attnflow.setup.AbstractSetup.from_record`; a record with ``"quadrature_default": True``
        (`record` of a setup whose quadrature was left out) leaves it out again.

        Student, teacher and loss are given back only when the record names a function of
        `attnflow.derive` (or `attnflow`) by its module and name, the ones `record` writes
        (``"attnflow.derive.setup:soft_committee"``). Any other name, a lambda or a function of
        one's own even if it is called ``soft_committee``, raises ``ValueError`` naming the
        field and the function and saying how to pass it in:
        ``Setup.from_record({**rec, "student": f})``. A bare name (``"soft_committee"``, as
        records written before the module was recorded hold) is read as the package's function
        of that name: for such a record of a function of one's own named like a package one,
        pass it in."""
        if isinstance(record, dict):
            record = {k: (_function_from_record(k, v) if k in _FUNCTIONS else v) for k, v in record.items()}
        if isinstance(record, dict) and record.get("quadrature_default", False):
            record = {k: v for k, v in record.items() if k != "quadrature_default"}
            record["quadrature"] = None
        return super().from_record(record)

    def initial_state(self) -> dict[str, Any]:
        """The start of `attnflow.derive.solve`: ``{"R": R0, "Q": Q0[, "v": v0]}``."""
        y = {"R": self.R0, "Q": self.Q0}
        if self.v0 is not None:
            y["v"] = self.v0
        return y

    @property
    def rate_v(self) -> jax.Array:
        """The learning rate of the readout: ``eta_v``, or ``eta`` when ``eta_v`` is ``None``."""
        return self.eta if self.eta_v is None else self.eta_v

    @property
    def K(self) -> int:
        """Number of student fields."""
        return int(self.R0.shape[0]) if self.R0.ndim >= 1 else 0

    @property
    def M(self) -> int:
        """Number of teacher fields."""
        return int(self.R0.shape[1]) if self.R0.ndim == 2 else 0

    @property
    def dim(self) -> int:
        """Dimension of the Gaussian expectations: ``K + M`` (`GaussianInputs`) or ``L (K + M)``
        (`SingleLocation`), +1 with label noise."""
        return self.data.dim(self.K, self.M) + (self.noise is not None)

    def _check_model(self, K: int, M: int) -> None:
        """Call student, teacher and loss once on abstract arguments of the shapes the
        derivation passes (`jax.eval_shape`: nothing is computed), so that a model that does
        not fit raises here, naming the call, and not deep inside a solve."""
        f = jnp.result_type(float)
        L = (self.data.L,) if isinstance(self.data, SingleLocation) else ()
        lam = jax.ShapeDtypeStruct((K, *L), f)
        nu = jax.ShapeDtypeStruct((M, *L), f)
        ctx = jax.ShapeDtypeStruct(L if L else (0,), f)
        v = None if self.v0 is None else jax.ShapeDtypeStruct(jnp.shape(self.v0), f)
        v_text = "None (no v0)" if v is None else f"an array of shape {v.shape}"
        teacher_call = (
            f"teacher(nu, e) with nu of shape {nu.shape}, e {ctx.shape}"
            if L
            else f"teacher(nu) with nu of shape {nu.shape}"
        )

        def call(what: str, fn: Callable, *args: Any) -> Any:
            try:
                return jax.eval_shape(fn, *args)
            except Exception as err:
                raise ValueError(f"{what} failed: {type(err).__name__}: {err}") from err

        student_call = f"student(lam, v) with lam of shape {lam.shape} and v {v_text}"
        y_hat = call(student_call, self.student, lam, v)
        y = call(teacher_call, lambda nu, c: self.data.label(self.teacher, nu, c), nu, ctx)
        # JAX clamps an index past the end (nu[1] with M = 1 reads nu[0]): a model written for other
        # sizes would run and derive the ODE of another model
        zeros = [None if a is None else jnp.zeros(a.shape, a.dtype) for a in (lam, v, nu, ctx)]
        for what, fn, args in (
            (student_call, self.student, zeros[:2]),
            (teacher_call, lambda nu, c: self.data.label(self.teacher, nu, c), zeros[2:]),
        ):
            clamped = V.clamped_index(fn, *args)
            if clamped is not None:
                raise ValueError(
                    f"{what} reads past the end of an array ({clamped}); JAX would clamp it to the last "
                    f"entry and derive another model's ODE: check K = {K} (rows of R0) and M = {M} "
                    "(columns of R0) against the model"
                )
        shapes = [jnp.shape(a) for a in (y_hat, y)]
        if shapes[0] != shapes[1]:
            raise ValueError(
                f"the student's output has shape {shapes[0]} and the teacher's {shapes[1]}: they must match "
                "(the loss compares them entry by entry)"
            )
        out = call("loss(student output, teacher output)", self.loss, y_hat, y)
        if jnp.shape(out) not in ((), shapes[0]):
            allowed = (
                "a scalar, as the outputs are"
                if shapes[0] == ()
                else f"a scalar or one loss per entry of the outputs (shape {shapes[0]}), which are summed"
            )
            raise ValueError(
                f"loss(student output, teacher output) returns shape {jnp.shape(out)} for outputs of shape "
                f"{shapes[0]}: it must return {allowed}"
            )
        v_shape = None if self.v0 is None else tuple(jnp.shape(self.v0))
        model = (self.student, self.teacher, self.loss, K, M)
        if not V.any_traced(self.v0):  # traced: checked where the setup was made with a concrete v0
            readout = None if self.v0 is None else (v_shape, tuple(np.asarray(self.v0, dtype=float).ravel().tolist()))
            bad = _per_model(_first_nonfinite, *model, L[0] if L else None, readout)
            if bad is not None:
                raise ValueError(bad)
        if isinstance(self.data, SingleLocation) and self.data.exchangeable:
            gap = _per_model(_positional_gap, *model, self.data.L, v_shape)
            if not gap < 1e-6:
                raise ValueError(
                    f"the loss changes by up to {gap:.2g} (relative) when the {self.data.L} token locations are "
                    "permuted: the student (or its readout, or the loss) treats positions differently, but "
                    "SingleLocation(exchangeable=True) puts the signal at location 0, which holds only for a model "
                    "equivariant under the locations. Use SingleLocation(..., exchangeable=False) (it enumerates "
                    "the locations)"
                )
        if isinstance(self.data, GaussianInputs) and isinstance(self.quadrature, GaussHermite | SparseGaussHermite):
            excess = _per_model(_kink_excess, *model, v_shape)
            if excess > KINK_TOLERANCE:
                warnings.warn(
                    f"derive.Setup: the per-sample loss has a kink (or a change too sharp for {self.quadrature!r}): "
                    f"along a random line in input space its derivative jumps, {excess:.0%} of its variation "
                    "beyond what its second derivative accounts for (a ReLU unit, abs, a hinge). Gauss-Hermite "
                    "converges slowly there (a 2-unit ReLU student with a tanh teacher under GaussHermite(16): dR/dt "
                    "off by up to 9e-4, 1.6%, an entry of dQ/dt by 1.3e-3, half of it): "
                    "use quadrature=derive.QuasiMonteCarlo(2**18), or compare derive.field under both rules",
                    stacklevel=_caller_outside_attnflow(),
                )
        if isinstance(self.data, GaussianInputs) and _per_model(_frozen_model, *model, v_shape):
            raise ValueError(
                f"the loss does not change with the student's fields{'' if v_shape is None else ' or readout'}: "
                f"its gradient is exactly zero at {_GRADIENT_PROBES * len(_PROBE_SCALES)} random Gaussian inputs "
                f"(standard deviations {', '.join(f'{x:g}' for x in _PROBE_SCALES)}), so online SGD "
                "would not move and the derived ODE would be dR/dt = dQ/dt = 0. A step function (sign, a "
                "0-1 loss) has zero derivative almost everywhere: use a smooth surrogate (erf(x / eps) for "
                "sign(x), a logistic loss for the 0-1 loss)"
            )

    def validate(self) -> None:
        if self.R0.ndim != 2 or 0 in self.R0.shape:
            raise ValueError(f"R0 must be a (K, M) matrix with K, M >= 1, got shape {self.R0.shape}")
        K, M = self.R0.shape
        if self.Q0.shape != (K, K):
            raise ValueError(f"Q0 must have shape (K, K) = {(K, K)}, got {self.Q0.shape}")
        if self.T.shape != (M, M):
            raise ValueError(f"T must have shape (M, M) = {(M, M)}, got {self.T.shape}")
        self.data.check(K, M)
        if self.noise is not None and isinstance(self.data, SingleLocation):
            raise ValueError("noise (label noise) is not available with data=SingleLocation(...); use noise=None")
        # a rule too large is refused here, as `rule` would refuse it at the first field evaluation
        self.quadrature.check(self.dim, self.noise is not None)
        if jnp.ndim(self.eta) not in (0, 1) or (jnp.ndim(self.eta) == 1 and jnp.shape(self.eta) != (K,)):
            raise ValueError(
                f"eta (learning rate of W) must be a number or one per student unit, shape (K,) = ({K},), got "
                f"shape {jnp.shape(self.eta)}"
            )
        V.positive("eta (learning rate of W)", self.eta)
        if jnp.ndim(self.eta) == 1 and self.v0 is not None and self.eta_v is None:
            raise ValueError(
                "eta is one rate per student unit: give the readout its own scalar rate eta_v (it would follow eta)"
            )
        if self.eta_v is not None:
            V.scalar("eta_v (learning rate of the readout)", self.eta_v)
            V.positive("eta_v (learning rate of the readout)", self.eta_v)
        if self.noise is not None:
            V.nonnegative("noise (label-noise std)", self.noise)
        if self.v0 is not None:
            V.finite_tree("v0 (initial readout)", self.v0)
        self._check_model(K, M)
        if V.any_traced((self.R0, self.Q0, self.T)):
            return
        V.finite_tree("R0", self.R0)
        V.finite_tree("Q0", self.Q0)
        V.finite_tree("T", self.T)
        T = np.asarray(self.T)
        if not np.allclose(T, T.T) or np.linalg.eigvalsh(T).min() <= 0:
            raise ValueError(f"T must be symmetric positive definite, got {V.show(T)}")
        check_realisable(self.R0, self.Q0, T, names=("R0", "Q0"))
