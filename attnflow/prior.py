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
        """Whether ``theta`` and ``-theta`` have the same law (decided at construction; a prior made
        from traced parameters counts as not symmetric)."""

    @abc.abstractmethod
    def support(self) -> tuple[jax.Array, jax.Array] | None:
        """``(points (J, F), weights (J,))`` for a prior with finite support, else ``None``."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` draws of ``theta``, shape ``(n, F)``."""

    @abc.abstractmethod
    def log_Z(self, u: jax.Array) -> jax.Array:
        """``log E_theta exp(theta . u - |theta|^2 / 2)`` for ``u (..., F)``, shape ``(...)``."""
