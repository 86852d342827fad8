"""Observables of a derived model, recorded alike by `solve` and `train`."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import jax

from .setup import Setup

__all__ = ["OBSERVABLES", "model_observables", "state_observables", "weight_observables"]

OBSERVABLES = MappingProxyType(
    {
        "R": "student-teacher overlaps R = W W*^T / D (shape (K, M))",
        "Q": "student-student overlaps Q = W W^T / D (shape (K, K))",
        "v": "the readout parameters (only for a setup with v0)",
        "error": "generalisation error E[loss(student(lambda, v), teacher(nu))], noise-free label (eq. 5)",
    }
)
"""What `attnflow.derive.solve` and `attnflow.derive.train` both record."""


def state_observables(y: dict, setup: Setup, rule: Any = None) -> dict[str, jax.Array]:
    """`OBSERVABLES` of the order parameters ``y = {"R", "Q"[, "v"]}`` of ``setup`` (the state
    first, as `attnflow.qkov.state_observables`); ``error`` by eq. (5) with the quadrature ``rule``
    (default `attnflow.derive.rule` of the setup)."""
    from .theory import expectations
    from .theory import rule as setup_rule

    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.derive.Setup (state_observables(y, setup)), got {setup!r:.80}")
    rule = setup_rule(setup) if rule is None else rule
    out = dict(y)
    out["error"] = expectations(setup, y["R"], y["Q"], y.get("v"), rule)["error"]
    return out


def weight_observables(params: dict, setup: Setup, W_star: jax.Array, rule: Any = None) -> dict[str, jax.Array]:
    """`OBSERVABLES` of finite-``D`` weights ``params = {"W"[, "v"]}`` of ``setup`` against the
    teacher ``W_star`` (the weights first, as in `state_observables`; ``rule`` as there). The local fields of Gaussian
    inputs are exactly Gaussian with covariance given by the measured overlaps, so ``error`` is the
    population error of these weights (up to quadrature), not a test-set estimate."""
    W = params["W"]
    D = W.shape[1]
    y = {"R": W @ W_star.T / D, "Q": W @ W.T / D}
    if "v" in params:
        y["v"] = params["v"]
    return state_observables(y, setup, rule)


def model_observables(model: dict, setup: Setup, rule: Any = None) -> dict[str, jax.Array]:
    """`OBSERVABLES` of the trained network ``model = {"W", "W_star"[, "v"]}`` that
    `attnflow.derive.train` returns with ``return_model=True`` (the student against the
    teacher it holds; `weight_observables`): what `train` records, the signature of every
    package's ``model_observables(model, setup)``."""
    if not isinstance(model, dict) or not {"W", "W_star"} <= set(model):
        raise ValueError(
            f"model must be a dict with 'W' and 'W_star' (and 'v'), as train(..., return_model=True) gives, "
            f"got {model!r:.80}"
        )
    return weight_observables({k: v for k, v in model.items() if k != "W_star"}, setup, model["W_star"], rule)
