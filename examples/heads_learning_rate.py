"""Does a larger learning rate make attention heads specialise sooner, and what does the SGD noise change?

A question the registered ``heads-*`` experiments do not ask. Under gradient flow the
order-parameter ODE depends on ``eta`` and ``t`` only through ``eta t``, so the specialisation
time ``t_spec`` (the first time ``|(I - 11^T/H) M|_F`` reaches 0.5, equation (15) of the heads
page) is exactly ``c / eta``: doubling the learning rate halves the number of samples needed.
Online SGD adds the ``eta^2`` term to ``dQ/dt`` (equation (8)). Relative to the drift it is of
order ``eta``, so to first order it shifts ``eta t_spec`` by an amount proportional to ``eta``:
a delay ``Delta t`` that does not depend on ``eta``. This script measures

1. ``t_spec`` of the ODE with and without the ``eta^2`` term over a grid of learning rates, from
   the reference setup's initial overlaps (`attnflow.heads.escape_time`, one sweep over ``eta``);
2. ``t_spec`` of online SGD at ``D = 1000`` for two of these rates and eight seeds, started from
   the same overlaps (one sweep of `attnflow.heads.train` over ``eta x seed``, the escape as
   its ``event``): the mean over the seeds and its standard error,

and prints ``eta t_spec``, the delay ``Delta t`` and how far the SGD mean lies from the ODE,
against the seed-to-seed scatter. Saves ``heads-learning-rate.png`` in the current directory.
"""

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

import attnflow as af
from attnflow import heads

ETAS = np.geomspace(0.25, 2.0, 4)  # learning rates of the ODE sweeps: 0.25, 0.5, 1, 2
SGD_ETAS = np.array([1.0, 2.0])  # learning rates of the SGD sweep
SEEDS = np.arange(8)  # SGD seeds (key frame and samples)
THRESHOLD = heads.ESCAPE_THRESHOLD  # |(I - 11^T/H) M|_F at which the heads count as specialised
T1 = 40.0  # horizon of the ODE solves (the slowest, eta = 0.25, escapes near t = 36)
# Horizon of the SGD runs: eta = 1 escapes near t = 9 (seed sd 0.2). The run goes on to SGD_T1
# whatever the rate, so eta = 0.5 (t = 18, twice the steps) is left to the ODE.
SGD_T1 = 11.0
BANK = heads.BankOptions(n=2048)


def t_spec_sgd(eta, seed):
    """The first time online SGD at D = 1000 reaches the threshold (placed linearly between saves)."""
    # D given: the setup is built inside the sweep, where its draw's D is a tracer
    sim = heads.train(
        heads.Setup(eta=eta),
        SGD_T1,
        key=seed,
        D=heads.REFERENCE_D,
        save=af.LinearGrid(111),
        eval_samples=0,
        event=lambda t, o: o["specialisation"] - THRESHOLD,
    )
    return sim.t_event


