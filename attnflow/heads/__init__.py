"""attnflow.heads: head specialisation in the high-dimensional single-location model (spec `heads.md`)."""

from .data import AnisotropicGaussian, Discrete, FlippedSpike, PointMass, SingleLocationTask, bayes_posterior, bayes_risk
from .theory import (BayesSoftmax, FieldBank, MultiHead, Softmax, Softmax1, oracle_config, order_parameter_field, overlaps, risk,
                     sample_loss, softmax_floor, solve_order_parameters)

__all__ = ["AnisotropicGaussian", "BayesSoftmax", "Discrete", "FieldBank", "FlippedSpike", "MultiHead", "PointMass",
           "SingleLocationTask", "Softmax", "Softmax1", "bayes_posterior", "bayes_risk", "oracle_config", "order_parameter_field",
           "overlaps", "risk", "sample_loss", "softmax_floor", "solve_order_parameters"]
