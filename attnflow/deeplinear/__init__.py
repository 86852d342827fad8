"""Deep linear networks (Saxe, McClelland & Ganguli 2014): the core's validation theory.

A two-layer linear network ``W2 W1`` trained by gradient flow on whitened inputs: each
input-output mode of strength ``s`` follows the closed-form sigmoid
``u(t) = s e^{2st/tau} / (e^{2st/tau} - 1 + s/u0)``.
"""

from .data import Teacher
from .model import TwoLayerLinear
from .theory import conserved, factor_field, matrix_field, mode_field, mode_strength, population_loss

__all__ = [
    "Teacher",
    "TwoLayerLinear",
    "conserved",
    "factor_field",
    "matrix_field",
    "mode_field",
    "mode_strength",
    "population_loss",
]
