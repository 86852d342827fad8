"""Data models of `attnflow.derive`: where the local fields come from.

- `GaussianInputs` (the default): ``x ~ N(0, I_D)``; the student sees ``lambda = W x / sqrt(D)``
  ``(K,)``, the teacher ``nu = W* x / sqrt(D)`` ``(M,)``, jointly Gaussian with covariance
  ``[[Q, R], [R^T, T]]`` (the committee-machine family).
- `SingleLocation`: the single-location token model of `attnflow.heads` (heads page, eq. (1)).
  A sample holds ``L`` tokens ``x_l = xi_l + delta_{l eps} sum_f theta_f w*_f / sqrt(D)``,
  ``xi_l ~ N(0, I_D)``, the signal location ``eps`` uniform, amplitudes ``theta ~ prior`` (an
  `attnflow.heads.Prior`). The student sees its fields at every location,
  ``lambda_kl = w_k . x_l / sqrt(D)`` ``(K, L)``, the teacher ``nu_ml = w*_m . x_l / sqrt(D)``
  ``(M, L)`` and the one-hot ``e`` of the signal location. Given ``(theta, eps)`` the locations
  are independent, each ``(lambda_l, nu_l) ~ N(0, [[Q, R], [R^T, T]])``, shifted by
  ``(R theta, T theta)`` at ``l = eps`` (with the orthonormal spikes of `attnflow.heads`,
  ``T = I`` and ``R`` is its ``M``: the heads page's eq. (6)).

A data model turns the quadrature's standard normal nodes into fields (`DataModel.fields`),
decides what the teacher is given (`DataModel.label`) and, for `attnflow.derive.train`, draws
finite-``D`` inputs (`DataModel.sample`) and projects them on weights (`DataModel.project`).
Quadrature nodes are the rows of one array: the Gaussian coordinates (the label noise last),
then (single-location model) ``F`` columns of amplitudes ``theta`` and one column with the
signal location.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from ..expect import psd_sqrt
from ..prior import Prior

__all__ = ["DataModel", "GaussianInputs", "SingleLocation", "signal_token"]


def signal_token(nu: jax.Array, e: jax.Array) -> jax.Array:
    """The teacher of the single-location token target of `attnflow.heads` (``y = x_eps``): the
    one-hot ``e`` of the signal location. With a student that returns the attention ``a (L,)``
    (output ``sum_l a_l x_l``) and `attnflow.derive.squared_loss` (summed over locations), the
    per-sample loss is the heads page's ``|e - a|^2 / 2``, the ``D -> infinity`` limit of
    ``|x_eps - sum_l a_l x_l|^2 / (2 D)``."""
    del nu
    return e


class DataModel(eqx.Module):
    """How the inputs are drawn (abstract): `GaussianInputs` (the default) or `SingleLocation`."""

    @abc.abstractmethod
    def dim(self, K: int, M: int) -> int:
        """Number of standard normal coordinates per quadrature node (label noise not counted)."""

    @abc.abstractmethod
    def nodes(self, z: np.ndarray, w: np.ndarray, quadrature: Any) -> tuple[jax.Array, jax.Array]:
        """The quadrature nodes and weights of this data model from standard normal nodes
        ``z (n, d)`` and weights ``w (n,)`` (``quadrature``: the `attnflow.derive.Quadrature` that
        made them; ``d`` is `dim` plus one with label noise)."""

    @abc.abstractmethod
    def fields(
        self, R: jax.Array, Q: jax.Array, T: jax.Array, nodes: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(lambda, nu, context)`` at every node: student fields ``(n, K[, L])``, teacher fields
        ``(n, M[, L])`` and what else the teacher is given ``(n, c)`` (`label`)."""

    @abc.abstractmethod
    def label(self, teacher: Callable, nu: jax.Array, context: jax.Array) -> Any:
        """The noise-free label of one node: ``teacher`` at its fields ``nu`` and ``context``."""

    def check(self, K: int, M: int) -> None:
        """Raise ``ValueError`` if this data model does not fit ``K`` student and ``M`` teacher vectors."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, n: int, W_star: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``n`` finite-``D`` inputs for `attnflow.derive.train` with teacher weights ``W* (M, D)``:
        ``(x, context)``, ``x`` of shape ``(n, D)`` or ``(n, L, D)`` and ``context (n, c)`` as in
        `fields`."""

    @abc.abstractmethod
    def project(self, x: jax.Array, W: jax.Array) -> jax.Array:
        """The fields ``W x / sqrt(D)`` of the inputs ``x`` from `sample` for weights ``W (k, D)``:
        ``(n, k)``, or ``(n, k, L)`` with a location axis."""


class GaussianInputs(DataModel):
    """I.i.d. standard Gaussian inputs ``x ~ N(0, I_D)`` (the default): ``lambda (K,)`` and
    ``nu (M,)`` jointly Gaussian with covariance ``[[Q, R], [R^T, T]]``; ``teacher(nu)``."""

    def dim(self, K, M):
        return K + M

    def nodes(self, z, w, quadrature):
        return jnp.asarray(z, dtype=float), jnp.asarray(w, dtype=float)

    def fields(self, R, Q, T, nodes):
        K, M = R.shape
        S = psd_sqrt(jnp.block([[Q, R], [R.T, T]]))
        g = nodes[:, : K + M] @ S.T
        return g[:, :K], g[:, K:], jnp.zeros((nodes.shape[0], 0), g.dtype)

    def label(self, teacher, nu, context):
        return teacher(nu)

    def sample(self, key, n, W_star):
        x = jax.random.normal(key, (n, W_star.shape[1]), dtype=W_star.dtype)
        return x, jnp.zeros((n, 0), W_star.dtype)

    def project(self, x, W):
        return x @ W.T / jnp.sqrt(jnp.asarray(W.shape[1], W.dtype))


