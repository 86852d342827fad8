"""A prior on signal amplitudes: the interface the theories' data models share.

`Prior` is the law ``P_theta`` of the amplitudes ``theta`` in ``R^F`` that a signal carries
(equation (1) of the heads page). The concrete priors (`attnflow.heads.FlippedSpike`,
`attnflow.heads.AnisotropicGaussian`, `attnflow.heads.Discrete`, `attnflow.heads.PointMass`)
live with the single-location model; `attnflow.derive.SingleLocation` takes any of them, or a
prior of the user's own that implements this interface.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

__all__ = ["Prior"]


class Prior(eqx.Module):
    """A prior ``P_theta`` on the signal amplitudes ``theta`` in ``R^F`` (abstract).

    Concrete priors: `attnflow.heads.FlippedSpike`, `attnflow.heads.AnisotropicGaussian`,
    `attnflow.heads.Discrete` (and `attnflow.heads.PointMass`); ``attnflow.heads.Prior`` is this
    class.
    """

    @property
    @abc.abstractmethod
    def F(self) -> int:
        """Number of latent features (spikes)."""

    @property
    @abc.abstractmethod
    def sign_symmetric(self) -> bool:
        """Whether ``theta`` and ``-theta`` have the same law, read from the parameters' current
        values each time it is asked (so a prior edited with ``eqx.tree_at`` answers for its new
        values); a prior whose parameters that decide it are traced counts as not symmetric."""

    def sign_symmetric_array(self) -> jax.Array:
        """`sign_symmetric` as a JAX boolean computed from the parameters, traceable: what
        `attnflow.heads.FieldBank` checks at run time when ``antithetic=True`` meets traced
        parameters (a sweep over a prior parameter). Default: the concrete `sign_symmetric`."""
        return jnp.asarray(self.sign_symmetric)

    @abc.abstractmethod
    def support(self) -> tuple[jax.Array, jax.Array] | None:
        """``(points (J, F), weights (J,))`` for a prior with finite support, else ``None``."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` draws of ``theta``, shape ``(n, F)``."""

    @abc.abstractmethod
    def log_Z(self, u: jax.Array) -> jax.Array:
        """``log E_theta exp(theta . u - |theta|^2 / 2)`` for ``u (..., F)``, shape ``(...)``."""
