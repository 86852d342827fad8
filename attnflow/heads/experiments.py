"""Registered experiments of `attnflow.heads` (partial: ODE against SGD)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from matplotlib.figure import Figure

from ..report import Report, Timer, register
from ..simulate import OnlineSGD, simulate
from .data import FlippedSpike, SingleLocationTask
from .theory import FieldBank, MultiHead, Softmax, overlaps, sample_loss, solve_order_parameters

ODE_SGD_DEFAULTS = {"Ds": [500, 1000, 2000, 4000], "L": 4, "H": 2, "s": 2.0, "p": 0.5, "eta": 0.5, "sigma0": 0.5,
                    "t_end": 8.0, "bank": 4096, "seed": 0}


@register("heads-ode-vs-sgd", defaults=ODE_SGD_DEFAULTS,
          description="order-parameter ODE vs online SGD at several D (softmax heads, flipped-spike prior): the gap shrinks with D")
def heads_ode_vs_sgd(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-ode-vs-sgd", cfg)
    prior = FlippedSpike(cfg["s"], cfg["p"])
    bank = FieldBank(prior, cfg["L"], cfg["H"], n=cfg["bank"], key=cfg["seed"] + 7)
    gaps, runs = [], {}
    for D in cfg["Ds"]:
        task = SingleLocationTask(D, cfg["L"], prior, key=cfg["seed"] + 1)
        model = MultiHead.init(cfg["seed"] + 2, cfg["H"], D, Softmax(), sigma0=cfg["sigma0"])
        ov = overlaps(model.K, task.spikes)  # the ODE starts from the same finite-D draw
        steps = int(round(cfg["t_end"] * D))
        with Timer() as tm:
            sim = simulate(sample_loss, model, optax.sgd(cfg["eta"]), steps, mode=OnlineSGD(task.sample, 1), key=cfg["seed"] + 3,
                           clock=1.0 / D, observe=lambda m, task=task: overlaps(m.K, task.spikes), n_save=17, spacing="linear")
        rep.timings[f"SGD D={D} ({steps} steps)"] = tm.seconds
        with Timer() as tm:
            ode = solve_order_parameters(ov["M"], ov["Q"], Softmax(), bank, cfg["eta"], cfg["t_end"], ts=sim.ts)
        rep.timings[f"ODE D={D}"] = tm.seconds
        gap = max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q"))
        gaps.append(gap)
        runs[D] = (sim, ode)
        rep.summary[f"D={D}: max |SGD - ODE| over M and Q"] = gap
        rep.trajectories[f"sgd_D{D}"] = sim
        rep.trajectories[f"ode_D{D}"] = ode
    Ds = np.asarray(cfg["Ds"], dtype=float)
    slope = float(np.polyfit(np.log(Ds), np.log(gaps), 1)[0])
    rep.summary["gap ~ D^p: fitted p (finite-size theory: -1/2)"] = slope
    rep.check("the SGD-ODE gap shrinks with D (fitted exponent p must be negative: value = max(p, 0))", max(slope, 0.0), 0.0)
    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    a1, a2, a3 = fig.subplots(1, 3)
    for j, D in enumerate(cfg["Ds"]):
        sim, ode = runs[D]
        a1.plot(np.asarray(ode.ts), np.asarray(ode["M"][:, 0, 0]), "-", color=f"C{j}", label=f"ODE, D={D}")
        a1.plot(np.asarray(sim.ts), np.asarray(sim["M"][:, 0, 0]), "o", mfc="none", ms=4, color=f"C{j}", label=f"SGD, D={D}")
        a2.plot(np.asarray(ode.ts), np.asarray(ode["Q"][:, 0, 0]), "-", color=f"C{j}")
        a2.plot(np.asarray(sim.ts), np.asarray(sim["Q"][:, 0, 0]), "o", mfc="none", ms=4, color=f"C{j}")
    a1.set_xlabel("t = n / D")
    a1.set_ylabel("m_11")
    a1.legend(fontsize=6, ncol=2)
    a2.set_xlabel("t = n / D")
    a2.set_ylabel("q_11")
    a3.loglog(Ds, gaps, "o-", label="max |SGD - ODE|")
    a3.loglog(Ds, gaps[0] * np.sqrt(Ds[0] / Ds), "k--", lw=1, label="D^-1/2")
    a3.set_xlabel("D")
    a3.set_ylabel("gap")
    a3.legend(fontsize=7)
    for ax in (a1, a2, a3):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"Order-parameter ODE (lines) vs online SGD (markers): softmax, H={cfg['H']}, L={cfg['L']}, flipped spike s={cfg['s']}")
    rep.figures["ode_vs_sgd"] = fig
    return rep
