"""`Setup` of the deep linear network: teacher, student width, initial strength, learning rate."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import _validate as V
from ..setup import AbstractSetup, array_field, size_field
from .data import Teacher

__all__ = ["Setup", "REFERENCE_MODES", "TEACHER_SEED"]

REFERENCE_MODES = (3.0, 2.0, 1.0, 0.5)
"""Mode strengths of the reference teacher (four modes, a decade of strengths)."""

TEACHER_SEED = 0
"""Seed of the reference teacher's singular frames ``U`` and ``V``."""


class Setup(AbstractSetup):
    """Two-layer linear network ``W2 W1`` learning a linear teacher (Saxe et al. 2014).

    Fields (numbers are arrays, so any of them can be a `attnflow.sweep` axis):

    - ``s``: the teacher's mode strengths ``s_i > 0`` (reference: `REFERENCE_MODES`);
    - ``u0``: the initial strength of every mode (balanced, aligned start, eq. 2): a number, or
      one per mode, shape ``(k,)`` like ``s`` (each mode then starts at its own ``u0_i``, in
      `solve`, `train` and the closed form `mode_strength`);
    - ``eta``: the learning rate; the gradient flow is ``dW/dt = -eta grad L`` and gradient
      descent with step ``dt`` uses the learning rate ``eta dt``, so ``t = dt * step``;
    - ``layer_ratio``: per-layer rates ``eta_1 / eta_2`` around ``eta`` (`layer_rates`:
      ``eta_1 = eta sqrt(rho)``, ``eta_2 = eta / sqrt(rho)``, default 1). From the
      weighted-balanced start `train` uses, the product moves as under the one rate
      ``sqrt(eta_1 eta_2) = eta``: `solve` and the closed form (2) are unchanged;
    - ``n_in``, ``n_out`` (static): input and output dimensions (at least the number of modes);
    - ``teacher_seed`` (static): seed of the teacher's orthonormal frames.
    """

    s: jax.Array = array_field("s (mode strengths)", REFERENCE_MODES)
    u0: jax.Array = array_field("u0 (initial mode strength)", 1e-3)
    eta: jax.Array = array_field("eta (learning rate)", 1.0)
    layer_ratio: jax.Array = array_field("layer_ratio (eta_1 / eta_2)", 1.0)
    n_in: int = size_field("n_in", 8)
    n_out: int = size_field("n_out", 6)
    teacher_seed: int = size_field("teacher_seed", TEACHER_SEED, minimum=0)

    def validate(self) -> None:
        if self.s.ndim != 1 or self.s.shape[0] == 0:
            raise ValueError(f"s must be a non-empty 1-D array of mode strengths, got shape {self.s.shape}")
        V.positive("mode strengths s", self.s)
        k = self.s.shape[0]
        if self.u0.shape not in ((), (k,)):  # a traced value's shape is known too
            raise ValueError(
                f"u0 (initial mode strength) must be a number or one per mode, shape (k,) = ({k},), "
                f"got shape {self.u0.shape}"
            )
        V.positive("u0 (initial mode strength)", self.u0)
        V.scalar("eta (learning rate)", self.eta)
        V.positive("eta (learning rate)", self.eta)
        V.scalar("layer_ratio (eta_1 / eta_2)", self.layer_ratio)
        V.positive("layer_ratio (eta_1 / eta_2)", self.layer_ratio)
        V.positive_int("n_in", self.n_in, minimum=self.s.shape[0])
        V.positive_int("n_out", self.n_out, minimum=self.s.shape[0])
        # teacher, two weight matrices and their gradients and optimizer copies, float64
        V.fits_in_memory(
            f"a teacher of n_out x n_in = {self.n_out} x {self.n_in} with {k} modes",
            8 * 6 * (self.n_out * self.n_in + k * (self.n_in + self.n_out)),
        )

    def initial_state(self) -> jax.Array:
        """The start of `attnflow.deeplinear.solve`: every mode strength at ``u0`` (shape of ``s``)."""
        return jnp.broadcast_to(self.u0, self.s.shape)

    @property
    def layer_rates(self) -> dict[str, jax.Array]:
        """The learning rate of each layer, ``{"W1": eta sqrt(rho), "W2": eta / sqrt(rho)}``
        (``rho = layer_ratio``)."""
        root = jnp.sqrt(self.layer_ratio)
        return {"W1": self.eta * root, "W2": self.eta / root}

    @property
    def teacher(self) -> Teacher:
        """The teacher ``A = U diag(s) V^T`` (frames drawn from ``teacher_seed``)."""
        return Teacher(self.s, self.n_in, self.n_out, key=self.teacher_seed)
