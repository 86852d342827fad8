"""`train`: finite-``D`` online SGD of the very student and teacher of a `Setup`, started at its
initial overlaps, on the clock ``t = steps / D``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _validate as V
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..expect import psd_sqrt
from ..optim import per_circuit
from ..options import LinearGrid, SaveGrid, TimeGrid, train_steps
from ..simulate import OnlineSGD, run_training, simulate
from .observe import weight_observables
from .setup import Setup
from .theory import rule

__all__ = ["DEFAULT_TRAIN_SAVE", "REFERENCE_D", "weights_from_overlaps", "train"]

DEFAULT_TRAIN_SAVE = LinearGrid(41)
"""`train`'s save grid when none is given (in time units ``t = steps / D``)."""

REFERENCE_D = 1000
"""`train`'s default input dimension."""


def weights_from_overlaps(R: Any, Q: Any, T: Any, D: int, key: Any = 0) -> tuple[jax.Array, jax.Array]:
    """Teacher ``W* (M, D)`` and student ``W (K, D)`` with exactly ``W* W*^T / D = T``,
    ``W W*^T / D = R`` and ``W W^T / D = Q``: ``W* = sqrt(D) T^{1/2} U^T`` and
    ``W = sqrt(D) (R T^{-1/2} U^T + P^{1/2} Z^T)`` with ``P = Q - R T^{-1} R^T`` and ``[U, Z]`` a
    random orthonormal ``(D, M + K)`` frame drawn from ``key``. Traceable."""
    R, Q, T = (jnp.asarray(a, dtype=jnp.result_type(float)) for a in (R, Q, T))
    K, M = R.shape
    if D < K + M:
        raise ValueError(f"D must be at least K + M = {K + M}, got {D}")
    G = jax.random.normal(V.prng_key(key), (D, K + M), dtype=R.dtype)
    # symmetric orthonormalisation G (G^T G)^{-1/2}: a Haar-random frame
    w, E = jnp.linalg.eigh(G.T @ G)
    F = G @ ((E / jnp.sqrt(w)) @ E.T)
    U, Z = F[:, :M], F[:, M:]
    T_half = psd_sqrt(T)
    T_inv_half = jnp.linalg.inv(T_half)
    P = Q - R @ jnp.linalg.solve(T, R.T)
    W_star = jnp.sqrt(D) * T_half @ U.T
    W = jnp.sqrt(D) * (R @ T_inv_half @ U.T + psd_sqrt(P) @ Z.T)
    return W_star, W


