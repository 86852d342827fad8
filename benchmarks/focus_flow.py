"""Population flow of focus and dilution: adaptive Diffrax vs fixed-step RK4, and a vmapped
lambda grid vs a loop.

(1) Flow to t = 5000 on pi = (0.75, 0.19, 0.05, 0.01), lambda = 0.5 (m = mk = 8 to keep the run
short). Reference: Tsit5 at rtol = 1e-12. Adaptive Tsit5 at the spec's tolerances (rtol 1e-7,
atol 1e-10) against fixed-step RK4 at the largest step (from a halving ladder) reaching the same
accuracy (max |loss - loss_ref| on 200 log-spaced save times). Compile time reported separately.
(2) Eight lambdas in one vmapped call vs a loop of jitted single flows (t = 1000).
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
from attnflow.focus.data import MarkovChain  # noqa: E402
from attnflow.focus.theory import flow_field, init_theta, population_loss  # noqa: E402

PI = (0.75, 0.19, 0.05, 0.01)


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


def timed(fn):
    fn()  # compile
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def main():
    chain = MarkovChain.lazy(PI, 0.5)
    th0 = init_theta(0, 4, 8, 8, 1e-3)
    ts = af.save_times(0.0, T, 200, "log", t_min=0.1)
    obs = lambda t, th, a: {"loss": population_loss(th, a["chain"])}  # noqa: E731
    args = {"chain": chain, "tau": 1.0}

    def run(**kw):
        return af.integrate(flow_field, th0, T, args=args, ts=ts, observe=obs, max_steps=10_000_000, **kw)["loss"]

    ref = run(rtol=1e-12, atol=1e-14)
    t_ad, l_ad = timed(lambda: run(rtol=1e-7, atol=1e-10))
    err_ad = float(jnp.max(jnp.abs(l_ad - ref)))
    steps_ad = int(diffrax.diffeqsolve(diffrax.ODETerm(flow_field), diffrax.Tsit5(), 0.0, T, None, th0, args,
                                       stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-10),
                                       max_steps=10_000_000, saveat=diffrax.SaveAt(t1=True)).stats["num_steps"])
    print(f"Population flow to t = {T:g} (d = 4, m = mk = 8)")
    print(f"{'method':40s} {'steps':>9s} {'seconds':>9s} {'max |loss err|':>15s}")
    print(f"{'adaptive Tsit5 (rtol 1e-7, atol 1e-10)':40s} {steps_ad:9d} {t_ad:9.3f} {err_ad:15.2e}")
    chosen = None
    for dt in (0.4, 0.2, 0.1, 0.05, 0.025):
        t_rk, l_rk = timed(lambda dt=dt: run(solver=RK4(), stepsize_controller=diffrax.ConstantStepSize(), dt0=dt))
        err = float(jnp.max(jnp.abs(l_rk - ref))) if bool(jnp.all(jnp.isfinite(l_rk))) else float("inf")
        print(f"{'fixed-step RK4, dt = %g' % dt:40s} {int(T / dt):9d} {t_rk:9.3f} {err:15.2e}")
        if err <= err_ad and chosen is None:
            chosen = (dt, t_rk)
    if chosen:
        print(f"RK4 needs dt = {chosen[0]:g} ({int(T / chosen[0])} steps) for the adaptive accuracy: "
              f"{chosen[1] / t_ad:.1f}x the adaptive time, {int(T / chosen[0]) / steps_ad:.1f}x its steps")
    else:
        print("RK4 did not reach the adaptive accuracy on the ladder")

    # (2) lambda grid
    lams = np.linspace(0.2, 0.9, 8)

    def flow_lam(lam):
        P = lam * jnp.eye(4) + (1 - lam) * jnp.outer(jnp.ones(4), jnp.asarray(PI))
        from attnflow.focus.experiments import _TracedChain

        return af.integrate(flow_field, th0, 1000.0, args={"chain": _TracedChain(jnp.asarray(PI), P), "tau": 1.0},
                            ts=af.save_times(0.0, 1000.0, 50, "log", t_min=0.1), observe=obs, rtol=1e-7, atol=1e-10)["loss"]

    t_v, _ = timed(lambda: af.sweep(flow_lam, {"lam": lams}, progress=False).values)
    single = jax.jit(flow_lam)
    t_l, _ = timed(lambda: [single(l) for l in lams])
    print(f"8 lambdas to t = 1000: vmapped sweep {t_v:.2f} s, loop of jitted flows {t_l:.2f} s, ratio {t_l / t_v:.1f}x")


if __name__ == "__main__":
    main()
