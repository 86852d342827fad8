"""Population flow of focus and dilution: Tsit5, the stiff solvers AutoStiff and KrylovW, and
fixed-step RK4; and a vmapped lambda grid vs a loop.

(1) Flow to t = 5000 on pi = (0.75, 0.19, 0.05, 0.01), lambda = 0.5 (m = mk = 8 to keep the run
short). Reference: Tsit5 at rtol = 1e-12. Adaptive Tsit5, AutoStiff and KrylovW at rtol 1e-7,
atol 1e-10 (steps, seconds after compilation, max |loss - loss_ref| on 200 log-spaced save
times), and fixed-step RK4 at the largest step (from a halving ladder) reaching Tsit5's accuracy.
(2) Eight lambdas in one vmapped call vs a loop of jitted single flows (t = 1000).
All through the public `attnflow.focus.solve` with `attnflow.SolverOptions`.
Usage: python benchmarks/focus_flow.py
"""

from __future__ import annotations

import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import attnflow as af  # noqa: E402
from attnflow import focus  # noqa: E402

PI = focus.SYNTHETIC_PI


class RK4(diffrax.AbstractERK):
    """Classic fourth-order Runge-Kutta (Diffrax ships no RK4 class); fixed steps only."""

    tableau = diffrax.ButcherTableau(
        c=np.array([0.5, 0.5, 1.0]),
        b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
        b_error=np.zeros(4),
        a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    )
    interpolation_cls = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        return 4


T = 5000.0
SAVE = af.LogGrid(200, t_min=0.1)


def timed(fn):
    fn()  # compile
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def main():
    setup = focus.Setup(m=8, mk=8)

    def run(solver, t1=T, s=setup):
        return focus.solve(s, t1, save=SAVE, solver=solver)["loss"]

    ref = run(af.SolverOptions(rtol=1e-12, atol=1e-14, max_steps=10_000_000))

    def steps_of(method):
        return int(
            diffrax.diffeqsolve(
                diffrax.ODETerm(focus.flow_field),
                method,
                0.0,
                T,
                None,
                setup.theta0(),
                setup,
                stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-10),
                max_steps=10_000_000,
                saveat=diffrax.SaveAt(t1=True),
            ).stats["num_steps"]
        )

    print(f"Population flow to t = {T:g} (d = 4, m = mk = 8); reference: Tsit5 at rtol 1e-12")
    print(f"{'method':44s} {'steps':>9s} {'seconds':>9s} {'max |loss err|':>15s}")
    rows = {}
    for name, method in (
        ("adaptive Tsit5", diffrax.Tsit5()),
        ("AutoStiff (Tsit5, then KrylovW)", af.AutoStiff()),
        ("KrylovW alone", af.KrylovW()),
    ):
        opts = af.SolverOptions(method, rtol=1e-7, atol=1e-10, max_steps=10_000_000)
        t_m, l_m = timed(lambda opts=opts: run(opts))
        rows[name] = (steps_of(method), t_m, float(jnp.max(jnp.abs(l_m - ref))))
        print(f"{name + ' (rtol 1e-7, atol 1e-10)':44s} {rows[name][0]:9d} {t_m:9.3f} {rows[name][2]:15.2e}")
    steps_ad, t_ad, err_ad = rows["adaptive Tsit5"]
    s_auto, t_auto, e_auto = rows["AutoStiff (Tsit5, then KrylovW)"]
    print(
        f"AutoStiff vs Tsit5: {steps_ad / s_auto:.0f}x fewer steps, {t_ad / t_auto:.0f}x less time, "
        f"error {e_auto:.2e} vs {err_ad:.2e}"
    )
    chosen = None
    for dt in (0.4, 0.2, 0.1, 0.05, 0.025):
        fixed = af.SolverOptions(
            solver=RK4(), stepsize_controller=diffrax.ConstantStepSize(), dt0=dt, max_steps=10_000_000
        )
        t_rk, l_rk = timed(lambda fixed=fixed: run(fixed))
        err = float(jnp.max(jnp.abs(l_rk - ref))) if bool(jnp.all(jnp.isfinite(l_rk))) else float("inf")
        print(f"{f'fixed-step RK4, dt = {dt:g}':44s} {int(T / dt):9d} {t_rk:9.3f} {err:15.2e}")
        if err <= err_ad and chosen is None:
            chosen = (dt, t_rk)
    if chosen:
        print(
            f"RK4 needs dt = {chosen[0]:g} ({int(T / chosen[0])} steps) for the adaptive accuracy: "
            f"{chosen[1] / t_ad:.1f}x the adaptive time, {int(T / chosen[0]) / steps_ad:.1f}x its steps"
        )
    else:
        print("RK4 did not reach the adaptive accuracy on the ladder")

    # (2) lambda grid: the chain is traced inside the sweep
    lams = np.linspace(0.2, 0.9, 8)
    loose = af.SolverOptions(rtol=1e-7, atol=1e-10, max_steps=10_000_000)
    grid = af.LogGrid(50, t_min=0.1)

    def flow_lam(lam):
        s = setup.replace(chain=focus.MarkovChain.lazy(PI, lam))
        return focus.solve(s, 1000.0, save=grid, solver=loose)["loss"]

    t_v, _ = timed(lambda: af.sweep(flow_lam, {"lam": lams}, progress=False).values)
    single = jax.jit(flow_lam)
    t_l, _ = timed(lambda: [single(lam) for lam in lams])
    print(f"8 lambdas to t = 1000: vmapped sweep {t_v:.2f} s, loop of jitted flows {t_l:.2f} s, ratio {t_l / t_v:.1f}x")


if __name__ == "__main__":
    main()
