"""Saxe mode ODE over 256 learning rates: one vmapped sweep vs loops.

Peers, at matched tolerance (rtol=1e-8, atol=1e-10 for all):
  (a) `attnflow.sweep`: one jit(vmap) call over all 256 rates;
  (a') one jitted `integrate` on a stacked (n, 4) state holding all the rates (one shared
       step-size sequence), best of 3;
  (b) a Python loop of jitted single `integrate` calls (compiled once), best of 7;
  (c) a Python loop of `scipy.integrate.solve_ivp` (RK45), run once (``--no-scipy`` skips it).
Compile time is reported separately; ratios use the warm (compiled) timings.

The sweep shards the rates over one CPU device per core (`attnflow.use_cpu_cores`); the
loop runs its single solves one after another, as a Python loop does. `--devices 1` gives
the single-device numbers.

The script also times a floor: the same sweep doing only the 7 Tsit5 stage evaluations and
the update, on a fixed grid of as many steps as the slowest rate takes, with no error
estimate, step-size control or masking. A vmapped adaptive Tsit5 sweep that runs every lane
to the slowest one costs more, so the loop time over the floor time bounds the ratio that
such a sweep can reach on this machine.

(a'') is the same sweep with ``lanes=K`` (default 16): each device runs its rates as
consecutive groups of K, one group after another inside the one compiled call, and each
group stops with its own slowest rate (neighbouring rates take similar step counts), so
rates that finish early stop costing work. The script prints sweep / floor with and without
lanes; the sweep, the lanes sweep and the floor are timed in interleaved rounds (``--repeat``,
default 21), and the ratios are medians over rounds of the per-round ratios.
Usage: python benchmarks/sweep_vs_loop.py [--n 256] [--devices N] [--lanes K] [--repeat R] [--no-scipy]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import attnflow as af
from attnflow.deeplinear import mode_field, mode_strength

S = np.array([3.0, 2.0, 1.0, 0.5])
U0 = 1e-3
T = 1500.0
RTOL, ATOL = 1e-8, 1e-10


def solve(eta):
    return af.integrate(
        mode_field,
        jnp.full(4, U0),
        T,
        args={"s": jnp.asarray(S), "tau": 1.0 / eta},
        save=af.LinearGrid(2),
        solver=af.SolverOptions(rtol=RTOL, atol=ATOL),
    )["y"][-1]


def stages_only(eta, n_steps):
    """The floor: Tsit5's stages and update for one rate on a fixed grid of ``n_steps``."""
    import diffrax

    tab = diffrax.Tsit5.tableau
    args = {"s": jnp.asarray(S), "tau": 1.0 / eta}
    h = T / n_steps

    def step(i, u):
        ks = [mode_field(None, u, args)]
        for a in tab.a_lower:
            ks.append(mode_field(None, u + h * sum(float(c) * k for c, k in zip(a, ks)), args))
        return u + h * sum(float(c) * k for c, k in zip(tab.b_sol, ks))

    return jax.lax.fori_loop(0, n_steps, step, jnp.full(4, U0))


def best_of(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def rounds(fns, repeat):
    """Time each of ``fns`` (name -> zero-argument callable) once per round, ``repeat`` rounds,
    interleaved so that a slow spell of a shared machine hits all of them alike.
    Returns name -> array of seconds, one per round."""
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in times.items()}


def step_counts(etas):
    """Accepted steps of each rate's adaptive solve (the controller of `solve`)."""
    import diffrax

    def n_steps(eta):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(mode_field),
            af.UnrolledTsit5(),
            0.0,
            T,
            None,
            jnp.full(4, U0),
            {"s": jnp.asarray(S), "tau": 1.0 / eta},
            max_steps=100_000,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
        ).stats["num_steps"]

    return np.asarray(jax.jit(jax.vmap(n_steps))(jnp.asarray(etas)))


def lane_steps(steps, n_dev, lanes):
    """Lane-steps the busiest device computes: its block of the rates in groups of ``lanes``
    (None: one group), each group running all its lanes to its slowest one."""
    blocks = np.array_split(steps, n_dev)
    k = lanes or max(len(b) for b in blocks)
    return max(sum(len(g) * g.max() for g in np.array_split(b, range(k, len(b), k))) for b in blocks)


