"""Observables of the deep linear network, recorded alike by `solve` and `train`."""

from __future__ import annotations

from types import MappingProxyType

import jax
import jax.numpy as jnp

from .data import Teacher
from .model import TwoLayerLinear, check_fits
from .setup import Setup
from .theory import population_loss

__all__ = ["OBSERVABLES", "model_observables", "mode_observables"]

OBSERVABLES = MappingProxyType(
    {
        "u": "mode strengths u_i = U_i^T W2 W1 V_i, one per teacher mode (shape (k,))",
        "loss": "population loss 1/2 E|A x - W2 W1 x|^2 = 1/2 ||A - W2 W1||_F^2 (whitened inputs x)",
    }
)
"""What `attnflow.deeplinear.solve` and `attnflow.deeplinear.train` both record."""


def mode_observables(u: jax.Array, s: jax.Array) -> dict[str, jax.Array]:
    """`OBSERVABLES` of the mode state ``u``: on the aligned manifold ``W2 W1 = U diag(u) V^T``,
    so the loss is ``1/2 sum_i (s_i - u_i)^2``."""
    return {"u": u, "loss": 0.5 * jnp.sum((s - u) ** 2, axis=-1)}


def model_observables(model: TwoLayerLinear, setup: Setup | Teacher) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a network's weights (the network `train` returns with
    ``return_model=True``) for the teacher of ``setup`` (its `Setup`, or the `Teacher` itself):
    what `train` records. ``ValueError`` for a ``model`` that is not a `TwoLayerLinear` of the
    teacher's sizes (``W1`` ``(h, n_in)``, ``W2`` ``(n_out, h)``), as in `train`."""
    teacher = setup.teacher if isinstance(setup, Setup) else setup
    if not isinstance(teacher, Teacher):
        raise ValueError(f"setup must be an attnflow.deeplinear.Setup (or its Teacher), got {setup!r:.80}")
    check_fits(model, teacher.Vt.shape[1], teacher.U.shape[0])
    return {"u": teacher.modes(model.product), "loss": population_loss(model.W1, model.W2, teacher.A)}
