"""Registered experiments of `attnflow.focus` (spec `focus.md`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from matplotlib.figure import Figure

from ..report import Report, Timer, register
from ..simulate import OnlineSGD, simulate
from ..sweep import sweep
from .data import MarkovChain, perturbed_pi
from .metrics import detect_plateaus, growth_rate, observables, token_entropy
from .model import OneLayerAttention, empirical_attention, next_token_loss
from .theory import conserved, init_theta, population_flow, sigma, stage_predictions

CYCLE_DEFAULTS = {"pi": [0.75, 0.19, 0.05, 0.01], "lam": 0.5, "tau": 1.0, "m": 16, "mk": 16, "eps": 1e-3,
                  "t_end": 5000.0, "seed": 0, "n_save": 400, "rtol": 1e-9, "atol": 1e-12}


def _obs_with_conserved(t, theta, args):
    out = observables(theta, args["chain"], args["tau"])
    c = conserved(theta)
    out["C_m"], out["C_k"] = c["C_m"], c["C_k"]
    return out


def measured_rates(tr, H_pi: float) -> dict:
    """Measured Stage I and II rates and the rates predicted along the same stretch.

    Stage I: slope of ``log |M|`` while ``|M|`` grows from 30x its initial value to 1e-2
    (prediction ``2 sigma``). Stage II: slope of ``log q_+``, ``q_+ = |a1^T (WQ + WK)|/sqrt 2`` (the
    unstable mode, eigenvalue ``+c``), from when the loss is within 2e-3 of ``H(pi)`` until
    ``q_+ = 0.1``. The flow reaches the critical manifold slowly (its outer block is only neutral
    along ``pi^T d gamma = 0``), so the general formula is also averaged over that stretch
    (``c_path``) beside its value at ``theta_c^1``.
    """
    ts = np.asarray(tr.ts)
    M = np.asarray(tr["norm_M"])
    two_sigma = growth_rate(ts, M, 30 * M[0], 1e-2)
    loss, q, cl = np.asarray(tr["loss"]), np.asarray(tr["q_plus"]), np.asarray(tr["c_local"])
    a = int(np.argmax(loss < H_pi + 2e-3))
    b = a + int(np.argmax(q[a:] > 0.1))
    sl = slice(a, b + 1)
    c = float(np.polyfit(ts[sl], np.log(q[sl]), 1)[0]) if b - a >= 3 else float("nan")
    c_path = float(np.trapezoid(cl[sl], ts[sl]) / (ts[b] - ts[a])) if b > a else float("nan")
    return {"two_sigma": two_sigma, "c": c, "c_path": c_path, "window": (float(ts[a]), float(ts[b]))}


@register("focus-cycle", defaults=CYCLE_DEFAULTS, headline=True,
          description="population gradient flow on pi = (0.75, 0.19, 0.05, 0.01): loss plateaus, entropy cycle, rates 2 sigma and c")
def focus_cycle(cfg: dict, quiet: bool) -> Report:
    rep = Report("focus-cycle", cfg)
    chain = MarkovChain.lazy(cfg["pi"], cfg["lam"])
    theta0 = init_theta(cfg["seed"], chain.d, cfg["m"], cfg["mk"], cfg["eps"])
    pred = stage_predictions(chain, cfg["tau"], cfg["eps"])
    with Timer() as tm:
        tr = population_flow(theta0, chain, cfg["t_end"], tau=cfg["tau"], observe=_obs_with_conserved, n_save=cfg["n_save"],
                             rtol=cfg["rtol"], atol=cfg["atol"], progress=not quiet)
    rep.timings["population flow"] = tm.seconds
    loss = np.asarray(tr["loss"])
    rep.check("L(0) = log d (abs error)", abs(loss[0] - pred["log_d"]), 1e-5)
    rep.check("loss non-increasing on the save grid (max increase)", max(0.0, float(np.max(np.diff(loss)))), 1e-12)
    plateaus = detect_plateaus(tr.ts, loss, rel_tol=2e-2)
    rep.check("condensation plateau: closest approach of the loss to H(pi)", float(np.min(np.abs(loss - pred["H_pi"]))), 1e-3)
    rates = measured_rates(tr, pred["H_pi"])
    rep.summary["2 sigma: predicted / measured"] = [2 * pred["sigma"], rates["two_sigma"]]
    rep.summary["c: at theta_c^1 / general formula averaged along the path / measured"] = [pred["c"], rates["c_path"], rates["c"]]
    rep.summary["Stage II fit window (t)"] = list(rates["window"])
    rep.check("Stage I rate |M| ~ e^{2 sigma t}: relative error", abs(rates["two_sigma"] / (2 * pred["sigma"]) - 1), 0.03)
    rep.check("Stage II rate q_+ ~ e^{c t} vs general formula along the path: relative error", abs(rates["c"] / rates["c_path"] - 1), 0.03)
    rep.summary["Stage II measured c vs c at theta_c^1: relative difference"] = abs(rates["c"] / pred["c"] - 1)
    i1 = int(np.argmin(np.abs(loss - pred["H_pi"])))
    rep.check("Stage I condensation: 1 - cos(u1(W0), pi) on the H(pi) plateau", 1 - float(tr["cos_W0_pi"][i1]), 1e-3)
    drift = {k: float(jnp.max(jnp.abs(tr[k] - tr[k][0]))) for k in ("C_m", "C_k")}
    rep.check("conserved C_m, C_k (max abs drift)", max(drift.values()), 1e-9)
    ent = np.asarray(tr["entropy"])
    i_min = int(np.argmin(ent))
    i_max = i_min + int(np.argmax(ent[i_min:]))
    cycle = bool(ent[i_min] < ent[0] - 0.1 and ent[i_max] > ent[i_min] + 0.1 and ent[-1] < ent[i_max] - 1e-3)
    rep.summary["entropy: initial / focus minimum (t) / dilution maximum (t) / final"] = [
        float(ent[0]), float(ent[i_min]), float(tr.ts[i_min]), float(ent[i_max]), float(tr.ts[i_max]), float(ent[-1])]
    rep.summary["entropy cycle down-up-down observed"] = cycle
    rep.summary["plateaus (t_start, t_end, level)"] = [[round(p["t_start"], 3), round(p["t_end"], 3), round(p["level"], 5)] for p in plateaus]
    rep.summary["predicted: log d, H(pi), L_*, sigma, c, T_I, T_II"] = [pred[k] for k in ("log_d", "H_pi", "L_star", "sigma", "c", "T_I", "T_II")]
    rep.trajectories["flow"] = tr.select("loss", "entropy", "norm_M", "q", "q_plus", "c_local", "D", "kappa", "sv_W0", "sv_W1", "sv_WQ", "sv_WK", "A",
                                         "cos_W0_pi", "cos_W1_ell", "cos_Phi_pipi")
    rep.figures["cycle"] = _cycle_figure(tr, pred, rates, cfg)
    rep.figures["attention_snapshots"] = _snapshots(tr, chain)
    return rep


def _cycle_figure(tr, pred, rates, cfg) -> Figure:
    ts = np.asarray(tr.ts)
    fig = Figure(figsize=(11, 7.2), layout="constrained")
    (a1, a2), (a3, a4) = fig.subplots(2, 2)
    a1.semilogx(ts, tr["loss"], "k-", lw=1.8, label="population loss")
    for lev, lab, ls in ((pred["log_d"], "log d", ":"), (pred["H_pi"], "H(pi)", "--"), (pred["L_star"], "L_* (Bayes)", "-.")):
        a1.axhline(lev, color="C3", ls=ls, lw=1, label=lab)
    a1.set_xlabel("t")
    a1.set_ylabel("loss")
    a1.legend(fontsize=7)
    a1.set_title("Stepwise loss")
    a2.semilogx(ts, tr["entropy"], "C0-", label="pi-weighted token entropy")
    a2.set_xlabel("t")
    a2.set_ylabel("attention entropy")
    a2.set_title("Focus (down), dilution (up), re-focus (down)")
    a2.legend(fontsize=7)
    for k, c in (("sv_W0", "C0"), ("sv_W1", "C1"), ("sv_WQ", "C2"), ("sv_WK", "C3")):
        sv = np.asarray(tr[k])
        for j in range(3):
            a3.semilogy(ts, sv[:, j], color=c, lw=1.4 - 0.4 * j, ls=["-", "--", ":"][j], label=f"s{j + 1}({k[3:]})" if j == 0 else None)
    a3.set_xscale("log")
    a3.set_xlabel("t")
    a3.set_ylabel("singular values (solid s1, dashed s2, dotted s3)")
    a3.legend(fontsize=7)
    a3.set_title("Spectra")
    M, q = np.asarray(tr["norm_M"]), np.asarray(tr["q_plus"])
    a4.semilogy(ts, M, "C0-", label="|M| = |W0 W1| (flow)")
    a4.semilogy(ts, q, "C2-", label="q+ = |a1^T (WQ + WK)|/sqrt2 (flow)")
    tI = ts[(ts < 12)]
    a4.semilogy(tI, M[0] * np.exp(2 * pred["sigma"] * tI), "C0--", lw=1, label=f"predicted slope 2 sigma = {2 * pred['sigma']:.4f}")
    wa, wb = rates["window"]
    i0 = int(np.argmin(np.abs(ts - wa)))
    tII = ts[(ts >= wa) & (ts <= wb)]
    if tII.size:
        a4.semilogy(tII, q[i0] * np.exp(pred["c"] * (tII - tII[0])), "C2--", lw=1, label=f"slope c(theta_c^1) = {pred['c']:.4f}")
    a4.set_xlabel("t")
    a4.set_ylabel("norm")
    a4.set_xlim(0, min(ts[-1], 250))
    a4.set_ylim(1e-7, 1e2)
    a4.legend(fontsize=7)
    a4.set_title(f"Rates (measured 2 sigma = {rates['two_sigma']:.4f}, c = {rates['c']:.4f})")
    fig.suptitle(f"Focus and dilution cycle: pi = {tuple(cfg['pi'])}, lambda = {cfg['lam']}, tau = {cfg['tau']}")
    return fig


def _snapshots(tr, chain) -> Figure:
    ts = np.asarray(tr.ts)
    A = np.asarray(tr["A"])
    ent = np.asarray(tr["entropy"])
    i_min = int(np.argmin(ent))
    i_max = i_min + int(np.argmax(ent[i_min:]))
    picks = sorted({0, int(np.argmin(np.abs(ts - 20))), i_min, (i_min + i_max) // 2, i_max, len(ts) - 1})
    fig = Figure(figsize=(2.6 * len(picks), 2.9), layout="constrained")
    axes = fig.subplots(1, len(picks))
    for ax, i in zip(axes, picks):
        im = ax.imshow(A[i], vmin=0, vmax=1, cmap="magma")
        ax.set_title(f"t = {ts[i]:.3g}\nentropy {ent[i]:.3f}", fontsize=8)
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
        ax.set_xticks(range(chain.d))
        ax.set_yticks(range(chain.d))
    fig.colorbar(im, ax=list(axes), label="attention A_qk")
    return fig
