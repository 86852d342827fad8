"""The ``attnflow`` command: list, show NAME, run NAME, reproduce.

One error boundary: every failure is one line on stderr naming what was wrong and what to
do, with exit status 2 for bad input (options, paths, sizes) and 1 for a run that failed
(a divergence, a solver that gave up) or whose checks failed; ``--debug`` shows the
traceback instead. Ctrl-C prints one line and exits with status 130; SIGTERM (what Slurm
sends a preempted or timed-out job) takes the same path and exits with status 143 (before
`main` takes them over, while JAX is imported, the console script's entry point,
``attnflow_command``, prints the same line and exits at once). A warning is shown as one line,
``attnflow: warning: MESSAGE``, without the file and line that raised it.

Results are written to a temporary folder beside ``--out`` and moved into place when the
run is complete, so ``--out`` holds the previous complete run or the new one, never a mix
(and no stale files): ``run`` replaces ``OUT/NAME``; ``reproduce`` replaces all of its
experiment folders and its index ``OUT/summary.md`` / ``OUT/summary.json`` together.
``reproduce`` runs each experiment on its own: one that raises is recorded as a failed run
(exit status 1) and one whose data file is missing (`attnflow.data_path` or the qkov
real-data lookup) as skipped, one line on stderr each; the others' results are written.

The sweeps of ``run NAME`` save their finished chunks in ``OUT/.attnflow-sweeps/NAME``: the
shards of ``--shard I/N`` share them there for ``--merge``, and a plain run that is interrupted
leaves them there, so the same command run again loads them and computes only the rest (a
plain run deletes the folder it made once its report is in place).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from pathlib import Path
from typing import Any

from . import __version__
from ._interrupt import Terminated, redelivering_hook

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


_STOPPING = threading.Event()  # set once main has caught the interrupt: no more re-delivery


def _format_warning(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    """A warning as the command shows it: ``attnflow: warning: MESSAGE`` (``CATEGORY: MESSAGE`` when
    it is not a plain ``UserWarning``), without the file and line that raised it: for the command's
    user that is a line inside attnflow or a library, not something to act on."""
    text = str(message) if category is UserWarning else f"{category.__name__}: {message}"
    return f"attnflow: warning: {text}\n"


SWEEPS = ".attnflow-sweeps"  # OUT/SWEEPS/NAME/sweep-k: the chunks of a run's sweeps, kept between runs
PLAIN = ".plain-run"  # in OUT/SWEEPS/NAME: the folder was made by a plain run, which deletes it when done


class UsageError(ValueError):
    """Bad input to the command (exit status 2)."""


def _parse_sets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise UsageError(f"malformed --set {item!r}; expected key=value")
        k, v = item.split("=", 1)
        k = k.strip()
        if k in out:
            raise UsageError(f"--set {k} is given twice ({k}={out[k]} and {k}={v}); give each option once")
        out[k] = v
    return out


def _imports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module or .py file whose experiments (attnflow.report.register) join the built-in ones; "
        "repeatable (also $ATTNFLOW_EXPERIMENTS, comma-separated)",
    )


def _load(args) -> dict:
    """Every registered experiment, the built-in ones and those of ``--import``, ``$ATTNFLOW_EXPERIMENTS``
    and installed entry points; an error in importing one of the user's modules names it (exit status 2)."""
    from .registry import load_all

    try:
        return load_all(getattr(args, "imports", []) or [])
    except ValueError as err:
        raise UsageError(str(err)) from None
    except Exception as err:
        if getattr(args, "debug", False):
            raise
        raise UsageError(f"importing experiments failed: {type(err).__name__}: {_one_line(err)}") from None


def _common(p: argparse.ArgumentParser) -> None:
    _imports(p)
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


