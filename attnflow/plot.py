"""Plots as pure functions returning a matplotlib ``Figure`` (no pyplot state).

`overlay` draws theory as lines and simulations as markers (one seed) or as the seed
mean with a shaded band (several seeds: min-max, standard deviation or standard error),
observable by observable; `mark_times`
adds the times the theory predicts for events (escapes, stage transitions, thresholds) and
the times measured on a simulation, as vertical lines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .trajectory import Trajectory, name_list

__all__ = ["overlay", "family", "heatmap", "mark_times", "save_figure"]

_COLORS = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"]


def _as_runs(simulations: Any) -> list[Trajectory]:
    """`overlay`'s runs (one value of its ``simulations`` mapping, or the whole of it) as a list of
    unbatched trajectories: a batched one, and each batched item of a list, gives one per run."""
    if simulations is None:
        return []
    from .sweep import SweepResult

    if isinstance(simulations, SweepResult):  # a sweep over seeds: its runs, as family takes it
        from .sweep import _SEED_AXES

        other = [d for d in simulations.dims if d not in _SEED_AXES]
        if other:
            # pooling runs of different parameters into one band would draw them as seeds
            raise ValueError(
                f"overlay: a SweepResult of runs must be over seeds only (axes {_SEED_AXES}); this one is over "
                f"{simulations.dims}: pick a point (res.sel({other[0]}=...)) or draw them side by side with af.family"
            )
        if not isinstance(simulations.values, Trajectory):
            raise ValueError(
                f"overlay: a SweepResult of runs must have Trajectory values, got {type(simulations.values).__name__}"
            )
        return _runs_of(simulations.values)  # its axes are seed axes, checked above
    if isinstance(simulations, Trajectory):
        if len(simulations.batch_shape) > 1:
            # its axes are unnamed: two of them are a grid (rates x seeds), whose runs a band would pool as seeds
            shape = simulations.batch_shape
            lead = "ijklmnopqrstuvw"[: len(shape) - 1]
            pick = lead if len(lead) == 1 else f"({', '.join(lead)})"
            raise ValueError(
                f"overlay: simulations has batch shape {shape}, more than one batch axis (a grid of parameters "
                f"and seeds?), and a band is drawn over one axis of seeds: pick a point with traj.batch({pick}) "
                "(its runs along the last axis), or res.sel(...) of its SweepResult, or draw the points side by "
                "side with af.family"
            )
        return _runs_of(simulations)
    if not isinstance(simulations, Sequence) or isinstance(simulations, str):
        raise ValueError(
            f"overlay: simulations must be a Trajectory, a SweepResult of runs, a list of them or a mapping "
            f"label -> runs, got {type(simulations).__name__}"
        )
    runs = []
    for i, item in enumerate(simulations):  # each item as a lone one: a batched run is its seeds
        if not isinstance(item, Trajectory | SweepResult):
            raise ValueError(
                f"overlay: simulations[{i}] must be a Trajectory (batched or not) or a SweepResult of runs, "
                f"got {type(item).__name__}"
            )
        runs += _as_runs(item)
    return runs


def _runs_of(traj: Trajectory) -> list[Trajectory]:
    """The runs of ``traj``, unbatched: itself, or one per entry of its batch axes."""
    if traj.ts.ndim == 1:
        return [traj]
    flat = traj.ts.reshape(-1, traj.ts.shape[-1])
    return [simulations_batch(traj, i) for i in range(flat.shape[0])]


def _failed(traj: Trajectory) -> bool:
    """A failed run (a point of a sweep that failed: its times are NaN)."""
    return bool(np.all(np.isnan(np.asarray(traj.ts, dtype=float))))


def simulations_batch(traj: Trajectory, i: int) -> Trajectory:
    """The ``i``-th run of a batched trajectory, all batch axes flattened."""
    b = traj.ts.ndim - 1
    ts = np.asarray(traj.ts).reshape((-1, traj.ts.shape[-1]))[i]
    ys = {k: np.asarray(v).reshape((-1,) + v.shape[b:])[i] for k, v in traj.ys.items()}
    return Trajectory(ts, ys, traj.meta)


def _columns(y: np.ndarray) -> np.ndarray:
    return y.reshape(y.shape[0], -1)


def _components(name: str, refs: Sequence[np.ndarray], given: Any) -> tuple[list[int], list[str | None]]:
    """The columns of observable ``name`` to draw (of the arrays ``refs``, theory and runs, each
    of shape ``(T, *features)``) and their labels. A square matrix symmetric at every saved time
    in all of them (an overlap ``Q``) draws its upper triangle only: each off-diagonal entry
    once. Labels: ``given`` (one list for every panel, or ``{name: list}``) indexed by the
    flattened entry, else ``name[i]`` / ``name[i,j]`` for up to 10 drawn entries (more would not
    fit a legend, and the colours repeat)."""
    shape = refs[0].shape[1:]
    cols = list(range(int(np.prod(shape, dtype=int))))

    def symmetric(a):
        return np.allclose(a, np.swapaxes(a, -1, -2), rtol=1e-12, atol=1e-14 * (1 + np.abs(a).max()))

    square = len(shape) == 2 and shape[0] == shape[1] > 1
    if square and all(r.shape[1:] == shape and np.all(np.isfinite(r)) and symmetric(r) for r in refs):
        cols = [k for k in cols if k // shape[1] <= k % shape[1]]
    if isinstance(given, Mapping):
        given = given.get(name)
    if len(cols) == 1:
        return cols, [None]
    if given is not None and len(given) < len(cols) and len(given) <= max(cols):
        raise ValueError(
            f"overlay: component_labels has {len(given)} labels, but {name!r} has {int(np.prod(shape))} entries "
            f"(shape {shape}): give one label per entry, or {{name: labels}} per observable"
        )
    if given is not None:
        return cols, [str(given[k]) for k in cols]
    if len(cols) > 10:
        return cols, [None] * len(cols)
    return cols, [f"{name}[{','.join(str(int(i)) for i in np.unravel_index(k, shape))}]" for k in cols]


def overlay(
    theory: Trajectory | None,
    simulations: Trajectory | Sequence[Trajectory] | Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    *,
    log_time: bool = False,
    log_y: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    component_labels: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    time_label: str = "t",
    theory_label: str = "theory",
    simulation_label: str = "simulation",
    title: str | None = None,
    ncols: int = 2,
    figsize_per_panel: tuple[float, float] = (4.2, 3.2),
    max_markers: int = 60,
    band: str | float | None = "minmax",
) -> Figure:
    """Theory (lines) against simulations (markers or seed band), one panel per observable.

    ``simulations`` may be one `Trajectory`, a batched one over one axis of seeds (more batch
    axes, a grid of parameters and seeds, are refused with a ``ValueError`` naming the batch
    shape: pick a point with ``traj.batch(i)``), an `attnflow.SweepResult` of runs (a sweep
    over seeds) or a list of them. Several
    runs saved at the same times are drawn as their mean ``m`` (markers) and a shaded band, per
    save time over the ``n`` runs: ``band="minmax"`` (the default) from the smallest to the largest
    run, ``"std"`` ``m +- sd`` with ``sd`` the sample standard deviation (``ddof = 1``, as
    ``Trajectory.std(ddof=1)``), ``"sem"`` ``m +- sd / sqrt(n)`` (the standard error of the mean),
    a number ``k > 0`` ``m +- k sd``, ``None`` no band; the legend entry says which (on a ``log_y``
    panel a lower edge at or below 0 runs off the bottom of the axis). Runs saved at
    different times (another ``t1`` or save grid) are drawn one by one. A mapping ``{label:
    runs}`` (each a `Trajectory`, batched or not, or a list) draws each group apart, with its own
    marker and legend entry (runs at several sizes: ``{"D=250": run_a, "D=1000": run_b}``).
    Observables with feature axes draw one colour per component, labelled ``name[i,j]`` (up to
    10 components) or by ``component_labels`` (one list for every panel, or ``{name: list}``,
    indexed by the flattened entry); a square matrix symmetric at every saved time (an overlap
    matrix ``Q``) draws each off-diagonal entry once (its upper triangle).
    A panel whose observable the theory or a group of runs lacks says so in its legend
    (``"simulation (no 'loss' recorded)"``): names differ between theory and training? rename
    one side (`Trajectory.rename`).
    At most ``max_markers`` simulation points are drawn per curve (evenly in save index).
    Failed runs of a sweep (NaN times) are left out, and their number is in the legend (a group
    whose runs all failed keeps its legend entry, "(all N runs failed)", "(the run failed)").
    """
    if theory is not None and not isinstance(theory, Trajectory):
        raise ValueError(f"overlay: theory must be a Trajectory or None, got {type(theory).__name__}")
    _check_band(band)
    if theory is not None and theory.batch_shape:
        raise ValueError(
            f"overlay draws one theory curve, but theory has batch shape {theory.batch_shape} (a sweep?): "
            "pass theory.batch(i) or theory.mean(), or draw the family with attnflow.family"
        )
    if theory is not None and _failed(theory):
        raise ValueError("overlay: the theory is a failed run (its times are NaN)")
    if isinstance(simulations, Mapping):
        given = [(str(k), _as_runs(v)) for k, v in simulations.items()]
    else:
        given = [(simulation_label, _as_runs(simulations))]
    groups = []
    for label, group in given:
        ok = [r for r in group if not _failed(r)]  # failed sweep points are left out, and counted
        if not ok and group:  # still in the legend: a size whose runs all diverged is a result
            label = f"{label} ({f'all {len(group)} runs' if len(group) > 1 else 'the run'} failed)"
        elif len(ok) < len(group):
            label = f"{label} ({len(group) - len(ok)} failed runs left out)"
        groups.append((label, ok))
    every = [r for _, group in given for r in group]
    runs = [r for _, group in groups for r in group]
    if every and not runs and theory is None:
        raise ValueError(f"overlay: all {len(every)} simulation runs failed (their times are NaN)")
    if theory is None and not runs:
        raise ValueError("overlay needs a theory or at least one simulation")
    names = list(name_list(names, (theory if theory is not None else runs[0]).names))
    if not names:
        raise ValueError("overlay needs at least one observable name")
    for name in names:
        if not ((theory is not None and name in theory) or any(name in r for r in runs)):
            have = sorted(set(theory.names if theory is not None else ()).union(*(r.names for r in runs)))
            raise KeyError(f"overlay: no observable {name!r} in the theory or the simulations; they have {have}")
    unknown = sorted(set([log_y] if isinstance(log_y, str) else log_y) - set(names))
    if unknown:
        raise KeyError(f"overlay: log_y names {unknown}, which are not among the panels {names}")
    labels = labels or {}
    fig, axes = _panels(len(names), ncols, figsize_per_panel)
    for ax, name in zip(axes, names):
        sim = [r for r in runs if name in r]
        refs = [np.asarray(theory[name])] if theory is not None and name in theory else []
        refs += [np.asarray(r[name]) for r in sim]
        cols, col_labels = _components(name, refs, component_labels)
        if theory is not None and name in theory:
            t = np.asarray(theory.ts)
            y = _columns(np.asarray(theory[name]))
            for c, j in enumerate(cols):
                lab = theory_label if c == 0 else None
                if col_labels[c] is not None:
                    lab = f"{theory_label} {col_labels[c]}"
                ax.plot(t, y[:, j], "-", color=_COLORS[c % 10], lw=1.8, label=lab)
        elif theory is not None:  # said, not left to a missing line (names differ? rename one side)
            ax.plot([], [], "-", color="0.5", lw=1.8, label=f"{theory_label} (no {name!r} recorded)")
        for g, (label, group) in enumerate(groups):
            if not group:
                ax.plot([], [], _MARKERS[g % len(_MARKERS)], color="0.5", mfc="none", label=label)
                continue
            sim = [r for r in group if name in r]
            if not sim:
                missing = f"{label} (no {name!r} recorded)"
                ax.plot([], [], _MARKERS[g % len(_MARKERS)], color="0.5", mfc="none", label=missing)
                continue
            _draw_runs(ax, name, sim, cols, label, _MARKERS[g % len(_MARKERS)], max_markers, band)
        _style_panel(ax, name, log_time, log_y, time_label, labels)
        ax.legend(fontsize=7, framealpha=0.6)  # the least-covering place, and data shows through
    return _finish(fig, axes, len(names), title)


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_BANDS = ("minmax", "std", "sem")


def _check_band(band: Any) -> None:
    """``ValueError`` naming ``band`` unless it is one of `overlay`'s bands."""
    if band is None or (isinstance(band, str) and band in _BANDS):
        return
    number = isinstance(band, int | float | np.integer | np.floating) and not isinstance(band, bool)
    if not (number and math.isfinite(band) and band > 0):
        raise ValueError(
            f"overlay: band must be 'minmax', 'std', 'sem', None or a positive number of standard deviations, "
            f"got {band!r}"
        )


