"""`attnflow run --chunk-size N`: every sweep of the run saves chunks of N grid points, so an
interrupted run (or a preempted shard) loses at most the chunk it was on."""

import json

import pytest
from test_cli_resume import FAIL_ENV, NAME, TinyConfig, _tiny

from attnflow.cli import main


@pytest.fixture
def tiny():
    from attnflow import report
    from attnflow.report import register

    register(NAME, config=TinyConfig, description="two small sweeps", sweeps=True)(_tiny)
    yield NAME
    report._REGISTRY.pop(NAME, None)


def test_chunk_size_reaches_the_sweeps_and_a_rerun_computes_only_missing_chunks(tiny, tmp_path, capsys, monkeypatch):
    sets = ["--set", "n=6", "--chunk-size", "2"]
    assert main(["run", tiny, "--set", "n=6", "--out", str(tmp_path / "full"), "--quiet"]) == 0
    out = tmp_path / "out"
    first = out / ".attnflow-sweeps" / tiny / "sweep-1"
    monkeypatch.setenv(FAIL_ENV, "raise")
    assert main(["run", tiny, *sets, "--out", str(out), "--quiet"]) == 1
    assert sorted(p.name for p in first.glob("chunk_*")) == [f"chunk_{i:05d}.npz" for i in range(3)]
    assert json.loads((first / "sweep.json").read_text())["chunk_size"] == 2
    (first / "chunk_00001.npz").unlink()  # as if interrupted while computing the second chunk
    monkeypatch.delenv(FAIL_ENV)
    capsys.readouterr()
    assert main(["run", tiny, *sets, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    # sweep 1: 2 of 3 chunks loaded, 1 computed; sweep 2 (6 x 2 points, whole rows): 6 chunks computed
    assert "2 of the 9 sweep chunks were loaded" in err and "7 computed now" in err
    full, resumed = (json.loads((d / NAME / "summary.json").read_text()) for d in (tmp_path / "full", out))
    assert resumed["summary"] == full["summary"]


@pytest.mark.parametrize("n", ["0", "-3"])
def test_chunk_size_must_be_positive(n, tmp_path, capsys):
    assert main(["run", "focus-rates", "--chunk-size", n, "--out", str(tmp_path)]) == 2
    assert f"--chunk-size must be a positive integer, got {n}" in capsys.readouterr().err
