"""The data model: priors on the signal amplitude, targets, and the single-location task.

A sample has ``L`` tokens ``x_l`` in ``R^D``. One location ``eps ~ Unif{1..L}`` carries the
signal: ``x_l = xi_l + delta_{l eps} sum_f theta_f k*_f / sqrt(D)`` with ``xi_l ~ N(0, I_D)``,
amplitudes ``theta ~ P_theta`` on ``R^F`` and ``F`` orthogonal spikes ``|k*_f|^2 = D``
(equation (1) of the heads page). Each prior samples ``theta`` and evaluates the log partition
function ``log Z(u) = log E_theta exp(theta . u - |theta|^2 / 2)`` of the Bayes posterior on the
location, ``P(eps = l | X) = softmax_l(log Z(chi*_l))`` (equation (12)).

The target (token or scalar, equation (2)) is an object: `TokenTarget` or `ScalarTarget`.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..expect import psd_sqrt
from ..prior import Prior
from ..rng import normal

__all__ = [
    "AnisotropicGaussian",
    "Discrete",
    "FlippedSpike",
    "PointMass",
    "Prior",
    "ScalarTarget",
    "SingleLocationTask",
    "Target",
    "TokenTarget",
]


# ----------------------------------------------------------------------------- priors
def _parameter(name: str, value: Any) -> jax.Array:
    """``value`` as `attnflow._validate.floats`; a concrete value stays a concrete array when the
    prior is built inside ``jit`` or ``vmap`` (where the conversion would make a tracer), so that
    `Prior.sign_symmetric` can still read it there."""
    if V.any_traced(value):
        return V.floats(name, value)
    with jax.ensure_compile_time_eval():
        return V.floats(name, value)


def _concrete_symmetry(prior: Prior, params: Any) -> bool:
    """`Prior.sign_symmetric` of a prior whose symmetry depends on ``params`` only: ``False``
    while any of them is traced (the antithetic copies would average a traced parameter with
    its mirror, and its derivative would vanish), else its `Prior.sign_symmetric_array` now."""
    if V.any_traced(params):
        return False
    with jax.ensure_compile_time_eval():
        return bool(prior.sign_symmetric_array())


class FlippedSpike(Prior):
    """``F = 1``; ``theta = +s`` with probability ``p``, ``-s`` otherwise (sign-symmetric at ``p = 1/2``)."""

    s: jax.Array
    p: jax.Array

    def __init__(self, s: Any, p: Any = 0.5):
        s, p = _parameter("s (signal strength)", s), _parameter("p", p)
        if s.ndim or p.ndim:
            raise ValueError(f"s and p must be scalars, got shapes {s.shape} and {p.shape}")
        V.positive("s (signal strength)", s)
        if not V.any_traced(p) and not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {V.show(p)}")
        self.s, self.p = s, p

    @property
    def F(self) -> int:
        return 1

    @property
    def sign_symmetric(self) -> bool:
        """``p == 1/2``, read from the current ``p`` (traced: not symmetric)."""
        return _concrete_symmetry(self, self.p)

    def sign_symmetric_array(self) -> jax.Array:
        """``p == 1/2`` as a JAX boolean (traceable)."""
        return self.p == 0.5

    def support(self):
        return jnp.stack([self.s, -self.s])[:, None], jnp.stack([self.p, 1.0 - self.p])

    def sample(self, key, n):
        sign = jnp.where(jax.random.uniform(key, (n, 1)) < self.p, 1.0, -1.0)
        return sign * self.s

    def log_Z(self, u):
        u = u[..., 0]
        return jnp.logaddexp(jnp.log(self.p) + self.s * u, jnp.log1p(-self.p) - self.s * u) - 0.5 * self.s**2


class AnisotropicGaussian(Prior):
    """``theta ~ N(mean, C)``: ``variances`` 1-D, ``C = diag(variances)`` with ``variances >= 0``
    (canonical ``v_1 > v_2 > ...``; a zero variance fixes that component at its mean), or 2-D,
    the covariance ``C`` itself (symmetric positive semidefinite, as the diagonal form)."""

    mean: jax.Array
    variances: jax.Array

    def __init__(self, mean: Any, variances: Any):
        mean, variances = _parameter("mean", mean), _parameter("variances", variances)
        F = mean.shape[0] if mean.ndim == 1 else None
        if F is None or variances.shape not in ((F,), (F, F)):
            raise ValueError(
                "mean must be 1-D and variances 1-D of its length (a diagonal covariance) or its covariance "
                f"matrix C (F, F); got {mean.shape} and {variances.shape}"
            )
        V.finite_tree("mean", mean)
        if variances.ndim == 1:
            V.nonnegative("variances", variances)
        elif not V.any_traced(variances):
            C = np.asarray(variances)
            V.finite_tree("variances (covariance C)", C)
            tol = 1e-12 * max(1.0, float(np.abs(C).max()))
            asym = np.abs(C - C.T)
            if asym.max() > tol:
                i, j = (int(k) for k in np.unravel_index(np.argmax(asym), asym.shape))
                raise ValueError(
                    f"the covariance C must be symmetric, got {V.show(C)}: the largest |C - C^T| entry is "
                    f"{float(asym[i, j]):.3g} at index ({i}, {j}) (C[{i}, {j}] = {float(C[i, j]):g}, "
                    f"C[{j}, {i}] = {float(C[j, i]):g})"
                )
            low = float(np.linalg.eigvalsh(0.5 * (C + C.T)).min())
            if low < -tol:
                raise ValueError(
                    f"the covariance C must be symmetric positive semidefinite, got {V.show(C)} (smallest eigenvalue "
                    f"{low:.3g})"
                )
        self.mean, self.variances = mean, variances

    @property
    def F(self) -> int:
        return self.mean.shape[0]

    @property
    def covariance(self) -> jax.Array:
        """``C`` ``(F, F)``."""
        return jnp.diag(self.variances) if self.variances.ndim == 1 else self.variances

    @property
    def sign_symmetric(self) -> bool:
        """``mean == 0``, read from the current ``mean`` (traced: not symmetric)."""
        return _concrete_symmetry(self, self.mean)

    def sign_symmetric_array(self) -> jax.Array:
        """``mean == 0`` as a JAX boolean (traceable)."""
        return jnp.all(self.mean == 0)

    def support(self):
        return None

    def sample(self, key, n):
        z = jax.random.normal(key, (n, self.F))
        if self.variances.ndim == 1:
            return self.mean + jnp.sqrt(self.variances) * z
        return self.mean + z @ psd_sqrt(self.variances)

    def log_Z(self, u):
        v, mu = self.variances, self.mean
        if v.ndim == 1:
            return jnp.sum(-0.5 * jnp.log1p(v) + (v * u**2 + 2 * mu * u - mu**2) / (2 * (1 + v)), axis=-1)
        # E exp(theta . u - |theta|^2 / 2) for theta ~ N(mu, C), with A = (I + C)^{-1}:
        # -log det(I + C) / 2 + u^T C A u / 2 + u^T A mu - mu^T A mu / 2
        eye = jnp.eye(self.F, dtype=v.dtype)
        A = jnp.linalg.inv(eye + v)
        _, logdet = jnp.linalg.slogdet(eye + v)
        CA = v @ A
        return (
            -0.5 * logdet
            + 0.5 * jnp.einsum("...i,ij,...j->...", u, CA, u)
            + jnp.einsum("...i,ij,j->...", u, A, mu)
            - 0.5 * mu @ A @ mu
        )


class Discrete(Prior):
    """``theta = points[j]`` with probability ``weights[j]`` (nonnegative, summing to 1; uniform by default)."""

    points: jax.Array
    weights: jax.Array

    def __init__(self, points: Any, weights: Any = None):
        points = _parameter("points", points)
        if points.size == 0:
            raise ValueError("points must hold at least one point, got an empty array")
        if points.ndim == 1:
            # A 1-D array reads as either J scalar points (F = 1) or one point in F dimensions:
            # refused rather than guessed, since the two are different priors.
            shown = V.show(points) if not V.any_traced(points) else f"an array of shape {points.shape}"
            raise ValueError(
                f"points must have shape (J, F), one row per point, got the 1-D {shown}: the F = 1 prior on "
                "a and b is Discrete([[a], [b]]), one point in F dimensions Discrete([[x1, ..., xF]]) or PointMass(x)"
            )
        if points.ndim != 2:
            raise ValueError(f"points must have shape (J, F), one row per point, got {points.shape}")
        J = points.shape[0]
        weights = _parameter("weights", np.full(J, 1.0 / J) if weights is None else weights)
        if weights.shape != (J,):
            raise ValueError(f"weights must have shape ({J},), got {weights.shape}")
        V.finite_tree("points", points)
        if not V.any_traced(weights):
            w = np.asarray(weights)
            bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
            if bad.size:
                raise ValueError(f"weights must be nonnegative; weight {int(bad[0])} is {float(w[bad[0]]):g}")
            if abs(w.sum() - 1.0) > 1e-12:
                raise ValueError(f"weights must sum to 1, got sum {float(w.sum()):.15g}")
        self.points, self.weights = points, weights

    @property
    def F(self) -> int:
        return self.points.shape[1]

    @property
    def sign_symmetric(self) -> bool:
        """Whether each point's mirror image carries its weight, read from the current ``points``
        and ``weights`` (traced: not symmetric)."""
        return _concrete_symmetry(self, (self.points, self.weights))

    def sign_symmetric_array(self) -> jax.Array:
        """Whether the points mirrored onto each point ``j`` (``np.isclose`` tolerances) carry its
        weight ``weights[j]``, as a JAX boolean (traceable)."""
        pts, w = self.points, self.weights
        mirrors = jnp.all(jnp.isclose(pts[None, :, :], -pts[:, None, :]), axis=-1)  # [j, k]: k mirrors j
        return jnp.all(jnp.isclose(mirrors.astype(w.dtype) @ w, w))

    def support(self):
        return self.points, self.weights

    def sample(self, key, n):
        j = jax.random.choice(key, self.points.shape[0], (n,), p=self.weights)
        return self.points[j]

    def log_Z(self, u):
        logits = jnp.log(self.weights) + u @ self.points.T - 0.5 * jnp.sum(self.points**2, axis=1)
        return jax.scipy.special.logsumexp(logits, axis=-1)


def PointMass(mu: Any) -> Discrete:
    """``theta = mu`` almost surely: a `Discrete` prior with one point."""
    mu = _parameter("mu", mu)
    with jax.ensure_compile_time_eval():  # concrete stays concrete inside jit (`_parameter`)
        mu = jnp.atleast_2d(mu)
    return Discrete(mu, np.ones(1))


# ----------------------------------------------------------------------------- targets
class Target(eqx.Module):
    """What the model must output (abstract): `TokenTarget` (``y = x_eps``) or `ScalarTarget`.

    A target makes the labels of a batch, the loss of attention weights on a batch, and the
    second moment of the per-sample score gradient that drives the ``eta^2`` term of the
    order-parameter ODE (equations (8) and (9)).
    """

    @abc.abstractmethod
    def label_noise(self) -> Any:
        """The label-noise variance ``Delta`` added to the error (0 for the token target)."""

    @abc.abstractmethod
    def batch(self, key: jax.Array, X: jax.Array, eps: jax.Array, readout: jax.Array) -> tuple:
        """The batch of tokens ``X (B, L, D)`` with signal locations ``eps (B,)``."""

    @abc.abstractmethod
    def loss(self, a: jax.Array, batch: tuple) -> jax.Array:
        """Mean loss over the batch of the prediction with attention weights ``a (B, L)``."""

    @abc.abstractmethod
    def gradient_moment(self, activation: Any, chi: jax.Array, G: jax.Array) -> jax.Array:
        """``(H, H)`` second moment of the per-sample key gradient, divided by ``eta^2``, for one
        draw of the scores ``chi (H, L)`` with ``G = d loss / d chi`` (equations (8) and (9))."""


class TokenTarget(Target):
    """Sequence-to-token target ``y = x_eps`` in ``R^D``; loss ``|y - sum_l a_l x_l|^2 / (2 D)``."""

    def label_noise(self):
        return 0.0

    def batch(self, key, X, eps, readout):
        return X, X[jnp.arange(X.shape[0]), eps], eps

    def loss(self, a, batch):
        X, y = batch[0], batch[1]
        yhat = jnp.einsum("bl,bld->bd", a, X)
        return jnp.mean(jnp.sum((y - yhat) ** 2, axis=-1)) / (2 * X.shape[-1])

    def gradient_moment(self, activation, chi, G):
        return G @ G.T


class ScalarTarget(Target):
    """Scalar target ``y = z_eps + sqrt(Delta) xi_0`` with ``z_l = x_l . v* / sqrt(D)`` for a fixed
    readout ``v*`` orthogonal to the spikes (``|v*|^2 = D``); loss ``(y - sum_l a_l z_l)^2 / 2``.

    The error gains ``Delta``; the ``eta^2`` term becomes
    ``E[(|r|^2 + Delta) <J^h, J^h'>_F + 2 sum_l G_hl G_h'l]`` with ``J^h_{l'l} = d a_l' / d chi_hl``
    (equation (9)).
    """

    Delta: jax.Array = eqx.field(converter=lambda x: V.floats("Delta", x), default=0.0)

    def __check_init__(self):
        V.nonnegative("Delta (label noise variance)", self.Delta)

    def label_noise(self):
        return self.Delta

    def batch(self, key, X, eps, readout):
        z = X @ readout / jnp.sqrt(X.shape[-1])
        xi0 = jax.random.normal(key, (X.shape[0],), dtype=X.dtype)
        y = jnp.take_along_axis(z, eps[:, None], axis=1)[:, 0] + jnp.sqrt(self.Delta).astype(X.dtype) * xi0
        return X, y, eps, z

    def loss(self, a, batch):
        y, z = batch[1], batch[3]
        return 0.5 * jnp.mean((y - jnp.sum(a * z, axis=-1)) ** 2)

    def gradient_moment(self, activation, chi, G):
        a = activation(chi)
        r2 = jnp.sum((jax.nn.one_hot(0, chi.shape[1], dtype=a.dtype) - a) ** 2)
        J = jax.jacfwd(activation)(chi)  # (L, H, L)
        return (r2 + self.Delta) * jnp.einsum("ihl,igl->hg", J, J) + 2 * G @ G.T


# ----------------------------------------------------------------------------- task
class SingleLocationTask(eqx.Module):
    """``L`` tokens in dimension ``D`` with ``F`` orthogonal spikes ``k*_f`` (``|k*_f|^2 = D``, exact QR).

    ``location=None`` draws the signal location uniformly per sample; an index fixes it.
    ``target``: `TokenTarget()` (default) or `ScalarTarget(Delta)`; the scalar readout ``v*``
    (orthogonal to every spike, ``|v*|^2 = D``) is drawn from ``key`` too. ``dtype``: of the
    tokens (default: JAX's default float); float32 tokens come from `attnflow.rng.normal`
    (Box-Muller on both Threefry words), float64 ones from ``jax.random.normal``.
    """

    spikes: jax.Array
    readout: jax.Array
    prior: Prior
    target: Target
    L: int = eqx.field(static=True)
    location: int | None = eqx.field(static=True)

    def __init__(
        self,
        D: int,
        L: int,
        prior: Prior,
        key: Any = 0,
        location: int | None = None,
        target: Target | None = None,
        dtype: Any = None,
    ):
        D = V.positive_int("D", D, minimum=2)
        self.L = V.positive_int("L", L, minimum=2)
        if not isinstance(prior, Prior):
            raise ValueError(f"prior must be a Prior (FlippedSpike, AnisotropicGaussian, Discrete), got {prior!r}")
        if prior.F >= D:
            raise ValueError(f"need F < D, got F = {prior.F}, D = {D}")
        target = TokenTarget() if target is None else target
        if not isinstance(target, Target):
            raise ValueError(f"target must be TokenTarget() or ScalarTarget(Delta), got {target!r}")
        dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        if location is not None and not 0 <= int(location) < self.L:
            raise ValueError(f"location must be None (random) or an index in [0, {self.L}), got {location!r}")
        key = V.prng_key(key)
        q, _ = jnp.linalg.qr(jax.random.normal(key, (D, prior.F)))
        self.spikes = (jnp.sqrt(D) * q.T).astype(dtype)
        v = jax.random.normal(jax.random.fold_in(key, 1), (D,), dtype=self.spikes.dtype)
        v = v - self.spikes.T @ (self.spikes @ v) / D  # orthogonal to every spike
        self.readout = jnp.sqrt(D).astype(dtype) * v / jnp.linalg.norm(v)
        self.prior, self.target = prior, target
        self.location = None if location is None else int(location)

    @property
    def D(self) -> int:
        return self.spikes.shape[1]

    def sample(self, key: jax.Array, batch_size: int) -> tuple:
        """A batch from ``key``: ``(X (B, L, D), y (B, D), eps (B,))`` for the token target,
        ``(X, y (B,), eps, z (B, L))`` for the scalar target."""
        k1, k2, k3 = jax.random.split(key, 3)
        if self.location is None:
            eps = jax.random.randint(k1, (batch_size,), 0, self.L)
        else:
            eps = jnp.full((batch_size,), self.location)
        theta = self.prior.sample(k2, batch_size)
        X = normal(k3, (batch_size, self.L, self.D), dtype=self.spikes.dtype)
        signal = (theta @ self.spikes.astype(theta.dtype)) / jnp.sqrt(self.D)
        # add the signal to the eps-th token only (a scatter, not a one-hot product over all L tokens)
        X = X.at[jnp.arange(batch_size), eps].add(signal.astype(X.dtype))
        return self.target.batch(jax.random.fold_in(k1, 7), X, eps, self.readout)
