"""`train`: the one-layer network of a `Setup`, trained by online SGD on finite contexts."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import equinox as eqx
import jax
import numpy as np
import optax

from .. import _validate as V
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..options import LogGrid, SaveGrid, TimeGrid, _caller_outside_attnflow, train_steps
from ..simulate import OnlineSGD, run_training, simulate
from .data import MarkovChain, random_windows
from .model import OneLayerAttention, next_token_loss
from .observe import record
from .setup import Setup

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CONTEXT",
    "DEFAULT_DT",
    "DEFAULT_TRAIN_SAVE",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "train",
]

DEFAULT_TRAIN_SAVE = LogGrid(60, t_min=0.02, fit_span=True)
"""`train`'s save grid when none is given (read in time units, laid on the step axis)."""

DEFAULT_DT = 0.02
"""Time per SGD step (learning rate ``eta dt``)."""

DEFAULT_CONTEXT = 256
"""Context length ``s`` (tokens before the predicted one)."""

DEFAULT_BATCH = 64
"""Contexts per SGD step."""

REFERENCE_T = 40.0
"""Horizon of the documented comparison `TRAIN_TOLERANCE`: Stage I and the start of the ``H(pi)``
plateau at the reference `Setup`."""

TRAIN_TOLERANCE = MappingProxyType({"loss": 0.03, "sv_W0": 0.05, "entropy": 1e-3})
"""``af.compare(solve(Setup(), REFERENCE_T), train(Setup(), REFERENCE_T, key=k))`` stays below
these (maximum absolute gap over the save grid) for the default options of `train`. The gap
in ``loss`` and ``sv_W0`` is mostly the Euler delay of the Stage I escape (``O(dt)``); the
attention is frozen in Stage I, so the ``entropy`` gap is tiny."""


class _ChainContexts(eqx.Module):
    chain: MarkovChain
    length: int = eqx.field(static=True)
    start: Literal["uniform", "pi"] = eqx.field(static=True)
    burn_in: int = eqx.field(static=True, default=0)

    def __call__(self, key: jax.Array, batch_size: int) -> jax.Array:
        return self.chain.sample(key, batch_size, self.length, self.start, self.burn_in)


class _StreamContexts(eqx.Module):
    tokens: jax.Array
    length: int = eqx.field(static=True)

    def __call__(self, key: jax.Array, batch_size: int) -> jax.Array:
        return random_windows(key, self.tokens, batch_size, self.length)


MIXING_FRACTION = 0.1
"""`train` warns when the chain's autocorrelation time (`autocorrelation_time`) exceeds this
fraction of the context: the population flow `solve` integrates assumes key counts
proportional to ``pi``, which a sequence of a slowly mixing chain does not have."""


def autocorrelation_time(P: Any) -> float:
    """``max Re (1 + lambda) / (1 - lambda)`` over the eigenvalues ``lambda != 1`` of ``P`` (the
    stationary one left out; ``inf`` for a second unit eigenvalue, a reducible chain): the
    integrated autocorrelation time of the slowest mode, by which the variance of a sequence's
    token counts exceeds that of i.i.d. draws (1 for i.i.d. draws, ``(1 + lam) / (1 - lam)`` for
    the lazy chain). Anti-correlated (``lambda < 0``) and periodic modes (``|lambda| = 1``,
    ``lambda != 1``) give less than 1 or 0: their counts are closer to ``pi`` than i.i.d. ones."""
    ev = np.linalg.eigvals(np.asarray(P, dtype=float))
    ev = np.delete(ev, np.argmin(np.abs(ev - 1.0)))  # the stationary eigenvalue
    if ev.size == 0:
        return 0.0
    gap = np.abs(1.0 - ev)
    if np.any(gap <= 1e-12):
        return float("inf")
    return float(max(np.max(np.real((1.0 + ev) / (1.0 - ev))), 0.0))