def _band(ys: np.ndarray, band: str | float) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper edge of `overlay`'s band over the runs ``ys`` of shape ``(n, T)``."""
    if band == "minmax":
        return ys.min(0), ys.max(0)
    n = ys.shape[0]
    k = 1.0 if band == "std" else 1.0 / math.sqrt(n) if band == "sem" else float(band)
    mean, sd = ys.mean(0), ys.std(0, ddof=1)  # the unbiased seed-to-seed variance
    return mean - k * sd, mean + k * sd


def _band_label(band: str | float | None, n: int) -> str:
    """The legend's note on a group of ``n`` runs: ``"(mean, min-max of 3)"``, ``"(mean ± std of 3)"``, ..."""
    if band is None:
        what = ""
    elif isinstance(band, str):
        what = {"minmax": ", min-max", "std": " ± std", "sem": " ± s.e.m."}[band]
    else:
        what = f" ± {float(band):g} std"
    return f"(mean{what} of {n})"


def _draw_runs(
    ax: Any, name: str, sim: list, cols: list, label: str, marker: str, max_markers: int, band: Any = "minmax"
) -> None:
    """One group of runs of `overlay` on ``ax``: one run as markers, runs at the same save times
    as their mean (markers) and ``band`` (`_band`), runs at different times one by one."""
    if len(sim) == 1 or (len(sim) > 1 and not _same_times(sim)):
        # runs saved at different times are drawn one by one: a band would mix their clocks
        label = label if len(sim) == 1 else f"{label} ({len(sim)} runs, own save times)"
        for k, run in enumerate(sim):
            keep = _marker_indices(len(run.ts), max_markers)
            t = np.asarray(run.ts)[keep]
            y = _columns(np.asarray(run[name]))[keep]
            for c, j in enumerate(cols):
                ax.plot(
                    t,
                    y[:, j],
                    marker,
                    ms=3.5,
                    mfc="none",
                    color=_COLORS[c % 10],
                    alpha=0.9,
                    label=label if c == 0 and k == 0 else None,
                )
    elif len(sim) > 1:
        keep = _marker_indices(len(sim[0].ts), max_markers)
        t = np.asarray(sim[0].ts)[keep]
        ys = np.stack([_columns(np.asarray(r[name]))[keep] for r in sim])  # (seed, T, comp)
        for c, j in enumerate(cols):
            color = _COLORS[c % 10]
            if band is not None:
                ax.fill_between(t, *_band(ys[:, :, j], band), color=color, alpha=0.18, lw=0)
            ax.plot(
                t,
                ys[:, :, j].mean(0),
                marker,
                ms=3,
                mfc="none",
                color=color,
                label=f"{label} {_band_label(band, len(sim))}" if c == 0 else None,
            )


