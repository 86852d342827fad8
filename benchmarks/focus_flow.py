"""Population flow of focus and dilution: Tsit5, the stiff solvers AutoStiff and KrylovW, and
fixed-step RK4; and a vmapped lambda grid vs a loop.

(1) Flow to t = 5000 on pi = (0.75, 0.19, 0.05, 0.01), lambda = 0.5 (m = mk = 8 to keep the run
short). Reference: Tsit5 at rtol = 1e-12. Adaptive Tsit5, AutoStiff and KrylovW at rtol 1e-7,
atol 1e-10 (steps, seconds after compilation, max |loss - loss_ref| on 200 log-spaced save
times), and fixed-step RK4 at the largest step (from a halving ladder) reaching Tsit5's accuracy.
(2) Eight lambdas in one vmapped call vs a loop of jitted single flows (t = 1000).
All through the public `attnflow.focus.solve` with `attnflow.SolverOptions`.
Usage: python benchmarks/focus_flow.py [--t1 5000] [--m 8] [--rtol 1e-7] [--atol 1e-10] ...
(python benchmarks/focus_flow.py --help lists the options; the defaults are the runs above.)
"""

from __future__ import annotations

import argparse
import re
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import attnflow as af  # noqa: E402
from attnflow import focus  # noqa: E402

PI = focus.SYNTHETIC_PI


T = 5000.0
SAVE_POINTS = 200
RTOL, ATOL = 1e-7, 1e-10
RK4_STEPS = (0.4, 0.2, 0.1, 0.05, 0.025)
LAMBDAS = 8
LAMBDA_T = 1000.0


def num(x):
    """``x`` as ``:g`` prints it, without the exponent's leading zero (1e-7, not 1e-07)."""
    return re.sub(r"e([+-])0(\d)", r"e\1\2", f"{x:g}")


def fold(x):
    """A ratio or a time in seconds to three significant digits, without an exponent below 1e4
    (86.4, 1.03, 0.00412), so that a small value does not print as 0 or 1."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def timed(fn):
    fn()  # compile
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--t1", type=float, default=T, help="horizon of part (1) (default %(default)g)")
    ap.add_argument("--m", type=int, default=8, help="m = mk, the context sizes of focus.Setup (default %(default)s)")
    ap.add_argument("--save-points", type=int, default=SAVE_POINTS, help="log-spaced save times (default %(default)s)")
    ap.add_argument("--rtol", type=float, default=RTOL, help="rtol of the adaptive solvers (default %(default)g)")
    ap.add_argument("--atol", type=float, default=ATOL, help="atol of the adaptive solvers (default %(default)g)")
    ap.add_argument(
        "--rk4-steps",
        type=float,
        nargs="+",
        default=list(RK4_STEPS),
        help="fixed RK4 step sizes, tried in this order (default %(default)s)",
    )
    ap.add_argument("--lambdas", type=int, default=LAMBDAS, help="lambdas of part (2) (default %(default)s)")
    ap.add_argument("--lambda-t1", type=float, default=LAMBDA_T, help="horizon of part (2) (default %(default)g)")
    args = ap.parse_args(argv)
    for name in ("t1", "m", "save_points", "rtol", "atol", "lambdas", "lambda_t1"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if min(args.rk4_steps) <= 0:
        ap.error(f"--rk4-steps must be positive, got {args.rk4_steps}")
    return args


def main(argv=None):
    args = parse_args(argv)
    T, rtol, atol = args.t1, args.rtol, args.atol
    save = af.LogGrid(args.save_points, t_min=0.1)
    setup = focus.Setup(m=args.m, mk=args.m)

    def run(solver, t1=T, s=setup):
        return focus.solve(s, t1, save=save, solver=solver)["loss"]

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
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
                max_steps=10_000_000,
                saveat=diffrax.SaveAt(t1=True),
            ).stats["num_steps"]
        )

    methods = (
        ("adaptive Tsit5", diffrax.Tsit5()),
        ("AutoStiff (Tsit5, then KrylovW)", af.AutoStiff()),
        ("KrylovW alone", af.KrylovW()),
    )
    tols = f"(rtol {num(rtol)}, atol {num(atol)})"
    w = max(44, *(len(f"{name} {tols}") for name, _ in methods))  # the method column fits every label
    print(f"Population flow to t = {T:g} (d = 4, m = mk = {args.m}); reference: Tsit5 at rtol 1e-12")
    print(f"{'method':{w}s} {'steps':>9s} {'seconds':>9s} {'max |loss err|':>15s}")
    rows = {}
    for name, method in methods:
        opts = af.SolverOptions(method, rtol=rtol, atol=atol, max_steps=10_000_000)
        t_m, l_m = timed(lambda opts=opts: run(opts))
        rows[name] = (steps_of(method), t_m, float(jnp.max(jnp.abs(l_m - ref))))
        print(f"{f'{name} {tols}':{w}s} {rows[name][0]:9d} {t_m:9.3f} {rows[name][2]:15.2e}")
    steps_ad, t_ad, err_ad = rows["adaptive Tsit5"]
    s_auto, t_auto, e_auto = rows["AutoStiff (Tsit5, then KrylovW)"]
    print(
        f"AutoStiff vs Tsit5: {fold(steps_ad / s_auto)}x fewer steps, {fold(t_ad / t_auto)}x less time, "
        f"error {e_auto:.2e} vs {err_ad:.2e}"
    )
    chosen = None
    for dt in args.rk4_steps:
        fixed = af.SolverOptions(
            solver=af.RK4(), stepsize_controller=diffrax.ConstantStepSize(), dt0=dt, max_steps=10_000_000
        )
        t_rk, l_rk = timed(lambda fixed=fixed: run(fixed))
        err = float(jnp.max(jnp.abs(l_rk - ref))) if bool(jnp.all(jnp.isfinite(l_rk))) else float("inf")
        print(f"{f'fixed-step RK4, dt = {dt:g}':{w}s} {int(T / dt):9d} {t_rk:9.3f} {err:15.2e}")
        if err <= err_ad and chosen is None:
            chosen = (dt, t_rk)
    if chosen:
        print(
            f"RK4 needs dt = {chosen[0]:g} ({int(T / chosen[0])} steps) for the adaptive accuracy: "
            f"{fold(chosen[1] / t_ad)}x the adaptive time, {fold(int(T / chosen[0]) / steps_ad)}x its steps"
        )
    else:
        print("RK4 did not reach the adaptive accuracy on the ladder")

    # (2) lambda grid: the chain is traced inside the sweep
    lams = np.linspace(0.2, 0.9, args.lambdas)
    loose = af.SolverOptions(rtol=rtol, atol=atol, max_steps=10_000_000)
    grid = af.LogGrid(50, t_min=0.1)

    def flow_lam(lam):
        s = setup.replace(chain=focus.MarkovChain.lazy(PI, lam))
        return focus.solve(s, args.lambda_t1, save=grid, solver=loose)["loss"]

    t_v, _ = timed(lambda: af.sweep(flow_lam, {"lam": lams}, progress=False).values)
    single = jax.jit(flow_lam)
    t_l, _ = timed(lambda: [single(lam) for lam in lams])
    print(
        f"{args.lambdas} lambdas to t = {args.lambda_t1:g}: vmapped sweep {fold(t_v)} s, loop of jitted flows "
        f"{fold(t_l)} s, ratio {fold(t_l / t_v)}x"
    )


if __name__ == "__main__":
    main()
