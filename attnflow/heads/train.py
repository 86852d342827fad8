"""`train`: finite-``D`` online SGD of the multi-head model of a `Setup`, started at the overlaps of
its initial condition."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..expect import psd_sqrt
from ..optim import label_by_path, per_circuit
from ..options import LinearGrid, SaveGrid, TimeGrid, _caller_outside_attnflow, train_steps
from ..simulate import OnlineSGD, check_start, run_training, simulate
from .data import SingleLocationTask
from .model import MultiHead, sample_loss
from .observe import _observables_with_spikes
from .setup import REFERENCE_D, Setup, check_overlaps

__all__ = [
    "DEFAULT_TRAIN_SAVE",
    "EVAL_SAMPLES",
    "EVAL_SEED",
    "TASK_SEED",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "keys_from_overlaps",
    "train",
]

DEFAULT_TRAIN_SAVE = LinearGrid(41)
"""`train`'s save grid when none is given (in time units ``t = steps / D``)."""

TASK_SEED = 1
"""Seed of the spikes (and of the scalar readout) of the task `train` builds."""

EVAL_SEED = 12345
"""Seed of the held-out batch on which `train` estimates ``error`` and ``attention``."""

EVAL_SAMPLES = 2000
"""Size of `train`'s held-out batch."""

REFERENCE_T = 12.0
"""Horizon of the documented comparison `TRAIN_TOLERANCE` at ``D = 1000``: through the
specialisation of the reference `Setup`."""

TRAIN_TOLERANCE = MappingProxyType({"M": 0.12, "Q": 0.1, "specialisation": 0.1, "error": 0.03, "attention": 0.015})
"""Bound on ``af.compare(solve(Setup(), REFERENCE_T), train(Setup(), REFERENCE_T, key=k))`` per
observable at the
default size ``D = 1000``: the finite-size error ``~ D^{-1/2}`` of the trajectory (about ``3 / sqrt(D)``
to ``4 / sqrt(D)`` here, most of it from the ``O(1)`` shift of the escape time that the SGD noise
causes), the sampling error of the held-out batch, and a bias of the finite-``D`` ``error`` of order
``1 / D`` against its ``D -> infinity`` value ``E(M, Q)`` (see the heads page). Over keys 0-15 the
largest gaps were 0.103
(``M``), 0.090 (``Q``), 0.084 (``specialisation``), 0.017 (``error``), 0.0095 (``attention``)."""


def keys_from_overlaps(M: Any, Q: Any, spikes: Any, key: Any = 0) -> jax.Array:
    """Keys ``K (H, D)`` with exactly ``K K*^T / D = M`` and ``K K^T / D = Q``:
    ``K = sqrt(D) (M U^T + P^{1/2} Z^T)`` with ``U = K*^T / sqrt(D)``, ``P = Q - M M^T`` and ``Z`` a
    random orthonormal ``(D, H)`` frame orthogonal to the spikes (from ``key``). Traceable."""
    M, Q, spikes = jnp.asarray(M, dtype=float), jnp.asarray(Q, dtype=float), jnp.asarray(spikes, dtype=float)
    if M.ndim != 2 or spikes.ndim != 2:
        raise ValueError(f"M must be (H, F) and spikes (F, D), got {M.shape} and {spikes.shape}")
    (H, F), D = M.shape, spikes.shape[1]
    check_overlaps("keys_from_overlaps", M, Q, H, F)
    if spikes.shape[0] != F or D < F + H:
        raise ValueError(f"spikes must be (F = {F}, D >= F + H = {F + H}), got {spikes.shape}")
    U = spikes.T / jnp.sqrt(D)
    Z = jax.random.normal(V.prng_key(key), (D, H))
    Z = Z - U @ (U.T @ Z)
    # symmetric orthonormalisation Z (Z^T Z)^{-1/2} (a Haar-random frame, like the Q factor of a QR; XLA:CPU
    # can stall on a QR of this projected matrix inside a vmap sharded over several CPU devices)
    w, E = jnp.linalg.eigh(Z.T @ Z)
    Z = Z @ ((E / jnp.sqrt(w)) @ E.T)
    return jnp.sqrt(D) * (M @ U.T + psd_sqrt(Q - M @ M.T) @ Z.T)


