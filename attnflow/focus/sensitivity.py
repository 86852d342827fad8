"""Differentiable escape time of the focus flow: the end of the unigram plateau and its sensitivities.

After condensation (Stage I) the population gradient flow (P6) rests on the plateau
``L = H(pi)`` at the condensation point (R2) until the focus mode grows at the rate ``c`` of
(R3)-(R4) and the loss falls below it (Stage II; duration about ``c^{-1} log(1/eps)`` by (R8)).
`escape_time` returns the time ``t_esc`` at which the loss (P2) falls to a threshold (default
`escape_threshold`: ``H(pi)`` less ``ESCAPE_MARGIN`` or, for a chain little below its unigram
plateau, ``ESCAPE_FRACTION`` of the way to ``L*``) as the event time of the flow, a JAX function of the setup's arrays;
`escape_time_sensitivity` differentiates it with respect to the laziness ``lam`` of the chain
(D1) and the score scale ``tau``, through the solve and its stopping event (the
implicit-function formula (S1) of `attnflow.sensitivity`). The flow is deterministic, so the
derivatives are exact to the solver tolerance.

Not `attnflow.escape_time`, the linearised estimate ``log(r / eps) / mu`` of (R8).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._errors import fail_if
from ..ode import integrate, require_x64, with_progress
from ..options import LinearGrid, SolverOptions
from ..sensitivity import Sensitivity, sensitivity, solver_for_mode
from .data import MarkovChain
from .setup import Setup
from .theory import flow_field, population_loss

__all__ = [
    "ESCAPE_FRACTION",
    "ESCAPE_HORIZON",
    "ESCAPE_MARGIN",
    "ESCAPE_SOLVER",
    "escape_threshold",
    "escape_time",
    "escape_time_sensitivity",
]

ESCAPE_MARGIN = 0.05
"""`escape_time`'s default threshold is the loss ``H(pi) - ESCAPE_MARGIN``: the flow has left the
unigram plateau ``H(pi)`` (R2), 0.05 nats below it (or less: `ESCAPE_FRACTION`)."""

ESCAPE_FRACTION = 0.3
"""The default margin below ``H(pi)`` is at most this fraction of ``H(pi) - L*`` (``L*`` the Bayes
floor): Stage II takes the loss 0.34 to 0.55 of the way from ``H(pi)`` to ``L*`` (five chains
measured), so for a chain with ``H(pi) - L* < 1/6`` the fixed margin would be reached only by a
later stage, or never (the reference chain, 0.17, keeps the fixed margin)."""

ESCAPE_HORIZON = 5000.0
"""`escape_time`'s default horizon ``t1`` (the flow's default horizon; the solve stops at the event,
so this bounds only a flow that never escapes, e.g. ``lam <= 0``: no focus by (R4))."""

ESCAPE_SOLVER = SolverOptions(rtol=1e-10, atol=1e-12, max_steps=1_000_000)
"""`escape_time`'s solver options: Tsit5 with a PID controller at ``rtol = 1e-10`` (the escape comes
before the flow turns stiff, so `attnflow.focus.DEFAULT_SOLVER`'s stiff switch is not needed), tight
enough that central differences of ``t_esc`` agree with its derivatives to about 1e-8."""


# how far P may be from a lazy chain for its lam to be read off (concrete chains)
_LAZY_TOL = 1e-10


def _field(t: Any, theta: dict, args: tuple) -> dict:
    return flow_field(t, theta, args[0])


def _escaped(t: Any, theta: dict, args: tuple) -> jax.Array:
    setup, threshold = args
    return population_loss(theta, setup.chain, setup.tau) - threshold


def escape_threshold(setup: Setup) -> jax.Array:
    """The default threshold of `escape_time`: ``H(pi) - min(ESCAPE_MARGIN, ESCAPE_FRACTION (H(pi) -
    L*))``, the loss 0.05 below the unigram plateau ``H(pi)`` (R2, S2) of ``setup.chain``, or 0.3 of
    the way to the Bayes floor ``L*`` (`MarkovChain.bayes_floor`) when that is nearer: a loss the
    end of Stage II reaches. Traceable."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.focus.Setup, got {setup!r}")
    H = setup.chain.entropy()
    return H - jnp.minimum(ESCAPE_MARGIN, ESCAPE_FRACTION * (H - setup.chain.bayes_floor()))


