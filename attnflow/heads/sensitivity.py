"""Differentiable specialisation time of the heads ODE: ``t_spec`` and its sensitivities.

The heads specialise at the time ``t_spec`` at which ``S(M) = |(I - 11^T/H) M|_F`` reaches a
threshold (equation (15) of the heads page, ``ESCAPE_THRESHOLD = 0.5``), on the order-parameter
ODE (8). `specialisation_time` returns ``t_spec`` as the event time of that solve, a JAX
function of the setup's arrays; `specialisation_time_sensitivity` differentiates it with
respect to the learning rate ``eta`` and the signal strength ``s`` of the flipped-spike prior,
through the solve and its stopping event (the implicit-function formula (S1) of
`attnflow.sensitivity`).

The expectations of (8) are means over a fixed `FieldBank` (common random numbers), so with
the bank fixed ``t_spec`` is a smooth deterministic function of ``(eta, s)``: the derivatives are
exact derivatives of the bank's ODE (to the solver tolerance), not Monte Carlo estimates. The
bank's own error (its size and seed, `BankOptions`) moves ``t_spec`` and its derivatives together.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from .. import _validate as V
from ..ode import require_x64, with_progress
from ..options import LinearGrid, SolverOptions
from ..sensitivity import Sensitivity, sensitivity, solver_for_mode
from .data import FlippedSpike
from .setup import Setup
from .theory import DEFAULT_SOLVER, ESCAPE_THRESHOLD, BankOptions, DriftForm, check_escape_start, solve

__all__ = [
    "SPECIALISATION_HORIZON",
    "escape_time",
    "escape_time_sensitivity",
    "specialisation_time",
    "specialisation_time_sensitivity",
]

SPECIALISATION_HORIZON = 200.0
"""`specialisation_time`'s default horizon ``t1``: the solve stops at the event, so this only bounds
a solve that never specialises (the reference setup specialises at ``t ~ 9``; by (15) ``D = 10^7`` at ``t ~ 22``)."""


def _check(setup: Any, threshold: Any, t1: Any, solver: Any, where: str) -> tuple[Any, SolverOptions]:
    if not isinstance(setup, Setup):
        raise ValueError(f"{where}: setup must be an attnflow.heads.Setup, got {setup!r}")
    threshold = ESCAPE_THRESHOLD if threshold is None else threshold  # None: the default, as in focus
    if not V.any_traced(threshold):
        V.positive("threshold (of the specialisation S(M))", threshold)
    if not V.any_traced(t1):
        V.positive("t1 (horizon)", t1)
    if solver is not None and not isinstance(solver, SolverOptions):
        raise ValueError(f"{where}: solver must be attnflow.SolverOptions(...) or None, got {solver!r}")
    require_x64(where)
    return threshold, DEFAULT_SOLVER if solver is None else solver


def specialisation_time(
    setup: Setup,
    threshold: Any = ESCAPE_THRESHOLD,
    *,
    t1: Any = SPECIALISATION_HORIZON,
    bank: BankOptions | None = None,
    form: DriftForm | None = None,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The specialisation time ``t_spec``: the first time the solution of the order-parameter ODE (8)
    reaches ``S(M) = |(I - 11^T/H) M|_F = threshold`` (equation (15); default, or ``None``:
    `ESCAPE_THRESHOLD`). ``progress=True`` shows the solve's meter with the solver it uses anyway.

    `attnflow.heads.solve` with ``escape=threshold``, saving only the end points; NaN if the heads
    have not specialised by ``t1`` (default `SPECIALISATION_HORIZON`). ``bank`` (default
    `BankOptions()`), ``form`` and ``solver`` (default `DEFAULT_SOLVER`) as for `solve`.

    A differentiable JAX function of every array of ``setup`` (``eta``, the prior's parameters,
    ``weight_decay``, the initial condition's ``sigma0`` and ``D``) and of ``threshold``, the event
    time included (eq. (S1) of `attnflow.sensitivity`): reverse mode (``jax.grad``) with the
    default adjoint, forward mode (``jax.jacfwd``) with ``solver.replace(adjoint=diffrax.ForwardMode())``;
    `specialisation_time_sensitivity` picks the adjoint. Traceable: ``jax.jit``, ``jax.vmap``
    over setups, `attnflow.sweep`. Float64 (`attnflow.enable_x64` or ``with jax.enable_x64(True)``).

    Raises ``ValueError`` naming the argument for a setup that is not a `Setup`, a non-positive
    ``threshold`` or ``t1``, or a threshold at or below the initial specialisation ``S(M0)``.
    """
    threshold, solver = _check(setup, threshold, t1, solver, "heads.specialisation_time")
    solver = with_progress(solver, None, progress)
    check_escape_start(setup, threshold, "threshold")
    traj = solve(setup, t1, escape=threshold, save=LinearGrid(2), bank=bank, form=form, solver=solver)
    return traj.t_event


