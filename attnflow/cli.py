"""The ``attnflow`` command: list, show NAME, run NAME, reproduce.

One error boundary: every failure is one line on stderr naming what was wrong and what to
do, with exit status 2 for bad input (options, paths, sizes) and 1 for a run that failed
(a divergence, a solver that gave up) or whose checks failed; ``--debug`` shows the
traceback instead. Ctrl-C prints one line and exits with status 130.

Results are written to a temporary folder beside ``--out`` and moved into place when the
run is complete, so ``--out`` holds the previous complete run or the new one, never a mix
(and no stale files): ``run`` replaces ``OUT/NAME``; ``reproduce`` replaces all of its
experiment folders and its index ``OUT/summary.md`` / ``OUT/summary.json`` together.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
SWEEPS = ".attnflow-sweeps"  # OUT/SWEEPS/NAME/sweep-k: the chunks of a sharded run's sweeps, kept between runs


class UsageError(ValueError):
    """Bad input to the command (exit status 2)."""


def _parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise UsageError(f"malformed --set {item!r}; expected key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="attnflow-out", help="output folder (default: attnflow-out)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="split the CPU into N devices, over which sweeps shard their points (attnflow.use_cpu_cores)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="folder of data files (corpora) for experiments that read them; default: $ATTNFLOW_DATA",
    )
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnflow", description="Training dynamics of attention: theory vs simulation.")
    p.add_argument("--version", action="version", version=f"attnflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list registered experiments")
    ls.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sh = sub.add_parser("show", help="an experiment's options: name, type and default")
    sh.add_argument("name")
    sh.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    r = sub.add_parser("run", help="run one experiment")
    r.add_argument("name")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option (typed, JSON)")
    r.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help=f"compute only shard I of N of every sweep the experiment runs, saved in OUT/{SWEEPS}/NAME "
        "(one task of a Slurm job array); stops at the first sweep whose other shards are not done",
    )
    r.add_argument(
        "--merge",
        action="store_true",
        help=f"finish the experiment from the chunks the shards saved in OUT/{SWEEPS}/NAME (computing what is "
        "missing) and write its report",
    )
    _common(r)
    rp = sub.add_parser("reproduce", help="run the headline experiment of each package")
    rp.add_argument("--all", action="store_true", help="run every registered experiment")
    _common(rp)
    c = sub.add_parser("cache", help="where the compilation cache is, its size; --clear empties it")
    c.add_argument("--clear", action="store_true", help="delete the cached compiled programs")
    c.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    ct = sub.add_parser("cite", help="BibTeX for an experiment, a package, or (no name) everything reproduce uses")
    ct.add_argument("name", nargs="?", default=None, help="experiment (qkov-reduced) or package (qkov)")
    ct.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return p


def _check_out(out: Path) -> None:
    """``--out`` must be a folder we can write in (created if missing), checked before any computing."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a folder")
    parent = out if out.exists() else next((p for p in out.absolute().parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise UsageError(f"--out {str(out)!r}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {str(out)!r}: cannot write in {str(parent)!r} (permission denied)")


# staging folders made by this process, removed by the error boundary whatever interrupts the run
_STAGED: list[Path] = []


def _staging(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".attnflow-tmp-{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    _STAGED.append(stage)
    return stage


def _swap_in(stage: Path, out: Path, names: list[str]) -> None:
    """Move ``stage/NAME`` to ``out/NAME`` for each name (replacing the old folder or file), by renames."""
    trash = out / f".attnflow-old-{uuid.uuid4().hex[:8]}"
    trash.mkdir()
    _STAGED.append(trash)
    for name in names:
        if (out / name).exists():
            os.replace(out / name, trash / name)
        os.replace(stage / name, out / name)
    _cleanup()


def _run_one(exp, overrides, stage: Path, quiet: bool) -> dict:
    if not quiet:
        print(f"[attnflow] running {exp.name} ...", file=sys.stderr, flush=True)
    report = exp.run(overrides, quiet=quiet)
    report.write(stage / exp.name)
    status = "ok" if report.passed else "CHECKS FAILED"
    if not quiet:
        print(f"[attnflow] {exp.name}: {status} in {report.timings['total']:.1f} s", file=sys.stderr)
    return {
        "name": exp.name,
        "passed": report.passed,
        "seconds": report.timings["total"],
        "compilations": report.compilations,
        "checks": dict(report.checks),
    }


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line; for errors raised inside compiled code (equinox
    runtime errors, XLA callbacks), the line with attnflow's own message."""
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for prefix in ("integrate:", "simulate:", "sweep:"):
        for ln in lines:
            if prefix in ln:
                return ln[ln.index(prefix) :]
    return lines[0] if lines else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("attnflow: interrupted; --out is unchanged", file=sys.stderr, flush=True)
        _cleanup()
        # skip interpreter finalisation: XLA's threads may still hold work (a segfault risk)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
    except Exception as err:  # the one error boundary of the command
        _cleanup()
        if getattr(args, "debug", False):
            raise
        from .ode import DivergenceError, MaxStepsError
        from .sweep import SweepError

        bad_input = isinstance(
            err,
            (
                UsageError,
                ValueError,
                TypeError,
                FileNotFoundError,
                NotADirectoryError,
                PermissionError,
                IsADirectoryError,
            ),
        )
        failed = isinstance(err, (DivergenceError, MaxStepsError, SweepError)) or not bad_input
        kind = "run failed" if failed else "error"
        hint = (
            " (run again with --debug for the traceback)"
            if failed and not isinstance(err, (DivergenceError, MaxStepsError, SweepError))
            else ""
        )
        print(f"attnflow: {kind}: {_one_line(err)}{hint}", file=sys.stderr)
        return EXIT_FAILED if failed else EXIT_BAD_INPUT


def _cleanup() -> None:
    while _STAGED:
        shutil.rmtree(_STAGED.pop(), ignore_errors=True)


def _main(args) -> int:
    if getattr(args, "cpu_devices", None) is not None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if args.cpu_devices < 1 or args.cpu_devices > cores:
            raise UsageError(
                f"--cpu-devices must be a positive integer of at most {cores} (the cores this process "
                f"may use), got {args.cpu_devices}"
            )
        from .sweep import use_cpu_cores

        use_cpu_cores(args.cpu_devices)  # before any JAX computation
    if getattr(args, "data_dir", None) is not None:
        if not Path(args.data_dir).is_dir():
            raise UsageError(f"--data-dir {args.data_dir!r} is not a folder")
        from ._io import DATA_ENV

        os.environ[DATA_ENV] = str(Path(args.data_dir).resolve())  # read by attnflow.data_path
    from .cache import cache_dir, clear_compilation_cache, use_compilation_cache

    if args.command == "cite":
        from .citations import bibtex, keys_for

        print(bibtex(keys_for(args.name)), end="")
        return EXIT_OK
    if args.command == "cache":
        folder = cache_dir()
        if folder is None:
            print("compilation cache: off ($ATTNFLOW_CACHE)")
            return EXIT_OK
        if args.clear:
            print(f"compilation cache {folder}: removed {clear_compilation_cache(folder)} file(s)")
            return EXIT_OK
        files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
        print(
            f"compilation cache {folder}: {len(files)} file(s), {sum(p.stat().st_size for p in files) / 2**20:.1f} MiB"
        )
        return EXIT_OK
    from .ode import enable_x64
    from .registry import get_experiment, headline, load_all
    from .report import config_from

    enable_x64()  # theory runs in float64: enabled here, at the entry point
    use_compilation_cache()  # JAX's persistent cache: later runs skip most compilation ($ATTNFLOW_CACHE)
    if args.command == "list":
        for e in load_all().values():
            mark = "*" if e.headline else " "
            print(f"{mark} {e.name:28s} [{e.package}] {e.description}")
        print("(* = headline experiment, run by `attnflow reproduce`; `attnflow show NAME` lists its options)")
        return EXIT_OK
    if args.command == "show":
        load_all()
        exp = get_experiment(args.name)
        print(f"{exp.name} [{exp.package}]: {exp.description}")
        for key, (tp, default) in exp.options().items():
            print(f"  --set {key}=...   {tp}, default {default!r}")
        return EXIT_OK
    out = Path(args.out)
    if args.command == "run":
        shard = _parse_shard(args.shard, args.merge)
        load_all()
        exp = get_experiment(args.name)
        overrides = _parse_sets(args.set)
        config = config_from(exp.config, overrides, exp.name)  # every option checked before computing
        _check_out(out)
        sweeps = out / SWEEPS / exp.name  # outside the staging folder: it outlives each run
        if args.merge and not sweeps.is_dir():
            raise UsageError(
                f"--merge: {str(sweeps)!r} holds no shard output; run the shards first "
                f"(attnflow run {exp.name} --shard I/N --out {out})"
            )
        if shard is not None:
            return _run_shard(exp, overrides, config, shard, sweeps, args)
        stage = _staging(out)
        with _sweeps_in(sweeps, exp.name, config) if args.merge else contextlib.nullcontext():
            res = _run_one(exp, overrides, stage, args.quiet)
        _swap_in(stage, out, [exp.name])
        if not args.quiet:
            print(f"[attnflow] {exp.name} -> {out / exp.name}", file=sys.stderr)
        return EXIT_OK if res["passed"] else EXIT_FAILED
    exps = list(load_all().values()) if args.all else headline()
    _check_out(out)
    stage = _staging(out)
    t0 = time.perf_counter()
    results = [_run_one(e, {}, stage, args.quiet) for e in exps]
    total = time.perf_counter() - t0
    _write_index(stage, results, total)
    _swap_in(stage, out, [r["name"] for r in results] + ["summary.json", "summary.md"])
    print(
        f"[attnflow] {len(results)} experiment(s), {sum(r['passed'] for r in results)} passed their checks, "
        f"{total:.1f} s; summary in {out / 'summary.md'}"
    )
    return EXIT_OK if all(r["passed"] for r in results) else EXIT_FAILED


def _parse_shard(text: str | None, merge: bool):
    """``--shard I/N`` as a `Shard` (None without it), checked before any computing."""
    if text is None:
        return None
    if merge:
        raise UsageError("--shard and --merge do not go together: run each shard, then one --merge")
    from .sweep import Shard

    try:
        return Shard.parse(text)
    except ValueError as err:
        raise UsageError(f"--shard {text!r}: {err}") from None


def _sweeps_in(folder: Path, name: str, config, shard=None):
    """Every sweep of the run saves its chunks in ``folder/sweep-k`` (and resumes from them), under the
    experiment's name and options: a folder saved with other ``--set`` values is refused."""
    import dataclasses

    from .sweep import sweep_defaults

    return sweep_defaults(folder, shard=shard, meta={"experiment": name, "options": dataclasses.asdict(config)})


def _run_shard(exp, overrides, config, shard, folder: Path, args) -> int:
    """Run the experiment with every sweep sharded into ``folder``; stops at the first sweep that
    lacks other shards' chunks. Exit status 0 either way; one line says what was done and what next."""
    import shlex

    from .sweep import ShardPending

    if not args.quiet:
        print(f"[attnflow] running {exp.name}, shard {shard} ...", file=sys.stderr, flush=True)
    sets = [a for s in args.set for a in ("--set", s)]
    merge = shlex.join(["attnflow", "run", exp.name, *sets, "--out", args.out, "--merge"])
    head = f"[attnflow] {exp.name} shard {shard}"
    try:
        with _sweeps_in(folder, exp.name, config, shard) as log:
            exp.run(overrides, quiet=args.quiet)
    except ShardPending as pending:
        computed = sum(e["computed"] for e in log)
        print(
            f"{head}: computed {computed} chunk(s) in {folder}; sweep {pending.sweep} still lacks "
            f"{len(pending.missing)} of its {pending.n_chunks} chunks, from other shards. Next, once every shard "
            f"has finished: {merge} (or run the shards again to share the sweeps after it)",
            flush=True,
        )
        return EXIT_OK
    if not log:
        print(f"{head}: {exp.name} runs no sweep, so there is nothing to share; run it without --shard", flush=True)
        return EXIT_OK
    print(
        f"{head}: computed {sum(e['computed'] for e in log)} chunk(s); all {len(log)} sweep(s) are complete in "
        f"{folder}. Next: {merge} (writes the report)",
        flush=True,
    )
    return EXIT_OK


def _write_index(folder: Path, results: list[dict], total: float) -> None:
    from ._io import atomic_write, strict_json

    payload = strict_json({"experiments": results, "total_seconds": total}).encode()
    atomic_write(folder / "summary.json", lambda f: f.write(payload))
    lines = [
        "# attnflow reproduce",
        "",
        f"Total time: {total:.1f} s",
        "",
        "| experiment | checks | seconds | compilations | folder |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        comp = r.get("compilations") or {}
        lines.append(
            f"| {r['name']} | {'pass' if r['passed'] else '**FAIL**'} | {r['seconds']:.1f} | "
            f"{int(comp.get('count', 0))} ({comp.get('seconds', 0.0):.1f} s) | {r['name']}/ |"
        )
    lines.append("")
    for r in results:
        lines.append(f"## {r['name']}")
        for k, (v, tol) in r["checks"].items():
            lines.append(f"- {k}: {v:.3e} (tolerance {tol:.1e})")
        lines.append(f"- details: [{r['name']}/summary.md]({r['name']}/summary.md)")
        lines.append("")
    from .citations import SOFTWARE_KEYS, experiment_keys, references
    from .registry import load_all

    experiments = load_all()
    used = [k for r in results for k in experiment_keys(r["name"], experiments[r["name"]].package)]
    papers = [k for k in used if k not in SOFTWARE_KEYS]  # the papers first, then the software
    lines += ["## References", "", *[f"- {ref}" for ref in references([*papers, *SOFTWARE_KEYS])], ""]
    text = "\n".join(lines).encode()
    atomic_write(folder / "summary.md", lambda f: f.write(text))


if __name__ == "__main__":
    raise SystemExit(main())