def _marker_indices(T: int, max_markers: int) -> np.ndarray:
    """At most ``max_markers`` of ``T`` save indices, evenly spaced, first and last included."""
    return np.unique(np.linspace(0, T - 1, min(T, max_markers)).round().astype(int))


def _same_times(runs: Sequence[Trajectory]) -> bool:
    """Whether every run was saved at the same times (to rounding), so that their values at a
    save index can be averaged."""
    t0 = np.asarray(runs[0].ts, dtype=float)
    for r in runs[1:]:
        t = np.asarray(r.ts, dtype=float)
        if t.shape != t0.shape or not np.allclose(t, t0, rtol=1e-9, atol=1e-12 * (1 + np.abs(t0).max())):
            return False
    return True


def family(
    trajectories: Mapping[str, Trajectory] | Trajectory | Any,
    names: str | Sequence[str],
    *,
    time_transform: Any = None,
    log_time: bool = False,
    log_y: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    time_label: str = "t",
    legend_title: str | None = None,
    title: str | None = None,
    ncols: int = 2,
    styles: dict[str, str] | None = None,
    figsize_per_panel: tuple[float, float] = (4.2, 3.2),
) -> Figure:
    """A family of curves (one per labelled trajectory, e.g. one per learning-rate ratio),
    one panel per observable. ``time_transform`` maps the time axis (e.g. ``log10(1 + t)``).
    An observable with feature axes (a matrix ``M``, ``Q`` or ``A``) draws every entry, each in
    its trajectory's colour.

    ``trajectories``: ``{label: Trajectory}``; or a `Trajectory` with one batch axis (one curve
    per run, labelled by index); or an `attnflow.SweepResult` over one axis whose values are a
    `Trajectory` (labelled ``axis=value``). Failed runs of a sweep (NaN times) are left out and
    named in the legend's title."""
    members = _family_members(trajectories)
    trajectories = {lab: tr for lab, tr in members.items() if not _failed(tr)}  # failed sweep points: left out
    if members and not trajectories:
        raise ValueError(f"family: all {len(members)} trajectories are failed runs (their times are NaN)")
    if not trajectories:
        raise ValueError("family needs at least one trajectory")
    if len(trajectories) < len(members):
        gone = [lab for lab in members if lab not in trajectories]
        legend_title = f"{legend_title or ''} (failed, left out: {', '.join(gone[:4])})".strip()
    names = list(name_list(names, ()))
    for name in names:
        missing = [lab for lab, tr in trajectories.items() if name not in tr]
        if missing:
            raise KeyError(f"family: no observable {name!r} in {missing[:3]}")
    labels = labels or {}
    styles = styles or {}
    fig, axes = _panels(len(names), ncols, figsize_per_panel)
    for ax, name in zip(axes, names):
        for j, (lab, tr) in enumerate(trajectories.items()):
            t = np.asarray(tr.ts)
            if time_transform is not None:
                t = time_transform(t)
            y = _columns(np.asarray(tr[name]))  # a matrix observable: every entry, in the member's colour
            for k in range(y.shape[1]):
                ax.plot(
                    t,
                    y[:, k],
                    styles.get(lab, "-"),
                    color=_COLORS[j % 10],
                    lw=1.6 if y.shape[1] == 1 else 1.0,
                    label=lab if k == 0 else None,
                )
        _style_panel(ax, name, log_time, log_y, time_label, labels)
    axes[0].legend(fontsize=7, title=legend_title, title_fontsize=7)
    return _finish(fig, axes, len(names), title)


