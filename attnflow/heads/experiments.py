"""Registered experiments of `attnflow.heads` (spec `heads.md` section 11)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from matplotlib.figure import Figure

from ..report import Report, Timer, register
from ..sweep import sweep
from .data import AnisotropicGaussian, Discrete, FlippedSpike, SingleLocationTask, bayes_risk
from .theory import (BayesSoftmax, FieldBank, HeadsDynamics, MultiHead, Softmax, Softmax1, feature_escape_times, from_finite_D,
                     keys_from_overlaps, online_sgd, oracle_config, overlaps, prune, risk, softmax_floor, solve_order_parameters,
                     specialisation_spectrum, symmetric_seed, unspecialised_point)

ACTIVATIONS = ("softmax", "softmax-1", "bayes-softmax")


def make_activation(name: str, H: int):
    """Default activations of the experiments: softmax; softmax-1 with learned global ``b, c`` from
    0, 1; Bayes-softmax with learned per-head ``b_h`` from 0."""
    if name == "softmax":
        return Softmax()
    if name == "softmax-1":
        return Softmax1()
    if name == "bayes-softmax":
        return BayesSoftmax(jnp.zeros(H))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def _grid(axes):
    for ax in np.ravel(axes):
        ax.grid(alpha=0.3, which="both")


def _first_crossing(ts, values, threshold):
    hit = np.flatnonzero(np.asarray(values) >= threshold)
    return float(np.asarray(ts)[hit[0]]) if hit.size else np.nan


# =============================================================================== heads-ode-vs-sgd
ODE_SGD_DEFAULTS = {"Ds": [500, 1000, 2000, 4000], "seeds": 4, "L": 4, "H": 2, "s": 2.0, "p": 0.5, "eta": 0.5, "sigma0": 0.5,
                    "t_end": 8.0, "bank": 4096, "seed": 0}


@register("heads-ode-vs-sgd", defaults=ODE_SGD_DEFAULTS,
          description="order-parameter ODE vs online SGD at several D and seeds (softmax heads, flipped spike): the gap shrinks with D")
def heads_ode_vs_sgd(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-ode-vs-sgd", cfg)
    prior = FlippedSpike(cfg["s"], cfg["p"])
    bank = FieldBank(prior, cfg["L"], cfg["H"], n=cfg["bank"], key=cfg["seed"] + 7)
    seeds = np.arange(cfg["seed"], cfg["seed"] + cfg["seeds"])
    gaps, runs = [], {}
    for D in cfg["Ds"]:
        task = SingleLocationTask(D, cfg["L"], prior, key=cfg["seed"] + 1)

        def one(seed, D=D, task=task):
            model = MultiHead.init(jax.random.PRNGKey(seed + 100), cfg["H"], D, Softmax(), sigma0=cfg["sigma0"])
            return online_sgd(task, model, cfg["eta"], cfg["t_end"], key=seed + 1000, n_save=17), overlaps(model.K, task.spikes)

        with Timer() as tm:
            sims, ov0 = sweep(one, {"seed": seeds}, progress=not quiet).values
        rep.timings[f"SGD D={D} ({len(seeds)} seeds x {int(cfg['t_end'] * D)} steps, vmapped)"] = tm.seconds
        per_seed, odes = [], []
        with Timer() as tm:
            for i in range(len(seeds)):  # each seed's ODE starts from that seed's finite-D draw
                ode = solve_order_parameters(ov0["M"][i], ov0["Q"][i], Softmax(), bank, cfg["eta"], cfg["t_end"], ts=sims.ts[i])
                odes.append(ode)
                per_seed.append(max(float(jnp.max(jnp.abs(sims[k][i] - ode[k]))) for k in ("M", "Q")))
        rep.timings[f"ODE D={D} ({len(seeds)} solves)"] = tm.seconds
        gap = float(np.mean(per_seed))
        gaps.append(gap)
        runs[D] = (sims, odes)
        rep.summary[f"D={D}: max |SGD - ODE| over M and Q (mean over {len(seeds)} seeds; spread)"] = (
            f"{gap:.4f} (min {min(per_seed):.4f}, max {max(per_seed):.4f})")
        rep.trajectories[f"ode_D{D}_seed0"] = odes[0]
    Ds = np.asarray(cfg["Ds"], dtype=float)
    slope = float(np.polyfit(np.log(Ds), np.log(gaps), 1)[0])
    rep.summary["gap ~ D^p: fitted p (finite-size theory: -1/2)"] = slope
    rep.check("the SGD-ODE gap shrinks with D (fitted exponent p must be negative: value = max(p, 0))", max(slope, 0.0), 0.0)
    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    a1, a2, a3 = fig.subplots(1, 3)
    for j, D in enumerate(cfg["Ds"]):
        sims, odes = runs[D]
        a1.plot(np.asarray(odes[0].ts), np.asarray(odes[0]["M"][:, 0, 0]), "-", color=f"C{j}", label=f"ODE, D={D}")
        a1.plot(np.asarray(sims.ts[0]), np.asarray(sims["M"][0, :, 0, 0]), "o", mfc="none", ms=4, color=f"C{j}", label=f"SGD, D={D}")
        a2.plot(np.asarray(odes[0].ts), np.asarray(odes[0]["Q"][:, 0, 1]), "-", color=f"C{j}")
        a2.plot(np.asarray(sims.ts[0]), np.asarray(sims["Q"][0, :, 0, 1]), "o", mfc="none", ms=4, color=f"C{j}")
    a1.set(xlabel="t = n / D", ylabel="m_11 (seed 0)")
    a1.legend(fontsize=6, ncol=2)
    a2.set(xlabel="t = n / D", ylabel="q_12 (seed 0)")
    a3.loglog(Ds, gaps, "o-", label=f"max |SGD - ODE|, mean of {len(seeds)} seeds")
    a3.loglog(Ds, gaps[0] * np.sqrt(Ds[0] / Ds), "k--", lw=1, label="D^-1/2")
    a3.set(xlabel="D", ylabel="gap")
    a3.legend(fontsize=7)
    _grid((a1, a2, a3))
    fig.suptitle(f"Order-parameter ODE (lines) vs online SGD (markers): softmax, H={cfg['H']}, L={cfg['L']}, flipped spike s={cfg['s']}")
    rep.figures["ode_vs_sgd"] = fig
    return rep


# =============================================================================== heads-specialisation-time
SPEC_TIME_DEFAULTS = {"L": 4, "H": 2, "s": 3.0, "p": 0.5, "eta": 1.0, "sigma0": 0.45, "threshold": 0.5, "bank": 2048,
                      "ode_Ds": [1e3, 1e4, 1e5, 1e6, 1e7], "ode_seeds": 4, "kappa": 2.0, "sgd_Ds": [500, 1000, 2000, 4000, 8000],
                      "sgd_seeds": 3, "t_end": 40.0, "sgd_t_end": 12.0, "seed": 0}


@register("heads-specialisation-time", defaults=SPEC_TIME_DEFAULTS,
          description="specialisation time against ln D (seeded ODE and SGD) with the slope 1/(2 lambda) from the Jacobian")
def heads_specialisation_time(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-specialisation-time", cfg)
    H, L, thr = cfg["H"], cfg["L"], cfg["threshold"]
    prior = FlippedSpike(cfg["s"], cfg["p"])
    bank = FieldBank(prior, L, H, n=cfg["bank"], key=cfg["seed"] + 7)
    dyn = HeadsDynamics(Softmax(), bank, cfg["eta"])
    with Timer() as tm:
        y_star = unspecialised_point(dyn, dyn.state(jnp.zeros((H, 1)), cfg["sigma0"] ** 2 * jnp.eye(H)))
        spec = specialisation_spectrum(dyn, y_star)
    rep.timings["fixed point and antisymmetric Jacobian"] = tm.seconds
    lam = float(spec.rate)
    slope_pred = 1 / (2 * lam)
    rep.summary["unspecialised fixed point: M = 0, q_hh, q_hh'"] = (float(y_star["Q"][0, 0]), float(y_star["Q"][0, 1]))
    rep.summary["escape rate lambda (leading antisymmetric eigenvalue)"] = lam
    rep.summary["predicted slope dt_spec / d ln D = 1 / (2 lambda)"] = slope_pred

    # (a) ODE from finite-D draws: antisymmetric part O(D^-1/2) with a random O(1) prefactor
    ode_t, ode_ln, example = [], [], {}
    with Timer() as tm:
        for D in cfg["ode_Ds"]:
            for k in range(cfg["ode_seeds"]):
                M0, Q0 = from_finite_D(int(D), H, 1, cfg["sigma0"], key=cfg["seed"] + 31 * k + 1)
                tr = solve_order_parameters(M0, Q0, Softmax(), bank, cfg["eta"], cfg["t_end"], escape=thr, n_save=200)
                if tr.meta["escape_time"] is not None:
                    ode_t.append(tr.meta["escape_time"])
                    ode_ln.append(np.log(D))
                if k == 0:
                    example[D] = solve_order_parameters(M0, Q0, Softmax(), bank, cfg["eta"], cfg["t_end"], n_save=200)
    rep.timings[f"ODE from finite-D draws: {len(cfg['ode_Ds'])} D x {cfg['ode_seeds']} seeds"] = tm.seconds
    ode_slope = float(np.polyfit(ode_ln, ode_t, 1)[0])
    rep.summary["(a) ODE from finite-D draws: escaped runs / total"] = f"{len(ode_t)} / {len(cfg['ode_Ds']) * cfg['ode_seeds']}"
    rep.summary["(a) ODE from finite-D draws: fitted slope of t_spec against ln D"] = ode_slope
    rep.check("(a) ODE from finite-D draws: slope against 1/(2 lambda) (relative error)", abs(ode_slope / slope_pred - 1), 0.15)

    # (b) the same deterministic seed kappa / sqrt(D) at the fixed point for the ODE and for SGD (keys built
    # with exactly these overlaps): the SGD noise re-seeds the mode, so the two differ by O(1) at most
    b_ln, b_ode, b_sgd, sgd_runs = [], [], [], {}
    seeds = np.arange(cfg["seed"], cfg["seed"] + cfg["sgd_seeds"])
    for D in cfg["sgd_Ds"]:
        M0, Q0 = symmetric_seed(y_star["M"], y_star["Q"], cfg["kappa"], D)
        t_ode = solve_order_parameters(M0, Q0, Softmax(), bank, cfg["eta"], cfg["t_end"], escape=thr).meta["escape_time"]
        task = SingleLocationTask(D, L, prior, key=cfg["seed"] + 1)

        def one(seed, D=D, task=task, M0=M0, Q0=Q0):
            K = keys_from_overlaps(M0, Q0, task.spikes, key=seed + 100)
            return online_sgd(task, MultiHead(K, Softmax()), cfg["eta"], cfg["sgd_t_end"], key=seed + 1000, n_save=241)

        with Timer() as tm:
            sims = sweep(one, {"seed": seeds}, progress=not quiet).values
        rep.timings[f"SGD D={D}: {len(seeds)} seeds x {int(cfg['sgd_t_end'] * D)} steps (vmapped)"] = tm.seconds
        sgd_runs[D] = sims
        ts_D = [_first_crossing(sims.ts[i], sims["specialisation"][i], thr) for i in range(len(seeds))]
        b_ln += [np.log(D)] * len(ts_D)
        b_sgd += ts_D
        b_ode.append(t_ode)
        rep.summary[f"(b) D={D}: t_spec ODE / SGD seeds"] = [round(t_ode, 3)] + [round(t, 3) for t in ts_D]
    if np.any(~np.isfinite(b_sgd)):
        raise RuntimeError(f"some SGD runs did not specialise by t = {cfg['sgd_t_end']}; raise sgd_t_end")
    lnD = np.log(np.asarray(cfg["sgd_Ds"], float))
    b_ode_slope = float(np.polyfit(lnD, b_ode, 1)[0])
    b_sgd_slope = float(np.polyfit(b_ln, b_sgd, 1)[0])
    offset = np.asarray(b_sgd).reshape(len(lnD), -1) - np.asarray(b_ode)[:, None]
    rep.summary["(b) seeded ODE: slope of t_spec against ln D"] = b_ode_slope
    rep.summary["(b) SGD: slope of t_spec against ln D"] = b_sgd_slope
    rep.summary["(b) SGD - ODE escape time: mean, max |.|"] = (float(offset.mean()), float(np.abs(offset).max()))
    rep.check("(b) seeded ODE: slope against 1/(2 lambda) (relative error)", abs(b_ode_slope / slope_pred - 1), 0.05)
    rep.check("(b) SGD: slope against 1/(2 lambda) (relative error)", abs(b_sgd_slope / slope_pred - 1), 0.15)
    rep.check("(b) SGD vs identically seeded ODE: max |t_SGD - t_ODE| (O(1) expected)", float(np.abs(offset).max()), 1.0)

    fig = Figure(figsize=(14, 4), layout="constrained")
    a1, a2, a3 = fig.subplots(1, 3)
    x = np.linspace(min(ode_ln) - 0.3, max(ode_ln) + 0.3, 50)
    a1.plot(ode_ln, ode_t, "s", mfc="none", color="C0", label=f"ODE, finite-D draws ({cfg['ode_seeds']} per D)")
    a1.plot(x, np.mean(ode_t) + (x - np.mean(ode_ln)) * slope_pred, "k-", lw=1, label=f"slope 1/(2 lambda) = {slope_pred:.2f}")
    a1.set(xlabel="ln D", ylabel=f"t_spec (|(I - 11^T/H) M|_F = {thr})", title="(a) random finite-D seeds")
    a1.legend(fontsize=7)
    x = np.linspace(lnD[0] - 0.2, lnD[-1] + 0.2, 20)
    a2.plot(lnD, b_ode, "s-", mfc="none", color="C0", label="ODE")
    a2.plot(b_ln, b_sgd, "o", ms=4, alpha=0.7, color="C1", label=f"online SGD ({len(seeds)} seeds per D)")
    a2.plot(x, np.mean(b_ode) + (x - lnD.mean()) * slope_pred, "k--", lw=1, label=f"slope 1/(2 lambda) = {slope_pred:.2f}")
    a2.set(xlabel="ln D", ylabel="t_spec", title=f"(b) seed {cfg['kappa']}/sqrt(D) at the fixed point, same for ODE and SGD")
    a2.legend(fontsize=7)
    for j, (D, tr) in enumerate(example.items()):
        a3.semilogy(np.asarray(tr.ts), np.asarray(tr["specialisation"]), color=f"C{j}", label=f"ODE, D = {D:.0e}")
    a3.axhline(thr, color="k", lw=0.8, ls=":")
    a3.set(xlabel="t = n / D", ylabel="|(I - 11^T/H) M|_F", title="(a) growth e^{lambda t} from the seed")
    a3.legend(fontsize=7)
    _grid((a1, a2, a3))
    fig.suptitle(f"Specialisation at n = Theta(D ln D): softmax, H={H}, L={L}, flipped spike s={cfg['s']}, eta={cfg['eta']}")
    rep.figures["specialisation_time"] = fig
    return rep


# =============================================================================== heads-staged
STAGED_DEFAULTS = {"L": 4, "H": 4, "variances": [9.0, 4.0], "eta": 1.0, "sigma0": 0.4, "t_end": 300.0, "bank": 1024,
                   "D_init": 2000, "sgd_D": 1000, "threshold": 0.5, "seed": 1}


@register("heads-staged", defaults=STAGED_DEFAULTS,
          description="anisotropic Gaussian prior: heads specialise feature by feature, in order of decreasing variance")
def heads_staged(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-staged", cfg)
    H, L, F = cfg["H"], cfg["L"], len(cfg["variances"])
    prior = AnisotropicGaussian(np.zeros(F), cfg["variances"])
    bank = FieldBank(prior, L, H, n=cfg["bank"], key=cfg["seed"] + 7)
    dyn = HeadsDynamics(Softmax(), bank, cfg["eta"])
    with Timer() as tm:
        y0 = unspecialised_point(dyn, dyn.state(jnp.zeros((H, F)), cfg["sigma0"] ** 2 * jnp.eye(H)))
        spec = specialisation_spectrum(dyn, y0)
    rep.timings["linearisation at M = 0"] = tm.seconds
    # per feature: the leading antisymmetric eigenvalue whose eigenvector lives on that feature's column of M
    rates = np.full(F, -np.inf)
    for val, vec in zip(np.real(np.asarray(spec.values)), spec.vectors):
        col = np.sum(np.asarray(vec["M"]) ** 2, axis=0)
        f = int(np.argmax(col))
        if col[f] > 0.5 * np.sum(col) and val > rates[f]:
            rates[f] = val
    for f in range(F):
        rep.summary[f"feature {f + 1} (Var = {cfg['variances'][f]}): linear escape rate at M = 0"] = float(rates[f])
    M0, Q0 = from_finite_D(cfg["D_init"], H, F, cfg["sigma0"], key=cfg["seed"])
    with Timer() as tm:
        ode = solve_order_parameters(M0, Q0, Softmax(), bank, cfg["eta"], cfg["t_end"], n_save=301)
    rep.timings["ODE"] = tm.seconds
    t_ode = feature_escape_times(ode, cfg["threshold"])
    task = SingleLocationTask(cfg["sgd_D"], L, prior, key=cfg["seed"] + 1)
    model = MultiHead.init(cfg["seed"] + 2, H, cfg["sgd_D"], Softmax(), sigma0=cfg["sigma0"])
    with Timer() as tm:
        sgd = online_sgd(task, model, cfg["eta"], cfg["t_end"], key=cfg["seed"] + 3, n_save=151, progress=not quiet)
    rep.timings[f"SGD D={cfg['sgd_D']} ({int(cfg['t_end'] * cfg['sgd_D'])} steps)"] = tm.seconds
    t_sgd = feature_escape_times(sgd, cfg["threshold"])
    for f in range(F):
        rep.summary[f"feature {f + 1}: specialisation time, ODE (D_init={cfg['D_init']}) / SGD (D={cfg['sgd_D']})"] = (
            float(t_ode[f]), float(t_sgd[f]))
    order = np.argsort(-np.asarray(cfg["variances"]))
    rep.check("ODE learns features in order of decreasing variance (number of inversions)",
              float(np.sum(np.diff(t_ode[order]) <= 0)), 0.0)
    rep.check("SGD learns features in order of decreasing variance (number of inversions)",
              float(np.sum(np.diff(t_sgd[order]) <= 0)), 0.0)
    rep.check("linear escape rates ordered by variance (number of inversions)", float(np.sum(np.diff(rates[order]) >= 0)), 0.0)
    rep.trajectories["ode"] = ode
    rep.trajectories["sgd"] = sgd
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    axes = fig.subplots(1, F + 1)
    for f in range(F):
        for h in range(H):
            axes[f].plot(np.asarray(ode.ts), np.asarray(ode["M"][:, h, f]), color=f"C{h}", label=f"head {h + 1}, ODE")
            axes[f].plot(np.asarray(sgd.ts), np.asarray(sgd["M"][:, h, f]), ".", ms=2.5, color=f"C{h}", alpha=0.6)
        axes[f].axvline(t_ode[f], color="k", lw=0.8, ls=":")
        axes[f].set(xlabel="t = n / D", ylabel=f"m_h{f + 1}", title=f"feature {f + 1}, Var theta = {cfg['variances'][f]}")
    axes[0].legend(fontsize=6)
    axes[F].plot(np.asarray(ode.ts), np.asarray(ode["error"]), "k-", label="ODE")
    axes[F].set(xlabel="t = n / D", ylabel="generalisation error E", title="error")
    _grid(axes)
    fig.suptitle(f"Staged specialisation: H={H}, zero-mean Gaussian prior, variances {cfg['variances']}; lines ODE, dots SGD (D={cfg['sgd_D']})")
    rep.figures["staged"] = fig
    return rep


# =============================================================================== heads-excursion
EXCURSION_DEFAULTS = {"L": 4, "s": 2.0, "eta": 1.0, "m_init": [0.4, 0.3, 0.2, -0.3], "noise_var": 0.16, "t_end": 400.0,
                      "bank": 1024, "sgd_D": 1000, "seed": 0}


@register("heads-excursion", defaults=EXCURSION_DEFAULTS,
          description="a 3:1 split of four softmax heads rebalances to 2:2 through an excursion of one majority head")
def heads_excursion(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-excursion", cfg)
    L = cfg["L"]
    m0 = np.asarray(cfg["m_init"], float)[:, None]
    H = m0.shape[0]
    prior = FlippedSpike(cfg["s"], 0.5)
    bank = FieldBank(prior, L, H, n=cfg["bank"], key=cfg["seed"] + 7)
    M0 = jnp.asarray(m0)
    Q0 = M0 @ M0.T + cfg["noise_var"] * jnp.eye(H)
    with Timer() as tm:
        ode = solve_order_parameters(M0, Q0, Softmax(), bank, cfg["eta"], cfg["t_end"], n_save=200, spacing="log", t_min=0.5)
    rep.timings["ODE"] = tm.seconds
    D = cfg["sgd_D"]
    task = SingleLocationTask(D, L, prior, key=cfg["seed"] + 1)
    K = keys_from_overlaps(M0, Q0, task.spikes, key=cfg["seed"] + 2)  # the ODE's initial overlaps, exactly
    with Timer() as tm:
        sgd = online_sgd(task, MultiHead(K, Softmax()), cfg["eta"], cfg["t_end"], key=cfg["seed"] + 3, n_save=200,
                         spacing="log", progress=not quiet)
    rep.timings[f"SGD D={D} ({int(cfg['t_end'] * D)} steps)"] = tm.seconds
    rep.trajectories["ode"] = ode
    rep.trajectories["sgd"] = sgd
    out = {}
    for name, tr in (("ODE", ode), ("SGD", sgd)):
        m = np.asarray(tr["M"][:, :, 0])
        n_plus = np.sum(m > 0, axis=1)
        crossed = [h for h in range(H) if m[0, h] > 0 and m[-1, h] < 0]
        split0 = np.abs(np.mean(m[0]))
        peak = float(np.max(np.abs(np.mean(m, axis=1))))
        t_cross = float(np.asarray(tr.ts)[np.flatnonzero(n_plus == H // 2)[0]]) if np.any(n_plus == H // 2) else np.nan
        out[name] = (crossed, t_cross)
        rep.summary[f"{name}: heads with m > 0 at start / end"] = f"{int(n_plus[0])} / {int(n_plus[-1])}"
        rep.summary[f"{name}: majority head(s) that crossed; time of crossing"] = f"{crossed}; t = {t_cross:.1f}"
        rep.summary[f"{name}: imbalance |mean_h m_h|: start, peak, end"] = (float(split0), peak, float(np.abs(np.mean(m[-1]))))
        rep.summary[f"{name}: error at start / end"] = (float(tr["error"][0]), float(tr["error"][-1])) if "error" in tr.ys else "-"
        rep.check(f"{name}: ends at the even split (|#plus - H/2|)", float(abs(n_plus[-1] - H // 2)), 0.0)
        rep.check(f"{name}: the imbalance grows before rebalancing (start - peak, must be < 0)", float(split0 - peak), 0.0)
    rep.summary["softmax floor, even split (s -> inf)"] = softmax_floor(L)
    rep.summary["softmax floor, 3:1 split (s -> inf)"] = softmax_floor(L, 0.5, n_plus=3, H=4) if H == 4 else "-"
    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    for h in range(H):
        a1.semilogx(np.asarray(ode.ts), np.asarray(ode["M"][:, h, 0]), color=f"C{h}", label=f"head {h + 1}, ODE")
        a1.semilogx(np.asarray(sgd.ts), np.asarray(sgd["M"][:, h, 0]), ".", ms=2.5, color=f"C{h}", alpha=0.6)
    a1.axhline(0, color="k", lw=0.6)
    a1.set(xlabel="t = n / D", ylabel="m_h (overlap with the spike)")
    a1.legend(fontsize=7)
    a2.semilogx(np.asarray(ode.ts), np.abs(np.mean(np.asarray(ode["M"][:, :, 0]), axis=1)), "k-", label="imbalance |mean_h m_h|, ODE")
    a2.semilogx(np.asarray(sgd.ts), np.abs(np.mean(np.asarray(sgd["M"][:, :, 0]), axis=1)), "k.", ms=2.5, label="SGD")
    a2b = a2.twinx()
    a2b.semilogx(np.asarray(ode.ts), np.asarray(ode["error"]), "C3-", lw=1)
    a2b.set_ylabel("generalisation error E (ODE)", color="C3")
    a2.set(xlabel="t = n / D", ylabel="|mean_h m_h|")
    a2.legend(fontsize=7, loc="upper left")
    _grid((a1, a2))
    fig.suptitle(f"Excursion: 3:1 split rebalancing, softmax H={H}, flipped spike s={cfg['s']}; lines ODE, dots SGD (D={D})")
    rep.figures["excursion"] = fig
    return rep


# =============================================================================== heads-activations
ACT_DEFAULTS = {"L": 4, "H": 2, "signals": [0.5, 1.0, 2.0, 3.0, 4.0, 6.0], "p": 0.5, "eta": 1.0, "sigma0": 0.3, "t_end": 200.0,
                "bank": 1024, "D_init": 1000, "bayes_samples": 200_000, "seed": 0}


def _oracle_errors(prior, L, H, bank):
    """Best errors at structured ("oracle") configurations: heads at the support points, one free scale
    (softmax), scale and (b, c) (softmax-1), and the exact Bayes-softmax oracle."""
    Th, _ = prior.support()
    M1 = jnp.concatenate([Th] * (H // Th.shape[0]))

    def err_softmax(z):
        M = jnp.exp(z[0]) * M1
        return 2 * risk(M, M @ M.T, Softmax(), bank)

    def err_softmax1(z):
        M = jnp.exp(z[0]) * M1
        return 2 * risk(M, M @ M.T, Softmax1(z[1], jnp.exp(z[2])), bank)

    out = {}
    for name, fn, z0 in (("softmax", err_softmax, jnp.zeros(1)), ("softmax-1", err_softmax1, jnp.array([0.0, 0.0, 0.0]))):
        best = None
        for start in (-1.0, 0.0, 1.0):  # a few starts of the log-scale: the objective is not convex
            sol = optx.minimise(lambda z, _: fn(z), optx.BFGS(rtol=1e-7, atol=1e-9), z0.at[0].set(start), throw=False, max_steps=300)
            val = float(fn(sol.value))
            best = val if best is None else min(best, val)
        out[name] = best
    M, Q, b = oracle_config(prior)
    Mr = jnp.concatenate([M] * (H // M.shape[0]))
    br = jnp.concatenate([b - jnp.log(H // M.shape[0])] * (H // M.shape[0]))  # duplicated heads share their weight
    # the oracle error is a rare-event probability at large s: evaluate it on a 32x larger bank
    big = FieldBank(prior, bank.zeta.shape[1], H, n=2**15, key=11, permutations="none")
    out["bayes-softmax"] = float(2 * risk(Mr, Mr @ Mr.T, BayesSoftmax(br), big))
    return out


@register("heads-activations", defaults=ACT_DEFAULTS, headline=True,
          description="error against signal strength: softmax, softmax-1, Bayes-softmax, trained and at oracle configurations, vs Bayes")
def heads_activations(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-activations", cfg)
    H, L = cfg["H"], cfg["L"]
    rows = {k: [] for k in ("bayes", "bayes_se") + tuple(f"trained {a}" for a in ACTIVATIONS) + tuple(f"oracle {a}" for a in ACTIVATIONS)}
    M0, Q0 = from_finite_D(cfg["D_init"], H, 1, cfg["sigma0"], key=cfg["seed"])
    finals = {}
    for s in cfg["signals"]:
        prior = FlippedSpike(s, cfg["p"])
        bank = FieldBank(prior, L, H, n=cfg["bank"], key=cfg["seed"] + 7)
        e, se = bayes_risk(prior, L, key=cfg["seed"] + 3, n=cfg["bayes_samples"])
        rows["bayes"].append(float(e))
        rows["bayes_se"].append(float(se))
        with Timer() as tm:
            for a in ACTIVATIONS:
                tr = solve_order_parameters(M0, Q0, make_activation(a, H), bank, cfg["eta"], cfg["t_end"], n_save=50, spacing="log",
                                            t_min=0.1)
                rows[f"trained {a}"].append(float(tr["error"][-1]))
                finals[(s, a)] = tr
            orc = _oracle_errors(prior, L, H, bank)
        rep.timings[f"s={s}: three trained ODEs and oracles"] = tm.seconds
        for a in ACTIVATIONS:
            rows[f"oracle {a}"].append(orc[a])
    S = np.asarray(cfg["signals"], dtype=float)
    for k, v in rows.items():
        if k != "bayes_se":
            rep.summary[f"E at s = {[float(x) for x in S]}: {k}"] = [float(f"{x:.4g}") for x in v]
    rep.summary["softmax floor L/(4(L-1)) (s -> inf, p = 1/2)"] = softmax_floor(L)
    big = int(np.argmax(S))
    rep.check("B-softmax at the oracle equals the Bayes risk (max |diff| - 4 standard errors over s; must be <= 0)",
              max(abs(o - b) - 4 * (se + 0.5 / np.sqrt(cfg["bank"])) for o, b, se in
                  zip(rows["oracle bayes-softmax"], rows["bayes"], rows["bayes_se"])), 0.0)
    rep.summary["oracle B-softmax vs Bayes risk: max |diff| over s"] = max(
        abs(o - b) for o, b in zip(rows["oracle bayes-softmax"], rows["bayes"]))
    rep.check("softmax (best scale) stays above the floor at the largest s (floor - E, must be <= 0)",
              softmax_floor(L) - rows["oracle softmax"][big], 0.0)
    rep.check("trained softmax-1 beats trained softmax at the largest s (E_sm1 - E_sm, must be <= 0)",
              rows["trained softmax-1"][big] - rows["trained softmax"][big], 0.0)
    rep.check("trained B-softmax within 0.02 of the Bayes risk at the largest s",
              abs(rows["trained bayes-softmax"][big] - rows["bayes"][big]), 0.02)
    fig = Figure(figsize=(11, 4), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    a1.plot(S, rows["bayes"], "k-", lw=2, label="Bayes risk")
    a1.axhline(softmax_floor(L), color="k", ls=":", lw=1, label="softmax floor L/(4(L-1))")
    for j, a in enumerate(ACTIVATIONS):
        a1.plot(S, rows[f"trained {a}"], "o-", color=f"C{j}", label=f"{a}, trained (ODE)")
        a1.plot(S, rows[f"oracle {a}"], "x--", color=f"C{j}", label=f"{a}, oracle configuration")
    a1.set(xlabel="signal strength s", ylabel="generalisation error E", yscale="log")
    a1.legend(fontsize=7)
    for j, a in enumerate(ACTIVATIONS):
        tr = finals[(S[big], a)]
        a2.semilogx(np.asarray(tr.ts), np.asarray(tr["error"]), color=f"C{j}", label=a)
    a2.axhline(rows["bayes"][big], color="k", lw=2, label="Bayes risk")
    a2.set(xlabel="t = n / D", ylabel="E", yscale="log", title=f"training curves at s = {S[big]}")
    a2.legend(fontsize=7)
    _grid((a1, a2))
    fig.suptitle(f"Activations against the Bayes risk: H={H}, L={L}, flipped spike p={cfg['p']}")
    rep.figures["activations"] = fig
    return rep


# =============================================================================== heads-pruning
PRUNE_DEFAULTS = {"L": 4, "H": 6, "F": 3, "s": 3.0, "eta": 1.0, "sigma0": 0.3, "t_end": 2000.0, "bank": 512, "D_init": 1000,
                  "softmax1_b0": 2.0, "softmax1_c0": 3.0, "seed": 0}

@register("heads-pruning", defaults=PRUNE_DEFAULTS,
          description="error against heads removed (greedy) for trained softmax, softmax-1 and Bayes-softmax on a one-hot discrete prior")
def heads_pruning(cfg: dict, quiet: bool) -> Report:
    rep = Report("heads-pruning", cfg)
    H, L, F = cfg["H"], cfg["L"], cfg["F"]
    prior = Discrete(cfg["s"] * np.eye(F))
    bank = FieldBank(prior, L, H, n=cfg["bank"], key=cfg["seed"] + 7)
    M0, Q0 = from_finite_D(cfg["D_init"], H, F, cfg["sigma0"], key=cfg["seed"])
    e_bayes, _ = bayes_risk(prior, L, key=cfg["seed"] + 3)
    rep.summary["Bayes risk"] = float(e_bayes)
    curves = {}
    free = H - F
    for a in ACTIVATIONS:
        if a == "softmax-1":  # per-head (b, c), started with heads partly off: from (0, 1) it plateaus far longer
            act = Softmax1(cfg["softmax1_b0"], cfg["softmax1_c0"], per_head=H)
        else:
            act = make_activation(a, H)
        with Timer() as tm:
            tr = solve_order_parameters(M0, Q0, act, bank, cfg["eta"], cfg["t_end"], n_save=40, spacing="log", t_min=0.1)
            trained = act.with_params({k: tr[k][-1] for k in act.learned})
            rules = ("renormalise", "mask") if a == "softmax-1" else ("mask",)
            results = {rule: prune(tr["M"][-1], tr["Q"][-1], trained, bank, order="greedy", rule=rule) for rule in rules}
        rep.timings[f"{a}: ODE training to t = {cfg['t_end']} and greedy pruning"] = tm.seconds
        rep.trajectories[a] = tr
        for rule, res in results.items():
            name = a if rule == "mask" and a != "softmax-1" else f"{a} ({rule})"
            curves[name] = res["error"]
            rep.summary[f"{name}: E after removing 0..{H - 1} heads"] = [round(float(x), 4) for x in res["error"]]
            rep.summary[f"{name}: removal order"] = res["removed"]
            rep.summary[f"{name}: E increase over the first H - F = {free} removals / at the next one"] = (
                float(res["error"][free] - res["error"][0]), float(res["error"][free + 1] - res["error"][free]))
    for a in ("softmax-1 (renormalise)", "bayes-softmax"):
        c = curves[a]
        first, jump = float(c[free] - c[0]), float(c[free + 1] - c[free])
        rep.check(f"{a}: the first H - F removals cost under a quarter of the next one (value: first - jump / 4)",
                  first - jump / 4, 0.0)
        rep.check(f"{a}: removing a needed head hurts (jump after H - F removals must exceed 0.1; value = 0.1 - jump)",
                  0.1 - jump, 0.0)
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for j, (a, c) in enumerate(curves.items()):
        ax.plot(np.arange(H), c, "o-" if "mask" not in a else "o:", color=f"C{j}", label=a)
    ax.axhline(float(e_bayes), color="k", lw=1.5, label="Bayes risk")
    ax.axvline(H - F, color="k", ls=":", lw=0.8, label="H - |supp P_theta|")
    ax.set(xlabel="heads removed (greedy)", ylabel="generalisation error E")
    ax.legend(fontsize=8)
    _grid(ax)
    fig.suptitle(f"Pruning trained heads: H={H}, one-hot prior with F={F} features (s={cfg['s']}), L={L}")
    rep.figures["pruning"] = fig
    return rep