def _check(setup: Any, threshold: Any, t1: Any, solver: Any, where: str) -> tuple[jax.Array, SolverOptions]:
    if not isinstance(setup, Setup):
        raise ValueError(f"{where}: setup must be an attnflow.focus.Setup, got {setup!r}")
    if not V.any_traced(t1):
        V.positive("t1 (horizon)", t1)
    if solver is not None and not isinstance(solver, SolverOptions):
        raise ValueError(f"{where}: solver must be attnflow.SolverOptions(...) or None, got {solver!r}")
    require_x64(where)
    if threshold is None:
        threshold = escape_threshold(setup)
    elif not V.any_traced(threshold):
        V.finite_scalar("threshold (loss)", threshold)
    if not V.any_traced((setup, threshold)):
        L0 = float(population_loss(setup.theta0(), setup.chain, setup.tau))
        if not float(threshold) < L0:
            raise ValueError(
                f"threshold (loss) = {V.show(threshold)} must lie below the initial loss L(theta0) = {L0:.6g}"
            )
        floor = float(setup.chain.bayes_floor())
        if not float(threshold) > floor:
            raise ValueError(
                f"threshold (loss) = {V.show(threshold)} is never reached: it must lie above the chain's Bayes "
                f"floor L* = {floor:.6g}, the lowest loss any predictor reaches (MarkovChain.bayes_floor)"
            )
    threshold = jnp.asarray(threshold, dtype=jnp.result_type(float))
    return threshold, ESCAPE_SOLVER if solver is None else solver


def _lazy_lam(chain: MarkovChain) -> jax.Array:
    """The ``lam`` of a lazy chain ``P = lam I + (1 - lam) 1 pi^T`` (D1): ``(tr P - 1) / (d - 1)``.
    A concrete chain that is not lazy raises ``ValueError``."""
    d = chain.d
    if d < 2:
        raise ValueError(f"a lazy chain needs d >= 2 tokens, got d = {d}")
    lam = (jnp.trace(chain.P) - 1.0) / (d - 1)
    if not V.any_traced(chain):
        # in NumPy: under a user's jit the chain's (concrete) arrays would be staged
        P, pi = np.asarray(chain.P), np.asarray(chain.pi)
        lam_np = (np.trace(P) - 1.0) / (d - 1)
        lazy = lam_np * np.eye(d) + (1.0 - lam_np) * np.outer(np.ones(d), pi)
        dev = float(np.max(np.abs(P - lazy)))
        if not dev <= _LAZY_TOL:
            raise ValueError(
                "escape_time_sensitivity differentiates the laziness lam of a lazy chain (D1): setup.chain must "
                f"be MarkovChain.lazy(pi, lam); this P differs from every lazy chain on its pi by {dev:.3g}"
            )
    return lam


def _checked(result: Any, setup: Setup, threshold: jax.Array, where: str) -> Any:
    """``result`` failing where a traced ``threshold`` lies outside ``(L*, L(theta0))``: the checks
    of `_check` on traced values. A sweep point fails with the reason, a user's jit stops with it
    (the event would never fire: a silent NaN). Applied to the outcome, outside any derivative,
    so that a sweep of sensitivities sees the failure too."""
    if not V.any_traced((setup, threshold)):
        return result
    L0 = population_loss(setup.theta0(), setup.chain, setup.tau)
    floor = setup.chain.bayes_floor()
    result = fail_if(
        result, ~(threshold < L0), f"{where}: the threshold (loss) must lie below the initial loss L(theta0)"
    )
    return fail_if(
        result,
        ~(threshold > floor),
        f"{where}: the threshold (loss) is never reached: it must lie above the chain's Bayes floor L* "
        "(MarkovChain.bayes_floor)",
    )


def _t_event(setup: Setup, threshold: jax.Array, t1: Any, solver: SolverOptions) -> jax.Array:
    traj = integrate(
        _field,
        setup.theta0(),
        t1,
        args=(setup, threshold),
        event=_escaped,
        save=LinearGrid(2),
        solver=solver,
        meta={"theory": "focus", "equation": "escape of the H(pi) plateau, flow (P6)"},
    )
    return traj.t_event