def measure(n=256, lanes=16, repeat=21, scipy=True, loop=True):
    """Time the sweep, the sweep with ``lanes``, the floor and the peers on the default device(s).

    Returns a dict of seconds (medians over interleaved rounds for the sweeps and the floor),
    ratios and errors; used by `main` and by ``benchmarks/accelerator.py``.
    """
    etas = np.geomspace(1e-3, 5e-2, n)
    exact = np.stack([np.asarray(mode_strength(T, S, U0, 1.0 / e)) for e in etas])
    r = {"n": n, "lanes": lanes, "devices": jax.device_count(), "device": str(jax.devices()[0].device_kind)}

    # (a) sweep
    t0 = time.perf_counter()
    af.sweep(solve, {"eta": etas}, progress=False)
    r["t_first"] = time.perf_counter() - t0
    plain = af.sweep(solve, {"eta": etas}, progress=False)
    r["err_sweep"] = float(np.max(np.abs(np.asarray(plain.values) - exact) / exact))
    # (a'') the same sweep in groups of `lanes` rates
    grouped = af.sweep(solve, {"eta": etas}, progress=False, lanes=lanes)
    r["lanes_gap"] = float(np.max(np.abs(np.asarray(grouped.values) - np.asarray(plain.values))))

    # the floor: stages and update only, as many fixed steps as the slowest rate takes
    steps = step_counts(etas)
    floor = lambda eta: stages_only(eta, int(steps.max()))
    af.sweep(floor, {"eta": etas}, progress=False)
    times = rounds(
        {
            "sweep": lambda: af.sweep(solve, {"eta": etas}, progress=False).values,
            "lanes": lambda: af.sweep(solve, {"eta": etas}, progress=False, lanes=lanes).values,
            "floor": lambda: af.sweep(floor, {"eta": etas}, progress=False).values,
        },
        repeat,
    )
    for k, v in times.items():
        r[f"t_{k}"], r[f"t_{k}_min"] = float(np.median(v)), float(v.min())
    r["ratio_floor"] = float(np.median(times["sweep"] / times["floor"]))
    r["ratio_floor_lanes"] = float(np.median(times["lanes"] / times["floor"]))
    r["steps"] = steps
    n_dev = jax.device_count()
    r["work_lanes"] = lane_steps(steps, n_dev, lanes) / lane_steps(steps, n_dev, None)

    # (a') the grid as one state: a single integrate over a (n, 4) state (shared steps)
    stacked = jax.jit(
        lambda e: af.integrate(
            mode_field,
            jnp.full((e.shape[0], 4), U0),
            T,
            args={"s": jnp.asarray(S), "tau": 1.0 / e[:, None]},
            save=af.LinearGrid(2),
            solver=af.SolverOptions(rtol=RTOL, atol=ATOL),
        )["y"][-1]
    )
    stacked(jnp.asarray(etas)).block_until_ready()
    r["t_stacked"], out_st = best_of(lambda: stacked(jnp.asarray(etas)).block_until_ready())
    r["err_stacked"] = float(np.max(np.abs(np.asarray(out_st) - exact) / exact))

    if loop:  # (b) loop of jitted single solves
        single = jax.jit(solve)
        t0 = time.perf_counter()
        single(etas[0]).block_until_ready()
        r["t_compile_single"] = time.perf_counter() - t0
        r["t_loop"], outs = best_of(lambda: [np.asarray(single(e)) for e in etas], repeat=7)
        r["err_loop"] = float(np.max(np.abs(np.stack(outs) - exact) / exact))
        trivial = jax.jit(lambda x: x + 1.0)
        x = jnp.ones(4)
        trivial(x).block_until_ready()
        t_call, _ = best_of(lambda: [trivial(x).block_until_ready() for _ in range(1000)])
        r["t_call"] = t_call / 1000

    if scipy:  # (c) scipy solve_ivp loop
        from scipy.integrate import solve_ivp

        def scipy_one(eta):
            f = lambda t, u: 2.0 * u * (S - u) * eta
            return solve_ivp(f, (0.0, T), np.full(4, U0), method="RK45", rtol=RTOL, atol=ATOL).y[:, -1]

        r["t_scipy"], outs_sp = best_of(lambda: [scipy_one(e) for e in etas], repeat=1)
        r["err_scipy"] = float(np.max(np.abs(np.stack(outs_sp) - exact) / exact))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--n", type=int, default=256, help="learning rates, log-spaced in [1e-3, 5e-2] (default %(default)s)"
    )
    ap.add_argument(
        "--devices",
        type=int,
        default=None,
        help="CPU devices for the sweep (default: one per core, attnflow.use_cpu_cores)",
    )
    ap.add_argument("--lanes", type=int, default=16, help="rates per vmapped group in sweep(..., lanes=K)")
    ap.add_argument("--repeat", type=int, default=21, help="interleaved rounds of sweep, lanes sweep and floor")
    ap.add_argument("--no-scipy", action="store_true", help="skip the SciPy loop")
    args = ap.parse_args()
    af.use_cpu_cores(args.devices)  # before any JAX computation
    jax.config.update("jax_enable_x64", True)
    r = measure(args.n, args.lanes, args.repeat, scipy=not args.no_scipy)
    steps, n, k = r["steps"], args.n, args.lanes

    print(
        f"Saxe mode ODE, {n} learning rates, t1={T}, rtol={RTOL}, atol={ATOL}, sweep devices={r['devices']} "
        f"({r['device']})"
    )
    print(f"{'method':44s} {'seconds':>10s} {'max rel err':>12s}")
    print(f"{'attnflow.sweep (jit+vmap), warm, median':44s} {r['t_sweep']:10.4f} {r['err_sweep']:12.2e}")
    print(f"{'  best of the rounds':44s} {r['t_sweep_min']:10.4f}")
    print(f"{'  first call incl. compile':44s} {r['t_first']:10.4f}")
    label = f"attnflow.sweep(..., lanes={k}), warm, median"
    print(f"{label:44s} {r['t_lanes']:10.4f} {'':12s} (max |diff| vs sweep {r['lanes_gap']:.1e})")
    print(f"{'  best of the rounds':44s} {r['t_lanes_min']:10.4f}")
    print(f"{'one integrate on a stacked (n,4) state':44s} {r['t_stacked']:10.4f} {r['err_stacked']:12.2e}")
    print(f"{'loop of jitted single solves, warm':44s} {r['t_loop']:10.4f} {r['err_loop']:12.2e}")
    print(f"{'  compile of the single solve':44s} {r['t_compile_single']:10.4f}")
    if "t_scipy" in r:
        print(f"{'loop of scipy solve_ivp (RK45)':44s} {r['t_scipy']:10.4f} {r['err_scipy']:12.2e}")
    t_loop, t_floor = r["t_loop"], r["t_floor"]
    print(
        f"steps per solve: {steps.min()}..{steps.max()} (mean {steps.mean():.0f}); the vmapped sweep runs all lanes "
        f"for the slowest one: {1e6 * r['t_sweep'] / steps.max():.1f} us per batched step of {n} lanes"
    )
    print(
        f"loop: {1e6 * t_loop / n:.1f} us per solve, of which {1e6 * r['t_call']:.1f} us is the call of a "
        f"trivial jitted function; 50x would need {1e9 * t_loop / n / 50 / steps.max():.0f} ns per lane-step "
        "in the sweep"
    )
    print(
        f"floor, the same sweep with stages and update only ({steps.max()} fixed steps): {t_floor:.4f} s "
        f"(best {r['t_floor_min']:.4f}), {1e6 * t_floor / steps.max():.1f} us per batched step; loop / floor = "
        f"{t_loop / t_floor:.1f}x, the most a vmapped adaptive Tsit5 sweep running every lane to the slowest one "
        f"can reach here; {t_loop / (t_floor * steps.mean() / steps.max()):.1f}x even if each lane stopped "
        f"computing at its own last step (mean instead of max step count)"
    )
    print(
        f"lanes={k}: the busiest device computes {r['work_lanes']:.2f}x the lane-steps of one group per device "
        f"(each group of {k} runs to its own slowest rate)"
    )
    print(f"ratio sweep / floor:            {r['ratio_floor']:8.2f}x  (median of per-round ratios)")
    print(f"ratio sweep(lanes={k}) / floor: {r['ratio_floor_lanes']:8.2f}x  (target <= 1.3x)")
    print(f"ratio sweep vs jitted loop:      {t_loop / r['t_sweep']:8.1f}x   (target >= 50x)")
    print(f"ratio lanes sweep vs jitted loop: {t_loop / r['t_lanes']:7.1f}x")
    if "t_scipy" in r:
        print(f"ratio sweep vs scipy loop:  {r['t_scipy'] / r['t_sweep']:8.1f}x   (target >= 200x)")
        print(
            f"ratio stacked state vs jitted loop: {t_loop / r['t_stacked']:8.1f}x, vs scipy loop: "
            f"{r['t_scipy'] / r['t_stacked']:8.1f}x"
        )


if __name__ == "__main__":
    main()