def _family_members(trajectories: Any) -> dict[str, Trajectory]:
    """`family`'s input as ``{label: unbatched Trajectory}``."""
    from .sweep import SweepResult

    if isinstance(trajectories, SweepResult):
        if len(trajectories.dims) != 1 or not isinstance(trajectories.values, Trajectory):
            raise ValueError(
                f"family: a SweepResult must have one axis and Trajectory values, got dims {trajectories.dims} "
                f"and {type(trajectories.values).__name__}; select one axis with .sel(...) first"
            )
        (d,) = trajectories.dims
        return {f"{d}={_fmt(c)}": trajectories.values.batch(i) for i, c in enumerate(trajectories.coords[d])}
    if isinstance(trajectories, Trajectory):
        if len(trajectories.batch_shape) != 1:
            raise ValueError(
                f"family: a Trajectory must have one batch axis (one curve per run), got batch shape "
                f"{trajectories.batch_shape}"
            )
        return {str(i): trajectories.batch(i) for i in range(trajectories.batch_shape[0])}
    if not isinstance(trajectories, Mapping):
        raise ValueError(
            f"family: trajectories must be a mapping label -> Trajectory, a batched Trajectory or a "
            f"SweepResult, got {type(trajectories).__name__}"
        )
    for lab, tr in trajectories.items():
        if not isinstance(tr, Trajectory) or tr.batch_shape:
            raise ValueError(f"family: {lab!r} must be an unbatched Trajectory, got {tr!r:.80}")
    return {str(k): v for k, v in trajectories.items()}


