"""The registered experiment ``finite-size``: the gap between each theory (`solve`) and its finite
network (`train`) as the size grows, with the fitted law ``gap = A N^p`` (`fit_finite_size`).

Like `attnflow.registry`, this module knows the theory packages (the core does not): it runs
``heads``, ``qkov`` and ``focus`` side by side.

- ``heads``: online SGD in dimension ``D`` against the order-parameter ODE, from the same
  initial overlaps; gap in ``(M, Q)``. Theory of online SGD: ``p = -1/2``.
- ``qkov``: the number of common tokens ``|C|`` (full-matrix population gradient flow against
  the authors' reduced ODE, whose rate is the ``|C| -> infinity`` limit ``kappa = 1``) and the
  context length ``m + n`` at fixed ``m / n`` (online SGD on sampled sequences against the
  reduced ODE with the exact rate ``kappa = 1 + b / |C|``); gap in ``(mu_OV, mu_QK)``.
- ``focus``: the context length ``s`` and the batch size ``B`` of online SGD against the
  population (infinite-context) gradient flow; gap in the population loss and the attention
  entropy.

Each size kind is one `attnflow.sweep` over sizes x seeds: sizes change array shapes, so they
are a `Static` axis (one compiled program per size), with the seeds vmapped inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from . import focus, heads, qkov
from .citations import keys_for, references
from .finite_size import FiniteSizeFit, fit_finite_size, trajectory_gap
from .options import LinearGrid, TimeGrid
from .report import Report, Timer, option, register
from .sweep import Static, sweep
from .trajectory import Trajectory

__all__ = ["FiniteSizeConfig", "finite_size"]


@dataclass(frozen=True)
class FiniteSizeConfig:
    """Options of ``finite-size`` (``attnflow show finite-size`` lists them)."""

    seeds: int = option(6, "SGD seeds per size (one vmapped sweep axis)")
    level: float = option(0.95, "of the confidence interval of each exponent")
    n_save: int = option(25, "save times per run (linear grid); the gap is the RMS over them")
    # heads: online SGD in dimension D vs the order-parameter ODE
    heads_Ds: tuple[int, ...] = (500, 1000, 2000, 4000)
    heads_t_end: float = 4.0
    heads_init_D: int = option(200, "the initial overlaps: one draw at this D, shared by the ODE and all SGD runs")
    heads_bank: int = option(16384, "Monte Carlo bank of the ODE (its error stays below the smallest gap)")
    heads_dtype: str = option("float32", "of the SGD runs (the ODE is float64)")
    # qkov: |C| by population gradient flow; context length m + n (n = 10 m) by online SGD
    qkov_n_commons: tuple[int, ...] = (50, 100, 200, 400)
    qkov_ms: tuple[int, ...] = (1, 2, 4, 8)
    qkov_n_common: int = option(100, "|C| of the context-length runs")
    qkov_t_end: float = 600.0
    qkov_dt: float = 1.0
    qkov_batch: int = 16
    # focus: context length s (batch fixed) and batch B (context fixed), online SGD vs population flow
    focus_contexts: tuple[int, ...] = (8, 16, 32, 64)
    focus_context_batch: int = 32
    focus_context_t_end: float = option(40.0, "Stage I (condensation) and the start of the H(pi) plateau")
    focus_context_dt: float = 0.02
    focus_batches: tuple[int, ...] = (1, 2, 4, 8)
    focus_batch_context: int = 256
    focus_batch_t_end: float = option(100.0, "into Stage II (focus): the attention moves, SGD noise shows")
    focus_batch_dt: float = 0.05


THEORIES = ("heads", "qkov", "focus")
"""The panels of the figure, in order."""

HEADS_EXPONENT_SLACK = 0.1
"""How far outside the interval of the fitted heads exponent ``-1/2`` may lie: over ``D = 500 ..
4000`` the measured exponent is a little steeper than the asymptotic ``-1/2`` (12 seeds:
``-0.64``, interval ``(-0.79, -0.50)``)."""

R2_TOLERANCE = {"|C|": 1e-3, "m+n": 0.5, "s": 0.5, "B": 0.5}
"""Bounds on ``1 - R^2`` of the log-log fits of the kinds without a law to test: the
deterministic ``|C|`` flow must be a clean power law; for the SGD kinds, whose gaps scatter from
seed to seed, the law must explain at least half the variance of ``log gap``."""


@dataclass(frozen=True)
class _Kind:
    """One size kind of one theory: its label, sizes, per-seed gaps (S, R) and fit."""

    theory: str
    name: str  # the size's symbol, e.g. "D", "|C|"
    what: str  # one line: what is compared
    fit: FiniteSizeFit


SEED_STRIDE = 1000
"""The ``i``-th size of a kind runs seeds ``SEED_STRIDE i + (0, 1, ...)``: no two runs share a
random stream, so the (size, seed) points of a fit are independent."""


def _size_sweep(run: Callable[..., Trajectory], sizes: Sequence[Any], seeds: np.ndarray, quiet: bool) -> list:
    """``run(size, seed)`` over sizes x seeds in one `attnflow.sweep`: the sizes a `Static` axis (one
    compiled program each, they change shapes), the seeds vmapped inside. The ``i``-th size runs
    seeds ``SEED_STRIDE i + seeds``. Returns one seed-batched trajectory per size."""
    index = {size: i for i, size in enumerate(sizes)}

    def point(size, seed):
        traj = run(size, seed + SEED_STRIDE * index[size])
        # the metadata names the size and is part of the pytree structure: drop it, so that every
        # size returns the same structure
        return Trajectory(traj.ts, traj.ys, t_event=traj.t_event)

    res = sweep(point, {"size": Static(list(sizes)), "seed": seeds}, progress=not quiet)
    return [jax.tree_util.tree_map(lambda x, i=i: x[i], res.values) for i in range(len(sizes))]


def _heads(cfg: FiniteSizeConfig, seeds: np.ndarray, quiet: bool, rep: Report) -> list[_Kind]:
    draw = heads.FiniteDDraw(
        jnp.asarray(heads.REFERENCE_SIGMA0), jnp.asarray(float(cfg.heads_init_D)), jnp.asarray(heads.INIT_SEED)
    )
    setup = heads.Setup(init=draw)
    grid = LinearGrid(cfg.n_save)
    with Timer() as tm:
        ode = heads.solve(setup, cfg.heads_t_end, save=grid, bank=heads.BankOptions(n=cfg.heads_bank))
    rep.timings["heads: order-parameter ODE"] = tm.seconds

    def run(D, seed):
        return heads.train(setup, cfg.heads_t_end, key=seed, D=D, save=grid, eval_samples=0, dtype=cfg.heads_dtype)

    with Timer() as tm:
        gaps = [trajectory_gap(ode, sims, ["M", "Q"]) for sims in _size_sweep(run, cfg.heads_Ds, seeds, quiet)]
    rep.timings[f"heads: SGD at D = {', '.join(map(str, cfg.heads_Ds))} ({len(seeds)} seeds each, one sweep)"] = (
        tm.seconds
    )
    fit = fit_finite_size(cfg.heads_Ds, gaps, cfg.level)
    what = f"online SGD in dimension D vs the order-parameter ODE, RMS over t <= {cfg.heads_t_end:g} of |(M, Q)|"
    return [_Kind("heads", "D", what, fit)]


def _qkov(cfg: FiniteSizeConfig, seeds: np.ndarray, quiet: bool, rep: Report) -> list[_Kind]:
    grid = LinearGrid(cfg.n_save)
    names = ["mu_ov", "mu_qk"]
    # |C|: the exact population flow of the full matrices against the authors' reduced ODE (kappa = 1, the
    # |C| -> infinity rate, the same for every |C|); deterministic, so one run per size
    with Timer() as tm:
        ode = qkov.solve(qkov.Setup(), cfg.qkov_t_end, save=grid)
        flow_gaps = []
        for C in cfg.qkov_n_commons:
            flow = qkov.train(qkov.Setup(n_common=C), cfg.qkov_t_end, save=grid)
            flow_gaps.append(trajectory_gap(ode, flow, names))
    rep.timings[f"qkov: reduced ODE and full-matrix flows at {len(cfg.qkov_n_commons)} |C|"] = tm.seconds
    flow_fit = fit_finite_size(cfg.qkov_n_commons, flow_gaps, cfg.level)

    # context length m + n at n = 10 m: online SGD on sampled sequences against the reduced ODE with the exact
    # full-matrix rate (common_correction), which does not depend on m and n at fixed m / n
    def run(m, seed):
        s = qkov.Setup(m=m, n=10 * m, n_common=cfg.qkov_n_common, common_correction=True)
        return qkov.train(s, cfg.qkov_t_end, key=seed, dt=cfg.qkov_dt, batch=cfg.qkov_batch, save=grid)

    gaps, lengths = [], []
    with Timer() as tm:
        for m, sims in zip(cfg.qkov_ms, _size_sweep(run, cfg.qkov_ms, seeds, quiet), strict=True):
            s = qkov.Setup(m=m, n=10 * m, n_common=cfg.qkov_n_common, common_correction=True)
            ode = qkov.solve(s, cfg.qkov_t_end, save=TimeGrid(np.asarray(sims.ts[0])))
            gaps.append(trajectory_gap(ode, sims, names))
            lengths.append(11 * m)
    rep.timings[f"qkov: SGD at m + n = {', '.join(map(str, lengths))} ({len(seeds)} seeds each, one sweep)"] = (
        tm.seconds
    )
    sgd_fit = fit_finite_size(lengths, gaps, cfg.level)
    return [
        _Kind(
            "qkov",
            "|C|",
            f"full-matrix gradient flow at |C| common tokens vs the reduced ODE (kappa = 1), RMS over "
            f"t <= {cfg.qkov_t_end:g} of |(mu_OV, mu_QK)|; deterministic: one run per size",
            flow_fit,
        ),
        _Kind(
            "qkov",
            "m+n",
            f"online SGD (dt = {cfg.qkov_dt:g}, batch {cfg.qkov_batch}) on contexts of m + n tokens (n = 10 m, "
            f"|C| = {cfg.qkov_n_common}) vs the reduced ODE (kappa = 1 + b/|C|), RMS of |(mu_OV, mu_QK)|",
            sgd_fit,
        ),
    ]


def _focus(cfg: FiniteSizeConfig, seeds: np.ndarray, quiet: bool, rep: Report) -> list[_Kind]:
    setup = focus.Setup()
    grid = LinearGrid(cfg.n_save)
    names = ["loss", "entropy"]

    def kind(sizes, t_end, dt, context_of, batch_of, label):
        _, steps = grid.steps_for(t_end, dt)
        with Timer() as tm:  # the flow at exactly the SGD save times
            flow = focus.solve(setup, float(dt * steps[-1]), save=TimeGrid(dt * steps))
        rep.timings[f"focus: population flow to t = {t_end:g}"] = tm.seconds

        def run(size, seed):
            return focus.train(setup, t_end, key=seed, dt=dt, context=context_of(size), batch=batch_of(size), save=grid)

        with Timer() as tm:
            gaps = [trajectory_gap(flow, sims, names) for sims in _size_sweep(run, sizes, seeds, quiet)]
        rep.timings[
            f"focus: SGD, {label} = {', '.join(map(str, sizes))} ({len(seeds)} seeds each, {steps[-1]} steps)"
        ] = tm.seconds
        return fit_finite_size(sizes, gaps, cfg.level)

    ctx_fit = kind(
        cfg.focus_contexts,
        cfg.focus_context_t_end,
        cfg.focus_context_dt,
        lambda s: s,
        lambda s: cfg.focus_context_batch,
        "context s",
    )
    batch_fit = kind(
        cfg.focus_batches,
        cfg.focus_batch_t_end,
        cfg.focus_batch_dt,
        lambda B: cfg.focus_batch_context,
        lambda B: B,
        "batch B",
    )
    return [
        _Kind(
            "focus",
            "s",
            f"online SGD on contexts of s tokens (batch {cfg.focus_context_batch}, dt = {cfg.focus_context_dt:g}) "
            f"vs the population flow, RMS over t <= {cfg.focus_context_t_end:g} of |(loss, entropy)|",
            ctx_fit,
        ),
        _Kind(
            "focus",
            "B",
            f"online SGD with batch B (contexts of {cfg.focus_batch_context}, dt = {cfg.focus_batch_dt:g}) vs the "
            f"population flow, RMS over t <= {cfg.focus_batch_t_end:g} of |(loss, entropy)|",
            batch_fit,
        ),
    ]


_TITLES = {
    "heads": "heads: online SGD vs order-parameter ODE",
    "qkov": "qkov: full network vs reduced ODE",
    "focus": "focus: online SGD vs population flow",
}
_XLABELS = {
    "heads": "dimension D",
    "qkov": "size: |C| common tokens (flow), m + n context tokens (SGD)",
    "focus": "size: context s, batch B",
}
_YLABELS = {
    "heads": "gap in (M, Q), RMS over t",
    "qkov": "gap in (mu_OV, mu_QK), RMS over t",
    "focus": "gap in (loss, entropy), RMS over t",
}


def finite_size_figure(kinds: list[_Kind], level: float) -> Figure:
    """One panel per theory: per-seed gaps (small markers), their mean (large markers) and the
    fitted ``A N^p`` (dashed) with ``p`` and the half width of its interval in the legend."""
    fig = Figure(figsize=(14.0, 4.4), layout="constrained")
    axes = dict(zip(THEORIES, fig.subplots(1, len(THEORIES))))
    for theory, ax in axes.items():
        mine = [k for k in kinds if k.theory == theory]
        for j, k in enumerate(mine):
            f, colour = k.fit, f"C{j}"
            N = np.repeat(f.sizes, f.gaps.shape[1])
            ax.loglog(N, f.gaps.ravel(), ".", color=colour, alpha=0.35, ms=5)
            ax.loglog(f.sizes, f.mean_gaps, "o", color=colour, ms=6, mfc="none", mew=1.5)
            xs = np.geomspace(f.sizes.min() / 1.15, f.sizes.max() * 1.15, 50)
            ax.loglog(xs, f.predict(xs), "--", color=colour, lw=1.5, label=f"N = {k.name}: {f.label()}")
        if theory == "heads" and mine:
            f = mine[0].fit
            x0 = float(np.exp(np.mean(np.log(f.sizes))))
            y0 = float(f.predict(x0))
            xs = np.geomspace(f.sizes.min() / 1.15, f.sizes.max() * 1.15, 50)
            ax.loglog(xs, y0 * (xs / x0) ** -0.5, ":", color="k", lw=1.2, label="D^(-1/2), online-SGD theory")
            ax.set_xticks(f.sizes, [f"{int(D)}" for D in f.sizes])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(title=_TITLES[theory], xlabel=_XLABELS[theory], ylabel=_YLABELS[theory])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, title=f"fit, {level:.0%} interval", title_fontsize=8)
    fig.suptitle("The finite-size law: gap = A N^p (dots: seeds, circles: seed mean, dashed: fit)")
    return fig


@register(
    "finite-size",
    package="core",
    config=FiniteSizeConfig,
    description="finite-size law: solve-vs-train gap against size for heads (D), qkov (|C|, context length) and "
    "focus (context, batch), fitted exponents with confidence intervals",
)
def finite_size(cfg: FiniteSizeConfig, quiet: bool) -> Report:
    rep = Report("finite-size", dataclasses.asdict(cfg))
    if cfg.seeds < 2:
        raise ValueError(f"seeds must be at least 2 (the fit's scatter), got {cfg.seeds}")
    seeds = np.arange(cfg.seeds)
    kinds = [*_heads(cfg, seeds, quiet, rep), *_qkov(cfg, seeds, quiet, rep), *_focus(cfg, seeds, quiet, rep)]
    for k in kinds:
        f = k.fit
        key = f"{k.theory}, N = {k.name}"
        rep.summary[f"{key}: exponent p, {cfg.level:.0%} interval, R^2"] = [f.exponent, *f.ci, f.r2]
        rep.summary[f"{key}: sizes"] = [float(x) for x in f.sizes]
        rep.summary[f"{key}: mean gap per size"] = [float(x) for x in f.mean_gaps]
        rep.notes.append(f"{key}: {k.what}.")
    heads_fit = next(k.fit for k in kinds if k.theory == "heads")
    rep.check(
        "heads: distance of the online-SGD exponent -1/2 from the interval of the fitted p "
        f"(allowed: {HEADS_EXPONENT_SLACK:g}, corrections to the law at D <= {max(cfg.heads_Ds)})",
        heads_fit.distance(-0.5),
        HEADS_EXPONENT_SLACK,
    )
    for k in kinds:
        if k.theory == "heads":
            continue
        f = k.fit
        steps = np.diff(f.mean_gaps) * np.sign(f.exponent)
        rep.check(
            f"{k.theory}, N = {k.name}: steps of the seed-mean gap against the fitted trend (count)",
            float(np.sum(steps < 0)),
            0.0,
        )
        rep.check(f"{k.theory}, N = {k.name}: 1 - R^2 of the log-log fit", 1.0 - f.r2, R2_TOLERANCE[k.name])
    rep.figures["finite_size"] = finite_size_figure(kinds, cfg.level)
    rep.references = references(keys_for("finite-size"))
    return rep