class SingleLocation(DataModel):
    """The single-location token model of `attnflow.heads`: ``L`` tokens, the signal
    ``sum_f theta_f w*_f / sqrt(D)`` at one uniformly drawn location ``eps``, ``theta ~ prior``.

    The student sees ``lambda (K, L)`` (its ``K`` fields at each location: the heads' scores
    ``chi``), the teacher is called as ``teacher(nu, e)`` with ``nu (M, L)`` (the projections on
    the ``M = prior.F`` teacher vectors, ``chi*`` of the heads page) and ``e (L,)`` the one-hot
    of the signal location (`signal_token` returns it: the token target of `attnflow.heads`).

    - ``prior``: an `attnflow.heads.Prior` of the amplitudes (``FlippedSpike``, ``Discrete``,
      ``AnisotropicGaussian``, ``PointMass``); a prior with finite support is enumerated with
      its weights at every Gaussian node, any other is sampled (one draw per node, antithetic
      ``-theta`` with the antithetic half of a `attnflow.derive.MonteCarlo` bank when the prior
      is sign-symmetric);
    - ``L`` (static): the number of tokens (``>= 2``);
    - ``exchangeable`` (static, default ``True``): the signal sits at location 0, which is exact
      when the student and the loss are equivariant under permutations of the locations (every
      attention of `attnflow.heads` is); ``False`` enumerates the ``L`` locations (``L`` times
      the nodes; for a positional student).
    """

    prior: Prior
    L: int = eqx.field(static=True, default=4)
    exchangeable: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        if not isinstance(self.prior, Prior):
            raise ValueError(
                "prior must be an attnflow.heads Prior (FlippedSpike, Discrete, AnisotropicGaussian, PointMass), "
                f"got {self.prior!r:.80}"
            )
        V.positive_int("L (tokens)", self.L, minimum=2)
        if not isinstance(self.exchangeable, bool):
            raise ValueError(f"exchangeable must be True or False, got {self.exchangeable!r}")

    @property
    def F(self) -> int:
        """Number of signal directions (teacher vectors), ``prior.F``."""
        return self.prior.F

    def dim(self, K, M):
        return self.L * (K + M)

    def check(self, K, M):
        if M != self.F:
            raise ValueError(f"R0 must have M = prior.F = {self.F} columns (one per spike), got M = {M}")

    def nodes(self, z, w, quadrature):
        from .setup import MonteCarlo

        z = jnp.asarray(z, dtype=float)
        w = jnp.asarray(w, dtype=float)
        n = z.shape[0]
        support = self.prior.support()
        if support is not None:  # enumerate: every Gaussian node with every support point
            pts, pw = (jnp.asarray(a, dtype=float) for a in support)
            J = pts.shape[0]
            theta = jnp.tile(pts, (n, 1))
            z, w = jnp.repeat(z, J, axis=0), (w[:, None] * pw[None, :]).reshape(-1)
        else:
            seed = getattr(quadrature, "seed", 0)  # MonteCarlo, QuasiMonteCarlo
            key = jax.random.PRNGKey(seed + 1)
            if isinstance(quadrature, MonteCarlo) and self.prior.sign_symmetric:
                half = self.prior.sample(key, n // 2)  # the bank is [z, -z]: pair (z, theta) with (-z, -theta)
                theta = jnp.concatenate([half, -half])
            else:
                theta = self.prior.sample(key, n)
            theta = jnp.asarray(theta, dtype=float)
        n = z.shape[0]
        if self.exchangeable:
            eps = jnp.zeros((n, 1))
        else:
            eps = jnp.repeat(jnp.arange(self.L, dtype=float), n)[:, None]
            z, theta, w = jnp.tile(z, (self.L, 1)), jnp.tile(theta, (self.L, 1)), jnp.tile(w, self.L) / self.L
        return jnp.concatenate([z, theta, eps], axis=1), w

    def fields(self, R, Q, T, nodes):
        K, M = R.shape
        L = self.L
        d = L * (K + M)
        n = nodes.shape[0]
        S = psd_sqrt(jnp.block([[Q, R], [R.T, T]]))
        g = nodes[:, :d].reshape(n, L, K + M) @ S.T  # (n, L, K + M): independent locations
        theta = nodes[:, d : d + M]
        e = jax.nn.one_hot(nodes[:, d + M].astype(jnp.int32), L, dtype=g.dtype)  # (n, L)
        shift = jnp.concatenate([theta @ R.T, theta @ T.T], axis=1)  # (n, K + M): the signal's mean
        g = g + e[:, :, None] * shift[:, None, :]
        return jnp.swapaxes(g[..., :K], 1, 2), jnp.swapaxes(g[..., K:], 1, 2), e

    def label(self, teacher, nu, context):
        return teacher(nu, context)

    def sample(self, key, n, W_star):
        # the model itself, whatever `exchangeable`: the signal location is drawn uniformly
        D = W_star.shape[1]
        k_xi, k_theta, k_eps = jax.random.split(key, 3)
        xi = jax.random.normal(k_xi, (n, self.L, D), dtype=W_star.dtype)
        theta = jnp.asarray(self.prior.sample(k_theta, n), W_star.dtype)  # (n, F)
        e = jax.nn.one_hot(jax.random.randint(k_eps, (n,), 0, self.L), self.L, dtype=W_star.dtype)
        signal = theta @ W_star / jnp.sqrt(jnp.asarray(D, W_star.dtype))  # sum_f theta_f w*_f / sqrt(D)
        return xi + e[:, :, None] * signal[:, None, :], e

    def project(self, x, W):
        return jnp.swapaxes(x @ W.T, 1, 2) / jnp.sqrt(jnp.asarray(W.shape[1], W.dtype))  # (n, k, L)
