"""Options as objects: where to save (`SaveGrid`) and how to solve (`SolverOptions`).

Every verb that records a trajectory (`integrate`, `simulate`, and each theory package's
``solve`` and ``train``) takes one save-grid object and, for ODEs, one solver-options
object, and passes them straight through, as Diffrax passes ``SaveAt`` and a solver.

Save grids (an abstract base with final variants):

- `LinearGrid(n)`: ``n`` equally spaced points from ``t0`` to ``t1``;
- `LogGrid(n, t_min)`: ``t0``, then ``n - 1`` points log-spaced in the elapsed time from
  ``t_min`` to ``t1 - t0`` (the grid for plateaus that last decades);
- `TimeGrid(ts)`: explicit, strictly increasing times.

A grid gives times on ``[t0, t1]`` (`SaveGrid.times`, traceable) and integer steps on
``[0, total]`` (`SaveGrid.steps`, for `attnflow.simulate`, whose step count is static).
"""

from __future__ import annotations

import abc
import math
import os
import sys
import types
import warnings
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _validate as V

__all__ = ["SaveGrid", "LinearGrid", "LogGrid", "TimeGrid", "SolverOptions"]


class SaveGrid(eqx.Module):
    """Where a trajectory is recorded. Concrete grids: `LinearGrid`, `LogGrid`, `TimeGrid`."""

    @abc.abstractmethod
    def times(self, t0: Any, t1: Any) -> jax.Array:
        """Save times on ``[t0, t1]``, shape ``(T,)``; ``t0`` and ``t1`` may be traced."""

    @abc.abstractmethod
    def steps(self, total: int) -> np.ndarray:
        """Sorted unique integer steps in ``[0, total]`` (for a run of ``total`` optimizer steps)."""

    def steps_for(self, t1: float, dt: float) -> tuple[int, np.ndarray]:
        """``(total steps, save steps)`` of a run to time ``t1`` with ``dt`` time per step.

        The grid is read in time units: `LinearGrid` and `LogGrid` are laid on the step axis
        (``t_min`` divided by ``dt``), `TimeGrid` times are rounded to the nearest step.
        ``t1`` shorter than one step raises ``ValueError``; a ``t1`` that is not a multiple of
        ``dt`` ends at the last step before it (never past ``t1``: a theory solved to ``t1``
        covers the run), with a warning naming that time.
        """
        t1f = V.finite_scalar("t1", t1)
        dtf = V.finite_scalar("dt", dt)
        if t1f <= 0 or dtf <= 0:
            raise ValueError(f"t1 and dt must be positive, got t1={t1!r}, dt={dt!r}")
        if t1f < dtf * (1 - 1e-9):
            raise ValueError(f"t1 = {t1f:g} is shorter than one step dt = {dtf:g}")
        # the last step at or before t1 (up to rounding): a run never passes t1, so a theory solved
        # to t1 covers every time it saves
        total = max(1, int(np.floor(t1f / dtf * (1 + 1e-12) + 1e-6)))
        if abs(total * dtf - t1f) > 1e-9 * t1f + 1e-6 * dtf:
            warnings.warn(
                f"t1 = {t1f:g} is not a multiple of dt = {dtf:g}: the run ends at the last step before it, step "
                f"{total}, t = {total * dtf:g}",
                stacklevel=_caller_outside_attnflow(),
            )
        if total > 2**31 - 1:
            raise ValueError(
                f"t1 / dt = {t1f:g} / {dtf:g} is {total} steps, more than 2^31 - 1: shorten t1 or raise dt"
            )
        return total, self._steps_in_time(total, dtf, t1f)

    def _steps_in_time(self, total: int, dt: float, t1: float) -> np.ndarray:
        return self.steps(total)


def train_steps(save: Any, default: SaveGrid, t1: Any, dt: Any) -> tuple[int, np.ndarray]:
    """``(total steps, save steps)`` of a ``train`` to ``t1`` with ``dt`` per step
    (`SaveGrid.steps_for`) on ``save``, ``default`` when None; anything but a `SaveGrid`
    raises ``ValueError`` naming it, as `attnflow.integrate` and `attnflow.simulate` do."""
    grid = default if save is None else save
    if not isinstance(grid, SaveGrid):
        raise ValueError(f"save must be a SaveGrid (LinearGrid, LogGrid or TimeGrid), got {save!r:.80}")
    return grid.steps_for(t1, dt)