def _default_D(setup: Setup) -> int:
    """The dimension `train` uses when given none: the ``D`` of ``setup.init`` when it has one
    (`FiniteDDraw`, `SymmetricSeed`), else `attnflow.heads.REFERENCE_D`. A traced one (a setup
    built inside a sweep or a jit holds tracers there, even for a literal ``D``) cannot size the
    weights: `REFERENCE_D` with a warning, since another D than the draw's trains another
    network than ``solve`` starts."""
    D = getattr(setup.init, "D", None)
    if D is None:
        return REFERENCE_D
    if V.any_traced(D):
        warnings.warn(
            f"heads.train: the D of setup.init ({type(setup.init).__name__}) is traced here (a setup built "
            f"inside a sweep or jit holds tracers, even for a literal D), and the network's size must be "
            f"concrete: training at REFERENCE_D = {REFERENCE_D}. Pass train(setup, t1, D=...) (the draw's D), "
            "or build the setup outside the swept function",
            stacklevel=_caller_outside_attnflow(),
        )
        return REFERENCE_D
    return int(round(float(D)))


@keyword_hints(
    "heads.train",
    batch="the minibatch is a field of the setup, heads.Setup(minibatch=...): it enters the theory's eta^2 term",
    dt="one SGD step advances t by 1/D (t = steps / D): choose D",
    initial="the start is setup.init (heads.Overlaps(M, Q), FiniteDDraw, SymmetricSeed), or model= a network",
)
def train(
    setup: Setup,
    t1: float,
    *,
    key: Any = 0,
    D: int | None = None,
    model: MultiHead | None = None,
    save: SaveGrid | None = None,
    eval_samples: int = EVAL_SAMPLES,
    dtype: Any = None,
    event: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    return_model: bool = False,
    location: int | None = None,
    progress: bool = False,
) -> Any:
    """Online SGD of ``setup``'s model in dimension ``D`` to time ``t1`` on the clock
    ``t = steps / D`` of `attnflow.heads.solve`. ``D = None`` (the default) is the ``D`` of
    ``setup.init`` (`FiniteDDraw`, `SymmetricSeed`) when it has a concrete one, else
    `attnflow.heads.REFERENCE_D`.

    The keys start with exactly the overlaps ``(M0, Q0)`` of ``setup.init``
    (`keys_from_overlaps`), so SGD and the ODE start at the same point (a ``D`` other than the
    draw's keeps the draw's overlaps: every size starts where the theory does); ``key`` seeds the key frame
    and the samples (one fresh batch of ``setup.minibatch`` per step; may be traced, a sweep over
    seeds). Keys move at ``eta``, learned activation parameters at ``eta_b / D``, with weight decay
    ``-eta gamma k / D`` per step. ``model`` (a `MultiHead` of this setup, e.g. one returned by
    ``return_model=True``; ``D`` its keys' dimension) is trained on from instead of the start,
    the clock starting at 0 again (give another ``key`` for fresh samples).
    Records `attnflow.heads.OBSERVABLES` at ``save`` (default
    `DEFAULT_TRAIN_SAVE`, time units); ``error`` and ``attention`` on a held-out batch of
    ``eval_samples`` (``0``: not recorded). ``dtype``: of tokens and keys (default JAX's float).

    Against ``solve`` of the same setup the gap shrinks as ``D^{-1/2}`` away from an escape: at
    the defaults (``Setup()``, ``t1 = 12``, ``D = 1000``) it stays within `TRAIN_TOLERANCE`.
    Across a specialisation the SGD noise re-seeds the unstable direction, so the escape time
    differs from the ODE's (started from the same overlaps) by an ``O(1)`` amount that does not
    shrink with ``D``; the shapes after it match (``heads`` docs page, phases). A diverging
    run raises `attnflow.DivergenceError` naming the step.
    ``event(t, obs) -> scalar`` (as in `solve`) sets ``t_event``: the first time it changes sign
    on the saved points, placed linearly between them (`attnflow.event_time`); the run goes on
    to ``t1``.
    ``return_model=True`` returns ``(trajectory, trained network)``: the `MultiHead` at ``t1``
    (keys ``(H, D)`` and activation).
    ``location``: the signal's token, ``None`` (default) uniform per sample, or an index in
    ``[0, L)`` fixed for every sample (the model has no positional information, so the law of
    the dynamics, and the ODE, are the same).
    Compiled once per (``D``, number of save points, setup structure, ``eval_samples``, dtype):
    new ``t1``, learning rates, prior parameters or initial conditions reuse it.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r}")
    if not setup.sgd_noise:
        raise ValueError(
            "sgd_noise=False is the gradient flow of the theory (no eta^2 term); train runs online SGD, whose "
            "noise is always there: train the setup with sgd_noise=True, and compare with solve of either"
        )
    if model is not None and D is None and isinstance(model, MultiHead):
        D = int(model.K.shape[-1])  # the network's own dimension
    D = V.positive_int("D", _default_D(setup) if D is None else D, minimum=setup.F + setup.H)
    eval_samples = V.positive_int("eval_samples", eval_samples, minimum=0)
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating type, got {dtype}")
    if location is not None:
        location = V.positive_int("location", location, minimum=0, maximum=setup.L - 1)
    dt = 1.0 / D
    total, steps = train_steps(save, DEFAULT_TRAIN_SAVE, t1, dt)
    M0, Q0 = setup.initial_overlaps()
    check_overlaps("initial condition", M0, Q0, setup.H, setup.F)
    if model is not None:  # train on from a given network (one returned by return_model=True)
        check_start(
            model, MultiHead(jnp.zeros((setup.H, D)), setup.activation), f"a MultiHead of this setup at D = {D}"
        )
    args = (
        setup,
        model,
        M0,
        Q0,
        V.prng_key(key),
        D,
        np.asarray(steps, np.int32),
        np.asarray(total, np.int32),
        eval_samples,
        dtype.name,
        bool(return_model),
        location,
        progress,
    )
    return run_training(_train, args, clock=dt, total=total, event=event)


def _task_of(setup: Setup, D: int, location: int | None, dtype: Any) -> SingleLocationTask:
    """The task `train` runs ``setup`` on at dimension ``D``: its spikes drawn from `TASK_SEED`
    (so `attnflow.heads.model_observables` measures a returned network against the same ones)."""
    return SingleLocationTask(
        D, setup.L, setup.prior, key=TASK_SEED, location=location, target=setup.target, dtype=dtype
    )


def _label(learned):
    def rule(path):
        if path.startswith(".K"):
            return "keys"
        return "act" if path.split(".")[-1] in learned else "frozen"

    return rule


@filter_jit
def _train(setup, start, M0, Q0, key, D, steps, total, eval_samples, dtype, return_model, location, progress):
    task = _task_of(setup, D, location, dtype)
    k_frame, k_sgd = jax.random.split(key)
    K = keys_from_overlaps(M0, Q0, task.spikes, key=k_frame).astype(dtype)
    activation = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, setup.activation
    )
    model = MultiHead(K, activation)
    if start is not None:  # a given network, in the run's dtype
        model = jax.tree_util.tree_map(
            lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, start, is_leaf=lambda x: x is None
        )
    labels = label_by_path(model, _label(activation.learned))
    optimizer = per_circuit(labels, {"keys": setup.eta, "act": setup.rate_b / D, "frozen": None}, allow_unused=True)
    target, decay = setup.target, setup.weight_decay / D

    def loss(m, batch):
        return sample_loss(m, batch, target) + 0.5 * decay * jnp.sum(m.K**2)

    if eval_samples:
        held_out = task.sample(jax.random.PRNGKey(EVAL_SEED), eval_samples)

        def observe(m):
            return _observables_with_spikes(m, task.spikes, target.loss, held_out)
    else:

        def observe(m):
            out = _observables_with_spikes(m, task.spikes, target.loss, task.sample(jax.random.PRNGKey(EVAL_SEED), 1))
            return {k: v for k, v in out.items() if k not in ("error", "attention")}

    return simulate(
        loss,
        model,
        optimizer,
        total,
        mode=OnlineSGD(task.sample, setup.minibatch),
        key=k_sgd,
        observe=observe,
        save=TimeGrid(steps),
        clock=1.0 / D,
        progress=progress,
        throw=False,
        return_model=return_model,
        meta={
            "theory": "heads",
            "clock": "t = steps / D",
            "D": D,
            "dt": 1.0 / D,
            "batch": setup.minibatch,
            "eval_samples": eval_samples,
        },
    )
