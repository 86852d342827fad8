"""The `attnflow` command: list, run, reproduce, errors."""

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnflow.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("attnflow ")
    assert main(["list"]) == 0
    assert "deep-linear" in capsys.readouterr().out
    assert main(["show", "deep-linear"]) == 0
    out = capsys.readouterr().out
    # defaults written as --set reads them (JSON-like, shell-quoted), with the type and the option's help
    assert "  --set 'dts=[0.04, 0.02, 0.01]'   list of float; gradient-descent time steps" in out
    assert "  --set u0=0.001                   float; initial strength of every mode" in out
    assert "  --set n_in=8                     int\n" in out
    # `run NAME --help` ends with the same options
    with pytest.raises(SystemExit) as e:
        main(["run", "deep-linear", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: attnflow run") and "  --set u0=0.001                   float; initial strength" in out


def test_show_writes_defaults_that_set_reads_back(capsys):
    import shlex

    from attnflow.registry import load_all
    from attnflow.report import config_from

    for name, exp in load_all().items():
        assert main(["show", name]) == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  --set ")]
        assert len(lines) == len(exp.options())
        sets = {}
        for ln in lines:
            lex = shlex.shlex(ln, posix=True)
            lex.whitespace_split = True
            assert lex.get_token() == "--set"
            key, value = lex.get_token().split("=", 1)  # the shell word after --set (the note may follow)
            sets[key] = value
        assert config_from(exp.config, sets, name) == exp.defaults, name


def test_help_names_the_positional_argument(capsys):
    for cmd in ("run", "show"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "`attnflow list` lists them" in out.split("positional arguments:")[1].split("options:")[0]


def test_run_writes_outputs(tmp_path, capsys):
    rc = main(
        ["run", "deep-linear", "--set", "dts=[0.02, 0.01]", "--set", "t_end=10", "--out", str(tmp_path), "--quiet"]
    )
    assert rc == 0
    folder = tmp_path / "deep-linear"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["passed"] and summary["config"]["dts"] == [0.02, 0.01] and summary["config"]["t_end"] == 10.0
    assert summary["checks"]["solve vs closed form (max rel. error)"]["value"] < 1e-8
    assert summary["compilations"]["count"] > 0
    md = (folder / "summary.md").read_text()
    assert md.startswith("# deep-linear\n\nResult: all 4 checks passed.\n\nOptions: ")
    # options as --set reads them back: full precision, lists in brackets
    assert "`dts=[0.02, 0.01]`" in md and "`t_end=10.0`" in md and "`n_in=8`" in md and "`u0=0.001`" in md
    # names with |...| are escaped, so every table row keeps its 4 (or 2) cells
    assert "| GD error order in dt (\\|p - 1\\|) |" in md
    for row in (ln for ln in md.splitlines() if ln.startswith("| ")):
        assert len(row.replace("\\|", "").split("|")) - 2 in (2, 4), row
    assert (folder / "modes.png").stat().st_size > 10_000
    assert (folder / "theory.npz").exists() and (folder / "theory.json").exists()
    # the command line, shell-quoted alone in a code block: pasted back, it is the same command
    out = shlex.quote(str(tmp_path))
    line = f"attnflow run deep-linear --set 'dts=[0.02, 0.01]' --set t_end=10 --out {out} --quiet"
    assert f", by the command:\n\n```bash\n{line}\n```\n" in md
    words = shlex.split(line)
    assert words[0] == "attnflow" and _parser().parse_args(words[1:]) == _parser().parse_args(_recorded_argv(summary))
    assert summary["environment"]["sweep_chunks"] == {"total": 0, "computed": 0, "loaded": 0}
    assert "Timings: this run" not in md  # deep-linear runs no sweep: its timings are all its own


def _recorded_argv(summary):
    """The command line recorded in ``summary.json``, without its ``attnflow``."""
    command = summary["environment"]["command"]
    assert command[0] == "attnflow"
    return command[1:]


def test_a_recorded_command_keeps_its_backticks_inside_the_code_block():
    from attnflow.report import Report

    command = ["attnflow", "run", "lab", "--set", "label=a```b", "--out", "my out"]
    md = Report("lab", {}, environment={"command": command}).markdown()
    assert "by the command:\n\n````bash\nattnflow run lab --set 'label=a```b' --out 'my out'\n````\n" in md
    assert shlex.split(md.split("````bash\n")[1].split("\n````")[0]) == command


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["run", "deep-linear", "--set", "oops"], "malformed --set 'oops'"),
        (["run", "deep-linear", "--set", "nope=1"], "has no option 'nope'"),
        (["run", "deep-linear", "--set", "U0=1"], "has no option 'U0'; did you mean 'u0'?"),
        (["run", "deep-linear", "--set", "tend=1"], "has no option 'tend'; did you mean 't_end'?"),
        (["run", "deep-linear", "--set", "u0=abc"], "option 'u0' of deep-linear expects float"),
        (["run", "deep-linear", "--set", "u0=nan"], "option 'u0' of deep-linear must be a finite number, got 'nan'"),
        (["run", "deep-linear", "--set", "t_end=-inf"], "option 't_end' of deep-linear must be a finite number"),
        (
            ["run", "deep-linear", "--set", "dts=(0.1, 0.2)"],
            "expects list of float, written as in --set 'dts=[0.04, 0.02, 0.01]' (the default); got '(0.1, 0.2)'",
        ),
        (
            ["run", "deep-linear", "--set", "s=[3,2]", "--set", "u0=1e-4", "--set", "s=[2,1]"],
            "--set s is given twice (s=[3,2] and s=[2,1]); give each option once",
        ),
        (["run", "deep-linear", "--cpu-devices", "0"], "--cpu-devices must be a positive integer of at most"),
        (["run", "deep-linear", "--cpu-devices", "1000"], "got 1000"),
        (["run", "deep-linear", "--set", "dts=0.1"], "option 'dts' of deep-linear expects list of float"),
        (["run", "deep-linear", "--data-dir", "/no/such/folder"], "--data-dir '/no/such/folder' is not a folder"),
        (["show", "nothing"], "unknown experiment 'nothing'"),
    ],
)
def test_bad_arguments_one_line_error(argv, message, capsys, tmp_path):
    rc = main(argv + (["--out", str(tmp_path)] if argv[0] in ("run", "reproduce") else []))
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and len(err.splitlines()) == 1


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "attnflow.cli", "list"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "deep-linear" in out.stdout