def _warn_slow_mixing(setup: Setup, context: int) -> None:
    """A `UserWarning` when ``setup``'s chain mixes slowly against ``context`` (concrete chains)."""
    P = setup.chain.P
    if V.any_traced(P):
        return
    t_corr = autocorrelation_time(P)
    if t_corr > MIXING_FRACTION * context:
        warnings.warn(
            f"the chain's autocorrelation time is about {t_corr:.3g} tokens (focus.autocorrelation_time), more "
            f"than {MIXING_FRACTION:g} of the context ({context}): a sequence's key counts are not proportional to "
            "pi, so train departs from solve's population flow (a lazy chain with lam near 1; use a longer context "
            "or a faster-mixing chain)",
            stacklevel=_caller_outside_attnflow(),
        )


def _check_model(model: OneLayerAttention, setup: Setup) -> None:
    """``ValueError`` unless ``model`` fits ``setup``: the same ``d``, ``m``, ``mk`` and (where both
    are concrete) ``tau``, finite weights. `train` builds its network from ``setup.tau``, so a
    model's own ``tau`` would otherwise be dropped without a word."""
    (d, m), mk = model.W0.shape, model.WQ.shape[1]
    if (d, m, mk) != (setup.d, setup.m, setup.mk):
        raise ValueError(
            f"model has d = {d}, m = {m}, mk = {mk} (W0 {model.W0.shape}, WQ {model.WQ.shape}) but the setup has "
            f"d = {setup.d}, m = {setup.m}, mk = {setup.mk}: build the Setup with m=model.W0.shape[1], "
            "mk=model.WQ.shape[1]" + (f" and a chain of {d} tokens" if d != setup.d else "")
        )
    V.finite_tree("model", model)
    if not V.any_traced(model.tau) and not V.any_traced(setup.tau):
        model_tau, setup_tau = np.asarray(model.tau), np.asarray(setup.tau)
        # a float32 model holds tau rounded to float32: compare at its precision
        rtol = 4 * float(np.finfo(model_tau.dtype).eps)
        if model_tau.shape != setup_tau.shape or not np.allclose(model_tau, setup_tau, rtol=rtol, atol=0.0):
            raise ValueError(
                f"model.tau = {V.show(model_tau)} differs from setup.tau = {V.show(setup_tau)}: train takes tau from "
                "the setup (the network is rebuilt at setup.tau and tau is not trained); build the Setup with "
                "tau=model.tau"
            )