def _caller_outside_attnflow() -> int:
    """The ``stacklevel`` of the first caller outside attnflow and the JAX libraries that trace
    it (a warning then names the user's line)."""
    inside = tuple(
        os.path.dirname(os.path.abspath(m.__file__)) + os.sep
        for m in (sys.modules[__package__], jax, eqx)
        if m.__file__
    )
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class LinearGrid(SaveGrid):
    """``n`` equally spaced save points, ends included. ``n = 2`` saves only the endpoints,
    outside the solver's step loop (the cheapest way to ask a sweep for final values)."""

    n: int = eqx.field(static=True, default=200)

    def __check_init__(self):
        V.positive_int("n (save points)", self.n, minimum=2)

    def times(self, t0, t1):
        return jnp.linspace(jnp.asarray(t0, dtype=float), jnp.asarray(t1, dtype=float), self.n)

    def steps(self, total):
        total = V.positive_int("total steps", total)
        return np.unique(np.round(np.linspace(0, total, self.n)).astype(np.int64))


class LogGrid(SaveGrid):
    """``t0`` and then ``n - 1`` points log-spaced in the elapsed time from ``t_min`` to
    ``t1 - t0``; ``t_min=None`` is ``1e-6 (t1 - t0)`` for times, one step for `steps`.
    ``t_min`` must be below ``t1 - t0`` (``ValueError`` otherwise), unless ``fit_span=True``:
    then a span no longer than ``t_min`` is saved from ``1e-3 (t1 - t0)`` instead (the theory
    packages' default grids, so that a short solve runs; a span longer than ``t_min`` is saved
    from ``t_min`` as usual). On the step axis of a simulation (`steps`) ``t_min=None`` is one
    step. In the time units of a run with step ``dt`` (`steps_for`, what the theory packages'
    ``train`` use) the grid is the times a solve to ``t1`` saves, rounded to the nearest steps:
    theory and simulation are saved at the same times, to ``dt / 2`` when ``t1`` is a multiple
    of ``dt``. Times that round to the same step are saved once (duplicates merged; nothing is
    saved between steps), so fewer than ``n`` may remain: ``t_min=None`` spreads the grid over six
    decades below ``t1``, and a run of 1000 steps, three decades, keeps about half (``LogGrid(50)``:
    24). ``t_min`` of one step or more keeps the times before the first step away, but log-spaced
    points near the first steps are still less than a step apart and merge unless the run is
    very long against ``n`` (about ``2 ** (n - 2)`` steps): ``LogGrid(60, t_min=dt)`` keeps 51
    points over 2,000 steps, 56 over 250,000."""

    n: int = eqx.field(static=True, default=200)
    t_min: float | None = eqx.field(static=True, default=None)
    fit_span: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        V.positive_int("n (save points)", self.n, minimum=2)
        if self.t_min is not None:
            t = V.finite_scalar("t_min", self.t_min)
            if t <= 0:
                raise ValueError(f"t_min must be positive, got {self.t_min!r}")

    def times(self, t0, t1):
        t0 = jnp.asarray(t0, dtype=float)
        span = jnp.asarray(t1, dtype=float) - t0
        too_short = self.t_min is not None and not V.any_traced((t0, span)) and float(self.t_min) >= float(span)
        if too_short and not self.fit_span:
            raise ValueError(
                f"LogGrid: t_min = {self.t_min:g} must be below t1 - t0 = {float(span):g} "
                "(or LogGrid(..., fit_span=True) to start at 1e-3 of a shorter span)"
            )
        lo = span * 1e-6 if self.t_min is None else jnp.asarray(self.t_min, dtype=float)
        if self.fit_span and self.t_min is not None:
            lo = jnp.where(lo < span, lo, 1e-3 * span)  # traced spans too
        rest = jnp.exp(jnp.linspace(jnp.log(lo), jnp.log(span), self.n - 1))
        rest = rest.at[-1].set(span)  # exactly t1 (exp(log(x)) can be off in the last bit)
        return jnp.concatenate([t0[None], t0 + rest])

    def steps(self, total):
        total = V.positive_int("total steps", total)
        lo = 1.0 if self.t_min is None else max(1.0, float(self.t_min))
        return self._log_steps(total, lo)

    def _steps_in_time(self, total, dt, t1):
        if self.t_min is not None and float(self.t_min) >= total * dt:
            if not self.fit_span:
                raise ValueError(f"LogGrid: t_min = {self.t_min:g} must be below t1 - t0 = {total * dt:g}")
            return self._log_steps(total, 1e-3 * total)
        # the times `times` gives a solve to t1, rounded to steps (those before the first step
        # merge into steps 0 and 1): a run and the theory are saved at the same times, so that
        # comparing them interpolates neither across a coarse stretch of the log grid
        lo = 1e-6 * total if self.t_min is None else float(self.t_min) / dt
        return self._log_steps(total, lo)

    def _log_steps(self, total, lo):
        if lo >= total and total > 1:
            raise ValueError(f"LogGrid: t_min = {lo:g} steps must be below the run's {total} steps")
        lo = min(lo, float(total))
        rest = np.round(np.geomspace(lo, total, self.n - 1))
        rest[-1] = total  # the run's end, also with one point after 0 (geomspace gives lo alone)
        return np.unique(np.concatenate([[0], rest]).astype(np.int64))


