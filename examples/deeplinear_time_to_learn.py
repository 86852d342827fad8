"""How long does a deep linear network take to learn a mode, and how much later does gradient descent learn it?

Two questions the ``deep-linear`` experiment does not ask:

1. The time at which a mode of strength ``s`` is half learned (``u = s / 2``), from the initial
   strength ``u0``, under gradient flow. The closed form of the mode ODE gives
   ``t_half = log(s / u0 - 1) / (2 eta s)``: about ``1 / s``, flattened by the logarithm. Measured
   here as the event time of `attnflow.deeplinear.solve` (the mode ODE (2)) over a grid of ``s``
   and ``u0`` (one `sweep`).
2. How much later gradient descent with time step ``dt`` (learning rate ``eta dt``) reaches it.
   On the aligned manifold one GD step maps ``u`` to ``u (1 + eta dt (s - u))^2``, whose modified
   equation is ``du/dt = 2 eta u (s - u) (1 + eta dt (3u - s) / 2) + O(dt^2)``; integrated from
   ``u0`` to ``s / 2`` it predicts the delay ``t_GD - t_flow = dt (log(s / u0) - 3 log 2) / 4``:
   the same for every ``eta`` and only logarithmic in ``s`` (0.043 to 0.078 over ``s = 0.25 ... 4``
   at ``u0 = 1e-3``), while ``t_flow`` falls about like ``1 / s``, so the *relative* delay grows
   about like ``s dt``. Measured as the event time of `attnflow.deeplinear.train` over the same
   grid (a second `sweep`).

Prints both checks and saves ``deeplinear-time-to-learn.png`` in the current directory.
"""

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

import attnflow as af
from attnflow import deeplinear as dl

STRENGTHS = np.geomspace(0.25, 4.0, 9)  # mode strengths s
INITIAL = np.array([1e-3, 1e-6])  # initial strengths u0
T1 = 30.0  # long enough for the weakest mode from the smallest start (t_half = 24.9)
DT = 0.05  # gradient-descent time step (learning rate eta * DT, eta = 1)
TIGHT = af.SolverOptions(rtol=1e-10, atol=1e-14)  # u starts at 1e-6: atol must be far below it


def half_learned(s):
    """The event ``u = s / 2`` on the observables of `solve` and `train` (one mode, strength ``s``)."""
    return lambda t, obs: obs["u"][0] - 0.5 * s


def t_half_flow(s, u0):
    """Event time of the mode ODE (2) at u = s / 2."""
    setup = dl.Setup(s=jnp.reshape(s, (1,)), u0=u0)
    return dl.solve(setup, T1, save=af.LinearGrid(2), solver=TIGHT, event=half_learned(s)).t_event


def t_half_gd(s, u0):
    """First time gradient descent on the network reaches u = s / 2 (placed linearly between steps)."""
    setup = dl.Setup(s=jnp.reshape(s, (1,)), u0=u0)
    # every step saved: the event is placed between consecutive steps
    return dl.train(setup, T1, dt=DT, save=af.LinearGrid(round(T1 / DT) + 1), event=half_learned(s)).t_event


def main() -> None:
    af.enable_x64()
    axes = {"s": STRENGTHS, "u0": INITIAL}
    flow = np.asarray(af.sweep(t_half_flow, axes, progress=False).values)
    gd = np.asarray(af.sweep(t_half_gd, axes, progress=False).values)

    s, u0 = STRENGTHS[:, None], INITIAL[None, :]
    closed = np.log(s / u0 - 1) / (2 * s)
    delay = DT * (np.log(s / u0) - 3 * np.log(2)) / 4

    print("1. time to half-learn a mode under gradient flow (eta = 1)")
    print(f"   max |t_half(ODE event) - log(s/u0 - 1)/(2s)| = {np.max(np.abs(flow - closed)):.2e}")
    for j, u in enumerate(INITIAL):
        fit = af.fit_power_law(STRENGTHS, flow[:, j])
        local = -1 + 1 / np.log(1.0 / u)  # d log t_half / d log s at s = 1, the middle of the grid
        print(
            f"   u0 = {u:.0e}: t_half ~ s^p with p = {fit.slope:.3f} (1/s flattened by the log: -1 + 1/log(s/u0) "
            f"= {local:.3f} at s = 1)"
        )
    line = af.fit_line(np.log(s / u0 - 1).ravel(), (2 * s * flow).ravel())
    print(f"   2 s t_half against log(s/u0 - 1): slope {line.slope:.6f}, intercept {line.intercept:.1e}")

    print(f"2. delay of gradient descent with dt = {DT} behind gradient flow")
    print("      s    u0     t_flow    t_GD   delay  predicted  rel. delay")
    for i, sv in enumerate(STRENGTHS):
        for j, u in enumerate(INITIAL):
            print(
                f"   {sv:5.2f} {u:5.0e} {flow[i, j]:8.3f} {gd[i, j]:8.3f} {gd[i, j] - flow[i, j]:7.4f} "
                f"{delay[i, j]:9.4f} {(gd[i, j] - flow[i, j]) / flow[i, j]:10.2%}"
            )
    err = np.max(np.abs((gd - flow) - delay) / delay)
    print(
        f"   max relative error of the predicted delay dt (log(s/u0) - 3 log 2) / 4: {err:.1%} "
        f"(second order in dt: s dt is up to {STRENGTHS[-1] * DT:g})"
    )

    fig = Figure(figsize=(9.5, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    fine = np.geomspace(STRENGTHS[0], STRENGTHS[-1], 200)
    for j, u in enumerate(INITIAL):
        color = f"C{j}"
        left.loglog(fine, np.log(fine / u - 1) / (2 * fine), color=color, label=f"closed form, u0={u:.0e}")
        left.loglog(STRENGTHS, flow[:, j], "o", color=color, mfc="none", label="mode ODE event")
        left.loglog(STRENGTHS, gd[:, j], "x", color=color, label=f"gradient descent, dt={DT}")
        right.semilogx(fine, DT * (np.log(fine / u) - 3 * np.log(2)) / 4, color=color, label=f"predicted, u0={u:.0e}")
        right.semilogx(STRENGTHS, gd[:, j] - flow[:, j], "x", color=color, label="measured")
    left.set_xlabel("mode strength s")
    left.set_ylabel("time to half-learn, t_half")
    left.set_title("t_half = log(s/u0 - 1) / (2 s)")
    right.set_xlabel("mode strength s")
    right.set_ylabel("t_GD - t_flow")
    right.set_title("GD delay = dt (log(s/u0) - 3 log 2) / 4")
    for ax in (left, right):
        ax.set_xticks([0.25, 0.5, 1.0, 2.0, 4.0], ["0.25", "0.5", "1", "2", "4"])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    path = af.save_figure(fig, "deeplinear-time-to-learn.png")
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
