"""Plots as pure functions returning a matplotlib ``Figure`` (no pyplot state).

`overlay` draws theory as lines and simulations as markers (one seed) or as the seed
mean with a shaded min-max band (several seeds), observable by observable.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .trajectory import Trajectory

__all__ = ["overlay", "family", "heatmap", "save_figure"]

_COLORS = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"]


def _as_runs(simulations: Trajectory | Sequence[Trajectory] | None) -> list[Trajectory]:
    if simulations is None:
        return []
    if isinstance(simulations, Trajectory):
        if simulations.ts.ndim == 1:
            return [simulations]
        flat = simulations.ts.reshape(-1, simulations.ts.shape[-1])
        return [simulations_batch(simulations, i) for i in range(flat.shape[0])]
    return list(simulations)


def simulations_batch(traj: Trajectory, i: int) -> Trajectory:
    """The ``i``-th run of a batched trajectory, all batch axes flattened."""
    b = traj.ts.ndim - 1
    ts = np.asarray(traj.ts).reshape((-1, traj.ts.shape[-1]))[i]
    ys = {k: np.asarray(v).reshape((-1,) + v.shape[b:])[i] for k, v in traj.ys.items()}
    return Trajectory(ts, ys, traj.meta)


def _columns(y: np.ndarray) -> np.ndarray:
    return y.reshape(y.shape[0], -1)


def overlay(
    theory: Trajectory | None,
    simulations: Trajectory | Sequence[Trajectory] | None = None,
    names: Sequence[str] | None = None,
    *,
    log_time: bool = False,
    log_y: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    component_labels: Sequence[str] | None = None,
    time_label: str = "t",
    theory_label: str = "theory",
    simulation_label: str = "simulation",
    title: str | None = None,
    ncols: int = 2,
    figsize_per_panel: tuple[float, float] = (4.2, 3.2),
    max_markers: int = 60,
) -> Figure:
    """Theory (lines) against simulations (markers or seed band), one panel per observable.

    ``simulations`` may be one `Trajectory`, a batched one (leading seed axes) or a list.
    Observables with feature axes draw one colour per component (``component_labels``).
    At most ``max_markers`` simulation points are drawn per curve (evenly in save index).
    """
    runs = _as_runs(simulations)
    if names is None:
        src = theory if theory is not None else runs[0]
        names = list(src.names)
    names = list(names)
    if not names:
        raise ValueError("overlay needs at least one observable name")
    labels = labels or {}
    fig, axes = _panels(len(names), ncols, figsize_per_panel)
    for ax, name in zip(axes, names):
        if theory is not None and name in theory:
            t = np.asarray(theory.ts)
            y = _columns(np.asarray(theory[name]))
            for j in range(y.shape[1]):
                lab = theory_label if j == 0 else None
                if component_labels is not None and y.shape[1] > 1:
                    lab = f"{theory_label} {component_labels[j]}"
                ax.plot(t, y[:, j], "-", color=_COLORS[j % 10], lw=1.8, label=lab)
        sim = [r for r in runs if name in r]
        keep = None
        if sim:
            T = len(sim[0].ts)
            keep = np.unique(np.linspace(0, T - 1, min(T, max_markers)).round().astype(int))
        if len(sim) == 1:
            t = np.asarray(sim[0].ts)[keep]
            y = _columns(np.asarray(sim[0][name]))[keep]
            for j in range(y.shape[1]):
                ax.plot(
                    t,
                    y[:, j],
                    "o",
                    ms=3.5,
                    mfc="none",
                    color=_COLORS[j % 10],
                    alpha=0.9,
                    label=simulation_label if j == 0 else None,
                )
        elif len(sim) > 1:
            t = np.asarray(sim[0].ts)[keep]
            ys = np.stack([_columns(np.asarray(r[name]))[keep] for r in sim])  # (seed, T, comp)
            for j in range(ys.shape[2]):
                c = _COLORS[j % 10]
                ax.fill_between(t, ys[:, :, j].min(0), ys[:, :, j].max(0), color=c, alpha=0.18, lw=0)
                ax.plot(
                    t,
                    ys[:, :, j].mean(0),
                    "o",
                    ms=3,
                    mfc="none",
                    color=c,
                    label=f"{simulation_label} (mean, min-max of {len(sim)})" if j == 0 else None,
                )
        _style_panel(ax, name, log_time, log_y, time_label, labels)
        ax.legend(fontsize=7)
    return _finish(fig, axes, len(names), title)


def family(
    trajectories: dict[str, Trajectory],
    names: Sequence[str],
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
    one panel per observable. ``time_transform`` maps the time axis (e.g. ``log10(1 + t)``)."""
    if not trajectories:
        raise ValueError("family needs at least one trajectory")
    names = list(names)
    labels = labels or {}
    styles = styles or {}
    fig, axes = _panels(len(names), ncols, figsize_per_panel)
    for ax, name in zip(axes, names):
        for j, (lab, tr) in enumerate(trajectories.items()):
            t = np.asarray(tr.ts)
            if time_transform is not None:
                t = time_transform(t)
            ax.plot(t, np.asarray(tr[name]), styles.get(lab, "-"), color=_COLORS[j % 10], lw=1.6, label=lab)
        _style_panel(ax, name, log_time, log_y, time_label, labels)
    axes[0].legend(fontsize=7, title=legend_title, title_fontsize=7)
    return _finish(fig, axes, len(names), title)


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
    x: Sequence[Any],
    y: Sequence[Any],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    colorbar_label: str = "",
    annotate: bool = True,
    fmt: str = "{:.1f}",
    cmap: str = "viridis",
) -> Figure:
    """A labelled heatmap of ``values[i_y, i_x]`` with tick labels ``x`` and ``y``."""
    v = np.asarray(values, dtype=float)
    if v.shape != (len(y), len(x)):
        raise ValueError(f"values must have shape (len(y), len(x)) = {(len(y), len(x))}, got {v.shape}")
    fig = Figure(figsize=(1.0 + 0.8 * len(x), 0.8 + 0.6 * len(y)), layout="constrained")
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


def save_figure(fig: Figure, path: str | Path, dpi: int = 130) -> Path:
    """Save a figure as PNG (creating the folder), atomically: a temporary file renamed into place."""
    from ._io import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
