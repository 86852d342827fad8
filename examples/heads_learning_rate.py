"""Does a larger learning rate make attention heads specialise sooner, and what does the SGD noise change?

A question the registered ``heads-*`` experiments do not ask. Under gradient flow the
order-parameter ODE depends on ``eta`` and ``t`` only through ``eta t``, so the specialisation
time ``t_spec`` (the first time ``|(I - 11^T/H) M|_F`` reaches 0.5) is exactly ``c / eta``: doubling
the learning rate halves the number of samples needed. Online SGD adds the ``eta^2`` term to
``dQ/dt`` (equation (8) of the heads page). Relative to the drift it is of order ``eta``, so to
first order it shifts ``eta t_spec`` by an amount proportional to ``eta``: a delay ``Delta t`` that
does not depend on ``eta``. This script measures

1. ``t_spec`` of the ODE with and without the ``eta^2`` term over a grid of learning rates, from
   the reference setup's initial overlaps (two sweeps over ``eta``, escape times as event times);
2. ``t_spec`` of online SGD at ``D = 1000`` for three of these rates, started from the same
   overlaps (one sweep of `attnflow.heads.train` over ``eta``),

and prints ``eta t_spec`` and the delay ``Delta t``. Saves ``heads-learning-rate.png`` in the
current directory.
"""

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

import attnflow as af
from attnflow import heads

ETAS = np.geomspace(0.25, 2.0, 4)  # learning rates of the ODE sweeps: 0.25, 0.5, 1, 2
SGD_ETAS = np.array([0.5, 1.0, 2.0])  # learning rates of the SGD sweep
THRESHOLD = heads.ESCAPE_THRESHOLD  # |(I - 11^T/H) M|_F at which the heads count as specialised
T1 = 40.0  # horizon of the ODE solves (the slowest, eta = 0.25, escapes near t = 36)
SGD_T1 = 20.0  # horizon of the SGD runs (eta = 0.5 escapes near t = 17)
BANK = heads.BankOptions(n=2048)


def t_spec_ode(setup):
    """The escape time of the ODE: the time of its specialisation event (NaN if not reached by T1)."""
    return heads.solve(setup, T1, save=af.LinearGrid(2), bank=BANK, escape=THRESHOLD).t_event


def t_spec_sgd(eta):
    """The first time online SGD at D = 1000 reaches the threshold (interpolated between saves)."""
    # D given: the setup is built inside the sweep, where its draw's D is a tracer
    setup = heads.Setup(eta=eta)
    sim = heads.train(setup, SGD_T1, key=0, D=heads.REFERENCE_D, save=af.LinearGrid(201), eval_samples=0)
    return af.first_crossing(sim.ts, sim["specialisation"], THRESHOLD, interpolate=True)


def main() -> None:
    af.enable_x64()
    sgd_noise = heads.Setup()  # the reference setup: softmax, H = 2, L = 4, flipped spike s = 3, D = 1000 draw
    flow = sgd_noise.replace(sgd_noise=False)
    t_noise = np.asarray(
        af.sweep(lambda eta: t_spec_ode(sgd_noise.replace(eta=eta)), {"eta": ETAS}, progress=False).values
    )
    t_flow = np.asarray(af.sweep(lambda eta: t_spec_ode(flow.replace(eta=eta)), {"eta": ETAS}, progress=False).values)
    t_sgd = np.asarray(af.sweep(t_spec_sgd, {"eta": SGD_ETAS}, progress=False).values)

    print("specialisation time t_spec (|(I - 11^T/H) M|_F = 0.5), reference setup, initial overlaps of a D = 1000 draw")
    print("    eta   ODE (eta^2 term)   gradient flow   delay Dt   eta t_spec (with / flow)   SGD, D = 1000")
    for i, eta in enumerate(ETAS):
        j = np.flatnonzero(np.isclose(SGD_ETAS, eta))
        sgd = f"{t_sgd[j[0]]:8.2f}" if j.size else "       -"
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
    ode_at_sgd = np.interp(np.log(SGD_ETAS), np.log(ETAS), t_noise)
    print(
        "SGD - ODE: "
        + ", ".join(f"{d:+.2f} at eta = {e:g}" for e, d in zip(SGD_ETAS, t_sgd - ode_at_sgd, strict=True))
        + " (the SGD noise re-seeds the escape: an O(1) offset)"
    )

    fig = Figure(figsize=(9.5, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.loglog(ETAS, t_noise, "o-", label="ODE with the eta^2 term (online SGD)")
    left.loglog(ETAS, t_flow, "s--", mfc="none", label="ODE without it (gradient flow)")
    left.loglog(SGD_ETAS, t_sgd, "x", ms=8, color="k", label="online SGD, D = 1000")
    left.set(xlabel="learning rate eta", ylabel="t_spec = steps / D", title="specialisation time")
    right.semilogx(ETAS, ETAS * t_noise, "o-", label="with the eta^2 term")
    right.semilogx(ETAS, ETAS * t_flow, "s--", mfc="none", label="gradient flow (constant)")
    right.semilogx(SGD_ETAS, SGD_ETAS * t_sgd, "x", ms=8, color="k", label="online SGD")
    right.set(xlabel="learning rate eta", ylabel="eta t_spec", title="eta t_spec: a constant delay Dt in t")
    for ax in (left, right):
        ax.set_xticks(ETAS, [f"{e:g}" for e in ETAS])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    path = af.save_figure(fig, "heads-learning-rate.png")
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