def specialisation_time_sensitivity(
    setup: Setup,
    threshold: Any = ESCAPE_THRESHOLD,
    *,
    t1: Any = SPECIALISATION_HORIZON,
    bank: BankOptions | None = None,
    form: DriftForm | None = None,
    solver: SolverOptions | None = None,
    mode: str = "forward",
    progress: bool | None = None,
) -> Sensitivity:
    """`specialisation_time` and its derivatives ``d t_spec / d eta`` and ``d t_spec / d s`` (``s``
    the signal strength of the `FlippedSpike` prior), through the ODE (8) and its escape event
    (15), by the implicit-function formula (S1) of `attnflow.sensitivity`.

    Returns a `attnflow.Sensitivity`: ``.value`` is ``t_spec`` (NaN, with NaN derivatives, if not
    reached by ``t1``), ``.grad["eta"]`` and ``.grad["s"]`` its derivatives at the setup's values.
    ``eta`` moves every place the learning rate enters (8): the drift, the ``eta^2`` SGD-noise term
    and, when ``eta_b`` is ``None``, the rate of the activation's parameters. ``s`` moves the prior
    and so the signal ``theta = +-s`` of every draw of the bank; the bank's Gaussian draws stay
    fixed, so both derivatives are exact for the bank's ODE (to the solver tolerance: central
    differences agree to 1e-8 at ``rtol = 1e-10``; `DEFAULT_SOLVER`'s ``rtol = 1e-6`` gives about 1e-4), and
    the bank's Monte Carlo error is shared by ``t_spec`` and its derivatives.

    ``mode``: ``"forward"`` (default) is ``jax.jacfwd`` with Diffrax's ``ForwardMode`` adjoint (two
    tangents through one solve, compiled in about 0.7 of the time reverse mode takes);
    ``"reverse"`` is `attnflow.sensitivity` (``jax.jacrev``) with the solver's adjoint, Diffrax's
    ``RecursiveCheckpointAdjoint`` by default (``DirectAdjoint`` also works; Diffrax refuses
    ``BacksolveAdjoint`` with events). Both give the same numbers. Traceable: ``jax.jit``, and
    ``jax.vmap`` over a batch of setups (``jax.vmap(lambda eta: specialisation_time_sensitivity(
    setup.replace(eta=eta)))(etas)``). Float64.

    Raises ``ValueError`` naming the value for the bad inputs of `specialisation_time`, a prior
    that is not a `FlippedSpike`, an unknown ``mode`` or an adjoint that does not fit it.
    """
    threshold, solver = _check(setup, threshold, t1, solver, "heads.specialisation_time_sensitivity")
    if not isinstance(setup.prior, FlippedSpike):
        raise ValueError(
            "specialisation_time_sensitivity differentiates the signal strength s of a FlippedSpike prior; "
            f"got prior {setup.prior!r}"
        )
    solver = solver_for_mode(mode, with_progress(solver, None, progress))
    check_escape_start(setup, threshold, "threshold")

    def outcome(eta, s):
        st = setup.replace(eta=eta, prior=eqx.tree_at(lambda p: p.s, setup.prior, s))
        traj = solve(st, t1, escape=threshold, save=LinearGrid(2), bank=bank, form=form, solver=solver)
        return traj.t_event

    return sensitivity(outcome, mode=mode, **{"eta": setup.eta, "s": setup.prior.s})


# The name every theory package gives the solved escape time (`attnflow.focus.escape_time`):
# the same functions, so that code written against one package runs against another.
escape_time = specialisation_time
"""`specialisation_time` under the name of `attnflow.focus.escape_time`: the same function."""

escape_time_sensitivity = specialisation_time_sensitivity
"""`specialisation_time_sensitivity` under the name of `attnflow.focus.escape_time_sensitivity`."""