class TimeGrid(SaveGrid):
    """Explicit save times ``ts`` (1-D, finite, strictly increasing). As steps
    (`steps`) they must be integers in ``[0, total]``; as times of a run with step ``dt``
    (`steps_for`) they are rounded to the nearest step (at most the run's last), and two that
    round to the same step raise ``ValueError``."""

    ts: Any

    def __check_init__(self):
        if V.any_traced(self.ts):
            return
        ts = np.asarray(self.ts)
        if ts.ndim != 1 or ts.size < 1:
            raise ValueError(f"ts must be a non-empty 1-D array of times, got shape {ts.shape}")
        if ts.dtype.kind not in "fiu":
            raise ValueError(f"ts must be real numbers, got dtype {ts.dtype}")
        bad = np.flatnonzero(~np.isfinite(ts.astype(float)))
        if bad.size:
            raise ValueError(f"ts must be finite; entry {int(bad[0])} is {float(ts[bad[0]])}")
        step = np.flatnonzero(np.diff(ts.astype(float)) <= 0)
        if step.size:
            i = int(step[0])
            raise ValueError(
                f"ts must be strictly increasing; ts[{i}] = {float(ts[i]):.6g} >= ts[{i + 1}] = {float(ts[i + 1]):.6g}"
            )

    def times(self, t0, t1):
        return jnp.asarray(self.ts, dtype=float)

    def steps(self, total):
        total = V.positive_int("total steps", total)
        s = np.asarray(self.ts, dtype=float)
        frac = np.flatnonzero(s != np.round(s))
        if frac.size:
            raise ValueError(f"save steps must be whole numbers; entry {int(frac[0])} is {float(s[frac[0]]):.6g}")
        if s[0] < 0 or s[-1] > total:
            raise ValueError(f"save steps must lie in [0, {total}], got {s[0]:g} .. {s[-1]:g}")
        return s.astype(np.int64)

    def _steps_in_time(self, total, dt, t1):
        s = np.asarray(self.ts, dtype=float)
        # up to t1, as solve's save times (a t1 not a multiple of dt lies within a step past the
        # last one, whose step saves it); past t1 would be recorded at a time the run never reaches
        # to the times' own resolution too (float32 times of a step of 0.1 are off by 1e-9)
        eps = np.finfo(np.asarray(self.ts).dtype).eps if np.asarray(self.ts).dtype.kind == "f" else 0.0
        if s[0] < 0 or s[-1] > t1 + max(1e-9, 8 * eps) * max(t1, dt):
            raise ValueError(f"save times must lie in [0, t1 = {t1!r}], got {float(s[0])!r} .. {float(s[-1])!r}")
        steps = np.minimum(np.round(s / dt), total).astype(np.int64)
        same = np.flatnonzero(np.diff(steps) == 0)
        if same.size:
            # dropping one would return fewer save points than asked for, silently misaligned
            i = int(same[0])
            raise ValueError(
                f"save times {s[i]:g} and {s[i + 1]:g} round to the same step {int(steps[i])} (dt = {dt:g}): "
                "give times at least dt apart, or a smaller dt"
            )
        off = np.flatnonzero(np.abs(steps * dt - s) > max(1e-9, 8 * eps) * np.maximum(np.abs(s), dt))
        if off.size:
            i = int(off[0])
            warnings.warn(
                f"{off.size} save time(s) are not multiples of dt = {dt:g} and are saved at the nearest step "
                f"(t = {s[i]:g} at t = {steps[i] * dt:g}); the trajectory's ts are the times saved",
                stacklevel=_caller_outside_attnflow(),
            )
        return steps


def _whole_as_int(value: Any) -> Any:
    """A whole float (``max_steps=1e5``, the common way to write it) as the int Diffrax needs;
    anything else as given, for `attnflow._validate.positive_int` to accept or refuse by name."""
    if isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return value


