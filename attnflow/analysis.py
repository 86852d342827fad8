"""Trajectory analysis shared by every theory: crossings, plateaus, growth rates, fits.

Two kinds of helpers:

- traceable (``jax.numpy``, work under ``jit`` and ``vmap``, so they can be the output of a
  `attnflow.sweep`): `first_crossing`, `value_at`;
- post-processing on host arrays (NumPy, return Python numbers and lists): `growth_rate`,
  `detect_plateaus`, `fit_line`, `fit_power_law`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from . import _validate as V
from .options import _caller_outside_attnflow
from .trajectory import Trajectory

__all__ = [
    "first_crossing",
    "event_time",
    "value_at",
    "growth_rate",
    "detect_plateaus",
    "fit_line",
    "fit_power_law",
    "LineFit",
]


def first_crossing(
    ts: Real[ArrayLike, "*batch T"] | Trajectory,
    y: Real[ArrayLike, "*batch T"] | str,
    threshold: Real[ArrayLike, "*threshold_shape"],
    *,
    above: bool = True,
    interpolate: bool = False,
) -> Float[Array, "*batch"]:
    """Time at which ``y`` first reaches ``threshold`` (``y >= threshold``; ``y <= threshold``
    with ``above=False``), along the last axis of ``ts`` (``y`` may carry the same batch axes);
    NaN where it never does. ``threshold`` is a number, or one per batch entry (an array that
    broadcasts against the batch shape ``y.shape[:-1]``).

    ``interpolate=True`` places the crossing between the two save times around it, linearly
    in ``y``; otherwise it is the first save time at or past the threshold. Traceable.

    ``first_crossing(traj, "loss", 0.1)`` reads the times and a scalar observable of a
    `Trajectory` (batched too).
    """
    if isinstance(ts, Trajectory):
        if not isinstance(y, str):
            raise ValueError(f"first_crossing(traj, name, threshold): name must be an observable name, got {y!r:.60}")
        traj, y = ts, ts[y]
        if y.shape != traj.ts.shape:
            raise ValueError(
                f"first_crossing: observable has shape {y.shape}, not one value per save time {traj.ts.shape}; "
                "pass first_crossing(traj.ts, traj[name][..., i], threshold) for one component"
            )
        ts = traj.ts
    elif isinstance(y, str):
        raise ValueError("first_crossing: an observable name needs a Trajectory as first argument")
    ts, y = jnp.asarray(ts), jnp.asarray(y)
    if ts.shape != y.shape:
        raise ValueError(f"ts and y must have the same shape, got {ts.shape} and {y.shape}")
    if not isinstance(threshold, jax.core.Tracer):
        threshold = V.reals("threshold", threshold)
        try:
            if np.broadcast_shapes(threshold.shape, y.shape[:-1]) != y.shape[:-1]:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"threshold must be a number or broadcast against the batch shape {y.shape[:-1]}, "
                f"got shape {threshold.shape}"
            ) from None
    threshold = jnp.asarray(threshold)
    level = threshold[..., None]  # against the time axis: one threshold per batch entry
    hit = y >= level if above else y <= level
    i = jnp.argmax(hit, axis=-1)
    found = jnp.any(hit, axis=-1)
    t_hit = jnp.take_along_axis(ts, i[..., None], axis=-1)[..., 0]
    if interpolate:
        j = jnp.maximum(i - 1, 0)
        t0 = jnp.take_along_axis(ts, j[..., None], axis=-1)[..., 0]
        y0 = jnp.take_along_axis(y, j[..., None], axis=-1)[..., 0]
        y1 = jnp.take_along_axis(y, i[..., None], axis=-1)[..., 0]
        dy = y1 - y0
        w = jnp.where((i > 0) & (dy != 0), (threshold - y0) / jnp.where(dy != 0, dy, 1.0), 1.0)
        t_hit = t0 + jnp.clip(w, 0.0, 1.0) * (t_hit - t0)
    return jnp.where(found, t_hit, jnp.nan)


def event_time(traj: Trajectory, event: Callable[[Any, Mapping[str, Any]], Any]) -> Float[Array, "*batch"]:
    """Time at which ``event(t, obs)`` first reaches or crosses zero along the save points of
    ``traj`` (from a nonzero value), placed linearly between the two save times around it; NaN
    where it never does.

    ``event`` is what every package's ``solve(..., event=...)`` takes: a function of the time
    and the named observables at one save point (``lambda t, o: o["loss"] - 0.1``), giving one
    real number, or a boolean (then the first save time at which it holds, the first one
    included, as a solve stops at once on an event true at its start). A `solve`
    stops at its event, found by a root find of the ODE to solver accuracy; here the event is
    read on saved points, so its resolution is that of the save grid. A ``train(..., event=...)``
    that runs on to ``t1`` records this time as ``t_event`` (deeplinear, focus, heads, derive, and
    qkov's gradient descent, ``dt=...``); qkov's default gradient-flow ``train`` is a solve and
    stops at its event as ``solve`` does. Batched trajectories (a sweep, ``vmap``) give one time
    per run. Traceable.
    """
    from .ode import _NamedObservables  # the same KeyError listing the names as in `solve`

    if not isinstance(traj, Trajectory):
        raise ValueError(f"event_time(traj, event): traj must be a Trajectory, got {type(traj).__name__}")
    check_saved_event(event, traj)

    def one(t, ys):
        return jnp.asarray(event(t, _NamedObservables(ys)))

    g = one
    for _ in range(traj.ts.ndim):
        g = jax.vmap(g)
    values = g(traj.ts, dict(traj.ys))
    ts = traj.ts
    if jnp.issubdtype(values.dtype, jnp.bool_):
        hit = values  # the first save at which it holds (the start too, as in a solve)
        i = jnp.argmax(hit, axis=-1)
        t_hit = jnp.take_along_axis(ts, i[..., None], axis=-1)[..., 0]
    elif ts.shape[-1] < 2:  # one save point: no change of sign to see
        return jnp.full(ts.shape[:-1], jnp.nan, dtype=ts.dtype)
    else:
        g0, g1 = values[..., :-1], values[..., 1:]
        hit = ((g0 > 0) & (g1 <= 0)) | ((g0 < 0) & (g1 >= 0))
        i = jnp.argmax(hit, axis=-1)
        pick = lambda a: jnp.take_along_axis(a, i[..., None], axis=-1)[..., 0]
        a, b = pick(g0), pick(g1)
        t0, t1 = pick(ts[..., :-1]), pick(ts[..., 1:])
        t_hit = t0 + (t1 - t0) * a / jnp.where(a != b, a - b, 1.0)
    return jnp.where(jnp.any(hit, axis=-1), t_hit, jnp.nan)


def check_saved_event(event: Any, traj: Any) -> None:
    """``event(t, obs)`` must be callable and give one number on one save point of ``traj`` (a
    `Trajectory` or its shapes, from ``eqx.filter_eval_shape``): a named error, computing
    nothing."""
    from .ode import _NamedObservables

    if not callable(event):
        raise ValueError(f"event must be callable (t, observables) -> scalar, got {event!r:.80}")
    nb = len(traj.ts.shape)  # save axis last of ts; observables carry it at the same place
    t = jax.ShapeDtypeStruct((), traj.ts.dtype)
    obs = {k: jax.ShapeDtypeStruct(v.shape[nb:], v.dtype) for k, v in traj.ys.items()}
    out = V.abstract_call("event failed on the run's observables", lambda t, o: event(t, _NamedObservables(o)), t, obs)
    V.one_number("event", out, allow_bool=True)


def with_event_time(traj: Trajectory, event: Any) -> Trajectory:
    """``traj`` with ``t_event`` the time of `event_time` (``traj`` itself for ``event=None``):
    what a ``train(..., event=...)`` that runs on to ``t1`` returns (every package's but qkov's
    gradient flow, which stops at the event)."""
    if event is None:
        return traj
    return Trajectory(traj.ts, traj.ys, traj.meta, event_time(traj, event), traj.stats)


def value_at(
    x: Real[ArrayLike, "*batch T"],
    values: Real[ArrayLike, "*batch T"],
    target: Real[ArrayLike, ""],
    *,
    above: bool = False,
    log: bool = False,
) -> Float[Array, "*batch"]:
    """``values`` interpolated where ``x`` first reaches ``target`` (``x <= target`` by default,
    ``x >= target`` with ``above=True``), along the last axis; NaN where it never does.

    For example the attention at the first time the loss reaches ``L*``:
    ``value_at(traj["loss"], traj["a_rel"], L_star)``. ``log=True`` interpolates in ``log x``
    (losses spanning decades). Traceable.
    """
    x, values = jnp.asarray(x), jnp.asarray(values)
    if x.shape != values.shape:
        raise ValueError(f"x and values must have the same shape, got {x.shape} and {values.shape}")
    if not isinstance(target, jax.core.Tracer):
        target = V.reals("target", target)
        try:
            if np.broadcast_shapes(target.shape, x.shape[:-1]) != x.shape[:-1]:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"target must be a number or broadcast against the batch shape {x.shape[:-1]}, got shape {target.shape}"
            ) from None
    hit = x >= target if above else x <= target
    i = jnp.argmax(hit, axis=-1)
    found = jnp.any(hit, axis=-1)
    j = jnp.maximum(i - 1, 0)
    f = jnp.log if log else (lambda z: z)
    x0 = f(jnp.take_along_axis(x, j[..., None], axis=-1)[..., 0])
    x1 = f(jnp.take_along_axis(x, i[..., None], axis=-1)[..., 0])
    v0 = jnp.take_along_axis(values, j[..., None], axis=-1)[..., 0]
    v1 = jnp.take_along_axis(values, i[..., None], axis=-1)[..., 0]
    dx = x1 - x0
    w = jnp.where((i > 0) & (dx != 0), (f(jnp.asarray(target, x.dtype)) - x0) / jnp.where(dx != 0, dx, 1.0), 1.0)
    return jnp.where(found, v0 + jnp.clip(w, 0.0, 1.0) * (v1 - v0), jnp.nan)


def growth_rate(
    ts: Real[ArrayLike, " T"] | Sequence[float], y: Real[ArrayLike, " T"] | Sequence[float], lo: float, hi: float
) -> float:
    """Least-squares slope of ``log y`` against ``t`` over the first contiguous stretch of
    saves with ``lo <= y <= hi``: a measured exponential rate (NaN with fewer than 3 points).
    One run: ``ts`` and ``y`` 1-D of one length (``ValueError`` otherwise; a batched trajectory's
    run ``i`` is ``traj.batch(i)``)."""
    ts, y = _one_run("growth_rate", ts, y)
    inside = (y >= lo) & (y <= hi)
    idx = np.flatnonzero(inside)
    if idx.size < 3:
        return float("nan")
    breaks = np.flatnonzero(np.diff(idx) > 1)
    seg = idx[: breaks[0] + 1] if breaks.size else idx
    if seg.size < 3:
        return float("nan")
    return float(np.polyfit(ts[seg], np.log(y[seg]), 1)[0])


def detect_plateaus(
    ts: Real[ArrayLike, " T"] | Sequence[float],
    y: Real[ArrayLike, " T"] | Sequence[float],
    rel_tol: float = 1e-3,
    min_duration: float = 0.0,
) -> list[dict]:
    """Plateaus of a positive curve (a loss): maximal runs of save times where the relative
    change per unit log-time, ``|d log y / d log t|``, stays below ``rel_tol``.

    Returns ``[{"t_start", "t_end", "level"}]`` in time order (``level``: the mean of ``y``
    over the plateau). Saves at ``t <= 0`` are ignored, and so is a save that repeats the time
    before it (the saves after an event all hold the event time: no stretch of time, not a
    plateau). A value ``y <= 0`` at a kept save is refused (``log y``). One run: ``ts`` and
    ``y`` 1-D of one length (``ValueError`` otherwise; a batched trajectory's run ``i`` is
    ``traj.batch(i)``).
    """
    V.positive("rel_tol", rel_tol)
    ts, y = _one_run("detect_plateaus", ts, y)
    keep = ts > 0
    t, L = ts[keep], y[keep]
    new = np.concatenate([[True], t[1:] != t[:-1]]) if t.size else np.ones(0, bool)
    t, L = t[new], L[new]
    bad = np.flatnonzero(L <= 0)
    if bad.size:
        raise ValueError(
            f"detect_plateaus needs a positive curve (a loss: its log is taken), but y = {L[bad[0]]:.6g} "
            f"at t = {t[bad[0]]:.6g}"
        )
    rate = np.abs(np.diff(np.log(L))) / np.maximum(np.diff(np.log(t)), 1e-300)
    flat = rate < rel_tol
    out = []
    i = 0
    while i < flat.size:
        if flat[i]:
            j = i
            while j + 1 < flat.size and flat[j + 1]:
                j += 1
            if t[j + 1] - t[i] >= min_duration:
                out.append({"t_start": float(t[i]), "t_end": float(t[j + 1]), "level": float(np.mean(L[i : j + 2]))})
            i = j + 1
        else:
            i += 1
    return out


def _one_run(what: str, ts: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``ts`` and ``y`` as float arrays of one run: 1-D, of one length; ``ValueError`` naming
    their shapes otherwise (the rows of a batch would be read as one curve)."""
    t, v = np.asarray(ts, dtype=float), np.asarray(y, dtype=float)
    if t.ndim != 1 or v.ndim != 1:
        raise ValueError(
            f"{what} takes one run: ts and y must be 1-D, got shapes {t.shape} and {v.shape}; pass one run "
            "(traj.batch(i).ts, traj.batch(i)[name]) or loop over the runs"
        )
    if t.shape != v.shape:
        raise ValueError(f"{what}: ts and y must have one value per save time, got shapes {t.shape} and {v.shape}")
    return t, v


class LineFit(NamedTuple):
    """A least-squares line ``y = slope x + intercept`` with the standard error of the slope and
    its ``level`` confidence interval (Student t with ``n - 2`` degrees of freedom)."""

    slope: float
    intercept: float
    stderr: float
    ci: tuple[float, float]
    n: int


def fit_line(
    x: Real[ArrayLike, "*n"] | Sequence[float], y: Real[ArrayLike, "*n"] | Sequence[float], level: float = 0.95
) -> LineFit:
    """Least-squares line through the finite points ``(x, y)`` (at least 2; the interval
    needs 3). ``level``, the confidence of the interval, lies in ``(0, 1)``."""
    from scipy import stats

    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    _check_fit_input(xs, ys, level)
    ok = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[ok], ys[ok]
    n = xs.size
    if n < 2 or np.ptp(xs) == 0:
        raise ValueError(f"a line needs at least 2 finite points with distinct x, got {n}")
    slope, intercept = np.polyfit(xs, ys, 1)
    if n < 3:
        return LineFit(float(slope), float(intercept), float("nan"), (float("nan"), float("nan")), n)
    resid = ys - (slope * xs + intercept)
    se = float(np.sqrt(np.sum(resid**2) / (n - 2) / np.sum((xs - xs.mean()) ** 2)))
    q = float(stats.t.ppf(0.5 + level / 2, n - 2))
    return LineFit(float(slope), float(intercept), se, (float(slope - q * se), float(slope + q * se)), n)


def _check_fit_input(xs: np.ndarray, ys: np.ndarray, level: Any) -> None:
    """``ValueError`` unless ``xs`` and ``ys`` have as many points and ``level`` is in ``(0, 1)``
    (at 0 the interval has width zero, at 1 and beyond it is infinite or NaN)."""
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same number of points, got {xs.size} and {ys.size}")
    if isinstance(level, bool) or not isinstance(level, int | float | np.integer | np.floating) or not 0 < level < 1:
        raise ValueError(f"level (the confidence of the interval) must be in (0, 1), got {level!r}")


def fit_power_law(
    x: Real[ArrayLike, "*n"] | Sequence[float], y: Real[ArrayLike, "*n"] | Sequence[float], level: float = 0.95
) -> LineFit:
    """``y ~ C x^p``: the line through ``(log x, log y)`` over positive finite points (the others
    are left out with a ``RuntimeWarning`` counting them); ``slope`` is the exponent ``p`` and
    ``intercept`` is ``log C``."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    _check_fit_input(x, y, level)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if not ok.all():
        warnings.warn(
            f"fit_power_law: left out {int((~ok).sum())} of {ok.size} points that are not positive and finite "
            "(a fit in log-log needs x > 0 and y > 0)",
            RuntimeWarning,
            stacklevel=_caller_outside_attnflow(),
        )
    return fit_line(np.log(x[ok]), np.log(y[ok]), level)
