"""Priors and the single-location task (spec `heads.md` sections 1 and 8).

A sample: location ``eps ~ Unif{1..L}``, amplitude ``theta ~ P_theta`` on ``R^F``,
``x_l = xi_l + delta_{l eps} sum_f theta_f k*_f / sqrt(D)``, target ``y = x_eps``.
Each prior samples ``theta`` and evaluates ``log Z(u) = log E_theta exp(theta.u - |theta|^2/2)``,
the Bayes posterior partition function: ``P(eps = l | X) = softmax_l(log Z(chi*_l))``.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..rng import normal

__all__ = ["Prior", "FlippedSpike", "AnisotropicGaussian", "Discrete", "PointMass", "SingleLocationTask", "bayes_risk"]


class Prior(eqx.Module):
    """A prior on the amplitudes ``theta`` in ``R^F``."""

    @property
    def F(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, key: jax.Array, n: int) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_Z(self, u: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def sign_symmetric(self) -> bool:
        return False

    def support(self) -> tuple[jax.Array, jax.Array] | None:
        """``(points (J, F), weights (J,))`` for a prior with finite support, else ``None``."""
        return None


class FlippedSpike(Prior):
    """``F = 1``; ``theta = +s`` with probability ``p``, ``-s`` otherwise."""

    s: jax.Array
    p: jax.Array

    def __init__(self, s: Any, p: Any = 0.5):
        V.positive("s", s)
        if not V.any_traced(p) and not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        self.s, self.p = jnp.asarray(s, dtype=float), jnp.asarray(p, dtype=float)

    @property
    def F(self) -> int:
        return 1

    @property
    def sign_symmetric(self) -> bool:
        return bool(self.p == 0.5)

    def support(self):
        return jnp.stack([self.s, -self.s])[:, None], jnp.stack([self.p, 1.0 - self.p])

    def sample(self, key, n):
        sign = jnp.where(jax.random.uniform(key, (n, 1)) < self.p, 1.0, -1.0)
        return sign * self.s

    def log_Z(self, u):
        u = u[..., 0]
        return jnp.logaddexp(jnp.log(self.p) + self.s * u, jnp.log1p(-self.p) - self.s * u) - 0.5 * self.s**2


class AnisotropicGaussian(Prior):
    """``theta ~ N(mean, diag(variances))``, variances > 0 (canonical ``v_1 > v_2 > ...``)."""

    mean: jax.Array
    variances: jax.Array

    def __init__(self, mean: Any, variances: Any):
        mean, variances = np.asarray(mean, float), np.asarray(variances, float)
        if mean.ndim != 1 or variances.shape != mean.shape:
            raise ValueError(f"mean and variances must be 1-D of equal length, got {mean.shape} and {variances.shape}")
        V.finite_tree("mean", mean)
        V.positive("variances", variances)
        self.mean, self.variances = jnp.asarray(mean), jnp.asarray(variances)

    @property
    def F(self) -> int:
        return self.mean.shape[0]

    @property
    def sign_symmetric(self) -> bool:
        return bool(jnp.all(self.mean == 0))

    def sample(self, key, n):
        return self.mean + jnp.sqrt(self.variances) * jax.random.normal(key, (n, self.F))

    def log_Z(self, u):
        v, mu = self.variances, self.mean
        return jnp.sum(-0.5 * jnp.log1p(v) + (v * u**2 + 2 * mu * u - mu**2) / (2 * (1 + v)), axis=-1)


class Discrete(Prior):
    """``theta = points[j]`` with probability ``weights[j]`` (weights nonnegative, summing to 1)."""

    points: jax.Array
    weights: jax.Array

    def __init__(self, points: Any, weights: Any = None):
        points = np.atleast_2d(np.asarray(points, float))
        J = points.shape[0]
        weights = np.full(J, 1.0 / J) if weights is None else np.asarray(weights, float)
        if weights.shape != (J,):
            raise ValueError(f"weights must have shape ({J},), got {weights.shape}")
        V.finite_tree("points", points)
        bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
        if bad.size:
            raise ValueError(f"weights must be nonnegative; weight {int(bad[0])} is {weights[bad[0]]!r}")
        if abs(weights.sum() - 1.0) > 1e-12:
            raise ValueError(f"weights must sum to 1, got {weights.sum()!r}")
        self.points, self.weights = jnp.asarray(points), jnp.asarray(weights)

    @property
    def F(self) -> int:
        return self.points.shape[1]

    def support(self):
        return self.points, self.weights

    @property
    def sign_symmetric(self) -> bool:
        pts, w = np.asarray(self.points), np.asarray(self.weights)
        for j in range(pts.shape[0]):  # each point's mirror image must carry the same weight
            k = np.flatnonzero(np.all(np.isclose(pts, -pts[j]), axis=1))
            if k.size == 0 or not np.isclose(w[k].sum(), w[j]):
                return False
        return True

    def sample(self, key, n):
        j = jax.random.choice(key, self.points.shape[0], (n,), p=self.weights)
        return self.points[j]

    def log_Z(self, u):
        logits = jnp.log(self.weights) + u @ self.points.T - 0.5 * jnp.sum(self.points**2, axis=1)
        return jax.scipy.special.logsumexp(logits, axis=-1)


def PointMass(mu: Any) -> Discrete:  # noqa: N802 - a constructor named as in the spec
    """``theta = mu`` almost surely (a `Discrete` prior with one point)."""
    return Discrete(np.atleast_2d(np.asarray(mu, float)), np.ones(1))


class SingleLocationTask(eqx.Module):
    """``L`` tokens in dimension ``D`` with ``F`` orthogonal spikes ``k*_f`` (``|k*_f|^2 = D``, exact QR).

    ``location=None`` draws the signal location uniformly per sample; an index fixes it.
    ``dtype``: of the tokens (default: JAX's default float, float64 with x64 on); float32 tokens
    are drawn with `attnflow.rng.normal`, float64 ones with ``jax.random.normal``.
    ``target="token"`` (default): ``y = x_eps``. ``target="scalar"`` (spec 5.3): ``y = z_eps + sqrt(Delta) xi_0``
    with ``z_l = x_l . v* / sqrt(D)`` for a fixed ``v*`` orthogonal to the spikes, ``|v*|^2 = D``."""

    spikes: jax.Array
    readout: jax.Array
    Delta: jax.Array
    L: int = eqx.field(static=True)
    prior: Prior
    location: int | None = eqx.field(static=True)
    target: str = eqx.field(static=True)

    def __init__(self, D: int, L: int, prior: Prior, key: Any = 0, location: int | None = None, target: str = "token",
                 Delta: float = 0.0, dtype: Any = None):
        D = V.positive_int("D", D, minimum=2)
        self.L = V.positive_int("L", L, minimum=2)
        if not isinstance(prior, Prior):
            raise ValueError(f"prior must be a Prior, got {prior!r}")
        if prior.F > D:
            raise ValueError(f"need F <= D, got F = {prior.F}, D = {D}")
        key = V.prng_key(key)
        q, _ = jnp.linalg.qr(jax.random.normal(key, (D, prior.F)))
        dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        self.spikes = (jnp.sqrt(D) * q.T).astype(dtype)
        self.prior = prior
        if location is not None and not 0 <= int(location) < self.L:
            raise ValueError(f"location must be None (random) or an index in [0, {self.L}), got {location!r}")
        self.location = None if location is None else int(location)
        self.target = V.choice("target", target, ("token", "scalar"))
        V.nonnegative("Delta", Delta)
        if target == "token" and Delta != 0:
            raise ValueError(f"Delta (label noise) needs target='scalar', got Delta = {Delta!r} with the token target")
        self.Delta = jnp.asarray(Delta, dtype=self.spikes.dtype)
        v = jax.random.normal(jax.random.fold_in(key, 1), (D,), dtype=self.spikes.dtype)
        v = v - self.spikes.T @ (self.spikes @ v) / D  # orthogonal to every spike
        self.readout = jnp.sqrt(D) * v / jnp.linalg.norm(v)

    @property
    def D(self) -> int:
        return self.spikes.shape[1]

    def sample(self, key: jax.Array, batch_size: int) -> tuple:
        """``(X (B, L, D), y (B, D), eps (B,))``; for the scalar target ``(X, y (B,), eps, z (B, L))``."""
        k1, k2, k3 = jax.random.split(key, 3)
        if self.location is None:
            eps = jax.random.randint(k1, (batch_size,), 0, self.L)
        else:
            eps = jnp.full((batch_size,), self.location)
        theta = self.prior.sample(k2, batch_size)
        # float32 tokens: Box-Muller on both Threefry words (attnflow.rng.normal, ~2x jax.random.normal);
        # float64: jax.random.normal
        X = normal(k3, (batch_size, self.L, self.D), dtype=self.spikes.dtype)
        signal = (theta @ self.spikes) / jnp.sqrt(self.D)
        rows = jnp.arange(batch_size)
        # add the signal to the eps-th token only (a scatter, not a one-hot product over all L tokens)
        X = X.at[rows, eps].add(signal.astype(X.dtype))
        if self.target == "scalar":
            z = X @ self.readout / jnp.sqrt(self.D)
            xi0 = jax.random.normal(jax.random.fold_in(k1, 7), (batch_size,), dtype=X.dtype)
            y = jnp.take_along_axis(z, eps[:, None], axis=1)[:, 0] + jnp.sqrt(self.Delta) * xi0
            return X, y, eps, z
        y = X[rows, eps]
        return X, y, eps


def bayes_posterior(prior: Prior, chi_star: jax.Array) -> jax.Array:
    """Location posterior ``p_l = softmax_l(log Z(chi*_l))`` for projections ``chi* (..., L, F)``."""
    return jax.nn.softmax(prior.log_Z(chi_star), axis=-1)


def bayes_risk(prior: Prior, L: int, key: Any = 0, n: int = 200_000) -> tuple[jax.Array, jax.Array]:
    """Monte Carlo Bayes risk ``E_Bayes = 1 - E[p_eps]`` (location 1 by exchangeability) and its standard error."""
    V.positive_int("L", L, minimum=1)
    key = V.prng_key(key)
    k1, k2 = jax.random.split(key)
    theta = prior.sample(k1, n)
    zeta = jax.random.normal(k2, (n, L, prior.F))
    chi = zeta.at[:, 0].add(theta)
    p1 = bayes_posterior(prior, chi)[:, 0]
    return 1.0 - jnp.mean(p1), jnp.std(p1) / jnp.sqrt(n)
