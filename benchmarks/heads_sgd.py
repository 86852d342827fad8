"""Online-SGD throughput of the multi-head single-location model, and the ODE right-hand side cost.

Part 1, samples per second (one sample per step, softmax heads, H=4, L=8, float32), at
D = 1024 and 4096, 8 seeds:
  (a) attnflow: `attnflow.heads.train` (one `lax.scan`) vmapped over the 8 seeds with `attnflow.sweep`;
  (b) a sequential Python loop of the same jitted single-seed run (compiled once);
  (c) eager PyTorch (optional extra ``torch``), one seed after the other, the same model, loss and
      sampler written step by step (the loop a user writes by hand).
Compile time is excluded (warm timings, best of 2, PyTorch too, and PyTorch first). PyTorch runs
fewer steps and is reported per sample. A fourth column times the step's Gaussian draws alone,
swept over the seeds like the SGD run (roughly the most any model on this sampler can reach). The float32
tokens are drawn with `attnflow.rng.normal` (Box-Muller on both words of an unrolled Threefry hash). By default
the script exposes one CPU device per core (`attnflow.use_cpu_cores`), so the sweep runs seeds
side by side; `--devices 1` gives the single-device numbers.

Part 2, cost of one evaluation of the order-parameter field against the Monte Carlo bank size
(H=4, L=8, cyclic permutation copies, float64).

Usage: python benchmarks/heads_sgd.py [--steps 4000] [--torch-steps 500] [--Ds 1024 4096] [--devices N]
(``--steps`` is the step count at D = 1024; at dimension D the JAX runs take steps * 1024 // D steps.)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import attnflow as af
from attnflow import heads
from attnflow._jit import cpu_compiler_options

H, L, ETA, SEEDS = 4, 8, 0.5, 8


def best_of(fn, repeat=2):
    out, best = None, np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(jax.tree_util.tree_leaves(out))
        best = min(best, time.perf_counter() - t0)
    return best, out


def jax_runs(D, steps):
    setup = heads.Setup(prior=heads.FlippedSpike(2.0), L=L, H=H, eta=ETA)
    t1 = steps / D

    def one(seed):  # keys with the overlaps of a sigma0 = 0.5 draw at this D, float32 tokens and keys
        s = setup.replace(init=heads.FiniteDDraw(0.5, D, seed))
        return heads.train(s, t1, key=seed + 1000, D=D, save=af.LinearGrid(5), eval_samples=0, dtype=jnp.float32)

    seeds = np.arange(SEEDS)
    t0 = time.perf_counter()
    af.sweep(one, {"seed": seeds}, progress=False)
    compile_v = time.perf_counter() - t0
    t_vmap, res = best_of(lambda: af.sweep(one, {"seed": seeds}, progress=False).values["M"])
    single = jax.jit(lambda s: one(s)["M"], compiler_options=cpu_compiler_options())  # as sweep compiles
    single(0).block_until_ready()
    t_loop, _ = best_of(lambda: [single(s) for s in seeds])
    return t_vmap, t_loop, compile_v, res


def gaussian_floor(D, steps):
    """Samples/s if a step cost only its Gaussian draws: L x D normals per seed and step, in a scan
    per seed, swept over the seeds like the SGD run (same sampler, `attnflow.rng.normal`, same
    devices and compiler options).

    Online SGD needs a fresh (L, D) Gaussian token matrix per sample, so this is roughly the
    most the SGD run can reach, whatever the model costs (timing noise can put a run above it).
    """

    def per_seed(seed):
        key = jax.random.PRNGKey(seed)

        def body(c, i):
            return c + jnp.sum(af.rng.normal(jax.random.fold_in(key, i), (L, D))), None

        return jax.lax.scan(body, jnp.float32(0), jnp.arange(steps))[0]

    seeds = np.arange(SEEDS)
    af.sweep(per_seed, {"seed": seeds}, progress=False)
    t, _ = best_of(lambda: af.sweep(per_seed, {"seed": seeds}, progress=False).values)
    return SEEDS * steps / t


def torch_runs(D, steps):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(max(1, torch.get_num_threads()))
    g = torch.Generator().manual_seed(0)
    spikes = torch.linalg.qr(torch.randn(D, 1, generator=g))[0].T * D**0.5
    t0 = time.perf_counter()
    for seed in range(SEEDS):
        gen = torch.Generator().manual_seed(seed)
        K = (0.5 * torch.randn(H, D, generator=gen)).requires_grad_(True)
        for _ in range(steps):
            eps = int(torch.randint(L, (1,), generator=gen))
            theta = 2.0 if torch.rand(1, generator=gen).item() < 0.5 else -2.0
            X = torch.randn(L, D, generator=gen)
            X[eps] += theta * spikes[0] / D**0.5
            y = X[eps]
            chi = X @ K.T / D**0.5  # (L, H)
            a = torch.softmax(chi.T, dim=-1).mean(0)
            loss = ((y - a @ X) ** 2).sum() / (2 * D)
            (gK,) = torch.autograd.grad(loss, K)
            with torch.no_grad():
                K -= ETA * gK
    return time.perf_counter() - t0


def field_cost(n):
    M = 0.1 * jnp.arange(1, H + 1, dtype=float)[:, None]
    setup = heads.Setup(
        prior=heads.FlippedSpike(2.0), L=L, H=H, eta=ETA, init=heads.Overlaps(M, M @ M.T + 0.2 * jnp.eye(H))
    )
    dyn = heads.Dynamics.build(setup, heads.BankOptions(n=n, seed=0))
    y = heads.initial_state(setup)
    f = jax.jit(heads.order_parameter_field)
    jax.block_until_ready(f(0.0, y, dyn))
    t, _ = best_of(lambda: [f(0.0, y, dyn) for _ in range(20)], repeat=3)
    return t / 20, dyn.bank.size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--steps",
        type=int,
        default=4000,
        help="SGD steps per seed of the JAX runs at D = 1024; at dimension D they run max(1, steps * 1024 // D) "
        "(default %(default)s: 4000 at D = 1024, 1000 at D = 4096)",
    )
    ap.add_argument(
        "--torch-steps", type=int, default=500, help="SGD steps per seed of eager PyTorch, at every D (default 500)"
    )
    ap.add_argument(
        "--Ds",
        type=int,
        nargs="+",
        default=[1024, 4096],
        metavar="D",
        help="token dimensions D of the SGD runs (default %(default)s)",
    )
    ap.add_argument(
        "--devices",
        type=int,
        default=None,
        help="CPU devices for the sweep (default: one per core, attnflow.use_cpu_cores)",
    )
    args = ap.parse_args()
    for name in ("steps", "torch_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if min(args.Ds) < 1:
        ap.error(f"--Ds must be positive, got {args.Ds}")
    af.use_cpu_cores(args.devices)  # before any JAX computation
    print(f"online SGD, softmax, H={H}, L={L}, {SEEDS} seeds, float32; devices: {jax.devices()}")
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "PyTorch is not installed: the eager PyTorch peer is skipped (its columns print nan); "
            'install it with pip install -e ".[torch]"'
        )
    print(
        f"{'D':>6} {'vmapped scan':>14} {'loop of jitted':>15} {'eager torch':>13} {'draws only':>11} "
        f"{'vmap/loop':>10} "
        f"{'vmap/torch':>11} {'draws/torch':>12}  (samples/s)"
    )
    # PyTorch first, for every D: XLA's worker threads keep spinning for a while after a JAX
    # call and slow an eager loop started right after it (up to 1.5x here)
    t_torchs = {D: torch_runs(D, args.torch_steps) for D in args.Ds}
    if all(t_torchs.values()):  # best of 2, as for the JAX runs
        t_torchs = {D: min(t, torch_runs(D, args.torch_steps)) for D, t in t_torchs.items()}
    for D in args.Ds:
        steps = max(1, args.steps * 1024 // D)
        t_torch = t_torchs[D]
        t_vmap, t_loop, comp, _ = jax_runs(D, steps)
        n = SEEDS * steps
        r_vmap, r_loop = n / t_vmap, n / t_loop
        r_torch = SEEDS * args.torch_steps / t_torch if t_torch else float("nan")
        r_floor = gaussian_floor(D, steps)
        print(
            f"{D:>6} {r_vmap:>14.3g} {r_loop:>15.3g} {r_torch:>13.3g} {r_floor:>11.3g} {r_vmap / r_loop:>10.2f} "
            f"{r_vmap / r_torch:>11.1f} {r_floor / r_torch:>12.1f}   (compile {comp:.1f} s; {steps} steps/seed)"
        )
    print(
        "'draws only': per seed, a scan that only draws its L x D Gaussians per step (attnflow.rng.normal), swept "
        "like the SGD run: roughly the most any model on this sampler reaches; 'draws/torch': its ratio to PyTorch"
    )
    jax.config.update("jax_enable_x64", True)
    print("\norder-parameter field (expectation form, float64), one evaluation, H=4, L=8:")
    print(f"{'base draws':>10} {'bank size':>10} {'time (ms)':>10} {'ns per draw':>12}")
    for n in (256, 1024, 4096, 16384):
        t, size = field_cost(n)
        print(f"{n:>10} {size:>10} {1e3 * t:>10.3f} {1e9 * t / size:>12.1f}")


if __name__ == "__main__":
    main()
