"""`attnflow run`: a plain run keeps its sweeps' finished chunks until its report is in place,
so the same command run again after an interruption loads them; options are checked against
the chunks before computing."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.cli import main
from attnflow.report import Report, register

NAME = "cli-resume-tiny"
FAIL_ENV = "ATTNFLOW_TEST_FAIL_SECOND_SWEEP"  # "raise": the second sweep fails; "sleep": it waits first


@dataclass(frozen=True)
class TinyConfig:
    """Options of the test experiment."""

    scale: float = 2.0
    n: int = 5


def _tiny(cfg: TinyConfig, quiet: bool) -> Report:
    rep = Report(NAME, cfg)
    xs = np.linspace(0.0, 1.0, cfg.n)
    ys = np.asarray(af.sweep(lambda x: jnp.sin(cfg.scale * x), {"x": xs}, progress=False).values)
    if os.environ.get(FAIL_ENV) == "raise":
        raise RuntimeError("the second sweep failed")
    if os.environ.get(FAIL_ENV) == "sleep":
        time.sleep(600)
    second = np.asarray(af.sweep(lambda y, k: y**k, {"y": ys, "k": np.array([1.0, 2.0])}, progress=False).values)
    rep.summary["first"] = ys.tolist()
    rep.summary["second"] = second.tolist()
    rep.check("second sweep at k = 1 vs the first (max abs)", float(np.max(np.abs(second[:, 0] - ys))), 1e-12)
    return rep


@pytest.fixture
def tiny():
    from attnflow import report

    register(NAME, config=TinyConfig, description="two small sweeps", sweeps=True)(_tiny)
    yield NAME
    report._REGISTRY.pop(NAME, None)


def _summary(out):
    return json.loads((out / NAME / "summary.json").read_text())


def test_a_failed_plain_run_keeps_its_chunks_and_the_same_command_goes_on_from_them(
    tiny, tmp_path, capsys, monkeypatch
):
    sets = ["--set", "scale=3", "--set", "n=6"]
    assert main(["run", tiny, *sets, "--out", str(tmp_path / "full"), "--quiet"]) == 0
    assert not (tmp_path / "full" / ".attnflow-sweeps").exists()  # removed once the report is in place
    out = tmp_path / "out"
    chunks = out / ".attnflow-sweeps" / tiny
    monkeypatch.setenv(FAIL_ENV, "raise")
    assert main(["run", tiny, *sets, "--out", str(out), "--quiet"]) == 1
    assert "the second sweep failed" in capsys.readouterr().err
    assert [p.name for p in (chunks / "sweep-1").glob("chunk_*")] == ["chunk_00000.npz"]
    assert not (out / tiny).exists() and not (chunks / "sweep-2").exists()
    # other options: refused before computing, naming the folder and the option that differs
    assert main(["run", tiny, "--set", "scale=4", "--set", "n=6", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a different sweep" in err and "scale=3.0 (now 4.0)" in err and len(err.splitlines()) == 1
    monkeypatch.delenv(FAIL_ENV)
    assert main(["run", tiny, *sets, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{tiny}: 1 of the 2 sweep chunks were loaded from {chunks}" in err and "1 computed now" in err
    full, resumed = _summary(tmp_path / "full"), _summary(out)
    assert resumed["summary"] == full["summary"] and resumed["passed"]
    assert any("1 of the 2 sweep chunks were loaded" in n for n in resumed["notes"])
    assert not any("loaded" in n for n in full["notes"])
    # the timings of the resumed run are of the one chunk it computed: said under them
    assert resumed["environment"]["sweep_chunks"] == {"total": 2, "computed": 1, "loaded": 1}
    assert full["environment"]["sweep_chunks"] == {"total": 2, "computed": 2, "loaded": 0}
    timings = (out / NAME / "summary.md").read_text().split("| timing | seconds |")[1]
    assert timings.split("\n\n")[1] == (
        "Timings: this run computed 1 of its 2 sweep chunks and loaded 1 from disk (computed earlier), so the "
        "timings cover only part of the sweeps."
    )
    assert "Timings: this run" not in (tmp_path / "full" / NAME / "summary.md").read_text()
    assert not (out / ".attnflow-sweeps").exists()


def test_a_plain_run_keeps_the_chunks_of_shards(tiny, tmp_path, capsys):
    """A plain run on shards' folder loads their chunks (as --merge would) and leaves the folder."""
    out = tmp_path / "out"
    assert main(["run", tiny, "--shard", "1/2", "--out", str(out), "--quiet"]) == 0
    assert main(["run", tiny, "--out", str(out), "--quiet"]) == 0
    assert any("loaded" in n for n in _summary(out)["notes"])
    assert (out / ".attnflow-sweeps" / tiny / "sweep-1" / "chunk_00000.npz").exists()


_SCRIPT = f"""
import sys
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
import test_cli_resume as t
from attnflow.cli import main
from attnflow.report import register
register(t.NAME, config=t.TinyConfig, description="two small sweeps", sweeps=True)(t._tiny)
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_keeps_the_finished_chunks_and_the_rerun_loads_them(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    chunk = out / ".attnflow-sweeps" / tiny / "sweep-1" / "chunk_00000.npz"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MPLBACKEND="Agg", **{FAIL_ENV: "sleep"})
    argv = ["run", tiny, "--set", "n=4", "--out", str(out), "--quiet"]
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, *argv], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not chunk.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().startswith("attnflow: interrupted; --out is unchanged but for the finished sweep chunks")
    assert chunk.exists() and not list(out.glob(".attnflow-tmp-*"))
    assert main([*argv[:-1]]) == 0
    assert "1 of the 2 sweep chunks were loaded" in capsys.readouterr().err
    assert not (out / ".attnflow-sweeps").exists()


def test_an_interrupted_shard_names_its_kept_chunks_and_the_command_to_go_on(tiny, tmp_path, capsys):
    """An interrupted --shard run used to say "--out is unchanged", though its finished chunks were
    kept for the merge and the same command goes on from them."""
    out = tmp_path / "out"
    folder = out / ".attnflow-sweeps" / tiny
    chunk = folder / "sweep-1" / "chunk_00000.npz"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MPLBACKEND="Agg", **{FAIL_ENV: "sleep"})
    argv = ["run", tiny, "--set", "n=4", "--shard", "1/1", "--out", str(out), "--quiet"]
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, *argv], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not chunk.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    command = f"attnflow run {tiny} --set n=4 --shard 1/1 --out {out} --quiet"
    assert err.strip() == (
        f"attnflow: interrupted; --out is unchanged but for the sweep chunks this shard finished, kept in {folder}: "
        f"run the same command again to go on from them ({command})"
    )
    assert chunk.exists()
    # the same command goes on: the first sweep is loaded, only the second one's chunk is computed
    assert main(argv) == 0
    assert f"{tiny} shard 1/1: computed 1 chunk(s); all 2 sweep(s) are complete in {folder}" in capsys.readouterr().out
