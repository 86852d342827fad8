"""The ``attnflow`` command: list, show NAME, run NAME, reproduce."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import __version__


def _parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"malformed --set {item!r}; expected key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnflow", description="Training dynamics of attention: theory vs simulation.")
    p.add_argument("--version", action="version", version=f"attnflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list registered experiments")
    sh = sub.add_parser("show", help="an experiment's options: name, type and default")
    sh.add_argument("name")
    r = sub.add_parser("run", help="run one experiment")
    r.add_argument("name")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option (JSON value)")
    r.add_argument("--out", default="attnflow-out", help="output folder (default: attnflow-out)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                   help="split the CPU into N devices, over which sweeps shard their points (attnflow.use_cpu_cores)")
    r.add_argument("--data-dir", default=None, metavar="DIR",
                   help="folder of data files (corpora) for experiments that read them; default: $ATTNFLOW_DATA")
    rp = sub.add_parser("reproduce", help="run the headline experiment of each package")
    rp.add_argument("--all", action="store_true", help="run every registered experiment")
    rp.add_argument("--out", default="attnflow-out", help="output folder (default: attnflow-out)")
    rp.add_argument("--quiet", action="store_true", help="no progress output")
    rp.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                    help="split the CPU into N devices, over which sweeps shard their points (attnflow.use_cpu_cores)")
    rp.add_argument("--data-dir", default=None, metavar="DIR",
                    help="folder of data files (corpora) for experiments that read them; default: $ATTNFLOW_DATA")
    return p


def _run_one(exp, overrides, out: Path, quiet: bool) -> dict:
    if not quiet:
        print(f"[attnflow] running {exp.name} ...", file=sys.stderr, flush=True)
    report = exp.run(overrides, quiet=quiet)
    folder = report.write(out / exp.name)
    status = "ok" if report.passed else "CHECKS FAILED"
    if not quiet:
        print(f"[attnflow] {exp.name}: {status} in {report.timings['total']:.1f} s -> {folder}", file=sys.stderr)
    return {"name": exp.name, "passed": report.passed, "seconds": report.timings["total"], "folder": str(folder),
            "checks": {k: v for k, v in report.checks.items()}}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "cpu_devices", None) is not None:
        if args.cpu_devices < 1:
            print(f"attnflow: error: --cpu-devices must be a positive integer, got {args.cpu_devices}", file=sys.stderr)
            return 2
        from .sweep import use_cpu_cores

        use_cpu_cores(args.cpu_devices)  # before any JAX computation
    if getattr(args, "data_dir", None) is not None:
        if not Path(args.data_dir).is_dir():
            print(f"attnflow: error: --data-dir {args.data_dir!r} is not a folder", file=sys.stderr)
            return 2
        import os

        from ._io import DATA_ENV

        os.environ[DATA_ENV] = str(Path(args.data_dir).resolve())  # read by attnflow.data_path
    from .ode import enable_x64
    from .registry import get_experiment, headline, load_all

    enable_x64()  # theory runs in float64: enabled here, at the entry point
    try:
        if args.command == "list":
            for e in load_all().values():
                mark = "*" if e.headline else " "
                print(f"{mark} {e.name:28s} [{e.package}] {e.description}")
            print("(* = headline experiment, run by `attnflow reproduce`; `attnflow show NAME` lists its options)")
            return 0
        if args.command == "show":
            load_all()
            exp = get_experiment(args.name)
            print(f"{exp.name} [{exp.package}]: {exp.description}")
            for key, (tp, default) in exp.options().items():
                print(f"  --set {key}=...   {tp}, default {default!r}")
            return 0
        if args.command == "run":
            load_all()
            exp = get_experiment(args.name)
            overrides = _parse_sets(args.set)
            from .report import config_from

            config_from(exp.config, overrides, exp.name)  # fail fast on bad options
            res = _run_one(exp, overrides, Path(args.out), args.quiet)
            return 0 if res["passed"] else 1
        if args.command == "reproduce":
            exps = list(load_all().values()) if args.all else headline()
            out = Path(args.out)
            t0 = time.perf_counter()
            results = [_run_one(e, {}, out, args.quiet) for e in exps]
            total = time.perf_counter() - t0
            _write_index(out, results, total)
            print(f"[attnflow] {len(results)} experiment(s), {sum(r['passed'] for r in results)} passed their checks, "
                  f"{total:.1f} s; summary in {out / 'summary.md'}")
            return 0 if all(r["passed"] for r in results) else 1
    except (ValueError, FileNotFoundError) as err:
        print(f"attnflow: error: {err}", file=sys.stderr)
        return 2
    return 2


def _write_index(out: Path, results: list[dict], total: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"experiments": results, "total_seconds": total}, indent=2, default=str))
    lines = ["# attnflow reproduce", "", f"Total time: {total:.1f} s", "",
             "| experiment | checks | seconds | folder |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {'pass' if r['passed'] else '**FAIL**'} | {r['seconds']:.1f} | {r['name']}/ |")
    lines.append("")
    for r in results:
        lines.append(f"## {r['name']}")
        for k, (v, tol) in r["checks"].items():
            lines.append(f"- {k}: {v:.3e} (tolerance {tol:.1e})")
        lines.append(f"- details: [{r['name']}/summary.md]({r['name']}/summary.md)")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
