"""attnflow.qkov: faster query-key learning sharpens attention (spec `qkov.md`)."""

from .theory import (
    PARAMETRISATIONS, QKOVParams, alpha, asymptotics, authors_rk4, balance_diagnostic, balanced_factorise,
    effective_rate, factor_conserved, first_integral, invariant, loss, loss_to_margin, reduced_field,
    solve_reduced, state_at_loss, upper_bounds,
)

__all__ = [
    "PARAMETRISATIONS", "QKOVParams", "alpha", "asymptotics", "authors_rk4", "balance_diagnostic",
    "balanced_factorise", "effective_rate", "factor_conserved", "first_integral", "invariant", "loss",
    "loss_to_margin", "reduced_field", "solve_reduced", "state_at_loss", "upper_bounds",
]