@keyword_hints(
    "derive.train",
    batch="the minibatch is a field of the setup, derive.Setup(..., minibatch=...): it enters the theory's eta^2 term",
    dt="one SGD step advances t by 1/D (t = steps / D): choose D",
    initial="the start is the setup's R0, Q0 (and v0), or model= a network",
)
def train(
    setup: Setup,
    t1: float,
    *,
    key: Any = 0,
    D: int | None = None,
    model: dict | None = None,
    save: SaveGrid | None = None,
    event: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    return_model: bool = False,
    progress: bool = False,
) -> Any:
    """Online SGD of ``setup``'s student on fresh inputs of its data model, ``setup.minibatch``
    samples per step (their mean gradient; default one),
    labels ``teacher(W* x / sqrt(D)) + sigma xi``, to ``t1 = steps / D``: Gaussian inputs
    ``x ~ N(0, I_D)``, or (`SingleLocation`) ``L`` tokens with the signal ``theta . W* / sqrt(D)``
    added at a uniformly drawn location, the teacher given its fields ``(M, L)`` and the
    location's one-hot (`DataModel.sample`).

    Steps: ``W <- W - eta grad_W l`` and ``v <- v - (eta_v / D) grad_v l`` (the convention of
    eq. (4), Goldt et al. 2019); with tokens, ``grad_W l = sum_l (d l / d lambda_kl) x_l / sqrt(D)``
    (the docs page's eq. (6)). Teacher and student start at exactly the overlaps ``T``, ``R0``,
    ``Q0`` of the setup (`weights_from_overlaps`, frame from ``key``; ``key`` also seeds the
    samples). ``model`` (the weights ``{"W", "W_star"[, "v"]}`` that ``return_model=True``
    returns; ``D`` theirs) is trained on from instead, the clock starting at 0 again (give
    another ``key`` for fresh samples). Records `attnflow.derive.OBSERVABLES` at the save grid (default
    `DEFAULT_TRAIN_SAVE`, in time units); ``error`` is the population error of the current
    weights by the setup's quadrature. A diverging run raises `attnflow.DivergenceError`.
    ``event(t, obs) -> scalar`` (as in `solve`) sets ``t_event``: the first time it changes sign
    on the saved points, placed linearly between them (`attnflow.event_time`); the run goes on
    to ``t1``.
    ``return_model=True`` returns ``(trajectory, trained network)``: ``{"W": W, "v": v,
    "W_star": W*}``, the student's weights ``(K, D)`` (and readouts, if trained) and the
    teacher's ``(M, D)``.
    Compiled once per (``D``, number of save points, model functions): new ``t1``, rates,
    overlaps or keys reuse it.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.derive.Setup, got {setup!r:.80}")
    if model is not None:  # train on from given weights (those returned by return_model=True)
        if not isinstance(model, dict) or not {"W", "W_star"} <= set(model):
            raise ValueError(
                f"model must be a dict with 'W' and 'W_star' (and 'v'), as return_model=True gives, got {model!r:.80}"
            )
        D = int(np.shape(model["W"])[-1]) if D is None else D
        want = {"W": (setup.K, D), "W_star": (setup.M, D)}
        if setup.v0 is not None:
            want["v"] = tuple(np.shape(setup.v0))
        for name, shape in want.items():
            if name not in model or tuple(np.shape(model[name])) != shape:
                got = tuple(np.shape(model[name])) if name in model else "missing"
                raise ValueError(
                    f"model[{name!r}] must have shape {shape} (K = {setup.K}, M = {setup.M}, D = {D}), got {got}"
                )
        model = {k: jnp.asarray(model[k], dtype=jnp.result_type(float)) for k in want}
        V.finite_tree("model", model)
    D = V.positive_int("D", REFERENCE_D if D is None else D, minimum=setup.K + setup.M)
    t1 = V.finite_scalar("t1", t1)
    if t1 <= 0:
        raise ValueError(f"t1 must be positive, got {t1}")
    total, steps = train_steps(save, DEFAULT_TRAIN_SAVE, t1, 1.0 / D)
    args = (
        setup,
        model,
        V.prng_key(key),
        rule(setup),
        np.asarray(steps, np.int32),
        np.asarray(total, np.int32),
        D,
        bool(return_model),
        progress,
    )
    return run_training(_train, args, clock=1.0 / D, total=total, event=event)


@filter_jit
def _train(setup, start, key, rl, steps, total, D, return_model, progress):
    k_frame, k_run = jax.random.split(key)
    if start is None:
        W_star, W0 = weights_from_overlaps(setup.R0, setup.Q0, setup.T, D, k_frame)
    else:
        W_star, W0 = start["W_star"], start["W"]
    params = {"W": W0}
    # one rate per row of W (student unit) when eta is a vector: (K, 1) broadcasts over W's columns
    eta_w = setup.eta if jnp.ndim(setup.eta) == 0 else jnp.asarray(setup.eta)[:, None]
    if setup.v0 is not None:
        params["v"] = setup.v0 if start is None else start["v"]
        opt = per_circuit({"W": "W", "v": "v"}, {"W": eta_w, "v": setup.rate_v / D})
    else:
        opt = optax.sgd(eta_w)
    noisy = setup.noise is not None

    def sampler(k, n):
        kx, kn = jax.random.split(k)
        x, ctx = setup.data.sample(kx, n, W_star)
        xi = jax.random.normal(kn, (n,), dtype=W0.dtype) if noisy else jnp.zeros((n,), W0.dtype)
        return x, ctx, xi

    sigma = setup.noise if noisy else 0.0

    def loss(p, batch):
        x, ctx, xi = batch
        lam = setup.data.project(x, p["W"])
        nu = setup.data.project(x, W_star)
        v = p.get("v")

        def one(lam_i, nu_i, ctx_i, xi_i):
            y = setup.data.label(setup.teacher, nu_i, ctx_i) + sigma * xi_i
            return jnp.sum(setup.loss(setup.student(lam_i, v), y))

        return jnp.mean(jax.vmap(one)(lam, nu, ctx, xi))

    out = simulate(
        loss,
        params,
        opt,
        total,
        mode=OnlineSGD(sampler, setup.minibatch),
        key=k_run,
        observe=lambda p: weight_observables(p, setup, W_star, rl),
        save=TimeGrid(steps),
        clock=1.0 / D,
        progress=progress,
        throw=False,
        return_model=return_model,
        meta={"theory": "derive", "D": D, "clock": "t = steps / D", "dt": 1.0 / D, "batch": setup.minibatch},
    )
    if return_model:  # the student's weights with the teacher's, which the overlaps are measured against
        traj, trained, bad = out
        return traj, {**trained, "W_star": W_star}, bad
    return out
