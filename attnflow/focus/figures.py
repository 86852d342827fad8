"""Figures of focus and dilution: pure functions of trajectories returning matplotlib Figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.ticker as mticker
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from ..plot import mark_times
from ..trajectory import Trajectory
from .metrics import embedding_pca

__all__ = ["attention_snapshots", "cycle_figure", "embedding_pca_figure", "rates_figure", "symmetry_figure"]


def cycle_figure(
    tr: Trajectory,
    pred: Mapping[str, float],
    rates: Mapping[str, Any],
    title: str,
    stage_times: Mapping[str, float] | None = None,
    measured_times: Mapping[str, Any] | None = None,
) -> Figure:
    """Four panels of a population flow over a cycle: the stepwise loss against ``log d``,
    ``H(pi)`` and ``L_*``; the ``pi``-weighted attention entropy; the spectra of the four
    matrices (needs ``sv_W1``, ``sv_WQ``, ``sv_WK`` beside ``sv_W0``); ``|M|`` and ``q_plus``
    against the predicted slopes ``2 sigma`` and ``c`` (``rates``: ``two_sigma``, ``c`` and the
    Stage II ``window``). ``stage_times`` (predicted) and ``measured_times`` (on the flow) of
    stage transitions are marked on the loss and entropy panels (`attnflow.plot.mark_times`)."""
    ts = np.asarray(tr.ts)
    fig = Figure(figsize=(11, 7.2), layout="constrained")
    (a1, a2), (a3, a4) = fig.subplots(2, 2)
    a1.semilogx(ts, tr["loss"], "k-", lw=1.8, label="population loss")
    for lev, lab, ls in (
        (pred["log_d"], "log d", ":"),
        (pred["H_pi"], "H(pi)", "--"),
        (pred["L_star"], "L_* (Bayes)", "-."),
    ):
        a1.axhline(lev, color="C3", ls=ls, lw=1, label=lab)
    a1.set_xlabel("t")
    a1.set_ylabel("loss")
    # the loss and its levels only, right of the drops, below log d; the stage markers are named on the entropy panel
    a1.legend(fontsize=7, loc="center right")
    a1.set_title("Stepwise loss")
    if stage_times:
        for ax in (a1, a2):
            mark_times(
                ax,
                stage_times,
                measured_times,
                colors=["C4", "C1"],
                theory_label="theory (R8)",
                measured_label="flow",
                legend=False,
            )
    a2.semilogx(ts, tr["entropy"], "C0-", label="pi-weighted token entropy")
    a2.set_xlabel("t")
    a2.set_ylabel("attention entropy")
    a2.set_title("Focus (down), dilution (up), re-focus (down)")
    a2.legend(fontsize=7, loc="center left")
    for k, c in (("sv_W0", "C0"), ("sv_W1", "C1"), ("sv_WQ", "C2"), ("sv_WK", "C3")):
        sv = np.asarray(tr[k])
        for j in range(min(3, sv.shape[1])):
            a3.semilogy(
                ts,
                sv[:, j],
                color=c,
                lw=1.4 - 0.4 * j,
                ls=["-", "--", ":"][j],
                label=f"s{j + 1}({k[3:]})" if j == 0 else None,
            )
    a3.set_xscale("log")
    a3.set_xlabel("t")
    a3.set_ylabel("singular values (solid s1, dashed s2, dotted s3)")
    a3.legend(fontsize=7)
    a3.set_title("Spectra")
    M, q = np.asarray(tr["norm_M"]), np.asarray(tr["q_plus"])
    a4.semilogy(ts, M, "C0-", label="|M| = |W0 W1| (flow)")
    a4.semilogy(ts, q, "C2-", label="q+ = |a1^T (WQ + WK)|/sqrt2 (flow)")
    # predicted slopes as guides parallel to the measured curves, a decade above them (on them they would hide)
    guide = 10.0
    tI = np.linspace(0.0, 12.0, 50)
    a4.semilogy(
        tI,
        guide * M[0] * np.exp(2 * pred["sigma"] * tI),
        "C0--",
        lw=1.2,
        label=f"predicted slope 2 sigma = {2 * pred['sigma']:.4f} (guide, x{guide:g})",
    )
    wa, wb = rates["window"]
    i0 = int(np.argmin(np.abs(ts - wa)))
    if np.isfinite(wa) and np.isfinite(wb) and wb > wa:
        tII = np.linspace(max(0.0, wa - 0.5 * (wb - wa)), wb + 1.5 * (wb - wa), 50)
        a4.semilogy(
            tII,
            guide * q[i0] * np.exp(pred["c"] * (tII - wa)),
            "C2--",
            lw=1.2,
            # the check compares the measured c with the formula averaged along the path: both are named
            label=f"predicted slope c(theta_c^1) = {pred['c']:.4f} (guide, x{guide:g}); "
            f"averaged along the path {rates['c_path']:.4f}",
        )
    a4.set_xlabel("t")
    a4.set_ylabel("norm")
    a4.set_xlim(0, min(ts[-1], 250))
    a4.set_ylim(1e-7, 1e2)
    a4.legend(fontsize=7, loc="lower right")
    a4.set_title(f"Rates (measured 2 sigma = {rates['two_sigma']:.4f}, c = {rates['c']:.4f})")
    fig.suptitle(title)
    return fig


def attention_snapshots(tr: Trajectory) -> Figure:
    """The population attention ``A`` at the start, ``t = 20``, the focus minimum of the entropy,
    half-way to and at the dilution maximum, and the end."""
    ts = np.asarray(tr.ts)
    A = np.asarray(tr["A"])
    ent = np.asarray(tr["entropy"])
    d = A.shape[-1]
    i_min = int(np.argmin(ent))
    i_max = i_min + int(np.argmax(ent[i_min:]))
    picks = sorted({0, int(np.argmin(np.abs(ts - 20))), i_min, (i_min + i_max) // 2, i_max, len(ts) - 1})
    # square panels fill the width: a wider figure would leave a gap before the colour bar
    fig = Figure(figsize=(2.2 * len(picks) + 0.9, 2.9), layout="constrained")
    axes = fig.subplots(1, len(picks))
    images = []
    for ax, i in zip(axes, picks, strict=True):
        images.append(ax.imshow(A[i], vmin=0, vmax=1, cmap="magma"))
        ax.set_title(f"t = {ts[i]:.3g}\nentropy {ent[i]:.3f}", fontsize=10)
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
        ax.set_xticks(range(d))
        ax.set_yticks(range(d))
    fig.colorbar(images[-1], ax=list(axes), label="attention A_qk", shrink=0.9, pad=0.01)
    return fig


def embedding_pca_figure(tr: Trajectory, pi: Sequence[float]) -> Figure:
    """Rows of ``W0`` over time (needs the observable ``W0``) on their first two principal axes."""
    ts = np.asarray(tr.ts)
    pcs = embedding_pca(np.asarray(tr["W0"]))  # (T, d, 2)
    fig = Figure(figsize=(5.4, 4.4), layout="constrained")
    ax = fig.subplots()
    color = np.log10(ts + 1e-2)
    for k in range(pcs.shape[1]):
        ax.plot(pcs[:, k, 0], pcs[:, k, 1], "-", color=f"C{k}", lw=1, alpha=0.7)
        ax.scatter(pcs[:, k, 0], pcs[:, k, 1], c=color, cmap="viridis", vmin=color.min(), vmax=color.max(), s=8)
    # labels at the end points, pointing into the plot (a label running past the edge pushes the colour bar away)
    x_mid = 0.5 * (np.min(pcs[..., 0]) + np.max(pcs[..., 0]))
    for k in range(pcs.shape[1]):
        right = pcs[-1, k, 0] > x_mid
        # the end point marked and the label in the token's colour on a light box: readable over
        # the other tokens' paths, and which path it names is unambiguous
        ax.plot(*pcs[-1, k], "s", color=f"C{k}", ms=6, mec="k", mew=0.6, zorder=4)
        ax.annotate(
            f"token {k} (pi={float(pi[k]):.2f})",
            pcs[-1, k],
            xytext=(-8 if right else 8, 6),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=8,
            color=f"C{k}",
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
            zorder=5,
        )
    fig.colorbar(ScalarMappable(Normalize(color.min(), color.max()), "viridis"), ax=ax, label="log10 t", pad=0.02)
    ax.set_xlabel("PC1 of embedding rows")
    ax.set_ylabel("PC2 of embedding rows")
    ax.set_title("Embedding rows of W0 over time", fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def rates_figure(rows: np.ndarray) -> Figure:
    """Measured Stage II rate against the closed form over a ``(lambda, tau)`` grid; ``rows``:
    ``lambda, tau, 2 sigma predicted, 2 sigma measured, c predicted, c measured``."""
    rows = np.asarray(rows)
    fig = Figure(figsize=(5.2, 4.0), layout="constrained")
    ax = fig.subplots()
    x = rows[:, 0] * rows[:, 1]
    order = np.argsort(x)
    # a small cross on each point: a grid of one (tau, lambda) draws no line at all
    ax.plot(x[order], rows[order, 4], "k-", marker="x", ms=5, label="closed form c (prop. to tau lambda)")
    ax.plot(x, rows[:, 5], "o", mfc="none", ms=8, label="measured growth rate of q+ from theta_c^1")
    ax.set_xlabel("tau * lambda")
    ax.set_ylabel("Stage II rate c")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("Focus rate over a (lambda, tau) grid")
    return fig


def symmetry_figure(ts: np.ndarray, s2: np.ndarray, deltas: np.ndarray, escape: np.ndarray, threshold: float) -> Figure:
    """``sigma_2(W0)`` over time for each ``delta`` (rows of ``s2``) and the escape time against
    ``delta`` with a slope ``-1`` guide."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    for i, dl in enumerate(deltas):
        a1.loglog(ts[1:], s2[i, 1:], label=f"delta = {dl:g}")
    a1.set_xlabel("t")
    a1.set_ylabel("sigma_2(W0)")
    a1.set_title("Stage IV: a second embedding direction")
    a1.legend(fontsize=7)
    nz = (deltas > 0) & np.isfinite(escape)
    if nz.any():
        a2.loglog(deltas[nz], escape[nz], "o-", label=f"measured: sigma2(W0) reaches {threshold:g}x its plateau")
        guide = escape[nz][0] * deltas[nz][0] / deltas[nz]
        a2.loglog(deltas[nz], guide, "k--", lw=1, label="guide: slope -1 through the first")
        # log ticks with every label of a narrow decade collide: label the deltas themselves
        a2.set_xticks(deltas[nz], [f"{d:g}" for d in deltas[nz]])
        a2.xaxis.set_minor_formatter(mticker.NullFormatter())
    never = [f"{d:g}" for d, e in zip(deltas, escape, strict=True) if not np.isfinite(e)]
    if never:  # not drawable on a log axis: said in the legend
        a2.plot([], [], " ", label=f"no escape by t = {ts[-1]:g}: delta = {', '.join(never)}")
    a2.set_xlabel("delta")
    a2.set_ylabel("escape time")
    a2.legend(fontsize=7)
    a2.set_title("Symmetry breaking: escape time vs delta")
    for ax in (a1, a2):
        ax.grid(alpha=0.3, which="both")
    return fig