def main() -> None:
    af.enable_x64()
    sgd_noise = heads.Setup()  # the reference setup: softmax, H = 2, L = 4, flipped spike s = 3, D = 1000 draw
    flow = sgd_noise.replace(sgd_noise=False)

    def t_spec_ode(eta):
        """The escape times of the ODE with and without the eta^2 term (one compiled program for both)."""
        return tuple(
            heads.escape_time(setup.replace(eta=eta), THRESHOLD, t1=T1, bank=BANK) for setup in (sgd_noise, flow)
        )

    t_noise, t_flow = map(np.asarray, af.sweep(t_spec_ode, {"eta": ETAS}, progress=False).values)
    t_sgd = np.asarray(af.sweep(t_spec_sgd, {"eta": SGD_ETAS, "seed": SEEDS}, progress=False).values)  # (eta, seed)
    assert not np.isnan(t_sgd).any(), f"an SGD run did not specialise by t = {SGD_T1}: {t_sgd}"
    sgd_mean = t_sgd.mean(axis=1)
    sgd_sd = t_sgd.std(axis=1, ddof=1)
    sgd_se = sgd_sd / np.sqrt(len(SEEDS))

    print("specialisation time t_spec (|(I - 11^T/H) M|_F = 0.5), reference setup, initial overlaps of a D = 1000 draw")
    print(
        f"    eta   ODE (eta^2 term)   gradient flow   delay Dt   eta t_spec (with / flow)   "
        f"SGD, D = 1000 ({len(SEEDS)} seeds)"
    )
    for i, eta in enumerate(ETAS):
        j = np.flatnonzero(np.isclose(SGD_ETAS, eta))
        sgd = f"{sgd_mean[j[0]]:8.2f} +- {sgd_se[j[0]]:.2f}" if j.size else "       -"
        print(
            f"  {eta:5.3f}   {t_noise[i]:16.2f}   {t_flow[i]:13.2f}   {t_noise[i] - t_flow[i]:8.3f}   "
            f"{eta * t_noise[i]:11.2f} / {eta * t_flow[i]:5.2f}   {sgd}"
        )
    c = np.mean(ETAS * t_flow)
    spread = np.ptp(ETAS * t_flow) / c
    print(f"gradient flow: eta t_spec varies by {spread:.1e} (relative) over the grid: t_spec = c / eta, c = {c:.3f}")
    delay = t_noise - t_flow
    print(
        f"the eta^2 term delays the escape by Dt = {delay.mean():.3f} (spread {np.ptp(delay):.1e} over eta = "
        f"{ETAS[0]:g}..{ETAS[-1]:g}): the same number of samples for every eta, "
        f"{delay[-1] / t_flow[-1]:.1%} of t_spec at eta = {ETAS[-1]:g}"
    )
    flow_at_sgd = np.interp(SGD_ETAS, ETAS, t_flow)  # SGD_ETAS are points of ETAS
    sgd_offsets = {
        "the ODE with the eta^2 term": sgd_mean - np.interp(SGD_ETAS, ETAS, t_noise),
        "gradient flow": sgd_mean - flow_at_sgd,
    }
    for name, offset in sgd_offsets.items():
        print(
            f"SGD mean - {name}: "
            + ", ".join(
                f"{d:+.2f} +- {e:.2f} at eta = {eta:g}" for eta, d, e in zip(SGD_ETAS, offset, sgd_se, strict=True)
            )
            + f" (mean +- standard error over {len(SEEDS)} seeds)"
        )
    within = [name for name, offset in sgd_offsets.items() if np.all(np.abs(offset) <= 2 * sgd_se)]
    print(
        f"one SGD run scatters by sd {sgd_sd.min():.2f}..{sgd_sd.max():.2f} about the mean (the noise re-seeds the "
        f"escape), more than Dt = {delay.mean():.3f}; the mean is within two standard errors of "
        f"{' and of '.join(within) if within else 'neither ODE'}. A standard error of Dt / 2 takes about "
        f"(2 sd / Dt)^2 = {np.ceil((2 * sgd_sd.max() / delay.mean()) ** 2):.0f} seeds"
    )

    fig = Figure(figsize=(9.5, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.loglog(ETAS, t_noise, "o-", label="ODE with the eta^2 term (online SGD)")
    left.loglog(ETAS, t_flow, "s--", mfc="none", label="ODE without it (gradient flow)")
    left.errorbar(SGD_ETAS, sgd_mean, sgd_se, fmt="x", ms=8, color="k", label="online SGD, D = 1000 (mean +- s.e.)")
    left.set(xlabel="learning rate eta", ylabel="t_spec = steps / D", title="specialisation time")
    ticks = [5, 10, 20, 40]
    left.set_yticks(ticks, [f"{v:g}" for v in ticks])
    left.yaxis.set_minor_formatter(NullFormatter())
    # the delays behind gradient flow on a linear axis: Dt, and the SGD mean with its standard-error band
    right.semilogx(ETAS, delay, "o-", label="ODE with the eta^2 term: Dt")
    right.axhline(0.0, color="C1", ls="--", label="gradient flow")
    for k in range(len(SEEDS)):
        right.semilogx(SGD_ETAS, t_sgd[:, k] - flow_at_sgd, ".", color="0.6", label="SGD seeds" if k == 0 else None)
    right.semilogx(SGD_ETAS, sgd_mean - flow_at_sgd, "x-", ms=8, color="k", label="SGD mean")
    right.fill_between(
        SGD_ETAS,
        sgd_mean - flow_at_sgd - sgd_se,
        sgd_mean - flow_at_sgd + sgd_se,
        color="k",
        alpha=0.15,
        label="+- standard error",
    )
    right.set(xlabel="learning rate eta", ylabel="t_spec - t_spec(gradient flow)", title="delay behind gradient flow")
    for ax in (left, right):
        ax.set_xticks(ETAS, [f"{e:g}" for e in ETAS])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    path = af.save_figure(fig, "heads-learning-rate.png")
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
