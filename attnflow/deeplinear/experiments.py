"""Registered experiment ``deep-linear``: closed form vs `solve` vs `train` (gradient descent)."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..analysis import first_crossing, fit_power_law
from ..ode import integrate
from ..options import LinearGrid, SolverOptions
from ..plot import mark_times, overlay
from ..report import Report, Timer, option, register
from ..saddle import spectrum
from ..trajectory import compare
from .model import TwoLayerLinear
from .setup import REFERENCE_MODES, TEACHER_SEED, Setup
from .theory import conserved, factor_field, matrix_field, mode_strength, population_loss, solve
from .train import train


@dataclass(frozen=True)
class DeepLinearConfig:
    """Options of ``deep-linear``."""

    s: tuple[float, ...] = option(REFERENCE_MODES, "teacher mode strengths")
    n_in: int = 8
    n_out: int = 6
    u0: float = option(1e-3, "initial strength of every mode")
    t_end: float = 14.0
    dts: tuple[float, ...] = option((0.04, 0.02, 0.01), "gradient-descent time steps (learning rate = dt, eta = 1)")
    seed: int = option(TEACHER_SEED, "teacher frames; seed + 1 draws the random start of the matrix flow")

    def __post_init__(self) -> None:
        if len(self.s) == 0 or min(self.s) <= 0:
            raise ValueError(f"s must hold at least one positive mode strength, got {list(self.s)}")
        if not 0 < self.u0 < min(self.s) / 2:
            raise ValueError(
                f"u0 must lie in (0, min(s) / 2) = (0, {min(self.s) / 2:g}) (each mode is timed when it is half "
                f"learned, u = s / 2), got {self.u0:g}"
            )
        if not self.t_end > 0:
            raise ValueError(f"t_end must be positive, got {self.t_end:g}")
        if len(self.dts) < 2 or len(set(self.dts)) != len(self.dts) or min(self.dts) <= 0:
            raise ValueError(
                f"dts must hold at least two distinct positive time steps (the error order is fitted "
                f"over them), got {list(self.dts)}"
            )
        if max(self.dts) >= self.t_end:
            raise ValueError(f"dts must be below t_end = {self.t_end:g}, got {list(self.dts)}")
        # gradient descent maps each mode u -> u (1 + eta dt (s - u))^2 (eta = 1 here); its fixed point
        # u = s has slope 1 - 2 eta dt s, so it is stable only while eta dt s < 1: past that the run
        # oscillates about s or blows up, and a fitted error order would be meaningless
        rate = max(self.dts) * max(self.s)
        if rate >= 1.0:
            raise ValueError(
                f"dts must satisfy max(dts) * eta * max(s) < 1 (eta = 1): gradient descent "
                "u -> u (1 + eta dt (s - u))^2 converges to u = s only for eta dt s < 1 (its slope there is "
                f"1 - 2 eta dt s), got max(dts) = {max(self.dts):g} with max(s) = {max(self.s):g}, product {rate:g}"
            )
        for name in ("n_in", "n_out"):
            if getattr(self, name) < len(self.s):
                raise ValueError(
                    f"{name} must be at least the number of modes len(s) = {len(self.s)}, got {getattr(self, name)}"
                )
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed}")
        Setup(s=self.s, u0=self.u0, n_in=self.n_in, n_out=self.n_out, teacher_seed=self.seed)  # checks the rest


@register(
    "deep-linear",
    config=DeepLinearConfig,
    headline=True,
    description="Saxe et al. (2014) two-layer linear net: closed form vs solve vs gradient descent (train)",
)
def deep_linear(cfg: DeepLinearConfig, quiet: bool) -> Report:
    setup = Setup(s=cfg.s, u0=cfg.u0, n_in=cfg.n_in, n_out=cfg.n_out, teacher_seed=cfg.seed)
    s = np.asarray(setup.s)
    report = Report("deep-linear", cfg)

    with Timer() as tm:
        theory = solve(
            setup, cfg.t_end, save=LinearGrid(400), solver=SolverOptions(rtol=1e-10, atol=1e-14, progress=not quiet)
        )
    report.timings["solve"] = tm.seconds
    closed = mode_strength(theory.ts[:, None], setup.s, setup.u0)
    report.check("solve vs closed form (max rel. error)", float(jnp.max(jnp.abs(theory["u"] - closed) / closed)), 1e-8)

    errors, sims = [], {}
    with Timer() as tm:
        for dt in cfg.dts:
            sim = train(setup, cfg.t_end, dt=dt)
            sims[dt] = sim
            errors.append(float(jnp.max(jnp.abs(sim["u"] - mode_strength(sim.ts[:, None], setup.s, setup.u0)))))
            report.summary[f"GD dt={dt}: max |u - closed form|"] = errors[-1]
            report.summary[f"GD dt={dt}: max |u - solve| (compare)"] = compare(theory, sim)["u"]
    report.timings["train"] = tm.seconds
    fit = fit_power_law(cfg.dts, errors)
    report.summary["GD error ~ dt^p: fitted p"] = fit.slope
    report.check("GD error order in dt (|p - 1|)", abs(fit.slope - 1.0), 0.15)

    # Gradient flow of the full matrices from a random small start: conserved quantity (4).
    W0 = TwoLayerLinear.random(cfg.seed + 1, cfg.n_in, len(s), cfg.n_out, scale=0.05)
    teacher = setup.teacher
    flow = integrate(
        matrix_field,
        {"W1": W0.W1, "W2": W0.W2},
        cfg.t_end,
        args={"A": teacher.A, "tau": 1.0},
        save=LinearGrid(100),
        solver=SolverOptions(rtol=1e-10, atol=1e-12),
        observe=lambda t, W, a: {"C": conserved(W["W1"], W["W2"]), "loss": population_loss(W["W1"], W["W2"], a["A"])},
    )
    report.check(
        "conserved W1W1^T - W2^T W2 along integrated flow (max abs drift)",
        float(jnp.max(jnp.abs(flow["C"] - flow["C"][0]))),
        1e-7,
    )

    # Saddle at the origin of the factor ODE (3): eigenvalues +-s.
    zeros = jnp.zeros_like(setup.s)
    spec = spectrum(factor_field, {"a": zeros, "b": zeros}, {"s": setup.s, "tau": 1.0})
    eig = np.sort(np.real(np.asarray(spec.values)))
    report.check(
        "saddle eigenvalues at origin vs +-s (max abs error)", float(np.max(np.abs(eig - np.sort(np.r_[s, -s])))), 1e-12
    )
    report.summary["origin eigenvalues"] = [float(x) for x in eig[::-1]]

    report.trajectories["theory"] = theory
    for dt, sim in sims.items():
        report.trajectories[f"gd_dt{dt:g}"] = sim
    # the figure and the half-learned times: gradient descent at the coarsest step, where it departs most from the
    # flow (every run is saved, gd_dt<dt>.npz)
    dt_fig = max(cfg.dts)
    sim = sims[dt_fig]
    report.figures["modes"] = fig = overlay(
        theory,
        sim,
        ["u", "loss"],
        labels={"u": "mode strength u(t)", "loss": "population loss"},
        component_labels=[f"s={x:g}" for x in s],
        time_label="t = dt * step",
        theory_label="mode ODE (solve)",
        simulation_label=f"gradient descent, dt={dt_fig:g} (train)",
        title=f"Deep linear network: theory (lines) vs gradient descent at dt = {dt_fig:g} (markers)",
        log_y=("loss",),
    )
    # each mode is half learned (u = s/2) at t = tau log(s/u0 - 1) / (2 s): its escape from the saddle at the
    # origin, rate 2 s (closed form (2)); measured on the gradient-descent run of the figure
    t_pred = np.log(s / cfg.u0 - 1.0) / (2.0 * s)
    u_sim = np.asarray(sim["u"]).T / s[:, None]
    t_meas = np.asarray(first_crossing(np.broadcast_to(np.asarray(sim.ts), u_sim.shape), u_sim, 0.5, interpolate=True))
    events = {f"mode s={x:g} half learned": float(t) for x, t in zip(s, t_pred, strict=True)}
    ax = fig.axes[0]
    colors = [f"C{j}" for j in range(len(s))]
    # predicted times as dashed vertical lines; the measured ones, a few percent later, as diamonds on the
    # gradient-descent curves where they cross s/2 (a second vertical line would hide under the first)
    mark_times(ax, events, colors=colors, legend=False)
    report.summary["half-learned times below: measured on gradient descent at dt"] = dt_fig
    for j, (k, tp, tm) in enumerate(zip(events, t_pred, t_meas, strict=True)):
        report.summary[f"predicted vs measured time of {k} (t_pred, t_meas, ratio)"] = [
            float(tp),
            float(tm),
            float(tp / tm),
        ]
        ax.plot([tm], [s[j] / 2], "D", ms=6, color=colors[j], mec="k", mew=0.8, zorder=5)
    handles, labels = ax.get_legend_handles_labels()
    keep = [i for i, lab in enumerate(labels) if "half learned" not in lab]
    handles = [handles[i] for i in keep] + [
        Line2D([], [], color="0.3", ls="--", lw=1.2),
        Line2D([], [], ls="none", marker="D", ms=6, color="0.6", mec="k", mew=0.8),
    ]
    labels = [labels[i] for i in keep] + [
        "half learned, theory: t = log(s/u0 - 1) / (2s)",
        f"half learned, measured: GD (dt={dt_fig:g}) crosses u = s/2",
    ]
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    fig.axes[1].legend(fontsize=8, loc="upper right")  # above the loss curve, which falls to the right
    fig.set_size_inches(8.4, 4.2)  # room for the legend below the panels
    dts = np.asarray(cfg.dts)
    fig = Figure(figsize=(4.5, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.loglog(dts, errors, "o-", label="measured max |u_GD - u_theory|")
    ax.loglog(dts, errors[-1] * dts / dts[-1], "k--", label="slope 1")
    ax.set_xlabel("time step dt (learning rate eta dt, eta = 1)")
    ax.set_ylabel("max error in mode strength")
    ax.set_title("GD error against its time step dt: O(dt)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    report.figures["error_vs_dt"] = fig
    return report
