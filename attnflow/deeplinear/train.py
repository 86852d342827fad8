"""`train`: the two-layer network of a `Setup`, trained by gradient descent or online SGD."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._errors import warn_traced
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..optim import label_by_path, per_circuit
from ..options import LinearGrid, SaveGrid, TimeGrid, _caller_outside_attnflow, train_steps
from ..simulate import FullBatch, OnlineSGD, run_training, simulate
from .model import TwoLayerLinear, check_fits
from .observe import model_observables
from .setup import Setup
from .theory import conserved, population_loss

__all__ = ["train", "DEFAULT_TRAIN_SAVE", "REFERENCE_T", "TRAIN_TOLERANCE"]

DEFAULT_TRAIN_SAVE = LinearGrid(60)
"""`train`'s save grid when none is given."""

REFERENCE_T = 8.0
"""Horizon of the documented comparison `TRAIN_TOLERANCE`: every mode of the reference `Setup`
learned."""

TRAIN_TOLERANCE = MappingProxyType({"u": 0.08, "loss": 0.15})
"""Bound on ``af.compare(solve(Setup(), REFERENCE_T), train(Setup(), REFERENCE_T))`` per observable
(maximum
absolute gap on `DEFAULT_TRAIN_SAVE`): gradient descent at the default ``dt = 0.01`` is the Euler
scheme of the mode ODE, so it lags the flow by ``O(dt)``; measured 0.066 (``u``) and 0.13
(``loss``), out of a largest mode strength of 3 and an initial loss of 7.1."""


@keyword_hints(
    "deeplinear.train", initial="the start is a field of the setup, deeplinear.Setup(u0=...), or model= a network"
)
def train(
    setup: Setup,
    t1: float,
    *,
    key: Any = 0,
    dt: float = 0.01,
    batch: int | None = None,
    model: TwoLayerLinear | None = None,
    save: SaveGrid | None = None,
    event: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    return_model: bool = False,
    progress: bool = False,
    conserved: bool = False,
) -> Any:
    """The network ``W2 W1`` of ``setup`` trained to time ``t1`` from the balanced, aligned start
    (``W2 W1 = u0 U V^T``, the start of the mode ODE).

    Each step advances the clock by ``dt`` with learning rate ``eta dt``: gradient descent on
    the population loss (``batch=None``, the Euler scheme of the flow that `solve` integrates,
    error ``O(dt)``), or online SGD on ``batch`` fresh whitened Gaussian inputs per step
    (``key`` seeds the draws; the same mean gradient, plus noise). ``model`` (a
    `TwoLayerLinear` of the teacher's sizes, any width, e.g. one returned by
    ``return_model=True``) is trained on from instead, the clock starting at 0 again. Records
    `attnflow.deeplinear.OBSERVABLES` at the save grid (default `DEFAULT_TRAIN_SAVE`, in time
    units); ``conserved=True`` also records ``conserved``, eq. (4) weighted by the per-layer
    rates (`conserved` with ``setup.layer_ratio``: 0 along gradient descent from the aligned
    start, to rounding; from another ``model`` it drifts by ``O(dt^2)`` a step). A diverging run raises
    `attnflow.DivergenceError` naming the step.
    ``event(t, obs) -> scalar`` (as in `solve`) sets ``t_event``: the first time it changes sign
    on the saved points, placed linearly between them (`attnflow.event_time`); the run goes on
    to ``t1``.

    ``return_model=True`` returns ``(trajectory, trained network)``: the `TwoLayerLinear` at ``t1``.

    Compiled once per (``dt``, number of save points, ``batch``, sizes): new ``t1``, learning
    rates, mode strengths or initial strengths reuse it; ``key`` may be traced (a sweep over
    seeds).
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.deeplinear.Setup, got {setup!r}")
    if batch is not None:
        batch = V.positive_int("batch", batch)
    if model is not None:
        check_fits(model, setup.n_in, setup.n_out)
    total, steps = train_steps(save, DEFAULT_TRAIN_SAVE, t1, dt)
    # the map u -> u (1 + eta dt (s - u))^2 has slope 1 - 2 eta dt s at u = s: past eta dt s = 1 it
    # settles into an oscillation (or blows up) instead of u = s, with nothing non-finite to stop it
    unstable = "gradient descent with eta dt s_max >= 1: it does not converge to u = s (it oscillates or diverges)"
    if not V.any_traced((setup.eta, setup.s)):
        rate = float(setup.eta) * float(dt) * float(np.max(np.asarray(setup.s)))
        if rate >= 1.0:
            warnings.warn(
                f"gradient descent with eta dt s_max = {rate:.3g} >= 1: it does not converge to u = s "
                "(it oscillates or diverges); lower eta or dt",
                stacklevel=_caller_outside_attnflow(),
            )
    else:  # a sweep over eta: the point keeps its values and the sweep names it (SweepResult.warnings)
        warn_traced(lambda: setup.eta * dt * jnp.max(setup.s) >= 1.0, unstable)
    key = V.prng_key(key)
    args = (
        setup,
        model,
        key,
        np.asarray(steps, np.int32),
        np.asarray(total, np.int32),
        float(dt),
        batch,
        bool(return_model),
        progress,
        bool(conserved),
    )
    return run_training(_train, args, clock=dt, total=total, event=event)


@filter_jit
def _train(setup, model, key, steps, total, dt, batch, return_model, progress, record_conserved):
    teacher = setup.teacher
    model = TwoLayerLinear.aligned(teacher, setup.u0, layer_ratio=setup.layer_ratio) if model is None else model
    if batch is None:
        mode = FullBatch()

        def loss(m, _):
            return population_loss(m.W1, m.W2, teacher.A)
    else:
        mode = OnlineSGD(teacher.sample, batch)

        def loss(m, b):
            x, y = b
            return 0.5 * jax.numpy.mean(jax.numpy.sum((y - m(x)) ** 2, axis=-1))

    return simulate(
        loss,
        model,
        per_circuit(
            label_by_path(model, {".W1": "W1", ".W2": "W2"}), {k: v * dt for k, v in setup.layer_rates.items()}
        ),
        total,
        mode=mode,
        key=key,
        observe=lambda m: {
            **model_observables(m, teacher),
            **({"conserved": conserved(m.W1, m.W2, setup.layer_ratio)} if record_conserved else {}),
        },
        save=TimeGrid(steps),
        clock=dt,
        progress=progress,
        throw=False,
        return_model=return_model,
        meta={
            "theory": "deeplinear",
            "clock": "t = steps * dt; gradient flow dW/dt = -eta grad L",
            "dt": dt,
            "batch": batch,
        },
    )
