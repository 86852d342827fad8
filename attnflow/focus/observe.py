"""Observables of focus and dilution, recorded alike by `solve` and `train`: population
quantities of the weights ``theta`` (so the finite-context network is measured on the same
scale as the flow)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

from .metrics import redistribution, token_entropy
from .model import OneLayerAttention, composites
from .setup import Setup
from .theory import attention, population_loss

__all__ = ["OBSERVABLES", "model_observables", "record", "theta_observables"]

OBSERVABLES = MappingProxyType(
    {
        "loss": "population (infinite-context) loss L(theta), eq. (P2)",
        "entropy": "pi-weighted token-level attention entropy sum_q pi_q H(A_q) of the population attention (P1)",
        "A": "population attention matrix A (d, d), rows = query token, eq. (P1)",
        "norm_M": "Frobenius norm of M = W0 W1 (grows at 2 sigma in Stage I)",
        "norm_Phi": "Frobenius norm of Phi = W0 WQ WK^T W0^T (grows in Stage II)",
        "sv_W0": "singular values of W0, largest first (min(d, m),); a second one grows in Stage IV",
        "q_plus": "|alpha1^T (WQ + WK)| / sqrt 2: the unstable attention mode at theta_c^1 (grows at c)",
        "kappa": "(alpha1^T WQ) . (alpha1^T WK): the rank-one scale of Phi ~ kappa gamma gamma^T",
        "D": "redistribution coordinate (1 - pi_1) gamma_1 - pi_1 sum_{i>=2} gamma_i, eq. (R6)",
    }
)
"""What `attnflow.focus.solve` and `attnflow.focus.train` both record (population quantities of
the weights, whichever way they were trained)."""


def theta_observables(theta: dict, setup: Setup) -> dict[str, jax.Array]:
    """`OBSERVABLES` of the weights ``theta`` under ``setup``'s chain and ``tau``."""
    chain = setup.chain
    A = attention(theta, chain.pi, setup.tau)
    M, Phi = composites(theta)
    red = redistribution(theta, chain.pi)
    return {
        "loss": population_loss(theta, chain, setup.tau),
        "entropy": token_entropy(A, chain.pi),
        "A": A,
        "norm_M": jnp.linalg.norm(M),
        "norm_Phi": jnp.linalg.norm(Phi),
        "sv_W0": jnp.linalg.svd(theta["W0"], compute_uv=False),
        "q_plus": red["q_plus"],
        "kappa": red["kappa"],
        "D": red["D"],
    }


def model_observables(model: OneLayerAttention, setup: Setup) -> dict[str, jax.Array]:
    """`OBSERVABLES` of a network's weights (the network `train` returns with
    ``return_model=True``) under ``setup``'s chain: what `train` records."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.focus.Setup, got {setup!r:.80}")
    return theta_observables(model.theta, setup)


def _flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def record(theta: dict, setup: Setup, observe: Callable[[dict, Setup], Mapping] | None = None) -> dict[str, Any]:
    """`theta_observables` plus the user's ``observe(theta, setup)`` (nested mappings flattened to
    dotted names, ``{"a": {"b": x}}`` to ``"a.b"``). A user name equal to one of `OBSERVABLES`
    raises ``ValueError``."""
    out = theta_observables(theta, setup)
    if observe is None:
        return out
    extra = observe(theta, setup)
    if not isinstance(extra, Mapping):
        raise ValueError(f"observe(theta, setup) must return a mapping name -> array, got {type(extra).__name__}")
    extra = _flatten(extra)
    clash = sorted(set(extra) & set(out))
    if clash:
        raise ValueError(f"observe returns {clash}, already recorded as focus.OBSERVABLES; rename them")
    out.update(extra)
    return out