def test_out_is_checked_before_computing(tmp_path, capsys):
    afile = tmp_path / "file"
    afile.write_text("x")
    assert main(["run", "deep-linear", "--out", str(afile)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: nothing to check here
            return
        assert main(["run", "deep-linear", "--out", str(locked / "out")]) == 2
        assert "permission denied" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    "out, message",
    [
        ("", "--out is empty"),
        ("/proc/attnflow-no-such/out", "--out '/proc/attnflow-no-such/out': cannot create the folder: "),
        ("{file}/sub", "/sub': cannot create the folder: "),
    ],
)
def test_out_that_cannot_be_made_is_one_line_naming_it(out, message, tmp_path, capsys):
    if out.startswith("/proc") and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    (tmp_path / "file").write_text("x")
    out = out.format(file=tmp_path / "file")
    assert main(["run", "deep-linear", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnflow: error: --out") and message in err and len(err.splitlines()) == 1


def test_out_made_for_a_run_that_stops_before_computing_is_removed(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert main(["run", "focus-rates", "--merge", "--out", str(out)]) == 2
    assert "holds no shard output; run the shards first (attnflow run focus-rates --shard I/N" in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


@dataclasses.dataclass(frozen=True)
class _DescentCfg:
    dt: float = 1.5
    t_end: float = 60.0


def _register_descent(name: str) -> None:
    """An experiment running the deep-linear network's gradient descent at time step ``dt`` (the
    deep-linear experiment itself refuses unstable steps up front)."""
    from attnflow import deeplinear as dl
    from attnflow.report import Report, get_experiment, register

    try:
        get_experiment(name)
        return
    except (KeyError, ValueError):
        pass

    @register(name, config=_DescentCfg, description="gradient descent at a given dt", sweeps=False)
    def descent(cfg: _DescentCfg, quiet: bool) -> Report:
        rep = Report(name, cfg)
        sim = dl.train(dl.Setup(), cfg.t_end, dt=cfg.dt)
        rep.check("final loss (finite)", float(sim["loss"][-1]), 10.0)
        return rep


def test_failed_run_is_one_line_exit_1_and_debug_shows_the_traceback(tmp_path, capsys):
    # gradient descent with learning rate 1.5 on modes of strength up to 3 diverges
    _register_descent("descent-diverges")
    argv = ["run", "descent-diverges", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("attnflow: run failed: simulate: non-finite loss or parameters at step")
        and len(err.splitlines()) == 1
    )
    assert not (tmp_path / "descent-diverges").exists() and not list(tmp_path.glob(".attnflow-*"))
    with pytest.raises(Exception, match="non-finite"):
        main(argv + ["--debug"])


def test_reused_out_holds_only_the_new_run_and_summary_json_is_strict(tmp_path):
    folder = tmp_path / "deep-linear"
    folder.mkdir()
    (folder / "stale.png").write_text("old")
    # a folder that is not a run's result is the user's: refused before computing, kept
    assert main(["run", "deep-linear", "--out", str(tmp_path), "--quiet"]) == 2
    assert (folder / "stale.png").read_text() == "old"
    (folder / "summary.json").write_text("{}")  # a previous run's folder: replaced whole
    assert (
        main(["run", "deep-linear", "--set", "dts=[0.04, 0.02]", "--set", "t_end=6", "--out", str(tmp_path), "--quiet"])
        == 0
    )
    assert not (folder / "stale.png").exists()
    text = (folder / "summary.json").read_text()

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    json.loads(text, parse_constant=refuse)
    assert oct((folder / "modes.png").stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    # the user's own file in a run's folder (one its summary.json does not list): refused, kept
    (folder / "my_analysis.txt").write_text("mine")
    argv = ["run", "deep-linear", "--set", "dts=[0.04, 0.02]", "--set", "t_end=6", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 2
    assert (folder / "my_analysis.txt").read_text() == "mine"


def _umask():
    m = os.umask(0o022)
    os.umask(m)
    return m


_SIGINT_SCRIPT = """
import sys
from attnflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


_SWALLOWED_SCRIPT = """
import os, signal, sys, time
from attnflow._interrupt import redeliver_swallowed_interrupts
from attnflow.cli import _on_sigterm

class Collected:
    # stands for JAX's garbage-collection callback: Python ignores what it raises
    def __del__(self):
        os.kill(os.getpid(), signal.SIG{name})
        time.sleep(0.5)  # the handler runs here, inside __del__, and its exception is swallowed

signal.signal(signal.SIGTERM, _on_sigterm)
try:
    with redeliver_swallowed_interrupts():  # what the command line and af.sweep run inside
        Collected()
        time.sleep(10)
        print("lost")
except KeyboardInterrupt as stop:
    print("delivered", type(stop).__name__)
"""


@pytest.mark.parametrize("name, kind", [("INT", "KeyboardInterrupt"), ("TERM", "Terminated")])
def test_an_interrupt_swallowed_by_a_callback_is_delivered_again(name, kind):
    proc = subprocess.run(
        [sys.executable, "-c", _SWALLOWED_SCRIPT.replace("{name}", name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == f"delivered {kind}", proc.stderr
    assert "Exception ignored" not in proc.stderr


@pytest.mark.parametrize(
    "sig, code, what",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_exits_130_and_leaves_out_intact(tmp_path, sig, code, what):
    out = tmp_path / "out"
    quick = ["run", "deep-linear", "--set", "dts=[0.04, 0.02]", "--set", "t_end=6", "--out", str(out), "--quiet"]
    assert main(quick) == 0
    before = {p.name: p.read_bytes() for p in (out / "deep-linear").iterdir()}
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["MPLBACKEND"] = "Agg"
    slow = [
        "run",
        "deep-linear",
        "--set",
        "dts=[0.001, 0.0005, 0.00025]",
        "--set",
        "t_end=5000",  # far longer than the test waits: the run is interrupted, never finishes
        "--out",
        str(out),
        "--quiet",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_SCRIPT, *slow],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # interrupt once the run has started (its staging folder exists), however loaded the machine
    deadline = time.monotonic() + 120
    while not list(out.glob(".attnflow-tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip() == f"attnflow: {what}; --out is unchanged"
    # the line as docs/concepts/cli.md quotes it
    assert f"`attnflow: {what}; --out is unchanged`" in (ROOT / "docs" / "concepts" / "cli.md").read_text()
    after = {p.name: p.read_bytes() for p in (out / "deep-linear").iterdir()}
    assert after == before and not list(out.glob(".attnflow-*"))


# experiments of a user's file, for the command run as its console script does (attnflow_command.main)
_START_UP_LAB = """
import time
import warnings
from dataclasses import dataclass

from attnflow.report import Report, register


@dataclass(frozen=True)
class Config:
    seconds: float = 30.0


@register("lab-sleepy", config=Config, description="sleeps", sweeps=False)
def sleepy(cfg, quiet):
    time.sleep(cfg.seconds)  # far longer than the test waits: every signal comes before the run ends
    return Report("lab-sleepy", cfg)


@register("lab-warner", config=Config, description="warns twice", sweeps=False)
def warner(cfg, quiet):
    warnings.warn("t1 = 14 is not a multiple of dt = 0.03", UserWarning, stacklevel=2)
    warnings.warn("sweep: 1 of 4 grid points failed", RuntimeWarning, stacklevel=2)
    return Report("lab-warner", cfg)
"""

_CONSOLE_SCRIPT = "import sys; from attnflow_command import main; sys.exit(main())"


def _command(tmp_path, *argv):
    lab = tmp_path / "start_up_lab.py"
    lab.write_text(_START_UP_LAB)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["MPLBACKEND"] = "Agg"
    argv = [*argv, "--import", str(lab), "--out", str(tmp_path / "out"), "--quiet"]
    command = [sys.executable, "-c", _CONSOLE_SCRIPT, *argv]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_signal_during_start_up_is_the_one_line_and_its_exit_status(tmp_path):
    """Ctrl-C or SIGTERM at any moment, also while JAX is imported (where a KeyboardInterrupt is
    swallowed by JAX's garbage-collection callback or ends the process with a traceback), or
    while the experiments are imported: the command's one line and exit status 130 (143)."""
    for sig, after, code, what in [
        (signal.SIGINT, 0.3, 130, "interrupted"),
        (signal.SIGINT, 0.7, 130, "interrupted"),
        (signal.SIGTERM, 1.0, 143, "terminated (SIGTERM)"),
        (signal.SIGINT, 1.5, 130, "interrupted"),
    ]:
        proc = _command(tmp_path, "run", "lab-sleepy")
        time.sleep(after)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, err, out) == (code, f"attnflow: {what}; --out is unchanged\n", ""), after
        assert not (tmp_path / "out").exists()  # made by the run (if it got so far), left empty: removed


def test_the_command_shows_a_warning_as_one_line_without_its_source(tmp_path):
    proc = _command(tmp_path, "run", "lab-warner")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err.splitlines() == [
        "attnflow: warning: t1 = 14 is not a multiple of dt = 0.03",
        "attnflow: warning: RuntimeWarning: sweep: 1 of 4 grid points failed",
    ]
    notes = json.loads((tmp_path / "out" / "lab-warner" / "summary.json").read_text())["notes"]
    assert notes == [
        "warning: UserWarning: t1 = 14 is not a multiple of dt = 0.03",
        "warning: RuntimeWarning: sweep: 1 of 4 grid points failed",
    ]


def test_main_restores_how_python_formats_warnings():
    import warnings

    before = warnings.formatwarning
    assert main(["list"]) == 0
    assert warnings.formatwarning is before


def test_library_messages_use_the_commands_option_names():
    from attnflow.cli import _one_line

    err = ValueError(
        "sweep: out/sweep-1 holds chunks of 1 points (chunk_size=1 then), and chunk_size=2 gives 2 on 1 device(s); "
        "pass the chunk_size it was saved with, or leave chunk_size out to resume with the folder's (on any device "
        "count)"
    )
    assert _one_line(err) == (
        "sweep: out/sweep-1 holds chunks of 1 points (--chunk-size 1 then), and --chunk-size 2 gives 2 on 1 device(s); "
        "pass the --chunk-size it was saved with, or leave --chunk-size out to resume with the folder's (on any device "
        "count)"
    )


def test_a_failed_check_is_said_under_quiet(tmp_path, capsys, monkeypatch):
    """Under ``--quiet`` a run whose checks fail exits 1 and says so in one line on stderr."""
    from attnflow.report import Report

    monkeypatch.setattr(Report, "passed", property(lambda self: False))
    argv = ["run", "deep-linear", "--set", "dts=[0.02, 0.01]", "--set", "t_end=10", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[attnflow] deep-linear: CHECKS FAILED in ")


def test_a_warning_of_the_run_is_in_its_notes(tmp_path, capsys):
    """Gradient descent at ``eta dt s_max = 1.5`` warns; the warning is in the report's notes (the
    checks pass: it was on stderr only)."""
    _register_descent("descent-warns")
    argv = ["run", "descent-warns", "--set", "dt=0.5", "--set", "t_end=6", "--out", str(tmp_path), "--quiet"]
    with pytest.warns(UserWarning, match="eta dt s_max = 1.5 >= 1"):
        assert main(argv) == 0
    summary = json.loads((tmp_path / "descent-warns" / "summary.json").read_text())
    notes = summary["notes"]
    env = summary["environment"]  # where and how it ran: enough to tell two runs' differences apart
    assert env["command"] == ["attnflow", *argv] and env["x64"] is True and env["device_count"] >= 1
    assert env["backend"] == "cpu" and env["date_utc"].startswith("20") and env["resumed_chunks"] == 0
    assert any(n.startswith("warning: UserWarning: gradient descent with eta dt s_max = 1.5 >= 1") for n in notes)
    assert "- warning: UserWarning: gradient descent" in (tmp_path / "descent-warns" / "summary.md").read_text()


def test_a_failed_run_still_shows_its_warnings(tmp_path, capsys):
    """What a run warned of before failing is often the cause: shown, then the one-line error."""
    import warnings as w

    from attnflow.report import Report, register

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        x: float = 1.0

    @register("warn-then-fail", config=Cfg, description="warns, then fails", sweeps=False)
    def warn_then_fail(cfg: Cfg, quiet: bool) -> Report:
        w.warn("t1 = 14 is not a multiple of dt = 0.03", UserWarning, stacklevel=1)
        raise RuntimeError("compare refused the run")

    with pytest.warns(UserWarning, match="not a multiple of dt"):
        code = main(["run", "warn-then-fail", "--out", str(tmp_path), "--quiet"])
    assert code == 1 and "compare refused the run" in capsys.readouterr().err


# experiments for `reproduce` with one of them lacking its data, another raising: registered once per process
@dataclasses.dataclass(frozen=True)
class _ReproCfg:
    x: float = 1.0


@dataclasses.dataclass(frozen=True)
class _ReproDataCfg:
    data: str | None = None


def _repro_lab() -> dict:
    import attnflow as af
    from attnflow.qkov.realdata import resolve_data
    from attnflow.report import Report, get_experiment, register

    @register("repro-ok", config=_ReproCfg, description="passes", sweeps=False)
    def ok(cfg, quiet):
        rep = Report("repro-ok", cfg)
        rep.check("fine", 0.25, 1.0)
        return rep

    @register("repro-corpus", config=_ReproCfg, description="reads a corpus", sweeps=False)
    def corpus(cfg, quiet):
        af.data_path("corpus-that-is-not-there.txt")
        return Report("repro-corpus", cfg)

    @register("repro-text", config=_ReproDataCfg, description="reads a data set", sweeps=False)
    def text(cfg, quiet):
        resolve_data(cfg.data, "hatexplain/val.jsonl.gz", "hatexplain")
        return Report("repro-text", cfg)

    @register("repro-broken", config=_ReproCfg, description="raises", sweeps=False)
    def broken(cfg, quiet):
        Path("a-file-of-its-own.txt").read_text()  # a FileNotFoundError that is no data lookup: a failed run
        return Report("repro-broken", cfg)

    names = ("repro-ok", "repro-corpus", "repro-text", "repro-broken")
    return {n: get_experiment(n) for n in names}


def _reproduce_only(monkeypatch, tmp_path, names):
    from attnflow import cli

    lab = _repro_lab()
    monkeypatch.setattr(cli, "_load", lambda args: {n: lab[n] for n in names})
    monkeypatch.delenv("ATTNFLOW_DATA", raising=False)
    monkeypatch.chdir(tmp_path)


def test_reproduce_skips_an_experiment_without_data_and_writes_the_others(tmp_path, monkeypatch, capsys):
    """``reproduce --all`` without data: the experiments whose data lookup (`af.data_path`,
    ``resolve_data``) finds nothing are skipped, one line each on stderr, listed in summary.md
    with how to give the data; the others' results are written; exit status 0."""
    _reproduce_only(monkeypatch, tmp_path, ["repro-corpus", "repro-ok", "repro-text"])
    out = tmp_path / "out"
    assert main(["reproduce", "--all", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["repro-ok", "summary.json", "summary.md"]
    assert (out / "repro-ok" / "summary.md").read_text().startswith("# repro-ok\n\nResult: the one check passed.\n")
    corpus = (
        "repro-corpus: data file 'corpus-that-is-not-there.txt' not found (data_dir not set; $ATTNFLOW_DATA not "
        "set); to run it: --data-dir DIR or $ATTNFLOW_DATA naming the folder that holds the data"
    )
    text = (
        "repro-text: no hatexplain data: looked at $ATTNFLOW_DATA/hatexplain/val.jsonl.gz, but $ATTNFLOW_DATA is "
        "not set; to run it: attnflow run repro-text --set data=PATH, or --data-dir DIR or $ATTNFLOW_DATA naming "
        "the folder that holds the data"
    )
    assert capsys.readouterr().err.splitlines() == [f"attnflow: skipped {corpus}", f"attnflow: skipped {text}"]
    md = (out / "summary.md").read_text()
    assert md.startswith(
        "# attnflow reproduce\n\nResult: 1 of 1 experiment passed its checks; 2 skipped for want of data "
        "(repro-corpus, repro-text).\n"
    )
    assert "| repro-corpus | skipped: no data | - | - | - |\n| repro-text | skipped: no data | - | - | - |\n" in md
    assert f"## Skipped for want of data\n\n- {corpus}\n- {text}\n" in md
    index = json.loads((out / "summary.json").read_text())
    assert [e["name"] for e in index["experiments"]] == ["repro-ok"]
    assert index["experiments"][0]["checks"] == {"fine": {"value": 0.25, "tolerance": 1.0, "ok": True}}
    assert [s["name"] for s in index["skipped"]] == ["repro-corpus", "repro-text"]


def test_reproduce_records_a_failed_run_and_exits_1_writing_the_others(tmp_path, monkeypatch, capsys):
    """An experiment that raises (here a ``FileNotFoundError`` of its own, not a data lookup) is a
    failed run: its error in summary.md, no folder (an older run's is removed), exit status 1."""
    _reproduce_only(monkeypatch, tmp_path, ["repro-broken", "repro-ok"])
    out = tmp_path / "out"
    (out / "repro-broken").mkdir(parents=True)
    (out / "repro-broken" / "summary.json").write_text("{}")  # an older run's result
    assert main(["reproduce", "--all", "--out", str(out), "--quiet"]) == 1
    error = "FileNotFoundError: [Errno 2] No such file or directory: 'a-file-of-its-own.txt'"
    assert capsys.readouterr().err.splitlines() == [f"attnflow: run failed: repro-broken: {error}"]
    assert sorted(p.name for p in out.iterdir()) == ["repro-ok", "summary.json", "summary.md"]
    md = (out / "summary.md").read_text()
    assert "Result: 1 of 2 experiments passed their checks; **1 failed to run** (repro-broken).\n" in md
    assert "| repro-broken | **RUN FAILED** |" in md and f"## repro-broken\n- run failed: {error}\n" in md
    index = json.loads((out / "summary.json").read_text())
    assert [(e["name"], e["passed"], e.get("error")) for e in index["experiments"]] == [
        ("repro-broken", False, error),
        ("repro-ok", True, None),
    ]


def test_run_of_an_experiment_without_data_is_still_exit_2(tmp_path, monkeypatch, capsys):
    """``attnflow run NAME`` stops on missing data with the lookup's error (bad input, status 2)."""
    _reproduce_only(monkeypatch, tmp_path, ["repro-text"])
    assert main(["run", "repro-text", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnflow: error: no hatexplain data: looked at $ATTNFLOW_DATA/hatexplain/val.jsonl.gz")
    assert "Give the file or folder with --set data=PATH" in err and len(err.strip().splitlines()) == 1


def test_a_single_check_is_said_in_the_singular(tmp_path):
    """summary.md's result line: "the one check passed", not "all 1 checks passed"."""
    from attnflow.report import Report

    rep = Report("one-check", _ReproCfg())
    rep.check("fine", 0.5, 1.0)
    assert rep.markdown().startswith("# one-check\n\nResult: the one check passed.\n")
    rep.checks["fine"] = (2.0, 1.0)
    assert rep.markdown().startswith("# one-check\n\nResult: **the one check FAILED**.\n")
    rep.check("other", 0.0, 1.0)
    assert rep.markdown().startswith("# one-check\n\nResult: **1 of 2 checks FAILED**.\n")


def test_focus_rates_measures_c_at_an_eps_whose_old_window_was_empty(tmp_path):
    """eps = 0.002 left the old Stage II window [10 q+(0), 0.05] empty (q+(0) = 0.0054): the check
    failed and advised raising n_save. The window starts at q+(0) now (the start lies on the unstable
    mode, so q+ grows as e^{ct} from t = 0): measured, c within 0.042% of the closed form."""
    argv = ["run", "focus-rates", "--set", "lams=[0.5]", "--set", "taus=[1.0]", "--set", "eps=0.002"]
    assert main([*argv, "--out", str(tmp_path), "--quiet"]) == 0
    summary = json.loads((tmp_path / "focus-rates" / "summary.json").read_text())
    [[_, _, two_sigma, two_sigma_meas, c, c_meas]] = next(iter(summary["summary"].values()))
    assert abs(c_meas / c - 1) < 1e-3 and abs(two_sigma_meas / two_sigma - 1) < 0.01
    assert summary["passed"] and summary["notes"] == []


def _deny_writing(monkeypatch, *folders):
    """``os.access`` says ``folders`` are not writable, as for a user without write permission
    (root ignores file modes, so a test cannot rely on them)."""
    real, denied = os.access, {os.path.abspath(f) for f in folders}

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and os.path.abspath(path) in denied:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _old_result(out, experiment, **fields):
    """``out/experiment``, as a run of it leaves it (``fields`` replace those of its summary.json)."""
    folder = out / experiment
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"name": experiment, "files": {}, **fields}))
    return folder


def test_an_old_result_that_cannot_be_moved_is_refused_before_computing(tmp_path, capsys, monkeypatch):
    """It used to fail after the whole run, with a raw "[Errno 13] Permission denied" of the rename."""
    old = _old_result(tmp_path, "deep-linear")
    _deny_writing(monkeypatch, old)
    assert main(["run", "deep-linear", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"attnflow: error: --out {str(tmp_path)!r}: cannot replace {str(old)!r}, the result of an earlier run: it "
        "is read-only (permission denied), and a run moves that folder aside: make it writable, or choose another "
        "--out"
    )
    assert json.loads((old / "summary.json").read_text()) == {"name": "deep-linear", "files": {}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep-linear"]  # nothing staged, nothing left


def test_a_sweep_folder_that_cannot_be_written_is_refused_before_computing(tmp_path, capsys, monkeypatch):
    sweeps = tmp_path / ".attnflow-sweeps" / "focus-rates"
    sweeps.mkdir(parents=True)
    _deny_writing(monkeypatch, sweeps)
    for extra in (["--shard", "1/2"], []):
        assert main(["run", "focus-rates", *extra, "--out", str(tmp_path), "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"attnflow: error: --out {str(tmp_path)!r}: cannot write the sweep chunks in {str(sweeps)!r} "
            "(permission denied): make it writable, or choose another --out"
        )
    assert list(sweeps.iterdir()) == []


def test_another_experiments_result_is_not_replaced(tmp_path, capsys):
    """OUT/deep-linear holding focus-rates' result (its summary.json names it) used to be replaced
    without a word."""
    other = _old_result(tmp_path, "deep-linear", name="focus-rates")
    assert main(["run", "deep-linear", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"attnflow: error: --out {str(tmp_path)!r}: {str(other)!r} holds the result of another experiment, "
        "focus-rates (its summary.json says so); a run of deep-linear replaces that folder: move it, or choose "
        "another --out"
    )
    assert json.loads((other / "summary.json").read_text())["name"] == "focus-rates"


_CACHE_LAB = """
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from attnflow.report import Report, register


@dataclass(frozen=True)
class Cfg:
    n: int = 4


@register("ro-cache-lab", config=Cfg, description="compiles n small programs", sweeps=False)
def lab(cfg, quiet):
    rep = Report("ro-cache-lab", cfg)
    total = sum(float(jax.jit(lambda x, k=k: jnp.sin(x) * k + k)(1.0)) for k in range(1, cfg.n + 1))
    expected = sum(k * (0.8414709848078965 + 1) for k in range(1, cfg.n + 1))  # sin(1) = 0.84147...
    rep.check("the programs ran (|total - expected|)", abs(total - expected), 1e-9)
    return rep
"""


def test_a_read_only_compilation_cache_is_one_warning(tmp_path):
    """It used to print one "Error writing persistent compilation cache entry" warning per program
    compiled (30 in a focus-rates run), copied into the summary's notes."""
    (tmp_path / "lab.py").write_text(_CACHE_LAB)
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    command = [sys.executable, "-m", "attnflow.cli", "run", "ro-cache-lab", "--import", str(tmp_path / "lab.py")]
    command += ["--out", str(tmp_path / "out"), "--quiet"]
    if os.geteuid() == 0:  # root writes in a read-only folder: run without that capability
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: no folder is read-only to this process")
        drop = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *command]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MPLBACKEND="Agg", ATTNFLOW_CACHE=str(cache))
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        cache.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == (
        f"attnflow: warning: the compilation cache {cache} is read-only: programs compiled now are not saved in it "
        "(reading the programs it holds still works); set $ATTNFLOW_CACHE to a folder you can write in to keep them"
    )
    summary = json.loads((tmp_path / "out" / "ro-cache-lab" / "summary.json").read_text())
    assert summary["passed"] and summary["notes"] == [] and summary["compilations"]["count"] >= 4
    assert list(cache.iterdir()) == []


def test_use_compilation_cache_only_reads_a_folder_it_cannot_write(tmp_path, monkeypatch):
    """`use_compilation_cache` stores every program in a writable folder and none (without a warning
    per program) in one it cannot write in; JAX's configuration is not touched here (recorded)."""
    import math
    import warnings

    from attnflow import cache as cache_module

    calls = {}
    monkeypatch.setattr(cache_module.jax.config, "update", lambda key, value: calls.__setitem__(key, value))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_module.use_compilation_cache(tmp_path / "rw") == tmp_path / "rw"
    assert calls == {
        "jax_compilation_cache_dir": str(tmp_path / "rw"),
        "jax_persistent_cache_min_compile_time_secs": cache_module.MIN_COMPILE_SECONDS,
    }
    monkeypatch.setattr(cache_module, "_writable", lambda folder: False)
    with pytest.warns(UserWarning, match=r"^the compilation cache .*/ro is read-only: programs compiled now") as seen:
        cache_module.use_compilation_cache(tmp_path / "ro")
    assert len(seen) == 1 and calls["jax_persistent_cache_min_compile_time_secs"] == math.inf
    assert calls["jax_compilation_cache_dir"] == str(tmp_path / "ro")