def escape_time(
    setup: Setup,
    threshold: Any = None,
    *,
    t1: Any = ESCAPE_HORIZON,
    solver: SolverOptions | None = None,
    progress: bool | None = None,
) -> jax.Array:
    """The escape time ``t_esc``: the first time the loss (P2) along the population gradient flow (P6)
    from ``setup.theta0()`` falls to ``threshold`` (default `escape_threshold`, ``H(pi) - min(0.05,
    0.3 (H(pi) - L*))``: the end of the unigram plateau, Stage II (R3)). ``progress=True`` shows
    the solve's meter with the solver it uses anyway.

    The event time of `attnflow.integrate` on `flow_field` with the event ``L(theta) - threshold``;
    NaN if the loss is still above ``threshold`` at ``t1`` (default `ESCAPE_HORIZON`). ``solver``:
    default `ESCAPE_SOLVER`. A differentiable JAX function of every array of ``setup`` (``tau``,
    ``eta``, ``eps``, the chain's ``pi`` and ``P``) and of ``threshold``, the event time included
    (eq. (S1) of `attnflow.sensitivity`): reverse mode (``jax.grad``) with the default adjoint,
    forward mode (``jax.jacfwd``) with ``solver.replace(adjoint=diffrax.ForwardMode())``. Traceable:
    ``jax.jit``, ``jax.vmap`` over setups, `attnflow.sweep`. Float64 (`attnflow.enable_x64` or
    ``with jax.enable_x64(True)``).

    Not `attnflow.escape_time` (the linearised estimate (R8) from a rate).

    Raises ``ValueError`` naming the argument for a setup that is not a `Setup`, a non-finite
    ``threshold``, one not below the initial loss or not above the chain's Bayes floor
    (`attnflow.focus.MarkovChain.bayes_floor`, never reached), or a non-positive ``t1``.
    """
    threshold, solver = _check(setup, threshold, t1, solver, "focus.escape_time")
    solver = with_progress(solver, None, progress)
    return _checked(_t_event(setup, threshold, t1, solver), setup, threshold, "focus.escape_time")


def escape_time_sensitivity(
    setup: Setup,
    threshold: Any = None,
    *,
    t1: Any = ESCAPE_HORIZON,
    solver: SolverOptions | None = None,
    mode: str = "forward",
    progress: bool | None = None,
) -> Sensitivity:
    """`escape_time` and its derivatives ``d t_esc / d lam`` (the laziness of the chain,
    ``P = lam I + (1 - lam) 1 pi^T``, (D1)) and ``d t_esc / d tau`` (the score scale, (P1)), through
    the flow (P6) and its escape event, by the implicit-function formula (S1) of
    `attnflow.sensitivity`.

    ``setup.chain`` must be a lazy chain (`MarkovChain.lazy`); its ``lam`` is read off ``P`` as
    ``(tr P - 1) / (d - 1)`` and ``P`` rebuilt from it at fixed ``pi`` (``pi`` is stationary for every
    ``lam``). The derivatives are those of ``escape_time(setup, threshold)`` as a function: a
    given ``threshold`` stays fixed, the default `escape_threshold` moves with the chain (it
    depends on ``pi`` only unless ``H(pi) - L* < 1/6``, where it follows ``L*`` and so ``lam``).
    Returns a `attnflow.Sensitivity`: ``.value`` is ``t_esc`` (NaN, with NaN derivatives, if not
    reached by ``t1``), ``.grad["lam"]`` and ``.grad["tau"]`` its derivatives. Both are negative at
    the reference (``c`` grows with ``tau lam`` by (R4), so the plateau is shorter): about -216.3
    and -72.64 at ``t_esc = 101.74``; central differences agree to about 2e-8.

    ``mode``: ``"forward"`` (default) is ``jax.jacfwd`` with Diffrax's ``ForwardMode`` adjoint (compiled
    in about half the time reverse mode takes for these two parameters); ``"reverse"`` is
    `attnflow.sensitivity` (``jax.jacrev``) with the solver's adjoint, Diffrax's
    ``RecursiveCheckpointAdjoint`` by default (``DirectAdjoint`` also works; Diffrax refuses
    ``BacksolveAdjoint`` with events). Both give the same numbers. Traceable: ``jax.jit``, and
    ``jax.vmap`` over a batch of setups (``jax.vmap(lambda lam: escape_time_sensitivity(
    Setup(chain=MarkovChain.lazy(lam=lam))))(lams)``). Float64.

    Raises ``ValueError`` naming the value for the bad inputs of `escape_time`, a chain that is not
    lazy, an unknown ``mode`` or an adjoint that does not fit it.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"focus.escape_time_sensitivity: setup must be an attnflow.focus.Setup, got {setup!r}")
    lam0 = _lazy_lam(setup.chain)
    default_threshold = threshold is None
    threshold, solver = _check(setup, threshold, t1, solver, "focus.escape_time_sensitivity")
    solver = solver_for_mode(mode, with_progress(solver, None, progress))
    pi = setup.chain.pi

    def outcome(lam, tau):
        moved = setup.replace(chain=MarkovChain.lazy(pi, lam), tau=tau)
        # the default threshold moves with the chain (through L*), as in escape_time(setup)
        return _t_event(moved, escape_threshold(moved) if default_threshold else threshold, t1, solver)

    res = sensitivity(outcome, mode=mode, **{"lam": lam0, "tau": setup.tau})
    return _checked(res, setup, threshold, "focus.escape_time_sensitivity")
