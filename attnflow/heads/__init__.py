"""attnflow.heads: head specialisation in the high-dimensional single-location model (spec `heads.md`)."""

from .data import AnisotropicGaussian, Discrete, FlippedSpike, PointMass, Prior, SingleLocationTask, bayes_posterior, bayes_risk
from .theory import (Activation, BayesSoftmax, FieldBank, HeadsDynamics, MultiHead, Softmax, Softmax1, feature_escape_times,
                     from_finite_D, keys_from_overlaps, online_sgd, oracle_config, order_parameter_field, overlaps, predicted_escape_time, prune, risk,
                     sample_loss, sgd_optimizer, softmax_floor, solve_order_parameters, specialisation, specialisation_spectrum,
                     symmetric_seed, symmetrise, unspecialised_point)

__all__ = ["Activation", "AnisotropicGaussian", "BayesSoftmax", "Discrete", "FieldBank", "FlippedSpike", "HeadsDynamics",
           "MultiHead", "PointMass", "Prior", "SingleLocationTask", "Softmax", "Softmax1", "bayes_posterior", "bayes_risk",
           "feature_escape_times", "from_finite_D", "keys_from_overlaps", "online_sgd", "oracle_config", "order_parameter_field", "overlaps",
           "predicted_escape_time", "prune", "risk", "sample_loss", "sgd_optimizer", "softmax_floor", "solve_order_parameters",
           "specialisation", "specialisation_spectrum", "symmetric_seed", "symmetrise", "unspecialised_point"]