@keyword_hints("focus.train")
def train(
    setup: Setup,
    t1: float,
    *,
    key: Any = 0,
    dt: float = DEFAULT_DT,
    context: int = DEFAULT_CONTEXT,
    batch: int = DEFAULT_BATCH,
    start: Literal["uniform", "pi"] = "uniform",
    burn_in: int = 0,
    tokens: Any = None,
    initial: dict | None = None,
    model: OneLayerAttention | None = None,
    save: SaveGrid | None = None,
    observe: Callable[[dict, Setup], Mapping] | None = None,
    event: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    return_model: bool = False,
    progress: bool = False,
) -> Any:
    """The network (M1) of ``setup`` trained by online SGD to time ``t1``, from ``setup.theta0()``
    (the draw `attnflow.focus.solve` starts from) or the weights ``initial`` (a dict like it), or
    the network ``model`` (a `OneLayerAttention`, e.g. one returned by ``return_model=True``;
    the clock starts at 0 again; its widths and ``tau`` must be the setup's, ``ValueError``
    otherwise, since ``tau`` comes from ``setup``).

    Each step draws ``batch`` fresh sequences of ``context + 1`` tokens from ``setup.chain``
    (first token uniform, ``start="uniform"``, or from ``pi``, ``start="pi"``; after ``burn_in``
    dropped steps of the chain, default 0) or, with
    ``tokens`` (a 1-D stream of token ids, e.g. `CorpusChain.stream`), random windows of it;
    the loss is the cross-entropy of the last token given the others, the learning rate
    ``eta dt`` and the clock ``t = dt * step`` (the population flow's time). ``key`` seeds the
    draws and may be traced (a sweep over seeds); ``tau`` is not trained.

    Records `attnflow.focus.OBSERVABLES` (population quantities of the weights) plus
    ``observe(theta, setup)`` if given, at the save grid (default `DEFAULT_TRAIN_SAVE`, in
    time units). At the reference `Setup` and the default options the gap to `solve` up to
    `REFERENCE_T` is below `TRAIN_TOLERANCE` (``loss``, ``sv_W0`` and ``entropy``): the flow is the limit of
    infinite context, small ``dt`` and large batch. A diverging run raises
    `attnflow.DivergenceError` naming the step.
    ``event(t, obs) -> scalar`` (as in `solve`) sets ``t_event``: the first time it changes sign
    on the saved points, placed linearly between them (`attnflow.event_time`); the run goes on
    to ``t1``.
    ``return_model=True`` returns ``(trajectory, trained network)``: the `OneLayerAttention` at
    ``t1`` (``model.theta`` its weights as a dict like ``setup.theta0()``).
    Compiled once per ``dt``, number of save points, ``context``, ``batch``, widths and
    ``observe``: new ``t1``, ``tau``, ``eta``, ``eps`` and chains reuse it.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.focus.Setup, got {setup!r}")
    context = V.positive_int("context", context)
    batch = V.positive_int("batch", batch)
    V.choice("start", start, ("uniform", "pi"))
    burn_in = V.positive_int("burn_in", burn_in, minimum=0)
    if burn_in and tokens is not None:
        raise ValueError("burn_in applies to sequences drawn from the chain, not to windows of tokens")
    V.positive("dt", dt)
    if observe is not None and not callable(observe):
        raise ValueError(f"observe must be callable (theta, setup) -> {{name: array}}, got {observe!r}")
    if model is not None:  # train on from a given network (one returned by return_model=True)
        if initial is not None:
            raise ValueError("give initial (weights as a dict) or model (a OneLayerAttention), not both")
        if not isinstance(model, OneLayerAttention):
            raise ValueError(f"model must be a OneLayerAttention (as return_model=True gives), got {model!r:.80}")
        _check_model(model, setup)
        initial = dict(model.theta)
    theta0 = setup.initial_state(initial)
    if tokens is not None:
        tokens = np.asarray(tokens) if not V.any_traced(tokens) else tokens
        if tokens.ndim != 1 or tokens.shape[0] <= context + 1:
            raise ValueError(
                f"tokens must be a 1-D stream longer than context + 1 = {context + 1}, got shape {tokens.shape}"
            )
        if not V.any_traced(tokens) and (tokens.min() < 0 or tokens.max() >= setup.d):
            raise ValueError(
                f"token ids must lie in [0, {setup.d}) for this chain, got {tokens.min()} .. {tokens.max()}"
            )
    if tokens is None:
        _warn_slow_mixing(setup, context)
    total, steps = train_steps(save, DEFAULT_TRAIN_SAVE, t1, dt)
    args = (
        setup,
        dict(theta0),
        V.prng_key(key),
        tokens,
        observe,
        np.asarray(steps, np.int32),
        np.asarray(total, np.int32),
        float(dt),
        context,
        batch,
        start,
        burn_in,
        bool(return_model),
        progress,
    )
    return run_training(_train, args, clock=dt, total=total, event=event)


@filter_jit
def _train(
    setup, theta0, key, tokens, observe, steps, total, dt, context, batch, start, burn_in, return_model, progress
):
    model = OneLayerAttention.from_theta(theta0, setup.tau)
    trainable = eqx.tree_at(lambda m: m.tau, jax.tree_util.tree_map(lambda _: True, model), False)
    if tokens is None:
        contexts = _ChainContexts(setup.chain, context + 1, start, burn_in)
    else:
        contexts = _StreamContexts(tokens, context + 1)

    def observe_model(m):
        return record(m.theta, setup, observe)

    return simulate(
        next_token_loss,
        model,
        optax.sgd(setup.eta * dt),
        total,
        mode=OnlineSGD(contexts, batch),
        key=key,
        observe=observe_model,
        save=TimeGrid(steps),
        clock=dt,
        filter_spec=trainable,
        progress=progress,
        throw=False,
        return_model=return_model,
        meta={
            "theory": "focus",
            "clock": "t = steps * dt; population gradient flow dtheta/dt = -eta grad L",
            "dt": dt,
            "context": context,
            "batch": batch,
            "start": start,
            "burn_in": burn_in,
            "data": "chain" if tokens is None else "token stream",
        },
    )
