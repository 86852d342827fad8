"""The sweep, QK/OV and heads SGD benchmarks on whatever device JAX sees: a GPU run is one command.

    python benchmarks/accelerator.py --out accelerator.md            # full sizes
    python benchmarks/accelerator.py --quick --out /tmp/quick.md      # reduced sizes, a few minutes

It runs the device side of three benchmark scripts on JAX's default device (a GPU or TPU when
JAX sees one, else the CPU), prints the device and a results table, and writes the table as
markdown to ``--out``:

- ``sweep``: `benchmarks/sweep_vs_loop.py` (its ``measure``): the Saxe mode ODE over 256
  learning rates; `attnflow.sweep`, the same sweep with ``lanes``, the floor (stages only),
  and the loop of jitted single solves. Medians of interleaved rounds for the sweeps.
- ``qkov-ode``: `benchmarks/qkov_ratio_sweep.py`: the reduced CACO ODE over 101 ratios to loss
  1e-4 (its ``reduced_final``, rtol 1e-14, atol 1e-16) in one sweep.
- ``qkov-sgd``: the same script's SGD comparison: 16 ratios x 4 seeds of CACO online SGD, the
  nested sweep against a loop of 64 jitted single runs.
- ``heads``: `benchmarks/heads_sgd.py` (its ``jax_runs`` and ``gaussian_floor``): online SGD of the
  multi-head model at D = 1024, 8 seeds, swept against a loop of jitted runs, in samples/s.

The peers that only run on a CPU (SciPy, the NumPy RK4 loop, eager PyTorch) are left out:
run those scripts themselves. Each part runs in a subprocess of its own (``--part NAME``),
with its script's JAX configuration: float64 where the script turns it on, and on a CPU the
script's device count, one CPU device per core (``--devices N`` for N) for ``sweep`` and
``heads`` as `sweep_vs_loop.py` and `heads_sgd.py` use, one device for the ``qkov`` parts as
`qkov_ratio_sweep.py` uses. The device count of each part is printed and written with the
table, and each warning a part prints on stderr is printed once, under the part's name, also
when the part succeeds (such as `attnflow.sweep` falling back from ``shard_map`` to jit
sharding). Compile times are reported beside the warm timings, not in them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("sweep", "qkov-ode", "qkov-sgd", "heads")
# the parts whose script calls `attnflow.use_cpu_cores` (one CPU device per core, or --devices);
# qkov_ratio_sweep.py does not, so its parts run on JAX's single default CPU device, as that script does
CPU_CORES = {"sweep": True, "qkov-ode": False, "qkov-sgd": False, "heads": True}


def _median_time(fn, repeat):
    import jax
    import numpy as np

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def part_sweep(quick):
    import jax

    jax.config.update("jax_enable_x64", True)
    import sweep_vs_loop as svl

    n = 64 if quick else 256
    r = svl.measure(n=n, lanes=16, repeat=5 if quick else 21, scipy=False)
    w = f"Saxe mode ODE, {n} learning rates"
    return [
        ("sweep", w, "attnflow.sweep, warm (s)", r["t_sweep"]),
        ("sweep", w, "attnflow.sweep(lanes=16), warm (s)", r["t_lanes"]),
        ("sweep", w, "floor: stages only, fixed grid (s)", r["t_floor"]),
        ("sweep", w, "loop of jitted single solves (s)", r["t_loop"]),
        ("sweep", w, "sweep / floor", r["ratio_floor"]),
        ("sweep", w, "sweep(lanes=16) / floor", r["ratio_floor_lanes"]),
        ("sweep", w, "loop / sweep", r["t_loop"] / r["t_sweep"]),
        ("sweep", w, "loop / sweep(lanes=16)", r["t_loop"] / r["t_lanes"]),
        ("sweep", w, "first sweep call incl. compile (s)", r["t_first"]),
        ("sweep", w, "max rel. error vs closed form", r["err_sweep"]),
    ]


def part_qkov_ode(quick):
    import numpy as np
    import qkov_ratio_sweep as qrs  # float64 on at import, as in the script

    import attnflow as af

    ratios = np.geomspace(1e-2, 1e2, 11 if quick else 101)
    fn = lambda r: qrs.reduced_final(r, 1e-14, 1e-16)
    t0 = time.perf_counter()
    af.sweep(fn, {"r": ratios}, progress=False)
    t_first = time.perf_counter() - t0
    t = _median_time(lambda: af.sweep(fn, {"r": ratios}, progress=False).values, 3 if quick else 5)
    res = af.sweep(fn, {"r": ratios}, progress=False).values
    resid = max(qrs.residual((res["mu_ov"][i], res["mu_qk"][i]), r) for i, r in enumerate(ratios))
    w = f"reduced CACO ODE, {len(ratios)} ratios to loss 1e-4, rtol 1e-14"
    return [
        ("qkov-ode", w, "attnflow.sweep, warm (s)", t),
        ("qkov-ode", w, "first sweep call incl. compile (s)", t_first),
        ("qkov-ode", w, "max first-integral residual", resid),
    ]


def part_qkov_sgd(quick):
    import jax
    import numpy as np
    import qkov_ratio_sweep  # noqa: F401  # float64 on at import, as in the script

    import attnflow as af
    from attnflow import qkov

    steps = 50 if quick else 2000
    gen = qkov.CodeGenerator(64)
    ev = gen.sample(jax.random.PRNGKey(7), 500)
    ratios = np.geomspace(0.1, 30, 4 if quick else 16)
    seeds = np.arange(2 if quick else 4)

    def f(r, seed):  # the workload of qkov_ratio_sweep.sgd_part
        tr, _ = qkov.train_on_generator(
            "CACO", r * 0.01, 0.01, steps, key=seed, generator=gen, eval_set=ev, save=af.LogGrid(10)
        )
        return tr["loss"]

    axes = {"r": ratios, "seed": seeds}
    t0 = time.perf_counter()
    af.sweep(f, axes, progress=False)
    t_first = time.perf_counter() - t0
    t_sweep = _median_time(lambda: af.sweep(f, axes, progress=False).values, 3)
    single = jax.jit(f)
    single(ratios[0], 0).block_until_ready()
    t_loop = _median_time(lambda: [single(r, s) for r in ratios for s in seeds], 3)
    w = f"CACO online SGD, {len(ratios)} ratios x {len(seeds)} seeds x {steps} steps"
    return [
        ("qkov-sgd", w, "attnflow.sweep (nested), warm (s)", t_sweep),
        ("qkov-sgd", w, f"loop of {len(ratios) * len(seeds)} jitted runs (s)", t_loop),
        ("qkov-sgd", w, "loop / sweep", t_loop / t_sweep),
        ("qkov-sgd", w, "first sweep call incl. compile (s)", t_first),
    ]


def part_heads(quick):
    import heads_sgd as hs

    D = 256 if quick else 1024
    steps = 200 if quick else 4000
    t_vmap, t_loop, compile_v, _ = hs.jax_runs(D, steps)
    floor = hs.gaussian_floor(D, steps)
    n = hs.SEEDS * steps
    w = f"heads online SGD, D={D}, {hs.SEEDS} seeds x {steps} steps, float32"
    return [
        ("heads", w, "attnflow.sweep over seeds (samples/s)", n / t_vmap),
        ("heads", w, "loop of jitted runs (samples/s)", n / t_loop),
        ("heads", w, "draws only (samples/s)", floor),
        ("heads", w, "sweep / loop", t_loop / t_vmap),
        ("heads", w, "first sweep call incl. compile (s)", compile_v),
    ]


RUNNERS = {"sweep": part_sweep, "qkov-ode": part_qkov_ode, "qkov-sgd": part_qkov_sgd, "heads": part_heads}


def run_part(name, quick, json_path, devices):
    """In the subprocess: set up the devices as the part's script does (before any JAX
    computation), run, dump rows."""
    sys.path.insert(0, str(HERE))
    import attnflow as af

    if CPU_CORES[name]:
        af.use_cpu_cores(devices)  # one CPU device per core, as the script; changes nothing for a GPU or TPU
    import jax

    rows = RUNNERS[name](quick)
    dev = jax.devices()[0]
    info = {"platform": dev.platform, "kind": dev.device_kind, "count": jax.device_count()}
    Path(json_path).write_text(json.dumps({"rows": rows, "device": info}))


def stderr_warnings(text):
    """The distinct warning lines of a part's stderr (Python warnings and JAX/absl ``W``/``WARNING``
    log lines), in order, each cut to 300 characters."""
    seen = []
    for line in text.splitlines():
        line = line.strip()
        if re.search(r"\w*Warning: |^WARNING|^W\d{4} ", line) and line[:300] not in seen:
            seen.append(line[:300])
    return seen


def _fmt(v):
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1e4 or (0 < abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}"
    return str(v)


def table(rows):
    head = "| benchmark | workload | measure | value |\n|---|---|---|---|\n"
    return head + "".join(f"| {b} | {w} | {m} | {_fmt(v)} |\n" for b, w, m, v in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced sizes (a quick check that everything runs)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as a markdown table here")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    ap.add_argument(
        "--devices",
        type=int,
        default=None,
        help="CPU devices of the sweep and heads parts when JAX runs on the CPU (default: one per core, as their "
        "scripts); the qkov parts run on one device, as qkov_ratio_sweep.py",
    )
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: one part, in a subprocess
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        run_part(args.part, args.quick, args.json, args.devices)
        return

    if args.devices is not None and args.devices < 1:
        ap.error(f"--devices must be at least 1, got {args.devices}")

    rows, device, failed, counts = [], None, [], {}
    for name in args.only:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [sys.executable, __file__, "--part", name, "--json", str(out)]
            cmd += ["--quick"] * args.quick + (["--devices", str(args.devices)] if args.devices else [])
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            took = time.perf_counter() - t0
            if proc.returncode != 0 or not out.exists():
                failed.append(name)
                print(f"{name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            data = json.loads(out.read_text())
        rows += [tuple(r) for r in data["rows"]]
        device = device or data["device"]
        counts[name] = data["device"]["count"]
        print(f"{name}: done in {took:.0f} s on {counts[name]} device(s)", flush=True)
        for line in stderr_warnings(proc.stderr):
            print(f"{name}: warning: {line}", flush=True)
    if device is None:
        raise SystemExit("no part ran")
    where = f"{device['platform']} ({device['kind']})"
    per_part = "devices per part: " + ", ".join(f"{k} {v}" for k, v in counts.items())
    host = f"{platform.node() or 'host'}, {os.cpu_count()} CPU cores"
    stamp = datetime.date.today().isoformat()
    size = "reduced sizes (--quick)" if args.quick else "full sizes"
    print(f"\nJAX default device: {where}; {per_part}; {host}; {stamp}; {size}\n")
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            f"# Benchmarks on {where}\n\n{per_part}; {host}; {stamp}; {size}; `python benchmarks/accelerator.py"
            f"{' --quick' if args.quick else ''}`.\n\n{text}"
        )
        print(f"written: {args.out}")
    if failed:
        raise SystemExit(f"parts failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
