"""The `attnflow` command: list, run, reproduce, errors."""

import json
import subprocess
import sys

import pytest

from attnflow.cli import main


def test_version_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("attnflow ")
    assert main(["list"]) == 0
    assert "deep-linear" in capsys.readouterr().out
    assert main(["show", "deep-linear"]) == 0
    out = capsys.readouterr().out
    assert "--set dts=...   list of float, default (0.04, 0.02, 0.01)" in out and "--set u0=...   float" in out


def test_run_writes_outputs(tmp_path, capsys):
    rc = main(["run", "deep-linear", "--set", "dts=[0.02, 0.01]", "--set", "t_end=10", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    folder = tmp_path / "deep-linear"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["passed"] and summary["config"]["dts"] == [0.02, 0.01] and summary["config"]["t_end"] == 10.0
    assert summary["checks"]["solve vs closed form (max rel. error)"]["value"] < 1e-8
    assert summary["compilations"]["count"] > 0
    assert (folder / "summary.md").read_text().startswith("# deep-linear")
    assert (folder / "modes.png").stat().st_size > 10_000
    assert (folder / "theory.npz").exists() and (folder / "theory.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["run", "deep-linear", "--set", "oops"], "malformed --set 'oops'"),
        (["run", "deep-linear", "--set", "nope=1"], "has no option 'nope'"),
        (["run", "deep-linear", "--set", "u0=abc"], "option 'u0' of deep-linear expects float"),
        (["run", "deep-linear", "--cpu-devices", "0"], "--cpu-devices must be a positive integer, got 0"),
        (["run", "deep-linear", "--set", "dts=0.1"], "option 'dts' of deep-linear expects list of float"),
        (["run", "deep-linear", "--data-dir", "/no/such/folder"], "--data-dir '/no/such/folder' is not a folder"),
        (["show", "nothing"], "unknown experiment 'nothing'"),
    ],
)
def test_bad_arguments_one_line_error(argv, message, capsys, tmp_path):
    rc = main(argv + ["--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and len(err.splitlines()) == 1


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "attnflow.cli", "list"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "deep-linear" in out.stdout