def _parser(run_epilog: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; ``run_epilog`` (an experiment's options) ends ``attnflow run NAME --help``."""
    p = argparse.ArgumentParser(prog="attnflow", description="Training dynamics of attention: theory vs simulation.")
    p.add_argument("--version", action="version", version=f"attnflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list registered experiments")
    ls.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    _imports(ls)
    sh = sub.add_parser("show", help="an experiment's options: name, type and default")
    sh.add_argument("name", help="the experiment (`attnflow list` lists them)")
    sh.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    _imports(sh)
    r = sub.add_parser(
        "run", help="run one experiment", epilog=run_epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    r.add_argument("name", help="the experiment to run (`attnflow list` lists them, `attnflow show NAME` its options)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an option, once each (typed: JSON numbers and lists, true/false, null; `attnflow show NAME`)",
    )
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
    r.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        metavar="N",
        help="grid points per saved chunk of every sweep (default: about one chunk per shard, at most 4096 "
        "points): smaller chunks lose less work to an interruption",
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
    _imports(ct)
    return p


def _check_out(text: str) -> Path:
    """``--out`` must be a folder we can write in: created here if missing, and written in (a
    folder made and removed), before any computing. Every failure names ``--out`` and the path."""
    if not text.strip():
        raise UsageError("--out is empty; give the output folder (default: attnflow-out)")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {text!r} is a file, not a folder")
    missing = [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {text!r}: cannot create the folder: {_os_error(err)}") from None
    if missing:  # the folders made here, deepest first: removed again if the run stops with them empty
        _CREATED.extend(missing)
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out {text!r}: cannot write in {str(out)!r} (permission denied)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnflow-probe-", dir=out))
    except OSError as err:
        raise UsageError(f"--out {text!r}: cannot write in it: {_os_error(err)}") from None
    return out


def _check_replaceable(out: Path, names: list[str]) -> None:
    """``UsageError`` before computing when ``out/NAME`` exists and is not a result of a run of
    experiment NAME (a folder with a ``summary.json`` that names no other registered experiment,
    or an empty folder), or cannot be moved aside: a run replaces the folder, and would delete the
    user's own files, or another experiment's result, in it, or fail once it has computed
    everything."""
    from .report import experiments

    for name in names:
        path = out / name
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_dir() and not path.is_symlink() and (path / "summary.json").is_file():
            summary = _read_summary(path)
            other = summary.get("name")
            if isinstance(other, str) and other != name and other in experiments():
                raise UsageError(
                    f"--out {str(out)!r}: {str(path)!r} holds the result of another experiment, {other} (its "
                    f"summary.json says so); a run of {name} replaces that folder: move it, or choose another --out"
                )
            foreign = _foreign_files(path, summary)
            if foreign:
                shown = ", ".join(repr(f) for f in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise UsageError(
                    f"--out {str(out)!r}: {str(path)!r} holds files the run did not write ({shown}); a run replaces "
                    "that folder and would delete them: move them, or choose another --out"
                )
            _check_movable(out, path)
            continue
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            _check_movable(out, path)
            continue
        raise UsageError(
            f"--out {str(out)!r}: {str(path)!r} exists and is not the result of a run (no summary.json in it); "
            "a run replaces that folder: move it, or choose another --out"
        )


def _check_movable(out: Path, folder: Path) -> None:
    """A run moves the old ``out/NAME`` aside into a folder of ``out`` before moving its own in: a
    folder moved to another parent needs write permission on itself (its ``..`` entry changes)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(
            f"--out {str(out)!r}: cannot replace {str(folder)!r}, the result of an earlier run: it is read-only "
            "(permission denied), and a run moves that folder aside: make it writable, or choose another --out"
        )


def _check_sweeps_writable(out: Path, folder: Path) -> None:
    """The sweeps of a run save their chunks in ``folder`` (``OUT/.attnflow-sweeps/NAME``) and its
    ``sweep-k`` folders: each of them that exists, or else the nearest folder above it that does,
    must be writable, checked before computing (a chunk that cannot be saved fails the run after
    its first chunk)."""
    existing = [folder, *(d for d in sorted(folder.iterdir()) if d.is_dir())] if folder.is_dir() else []
    if not existing:
        existing = [next(p for p in folder.parents if p.exists())]
    for d in existing:
        if not os.access(d, os.W_OK | os.X_OK):
            raise UsageError(
                f"--out {str(out)!r}: cannot write the sweep chunks in {str(d)!r} (permission denied): make it "
                "writable, or choose another --out"
            )


def _read_summary(folder: Path) -> dict:
    """``folder/summary.json`` as a dict; empty when it cannot be read or is not a JSON object."""
    import json

    try:
        data = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _foreign_files(folder: Path, summary: dict) -> list[str]:
    """The entries of a run's folder that its ``summary.json`` (``summary``) does not list (the user's
    own files), sorted; none when the summary lists no files (a run of an older attnflow)."""
    files = summary.get("files")
    if not isinstance(files, dict):
        return []
    ours = {"summary.json", "summary.md", *files.get("figures", [])}
    for npz in files.get("trajectories", []):
        ours |= {npz, str(Path(npz).with_suffix(".json"))}
    return sorted(p.name for p in folder.iterdir() if p.name not in ours)


def _os_error(err: OSError) -> str:
    """``[Errno 2] No such file or directory: '/proc/foo'`` as ``'/proc/foo': no such file or directory``."""
    what = (err.strerror or str(err)).rstrip(".")
    what = what[:1].lower() + what[1:]
    return f"{str(err.filename)!r}: {what}" if err.filename else what


# staging folders made by this process, removed by the error boundary whatever interrupts the run
_STAGED: list[Path] = []
# --out folders made by this process: removed by the error boundary if the run left them empty
_CREATED: list[Path] = []
# the sweep folder of a plain run that made it: removed by the error boundary if it holds no chunk
_RESUME: list[Path] = []
# the sweep folder of a --shard run, with the number of chunks in it when the run started: the
# error boundary names it if the run added chunks (kept for the same command, and --merge)
_SHARDED: list[tuple[Path, int]] = []


def _staging(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".attnflow-tmp-{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    _STAGED.append(stage)
    return stage


def _swap_in(stage: Path, out: Path, names: list[str], remove: list[str] | None = None) -> None:
    """Move ``stage/NAME`` to ``out/NAME`` for each name (replacing the old folder or file), by renames,
    and delete ``out/NAME`` for each name of ``remove`` (an older result the new run has none for)."""
    trash = out / f".attnflow-old-{uuid.uuid4().hex[:8]}"
    trash.mkdir()
    _STAGED.append(trash)
    for name in [*names, *(remove or [])]:
        if (out / name).exists():
            os.replace(out / name, trash / name)
        if name in names:
            os.replace(stage / name, out / name)
    _cleanup()


def _run_one(exp, overrides, stage: Path, quiet: bool, sweeps=None) -> dict:
    """Run ``exp`` and write its report into ``stage/NAME``; ``sweeps``: a `_sweeps_in` block
    (the run's sweeps save and load their chunks there), whose reused chunks the report notes."""
    if not quiet:
        print(f"[attnflow] running {exp.name} ...", file=sys.stderr, flush=True)
    with sweeps if sweeps is not None else contextlib.nullcontext([]) as log:
        report = exp.run(overrides, quiet=quiet)
    report.environment["command"] = list(_COMMAND)
    loaded = sum(e["loaded"] for e in log)
    report.environment["resumed_chunks"] = loaded
    # what the run's timings cover: the chunks of its sweeps it computed, and those it loaded instead
    report.environment["sweep_chunks"] = {
        "total": sum(e["n_chunks"] for e in log),
        "computed": sum(e["computed"] for e in log),
        "loaded": loaded,
    }
    if loaded:
        folder = Path(log[0]["out_dir"]).parent
        line = (
            f"{loaded} of the {sum(e['n_chunks'] for e in log)} sweep chunks were loaded from {folder}, "
            f"computed earlier (an interrupted run or the shards); {sum(e['computed'] for e in log)} computed now"
        )
        report.notes.append(line)
        if not quiet:
            print(f"[attnflow] {exp.name}: {line}", file=sys.stderr, flush=True)
    report.write(stage / exp.name)
    status = "ok" if report.passed else "CHECKS FAILED"
    if not quiet or not report.passed:  # a failure is said even under --quiet (exit status 1 alone is easy to miss)
        print(f"[attnflow] {exp.name}: {status} in {report.timings['total']:.1f} s", file=sys.stderr)
    return {
        "name": exp.name,
        "passed": report.passed,
        "seconds": report.timings["total"],
        "compilations": report.compilations,
        "checks": report.checks_record(),
    }


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line; for errors raised inside compiled code (equinox
    runtime errors, XLA callbacks), the line with attnflow's own message."""
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for prefix in ("integrate:", "simulate:", "sweep:"):
        for ln in lines:
            if prefix in ln:
                return _as_options(ln[ln.index(prefix) :])
    return _as_options(lines[0]) if lines else type(err).__name__


def _as_options(line: str) -> str:
    """A library message in the command's words: the argument ``chunk_size`` is ``--chunk-size``."""
    return (
        line.replace("chunk_size=", "--chunk-size ")
        .replace("the chunk_size it was saved with", "the --chunk-size it was saved with")
        .replace("leave chunk_size out", "leave --chunk-size out")
    )


def _run_help_options(argv: list[str]) -> str | None:
    """For ``attnflow run NAME --help``: the options of experiment NAME (as ``attnflow show NAME``
    lists them), or None for any other command line."""
    if argv[:1] != ["run"] or not ({"-h", "--help"} & set(argv)):
        return None
    from .registry import get_experiment, load_all

    imports = [b for a, b in itertools.pairwise(argv) if a == "--import"]
    imports += [a.split("=", 1)[1] for a in argv if a.startswith("--import=")]
    try:
        names = load_all(imports)
    except Exception as err:  # --help never reaches the run that would report it
        return (
            "The experiment's options are not shown: importing experiments failed: "
            f"{type(err).__name__}: {_one_line(err)}"
        )
    for word in argv[1:]:
        if word in names:
            return _show_options(get_experiment(word))
    return None


def _attach_shard_value(argv: list[str]) -> list[str]:
    """``--shard -1/2`` as ``--shard=-1/2``: argparse reads a value that starts with ``-`` as
    an option and would say only that ``--shard`` expects one argument, not which."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--shard":
            value = next(words, None)
            if value is not None and value.startswith("-") and "/" in value:
                out.append(f"--shard={value}")
                continue
            out.append(word)
            if value is not None:
                out.append(value)
            continue
        out.append(word)
    return out


_COMMAND: list[str] = []  # the command line of this run, recorded in each report's environment


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return its exit status."""
    argv = _attach_shard_value(sys.argv[1:] if argv is None else list(argv))
    _COMMAND[:] = ["attnflow", *argv]
    args = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    handlers: dict[int, Any] = {}  # the signal handlers replaced here, restored on the way out
    unraisablehook = sys.unraisablehook
    show = warnings.formatwarning
    try:  # from the first line: a Ctrl-C while experiments are imported or --help is built is caught too
        if in_main_thread:
            _STOPPING.clear()
            sys.unraisablehook = redelivering_hook(unraisablehook, _STOPPING)
            handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _on_sigterm)
            if getattr(signal.getsignal(signal.SIGINT), "attnflow_early_exit", False):
                # attnflow_command's handler (exit at once, nothing written yet): Ctrl-C raises from here on
                handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        if in_main_thread:  # process-wide: a call from another thread leaves it alone
            warnings.formatwarning = _format_warning
        args = _parser(_run_help_options(argv)).parse_args(argv)
        return _main(args)
    except KeyboardInterrupt as stop:
        _STOPPING.set()
        if in_main_thread:
            # a second SIGTERM or Ctrl-C must not cut the clean-up short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        kept = _kept_chunks()
        sharded = bool(_SHARDED)
        _cleanup()
        what = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        if kept and sharded:
            print(
                f"attnflow: {what}; --out is unchanged but for the sweep chunks this shard finished, kept in "
                f"{kept[0]}: run the same command again to go on from them ({shlex.join(_COMMAND)})",
                file=sys.stderr,
                flush=True,
            )
        elif kept:
            print(
                f"attnflow: {what}; --out is unchanged but for the finished sweep chunks kept in {kept[0]}: "
                "run the same command again to go on from them",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"attnflow: {what}; --out is unchanged", file=sys.stderr, flush=True)
        # skip interpreter finalisation: XLA's threads may still hold work (a segfault risk)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED)
    except Exception as err:  # the one error boundary of the command
        kept_chunks = _kept_chunks()
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
        message = str(err) if isinstance(err, UsageError) else _one_line(err)
        print(f"attnflow: {kind}: {message}{hint}", file=sys.stderr)
        if failed and kept_chunks:
            print(
                f"attnflow: the finished sweep chunks are kept in {kept_chunks[0]}: the same command run again "
                "goes on from them (delete that folder to start afresh)",
                file=sys.stderr,
            )
        return EXIT_FAILED if failed else EXIT_BAD_INPUT
    finally:
        _SHARDED.clear()
        if in_main_thread:
            warnings.formatwarning = show
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if in_main_thread:
            sys.unraisablehook = unraisablehook


def _cleanup() -> None:
    while _STAGED:
        shutil.rmtree(_STAGED.pop(), ignore_errors=True)
    while _RESUME:  # a plain run's sweep folder without a finished chunk: nothing to resume
        folder = _RESUME.pop()
        if not _holds_chunks(folder):
            _remove_sweeps(folder)
    for folder in _CREATED:  # an --out made by this run and left empty (deepest first)
        with contextlib.suppress(OSError):
            folder.rmdir()
    _CREATED.clear()


def _kept_chunks() -> list[Path]:
    """The sweep folders of this run that hold finished chunks (kept for a rerun): a plain run's, or
    a shard's that this run added chunks to."""
    return [d for d in _RESUME if _holds_chunks(d)] + [d for d, n in _SHARDED if _count_chunks(d) > n]


def _holds_chunks(folder: Path) -> bool:
    return folder.is_dir() and any(folder.rglob("chunk_*.npz"))


def _count_chunks(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("chunk_*.npz")) if folder.is_dir() else 0


def _remove_sweeps(folder: Path) -> None:
    """Delete the sweep folder ``OUT/SWEEPS/NAME``, and ``OUT/SWEEPS`` if that leaves it empty."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()


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
        from .citations import bibtex, keys_for, reproduce_keys

        _load(args)
        print(bibtex(reproduce_keys() if args.name is None else keys_for(args.name)), end="")
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
    from .registry import get_experiment
    from .report import config_from

    enable_x64()  # theory runs in float64: enabled here, at the entry point
    use_compilation_cache()  # JAX's persistent cache: later runs skip most compilation ($ATTNFLOW_CACHE)
    if args.command == "list":
        for e in _load(args).values():
            mark = "*" if e.headline else " "
            print(f"{mark} {e.name:28s} [{e.package}] {e.description}")
        print("(* = headline experiment, run by `attnflow reproduce`; `attnflow show NAME` lists its options)")
        return EXIT_OK
    if args.command == "show":
        _load(args)
        exp = get_experiment(args.name)
        print(_show_options(exp))
        return EXIT_OK
    if args.command == "run":
        from .registry import runs_sweeps

        shard = _parse_shard(args.shard, args.merge)
        if args.chunk_size is not None and args.chunk_size < 1:
            raise UsageError(f"--chunk-size must be a positive integer, got {args.chunk_size}")
        _load(args)
        exp = get_experiment(args.name)
        overrides = _parse_sets(args.set)
        config = config_from(exp.config, overrides, exp.name)  # every option checked before computing
        sweeping = runs_sweeps(exp)
        if sweeping is False and shard is not None:
            raise UsageError(
                f"--shard {args.shard}: {exp.name} runs no sweep, so there is nothing to share between shards; "
                "run it without --shard"
            )
        if sweeping is False and args.merge:
            raise UsageError(f"--merge: {exp.name} runs no sweep, so it has no shards to merge; run it without --merge")
        if sweeping is False and args.chunk_size is not None:
            raise UsageError(
                f"--chunk-size {args.chunk_size}: {exp.name} runs no sweep, so it saves no chunks; run it without "
                "--chunk-size"
            )
        out = _check_out(args.out)
        if shard is None:
            _check_replaceable(out, [exp.name])
        sweeps = out / SWEEPS / exp.name  # outside the staging folder: it outlives each run
        if args.merge and not sweeps.is_dir():
            raise UsageError(
                f"--merge: {str(sweeps)!r} holds no shard output; run the shards first "
                f"(attnflow run {exp.name} --shard I/N --out {out})"
            )
        _check_saved_options(sweeps, exp.name, config)
        if sweeping is not False:
            _check_sweeps_writable(out, sweeps)
        if shard is not None:
            return _run_shard(exp, overrides, config, shard, sweeps, args)
        stage = _staging(out)
        block = None
        plain = not args.merge and sweeping is not False
        if plain:  # a plain run keeps its finished chunks until its report is in place
            if not sweeps.exists():
                sweeps.mkdir(parents=True)
                (sweeps / PLAIN).touch()
            if (sweeps / PLAIN).exists():
                _RESUME.append(sweeps)
        if args.merge or plain:
            block = _sweeps_in(sweeps, exp.name, config, chunk_size=args.chunk_size)
        res = _run_one(exp, overrides, stage, args.quiet, block)
        _swap_in(stage, out, [exp.name])
        if plain and (sweeps / PLAIN).exists():
            _RESUME.clear()
            _remove_sweeps(sweeps)
        if not args.quiet:
            print(f"[attnflow] {exp.name} -> {out / exp.name}", file=sys.stderr)
        return EXIT_OK if res["passed"] else EXIT_FAILED
    loaded = _load(args)
    exps = [e for e in loaded.values() if args.all or e.headline]
    out = _check_out(args.out)
    _check_replaceable(out, [e.name for e in exps])
    stage = _staging(out)
    t0 = time.perf_counter()
    results, skipped = [], []
    for e in exps:  # one experiment's error is its own: the others still run and are written
        started = time.perf_counter()
        try:
            results.append(_run_one(e, {}, stage, args.quiet))
        except Exception as err:
            shutil.rmtree(stage / e.name, ignore_errors=True)  # a report cut short is no result
            if getattr(args, "debug", False):
                traceback.print_exc()
            if _missing_data(err):
                # the lookup's first sentence says what is missing; the rest names options of its own
                skip = {"name": e.name, "reason": _one_line(err).split(". ", 1)[0], "how": _data_hint(e)}
                skipped.append(skip)
                print(f"attnflow: skipped {e.name}: {skip['reason']}; {skip['how']}", file=sys.stderr, flush=True)
                continue
            error = f"{type(err).__name__}: {_one_line(err)}"
            results.append(
                {
                    "name": e.name,
                    "passed": False,
                    "error": error,
                    "seconds": time.perf_counter() - started,
                    "compilations": None,
                    "checks": {},
                }
            )
            print(f"attnflow: run failed: {e.name}: {error}", file=sys.stderr, flush=True)
    total = time.perf_counter() - t0
    _write_index(stage, results, total, skipped)
    written = [r["name"] for r in results if "error" not in r]
    # an experiment that failed or was skipped leaves no folder: an older run's would mix two runs in OUT
    gone = [e.name for e in exps if e.name not in written]
    _swap_in(stage, out, [*written, "summary.json", "summary.md"], remove=gone)
    failed = sum("error" in r for r in results)
    print(
        f"[attnflow] {len(results)} experiment(s) run, {sum(r['passed'] for r in results)} passed their checks"
        + (f", {failed} failed to run" if failed else "")
        + (f", {len(skipped)} skipped for want of data" if skipped else "")
        + f", {total:.1f} s; summary in {out / 'summary.md'}"
    )
    return EXIT_OK if all(r["passed"] for r in results) else EXIT_FAILED


def _missing_data(err: BaseException) -> bool:
    """Whether ``err`` is a data lookup finding no data: the ``FileNotFoundError`` raised by
    `attnflow.data_path` or `attnflow.qkov.realdata.resolve_data` (not a file error elsewhere)."""
    if not isinstance(err, FileNotFoundError) or err.__traceback__ is None:
        return False
    from ._io import data_path
    from .qkov.realdata import resolve_data

    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code in (data_path.__code__, resolve_data.__code__)


def _data_hint(exp) -> str:
    """How to give experiment ``exp`` its data, by the option its configuration has."""
    from ._io import DATA_ENV

    folder = f"--data-dir DIR or ${DATA_ENV} naming the folder that holds the data"
    options = exp.options()
    if "data" in options:  # the qkov real-data experiments: a file or folder
        return f"to run it: attnflow run {exp.name} --set data=PATH, or {folder}"
    if "data_dir" in options:  # focus-corpus: the folder of its corpora
        return f"to run it: attnflow run {exp.name} --set data_dir=DIR, or {folder}"
    return f"to run it: {folder}"


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


def _show_options(exp) -> str:
    """The lines of ``attnflow show NAME``: each option as ``--set`` takes it, with its default,
    its type and, where the configuration class says, its meaning."""
    from .report import format_value

    notes = exp.option_notes()
    rows = [(shlex.quote(f"{k}={format_value(d)}"), tp, notes.get(k)) for k, (tp, d) in exp.options().items()]
    width = max((len(r[0]) for r in rows), default=0)
    lines = [f"{exp.name} [{exp.package}]: {exp.description}", "options (--set KEY=VALUE, shown at their defaults):"]
    for text, tp, note in rows:
        lines.append(f"  --set {text:<{width}}   {tp}" + (f"; {note}" if note else ""))
    return "\n".join(lines)


def _check_saved_options(folder: Path, name: str, config) -> None:
    """Refuse, before computing, a sweep folder saved by a run of other options (its manifests
    record them): rerun with those options, or delete the folder."""
    import dataclasses
    import json

    from .report import format_value

    now = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    for manifest in sorted(folder.glob("**/sweep.json")) if folder.is_dir() else []:
        try:
            saved = json.loads(manifest.read_text()).get("meta", {}).get("options")
        except (OSError, ValueError, AttributeError):
            continue  # not a manifest attnflow can read: the sweep itself says so
        if not isinstance(saved, dict) or saved == now:
            continue
        diff = [k for k in now if saved.get(k) != now[k]] + [k for k in saved if k not in now]
        shown = ", ".join(f"{k}={format_value(saved.get(k))} (now {format_value(now.get(k))})" for k in diff[:3]) + (
            ", ..." if len(diff) > 3 else ""
        )
        raise UsageError(
            f"{str(folder)!r} holds a different sweep, the chunks of a {name} run with other options ({shown}); "
            "run with those options to go on from them, or delete the folder to start afresh"
        )


def _sweeps_in(folder: Path, name: str, config, shard=None, chunk_size=None):
    """Every sweep of the run saves its chunks in ``folder/sweep-k`` (and resumes from them), under the
    experiment's name and options: a folder saved with other ``--set`` values is refused."""
    import dataclasses

    from .sweep import sweep_defaults

    return sweep_defaults(
        folder, shard=shard, meta={"experiment": name, "options": dataclasses.asdict(config)}, chunk_size=chunk_size
    )


def _run_shard(exp, overrides, config, shard, folder: Path, args) -> int:
    """Run the experiment with every sweep sharded into ``folder``; stops at the first sweep that
    lacks other shards' chunks. Exit status 0 either way; one line says what was done and what next."""
    from .sweep import ShardPending

    if not args.quiet:
        print(f"[attnflow] running {exp.name}, shard {shard} ...", file=sys.stderr, flush=True)
    sets = [a for s in args.set for a in ("--set", s)]
    merge = shlex.join(["attnflow", "run", exp.name, *sets, "--out", args.out, "--merge"])
    head = f"[attnflow] {exp.name} shard {shard}"
    (folder / PLAIN).unlink(missing_ok=True)  # chunks of an interrupted plain run: now the shards' to share
    _SHARDED.append((folder, _count_chunks(folder)))
    try:
        with _sweeps_in(folder, exp.name, config, shard, args.chunk_size) as log:
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


def _write_index(folder: Path, results: list[dict], total: float, skipped: list[dict] | None = None) -> None:
    """``folder/summary.json`` and ``folder/summary.md``, the index of a ``reproduce``: ``results`` (one
    per experiment run; a run that raised has ``"error"`` and no folder) and ``skipped`` (``{"name",
    "reason", "how"}`` of each experiment skipped for want of its data)."""
    from ._io import atomic_write, strict_json

    skipped = skipped or []
    payload = strict_json({"experiments": results, "skipped": skipped, "total_seconds": total}).encode()
    atomic_write(folder / "summary.json", lambda f: f.write(payload))
    failed = [r["name"] for r in results if "error" in r]
    passed = sum(r["passed"] for r in results)
    one = len(results) == 1
    verdict = f"{passed} of {len(results)} experiment{'' if one else 's'} passed {'its' if one else 'their'} checks"
    if failed:
        verdict += f"; **{len(failed)} failed to run** ({', '.join(failed)})"
    if skipped:
        verdict += f"; {len(skipped)} skipped for want of data ({', '.join(s['name'] for s in skipped)})"
    lines = [
        "# attnflow reproduce",
        "",
        f"Result: {verdict}.",
        "",
        f"Total time: {total:.1f} s",
        "",
        "| experiment | checks | seconds | compilations | folder |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | **RUN FAILED** | {r['seconds']:.1f} | - | - |")
            continue
        comp = r.get("compilations") or {}
        lines.append(
            f"| {r['name']} | {'pass' if r['passed'] else '**FAIL**'} | {r['seconds']:.1f} | "
            f"{int(comp.get('count', 0))} ({comp.get('seconds', 0.0):.1f} s) | {r['name']}/ |"
        )
    for s in skipped:
        lines.append(f"| {s['name']} | skipped: no data | - | - | - |")
    lines.append("")
    for r in results:
        lines.append(f"## {r['name']}")
        if "error" in r:
            lines += [f"- run failed: {r['error']}", ""]
            continue
        for k, c in r["checks"].items():
            lines.append(f"- {k}: {c['value']:.3e} (tolerance {c['tolerance']:.1e})")
        lines.append(f"- details: [{r['name']}/summary.md]({r['name']}/summary.md)")
        lines.append("")
    if skipped:
        lines += ["## Skipped for want of data", ""]
        lines += [f"- {s['name']}: {s['reason']}; {s['how']}" for s in skipped]
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