def _fmt(c: Any) -> str:
    return f"{c:g}" if isinstance(c, float | np.floating) else str(c)


def _panels(n: int, ncols: int, figsize_per_panel: tuple[float, float]):
    ncols = min(ncols, n)
    nrows = int(np.ceil(n / ncols))
    fig = Figure(figsize=(figsize_per_panel[0] * ncols, figsize_per_panel[1] * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False).ravel()


def _style_panel(ax, name, log_time, log_y, time_label, labels) -> None:
    if log_time:
        ax.set_xscale("log")
    if name in log_y:
        ax.set_yscale("log")
    ax.set_xlabel(time_label)
    ax.set_ylabel(labels.get(name, name))
    ax.grid(alpha=0.3)


def _finish(fig: Figure, axes, n_used: int, title: str | None) -> Figure:
    for ax in axes[n_used:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def heatmap(
    values: Any,
    x: Sequence[Any] | str | None = None,
    y: Sequence[Any] | str | None = None,
    *,
    name: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    colorbar_label: str | None = None,
    annotate: bool = True,
    fmt: str = "{:.3g}",
    cmap: str = "viridis",
) -> Figure:
    """A labelled heatmap of ``values[i_y, i_x]`` with tick labels ``x`` and ``y``.

    ``values`` is an array of shape ``(len(y), len(x))`` (``xlabel`` and ``ylabel`` then
    required), or an `attnflow.SweepResult` over two axes. For a sweep, ``x`` and ``y`` are axis
    names (default: ``y`` the first axis, ``x`` the second; naming them the other way round draws
    the transpose), the ticks are the axis values, the axis labels default to the axis names, and
    the number drawn at each point is: the sweep's value (one number per point); ``values[name]``
    of a mapping (``name`` may be left out when it has one entry); or, for `Trajectory` values,
    the observable ``name`` at the last save time (``final()[name]``, e.g. the loss at the end of
    each run). The colour bar is labelled ``name`` unless ``colorbar_label`` is given. Failed
    points (NaN) are left blank. A ``name`` the values lack raises ``KeyError`` (as indexing a
    `Trajectory` does); anything else ``ValueError`` naming it.
    """
    from .sweep import SweepResult

    if isinstance(values, SweepResult):
        values, x, y, xlabel, ylabel = _sweep_grid(values, x, y, name, xlabel, ylabel)
        if colorbar_label is None:
            colorbar_label = name or ""
    else:
        if name is not None:
            raise ValueError(f"heatmap: name={name!r} picks a value of a SweepResult; values is an array")
        if x is None or y is None or isinstance(x, str) or isinstance(y, str):
            raise ValueError(
                "heatmap: an array of values needs its tick labels x and y as sequences (axis names are for a "
                f"SweepResult), got x={x!r:.60}, y={y!r:.60}"
            )
        if xlabel is None or ylabel is None:
            raise ValueError("heatmap: an array of values needs xlabel and ylabel")
    colorbar_label = colorbar_label or ""
    v = np.asarray(values, dtype=float)
    if v.shape != (len(y), len(x)):
        raise ValueError(f"values must have shape (len(y), len(x)) = {(len(y), len(x))}, got {v.shape}")
    # small grids still get room for the axis labels, the title and the colour bar
    fig = Figure(figsize=(max(5.0, 1.0 + 0.8 * len(x)), max(3.6, 0.8 + 0.6 * len(y))), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(v, origin="lower", cmap=cmap, aspect="auto")
    ax.set_xticks(range(len(x)), [str(a) for a in x], rotation=45)
    ax.set_yticks(range(len(y)), [str(a) for a in y])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate:
        vmax = np.nanmax(v) if np.isfinite(v).any() else 1.0
        for i in range(v.shape[0]):
            for j in range(v.shape[1]):
                if not np.isfinite(v[i, j]):
                    continue  # a failed point stays blank
                ax.text(
                    j,
                    i,
                    fmt.format(v[i, j]),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if v[i, j] < 0.6 * vmax else "black",
                )
    fig.colorbar(im, ax=ax, label=colorbar_label)
    if title:
        ax.set_title(title)
    return fig


def _sweep_grid(res: Any, x: Any, y: Any, name: str | None, xlabel: str | None, ylabel: str | None):
    """`heatmap`'s ``(values[i_y, i_x], x ticks, y ticks, xlabel, ylabel)`` of a sweep over two axes."""
    if len(res.dims) != 2:
        raise ValueError(
            f"heatmap: a SweepResult must have two axes, got dims {res.dims}; select the others with .sel(...) first"
        )
    for arg, a in (("x", x), ("y", y)):
        if a is not None and (not isinstance(a, str) or a not in res.dims):
            raise ValueError(f"heatmap: {arg} must name an axis of the sweep, one of {res.dims}, got {a!r:.60}")
    if x is None and y is None:
        y, x = res.dims
    elif x is None or y is None:
        given = x if x is not None else y
        other = res.dims[1] if given == res.dims[0] else res.dims[0]
        x, y = (given, other) if x is not None else (other, given)
    if x == y:
        raise ValueError(f"heatmap: x and y must name different axes of the sweep, got {x!r} for both")
    vals = res.values
    if isinstance(vals, Trajectory):
        if name is None:
            raise ValueError(f"heatmap: name the observable to draw (its final value), one of {sorted(vals.names)}")
        if name not in vals:
            raise KeyError(
                f"heatmap: no observable {name!r} in the sweep's trajectories; they have {sorted(vals.names)}"
            )
        v = vals.final()[name]
    elif isinstance(vals, Mapping):
        if name is None and len(vals) == 1:
            (name,) = vals
        if name is None:
            raise ValueError(f"heatmap: name the value to draw, one of {sorted(vals)}")
        if name not in vals:
            raise KeyError(f"heatmap: no value {name!r} in the sweep; it has {sorted(vals)}")
        v = vals[name]
    else:
        if name is not None:
            raise ValueError(f"heatmap: name={name!r}, but the sweep's values are one array, not a mapping")
        v = vals
    try:
        v = np.asarray(v, dtype=float)  # type: ignore[assignment]
    except (TypeError, ValueError):
        raise ValueError(f"heatmap: the sweep's values must be numbers, got {type(v).__name__}") from None
    if v.shape != res.shape:
        what = f"{name!r}" if name is not None else "the sweep's value"
        raise ValueError(
            f"heatmap: {what} has shape {v.shape[len(res.shape) :]} per grid point; a heatmap draws one number "
            "per point: pick an entry (e.g. sweep a function that returns it)"
        )
    if res.dims.index(y) != 0:
        v = v.T
    ticks = [[_fmt(c) for c in res.coords[a]] for a in (x, y)]
    return v, ticks[0], ticks[1], x if xlabel is None else xlabel, y if ylabel is None else ylabel


_EVENT_COLORS = ["k", "C3", "C4", "C5", "C6", "C8", "C9", "C7"]


def _event_times(arg: str, name: Any, value: Any) -> np.ndarray:
    """One event's time(s) as a 1-D float array; ``ValueError`` naming ``arg`` otherwise."""
    if not isinstance(name, str):
        raise ValueError(f"{arg}: event names must be strings, got {name!r}")
    try:
        v = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{arg}[{name!r}] must be a real number (or a 1-D sequence of them), got {value!r}") from None
    if v.ndim > 1 or np.iscomplexobj(value):
        raise ValueError(f"{arg}[{name!r}] must be a real number (or a 1-D sequence of them), got {value!r}")
    return v.reshape(-1)


def mark_times(
    ax: Any,
    times: Mapping[str, Any],
    measured: Mapping[str, Any] | None = None,
    *,
    colors: Sequence[str] | None = None,
    theory_label: str = "theory",
    measured_label: str = "measured",
    legend: bool = True,
    legend_kw: Mapping[str, Any] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """Mark event times on ``ax``: predicted ones as dashed vertical lines, measured ones as
    dotted vertical lines with a triangle at the top, one colour per event.

    ``times`` maps an event name to the time the theory predicts for it (e.g. an escape time
    ``log(1/eps) / lambda`` from `attnflow.escape_time`, or `attnflow.first_crossing` on a
    theory trajectory); ``measured`` maps (some of) the same names to the time measured on a
    simulation, one number or a 1-D sequence (one per seed: each is drawn). Non-finite times
    (an event that never happened: a NaN crossing) and, on a logarithmic time axis,
    non-positive ones are not drawn. A time outside the x range of the data already on ``ax``
    does not stretch the axis: its line is left out and its legend entry ends in "(off the
    axis)" (measured times partly on the axis: "(k off the axis)"). Each line gets a legend
    entry ``"EVENT: theory t=..."`` / ``"EVENT: measured t=..."``; with ``legend=True`` the legend of ``ax`` is redrawn
    (``legend_kw`` passed to ``ax.legend``, ``fontsize=7`` by default).

    Returns ``{event: (t_predicted, t_measured, t_predicted / t_measured)}`` for every event
    in ``times``, the measured time being the mean of the finite measured values (NaN where
    there is none): the rows of a report's predicted-against-measured table.

    Raises ``ValueError`` naming the argument: ``times`` or ``measured`` not a mapping, a
    name that is not a string, a time that is not a real number or 1-D sequence of them
    (``times`` takes one number per event), a measured event missing from ``times``, or
    ``colors`` empty.
    """
    if not isinstance(times, Mapping):
        raise ValueError(f"times must be a mapping of event name -> predicted time, got {type(times).__name__}")
    if measured is None:
        measured = {}
    if not isinstance(measured, Mapping):
        raise ValueError(f"measured must be a mapping of event name -> measured time(s), got {type(measured).__name__}")
    colors = list(_EVENT_COLORS if colors is None else colors)
    if not colors:
        raise ValueError("colors must name at least one colour")
    pred = {}
    for k, v in times.items():
        t = _event_times("times", k, v)
        if t.size != 1:
            raise ValueError(f"times[{k!r}] must be one number (the predicted time), got {v!r}")
        pred[k] = float(t[0])
    meas = {k: _event_times("measured", k, v) for k, v in measured.items()}
    extra = sorted(set(meas) - set(pred))
    if extra:
        raise ValueError(f"measured names events that times does not predict: {extra} (times has {sorted(pred)})")
    log_x = ax.get_xscale() == "log"

    def drawable(t: float) -> bool:
        return math.isfinite(t) and (t > 0 or not log_x)

    top = ax.get_xaxis_transform()  # x in data, y in axes fraction
    # a time far past the data would squash the curves into a corner: keep the data's range
    span = ax.get_xlim() if ax.has_data() else None
    lo, hi = (min(span), max(span)) if span is not None else (-math.inf, math.inf)

    def line(t: float, label: str | None, **style: Any) -> bool:
        if lo <= t <= hi:
            ax.axvline(t, label=label, **style)
            return True
        if label is not None:  # still in the legend, with the number
            ax.plot([], [], label=f"{label} (off the axis)", **style)
        return False

    rows = {}
    for i, (name, tp) in enumerate(pred.items()):
        c = colors[i % len(colors)]
        if drawable(tp):
            line(tp, f"{name}: {theory_label} t={tp:.3g}", color=c, ls="--", lw=1.2, alpha=0.9)
        tm = meas.get(name, np.zeros(0))
        finite = tm[np.isfinite(tm)]
        shown = [t for t in tm if drawable(float(t))]
        lab = f"{name}: {measured_label} t={np.mean(finite):.3g}" if shown else None
        if lab is not None and len(finite) > 1:
            lab += f" (mean of {len(finite)})"
        # the legend entry goes with the first line on the axis (off the axis when none is)
        on_axis = [t for t in shown if lo <= t <= hi]
        if lab is not None and on_axis and len(on_axis) < len(shown):
            lab += f" ({len(shown) - len(on_axis)} off the axis)"
        for t in on_axis or shown[:1]:
            if line(float(t), lab, color=c, ls=":", lw=1.2, alpha=0.9):
                ax.plot([t], [1.0], "v", color=c, ms=5, transform=top, clip_on=False)
            lab = None
        t_meas = float(np.mean(finite)) if finite.size else float("nan")
        ratio = tp / t_meas if finite.size and t_meas != 0 else float("nan")
        rows[name] = (tp, t_meas, ratio)
    if span is not None:
        ax.set_xlim(span)
    if legend:
        ax.legend(**{"fontsize": 7, **(legend_kw or {})})
    return rows


def save_figure(fig: Figure, path: str | Path, dpi: int = 130) -> Path:
    """Save a figure as PNG (creating the folder), atomically: a temporary file renamed into place."""
    from ._io import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
