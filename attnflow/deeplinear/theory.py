"""Gradient-flow theory of the two-layer linear network (Saxe, McClelland & Ganguli 2014).

With whitened inputs the population loss is ``L = 1/2 ||A - W2 W1||_F^2`` and gradient
flow with time constant ``tau`` (``tau = 1/eta`` in steps of learning rate ``eta``) is

    tau dW1/dt = W2^T (A - W2 W1),     tau dW2/dt = (A - W2 W1) W1^T.          (1)

On the balanced, mode-aligned manifold each mode strength ``u = a b`` obeys

    tau du/dt = 2 u (s - u),   u(t) = s e^{2st/tau} / (e^{2st/tau} - 1 + s/u0).    (2)

and the factors obey ``tau da/dt = b (s - a b)``, ``tau db/dt = a (s - a b)`` (3), whose
origin is a saddle with eigenvalues ``+-s / tau``. Flow (1) conserves
``W1 W1^T - W2^T W2`` (4).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def population_loss(W1: jax.Array, W2: jax.Array, A: jax.Array) -> jax.Array:
    """``1/2 ||A - W2 W1||_F^2`` (whitened inputs, constant dropped)."""
    return 0.5 * jnp.sum((A - W2 @ W1) ** 2)


def mode_strength(t: Any, s: Any, u0: Any, tau: Any = 1.0) -> jax.Array:
    """Closed form (2): ``u(t) = s e^{2st/tau} / (e^{2st/tau} - 1 + s/u0)``.

    Written as ``s / (1 - e^{-2st/tau} (1 - s/u0))`` to avoid overflow at large t.
    """
    e = jnp.exp(-2.0 * jnp.asarray(s) * jnp.asarray(t) / tau)
    return s / (1.0 - e * (1.0 - s / jnp.asarray(u0)))


def mode_field(t: Any, u: jax.Array, args: dict) -> jax.Array:
    """Eq. (2): ``du/dt = 2 u (s - u) / tau``; ``args = {"s": s, "tau": tau}``."""
    return 2.0 * u * (args["s"] - u) / args["tau"]


def factor_field(t: Any, y: dict, args: dict) -> dict:
    """Eq. (3) on the state ``{"a": a, "b": b}`` (one entry per mode)."""
    a, b = y["a"], y["b"]
    r = (args["s"] - a * b) / args["tau"]
    return {"a": b * r, "b": a * r}


def matrix_field(t: Any, W: dict, args: dict) -> dict:
    """Eq. (1) on ``{"W1": W1, "W2": W2}``; ``args = {"A": A, "tau": tau}``."""
    E = (args["A"] - W["W2"] @ W["W1"]) / args["tau"]
    return {"W1": W["W2"].T @ E, "W2": E @ W["W1"].T}


def conserved(W1: jax.Array, W2: jax.Array) -> jax.Array:
    """Eq. (4): ``W1 W1^T - W2^T W2``, constant under gradient flow (1)."""
    return W1 @ W1.T - W2.T @ W2
