"""Registered experiment ``derive-committee``: the plateau of the soft committee machine (Saad &
Solla 1995) from the derived ODE, against online SGD, with the escape time predicted by the
plateau's linearisation."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from ..analysis import first_crossing
from ..options import LinearGrid, SolverOptions
from ..report import Report, Timer, option, register
from ..sweep import sweep
from .setup import GaussHermite, Setup, soft_committee
from .theory import plateau as symmetric_plateau
from .theory import rule, solve
from .train import train


@dataclass(frozen=True)
class CommitteeConfig:
    """Options of ``derive-committee``: ``K = M = 2`` soft committee, ``g = erf(x / sqrt 2)``,
    ``T = I``, start ``R0 = r_sym + r0 I`` (every entry ``r_sym``, the diagonal ``r0`` more: ``r0``
    is the initial specialisation), ``Q0 = q0 I``."""

    etas: tuple[float, ...] = option((0.5, 1.0, 2.0), "learning rates of the sweep")
    r0s: tuple[float, ...] = option((1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1), "initial specialisations of the sweep")
    r_linear: float = option(1e-3, "the escape slope is fitted over r0 <= r_linear (the linear regime)")
    r_sym: float = 0.01
    q0: float = 0.2
    t_end: float = option(600.0, "every solve runs to t_end")
    points: int = option(12, "Gauss-Hermite points per dimension (12^4 nodes)")
    D: int = option(1000, "SGD input dimension")
    sgd_eta: float = option(1.0, "the learning rate of the SGD runs (one per sgd_r0)")
    sgd_r0s: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    seed: int = 0
    escape_fraction: float = option(0.5, "escape: error below this fraction of the plateau's error")

    def __post_init__(self) -> None:
        if not self.etas or min(self.etas) <= 0:
            raise ValueError(f"etas must be positive learning rates, got {list(self.etas)}")
        if sum(r <= self.r_linear for r in self.r0s) < 2 or min(self.r0s) <= 0:
            raise ValueError(
                f"r0s must be positive with at least two values <= r_linear = {self.r_linear}, got {list(self.r0s)}"
            )
        if not 0 < self.escape_fraction < 1:
            raise ValueError(f"escape_fraction must be in (0, 1), got {self.escape_fraction}")
        if not self.t_end >= 0.5:
            raise ValueError(f"t_end must be at least 0.5 (the ODE error is saved every 0.5), got {self.t_end}")
        if self.D < 4:
            raise ValueError(f"D must be at least 4, got {self.D}")
        if not self.sgd_r0s or min(self.sgd_r0s) <= 0:
            raise ValueError(f"sgd_r0s must be positive initial specialisations, got {list(self.sgd_r0s)}")
        if not self.sgd_eta > 0:
            raise ValueError(f"sgd_eta must be a positive learning rate, got {self.sgd_eta}")
        if not self.q0 > 0:
            raise ValueError(f"q0 must be positive, got {self.q0}")
        # Q0 - R0 R0^T >= 0: R0 = r_sym 11^T + r0 I has eigenvalues 2 r_sym + r0 and r0
        need = max(max((2 * self.r_sym + r) ** 2, r**2) for r in (*self.r0s, *self.sgd_r0s))
        if self.q0 < need:
            raise ValueError(
                f"q0 must be at least {need:.6g}, the largest (2 r_sym + r0)^2 or r0^2 over r0s and sgd_r0s (no "
                f"student weights have the overlaps Q0 = q0 I and R0 = r_sym + r0 I otherwise), got {self.q0}"
            )
        if self.points < 2:
            raise ValueError(f"points must be at least 2 (Gauss-Hermite points per dimension), got {self.points}")
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed}")
        self.setup(self.etas[0], self.r0s[0])  # checks the rest

    def setup(self, eta, r0) -> Setup:
        """The `Setup` at learning rate ``eta`` and initial specialisation ``r0``."""
        R0 = self.r_sym * jnp.ones((2, 2)) + r0 * jnp.eye(2)
        return Setup(
            soft_committee, soft_committee, R0, self.q0 * jnp.eye(2), eta=eta, quadrature=GaussHermite(self.points)
        )


def plateau(setup: Setup, r_sym: float, q0: float, rl) -> tuple[dict, float, float]:
    """`attnflow.derive.plateau` from ``R`` all ``r_sym`` and ``Q = q0 I``: the symmetric fixed
    point, its error and ``lambda_max``."""
    p = symmetric_plateau(setup.replace(R0=r_sym * jnp.ones((2, 2)), Q0=q0 * jnp.eye(2)), rule=rl)
    return p.state, float(p.error), float(p.lambda_max)


@register(
    "derive-committee",
    config=CommitteeConfig,
    description="Soft committee (Saad & Solla 1995) by derive: plateau length vs initial overlap and "
    "learning rate, ODE vs SGD, escape predicted by the plateau's linearisation",
)
def derive_committee(cfg: CommitteeConfig, quiet: bool) -> Report:
    report = Report("derive-committee", asdict(cfg))
    base = cfg.setup(cfg.etas[0], cfg.r0s[0])
    rl = rule(base)
    etas, r0s = np.asarray(cfg.etas, float), np.asarray(cfg.r0s, float)

    with Timer() as tm:
        plateaus = {eta: plateau(base.replace(eta=eta), cfg.r_sym, cfg.q0, rl) for eta in cfg.etas}
    report.timings["plateau fixed points"] = tm.seconds
    for eta, (_y, eg, lam) in plateaus.items():
        report.summary[f"eta={eta:g}: plateau error, lambda_max"] = [eg, lam]

    n_save = int(2 * cfg.t_end) + 1
    solver = SolverOptions(rtol=1e-7, atol=1e-9, max_steps=100_000)

    def curve(eta, r0):
        tr = solve(cfg.setup(eta, r0), cfg.t_end, save=LinearGrid(n_save), solver=solver, rule=rl)
        return {"ts": tr.ts, "error": tr["error"]}

    with Timer() as tm:
        res = sweep(curve, {"eta": etas, "r0": r0s}, progress=not quiet)
    report.timings["ODE sweep (eta x r0)"] = tm.seconds
    ts, err = np.asarray(res.values["ts"]), np.asarray(res.values["error"])
    thresh = np.asarray([cfg.escape_fraction * plateaus[e][1] for e in cfg.etas])[:, None]
    t_ode = np.asarray(first_crossing(ts, err, thresh, above=False, interpolate=True))
    report.summary["ODE escape times (rows: eta, columns: r0)"] = t_ode.tolist()

    # linearisation: t_esc = c + log(1 / r0) / lambda_max; the slope is predicted, c fitted per eta
    x = np.log(1.0 / r0s)
    lin = r0s <= cfg.r_linear
    slopes, offsets = [], []
    for i, eta in enumerate(cfg.etas):
        ok = np.isfinite(t_ode[i]) & lin
        slopes.append(float(np.polyfit(x[ok], t_ode[i][ok], 1)[0]) if ok.sum() >= 2 else np.nan)
        offsets.append(float(np.mean(t_ode[i][ok] - x[ok] / plateaus[eta][2])) if ok.any() else np.nan)
        ratio = slopes[-1] * plateaus[eta][2]
        report.summary[f"eta={eta:g}: fitted d t_esc / d log(1/r0) x lambda_max"] = ratio
        report.check(f"eta={eta:g}: escape slope vs 1/lambda_max (|ratio - 1|)", abs(ratio - 1.0), 0.05)

    j = int(np.argmin(np.abs(etas - cfg.sgd_eta)))
    sgd_theory = plateaus.get(cfg.sgd_eta) or plateau(base.replace(eta=cfg.sgd_eta), cfg.r_sym, cfg.q0, rl)
    sgd_t, sims, ths = [], {}, {}
    with Timer() as tm:
        for r0 in cfg.sgd_r0s:
            s = cfg.setup(cfg.sgd_eta, r0)
            th = solve(s, cfg.t_end, save=LinearGrid(n_save), solver=solver, rule=rl)
            t_th = float(first_crossing(th.ts, th["error"], cfg.escape_fraction * sgd_theory[1], above=False))
            t1 = min(cfg.t_end, 1.5 * t_th) if np.isfinite(t_th) else cfg.t_end
            sim = train(s, t1, key=cfg.seed, D=cfg.D, save=LinearGrid(101))
            ths[r0], sims[r0] = th, sim
            sgd_t.append(
                float(
                    first_crossing(
                        sim.ts, sim["error"], cfg.escape_fraction * sgd_theory[1], above=False, interpolate=True
                    )
                )
            )
    report.timings["SGD runs (and their ODEs)"] = tm.seconds
    report.summary[f"SGD escape times at eta={cfg.sgd_eta:g}, D={cfg.D} (per sgd_r0)"] = sgd_t
    if np.isclose(etas[j], cfg.sgd_eta):
        ode_at = np.interp(np.log(1 / np.asarray(cfg.sgd_r0s)), x[::-1], t_ode[j][::-1])
        report.summary["SGD / ODE escape time (per sgd_r0)"] = (np.asarray(sgd_t) / ode_at).tolist()
    report.notes.append(
        "At finite D the SGD noise seeds the specialisation with an O(D^-1/2) overlap, so for "
        "r0 << D^-1/2 the SGD escape time saturates near log(sqrt(D)) / lambda_max instead of growing as log(1/r0)."
    )
    report.figures["plateau"] = _figure(cfg, etas, r0s, t_ode, plateaus, offsets, slopes, sgd_t, ths, sims)
    last = cfg.sgd_r0s[-1]
    report.trajectories["theory"] = ths[last]
    report.trajectories["sgd"] = sims[last]
    return report


def _figure(cfg, etas, r0s, t_ode, plateaus, offsets, slopes, sgd_t, ths, sims) -> Figure:
    fig = Figure(figsize=(14, 4.0), layout="constrained")
    ax, bx, cx = fig.subplots(1, 3)
    colors = [f"C{i}" for i in range(len(etas))]
    grid = np.geomspace(r0s.min(), cfg.r_linear * 10, 50)
    for i, eta in enumerate(cfg.etas):
        ax.semilogx(r0s, t_ode[i], "o", color=colors[i], label=f"derived ODE, eta={eta:g}")
        ax.semilogx(grid, offsets[i] + np.log(1 / grid) / plateaus[eta][2], "--", color=colors[i], lw=1)
    ax.semilogx(cfg.sgd_r0s, sgd_t, "x", ms=9, mew=2, color="k", label=f"online SGD, D={cfg.D}, eta={cfg.sgd_eta:g}")
    ax.plot([], [], "k--", lw=1, label="linearisation: c + log(1/r0) / lambda_max (c fitted)")
    ax.axvline(1 / np.sqrt(cfg.D), color="0.6", lw=0.8, ls=":")
    ax.annotate(
        " r0 = 1/sqrt(D)", (1 / np.sqrt(cfg.D), 0.03), xycoords=("data", "axes fraction"), color="0.4", fontsize=7
    )
    ax.set_xlabel("initial specialisation r0 (R0 = r_sym + r0 I)")
    ax.set_ylabel(f"escape time t = steps/D (error < {cfg.escape_fraction:g} x plateau)")
    ax.set_title("Plateau length vs initial overlap")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3, which="both")
    lam = np.asarray([plateaus[e][2] for e in cfg.etas])
    bx.loglog(etas, slopes, "o", ms=8, label="fitted d t_esc / d log(1/r0) (ODE sweep)")
    bx.loglog(etas, 1 / lam, "k+--", ms=10, label="1 / lambda_max (Jacobian at the plateau)")
    bx.set_xlabel("learning rate eta")
    bx.set_ylabel("escape time per e-fold of r0")
    bx.set_title("Escape rate vs learning rate")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3, which="both")
    for k, r0 in enumerate(cfg.sgd_r0s):
        th, sim = ths[r0], sims[r0]
        cx.semilogy(th.ts, th["error"], "-", color=f"C{k}", label=f"derived ODE, r0={r0:g}")
        cx.semilogy(sim.ts, sim["error"], ".", ms=4, color=f"C{k}", label=f"SGD, D={cfg.D}, r0={r0:g}")
    cx.set_xlim(0, max(float(sim.ts[-1]) for sim in sims.values()))
    low = min(float(np.min(sim["error"])) for sim in sims.values())
    cx.set_ylim(max(low / 5, 1e-8), 1.0)
    cx.set_xlabel("t = steps / D")
    cx.set_ylabel("generalisation error")
    cx.set_title(f"Theory (lines) vs SGD (dots), eta={cfg.sgd_eta:g}")
    cx.legend(fontsize=7)
    cx.grid(alpha=0.3, which="both")
    return fig