class SolverOptions(eqx.Module):
    """How `integrate` (and every theory package's ``solve``) solves an ODE.

    Parameters
    ----------
    solver:
        A Diffrax solver; ``None`` picks Tsit5 (`attnflow.UnrolledTsit5` for small fields,
        ``diffrax.Tsit5`` for large ones: the same steps, see `attnflow.integrate`).
    rtol, atol:
        Tolerances of the default PID controller; arrays allowed (a sweep axis). ``rtol`` may
        be 0 (a purely absolute error control); ``atol`` must be positive (the error of a
        component that is 0 is measured against ``atol + rtol |y|``).
    dt0:
        Initial step (``None``: chosen by Diffrax); required for a constant step size.
    max_steps:
        Hard cap on solver steps; overflow raises `attnflow.MaxStepsError`.
    stepsize_controller:
        A Diffrax controller; ``None`` is ``PIDController(rtol, atol)``.
        ``diffrax.ConstantStepSize()`` with ``dt0`` gives a fixed-step run.
    adjoint:
        A Diffrax adjoint for gradients through the solve (``None``: Diffrax's default).
    progress:
        Show the solve's progress on stderr: a bar labelled ``integrate`` on a terminal,
        a few plain lines in a log file (see `attnflow.integrate`).
    dtmin:
        The default controller's smallest step, below which a solve stops with
        `attnflow.MaxStepsError` (a blow-up) instead of shrinking on: ``None`` is ``1e-12 (t1 -
        t0)``, a number sets it, ``0`` removes the floor (horizons of ``1e14`` and more, where
        the start needs steps below ``1e-12`` of the span).
    """

    solver: diffrax.AbstractSolver | None = None
    rtol: Any = 1e-8
    atol: Any = 1e-10
    dt0: Any = None
    max_steps: int = eqx.field(static=True, default=100_000, converter=lambda v: _whole_as_int(v))
    stepsize_controller: diffrax.AbstractStepSizeController | None = None
    adjoint: diffrax.AbstractAdjoint | None = None
    progress: bool = eqx.field(static=True, default=False)
    dtmin: Any = None

    @classmethod
    def fixed_step(cls, dt: Any, solver: diffrax.AbstractSolver | None = None, **options: Any) -> SolverOptions:
        """Fixed steps of size ``dt`` (``diffrax.ConstantStepSize()``, ``dt0 = dt``), with
        ``solver`` (default `attnflow.RK4`, the classical fourth-order method; or
        ``diffrax.Euler()``, ...); ``options`` set the other fields (``max_steps``, ``progress``)."""
        clash = sorted({"stepsize_controller", "dt0"} & set(options))
        if clash:
            raise ValueError(f"fixed_step sets {clash} itself (ConstantStepSize, dt0 = dt); give dt and solver only")
        if solver is None:
            from .ode import RK4

            solver = RK4()
        V.positive("dt", dt)
        return cls(solver=solver, stepsize_controller=diffrax.ConstantStepSize(), dt0=dt, **options)

    def __check_init__(self):
        V.positive_int("max_steps", self.max_steps)
        if self.dtmin is not None:
            V.nonnegative("dtmin", self.dtmin)
        V.nonnegative("rtol", self.rtol)
        V.positive("atol", self.atol)  # atol = 0 would divide by zero on a component that is 0
        if self.dt0 is not None:
            V.positive("dt0", self.dt0)
        if self.solver is not None and not isinstance(self.solver, diffrax.AbstractSolver):
            raise ValueError(f"solver must be a Diffrax solver (e.g. diffrax.Tsit5()), got {self.solver!r}")
        from .ode import RK4  # here: ode imports this module

        fixed = isinstance(self.stepsize_controller, diffrax.ConstantStepSize)
        if isinstance(self.solver, RK4) and not fixed:
            # its error estimate is zero: an adaptive controller would grow the steps unchecked
            raise ValueError(
                "RK4 has no error estimate, so an adaptive step-size controller would grow its steps without "
                "bound: use SolverOptions.fixed_step(dt) (diffrax.ConstantStepSize() with dt0 = dt)"
            )
        if self.stepsize_controller is not None and not isinstance(
            self.stepsize_controller, diffrax.AbstractStepSizeController
        ):
            raise ValueError(f"stepsize_controller must be a Diffrax controller, got {self.stepsize_controller!r}")
        if self.adjoint is not None and not isinstance(self.adjoint, diffrax.AbstractAdjoint):
            raise ValueError(f"adjoint must be a Diffrax adjoint, got {self.adjoint!r}")
        if not isinstance(self.progress, bool):
            raise ValueError(f"progress must be True or False, got {self.progress!r}")

    def replace(self, **changes: Any) -> SolverOptions:
        """A copy with some options changed (validated)."""
        unknown = set(changes) - {f for f in self.__dataclass_fields__}
        if unknown:
            raise ValueError(
                f"SolverOptions has no option {sorted(unknown)}; options: {sorted(self.__dataclass_fields__)}"
            )
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return SolverOptions(**{**fields, **changes})
