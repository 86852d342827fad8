"""A non-editable install runs from any directory: the package reads nothing beside its sources."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_runs_an_experiment_from_another_directory(tmp_path):
    wheels, target, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("attnflow-*.whl")
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert inst.returncode == 0, inst.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "ATTNFLOW_DATA")}
    env.update(PYTHONPATH=str(target), MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
    where = subprocess.run(
        [sys.executable, "-c", "import attnflow; print(attnflow.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-c",  # what the installed `attnflow` script runs: the entry module shipped in the wheel
            "import sys; from attnflow_command import main; sys.exit(main())",
            "run",
            "deep-linear",
            "--set",
            "dts=[0.04, 0.02]",
            "--set",
            "t_end=6",
            "--out",
            "out",
            "--quiet",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    summary = json.loads((work / "out" / "deep-linear" / "summary.json").read_text())
    assert summary["passed"] and (work / "out" / "deep-linear" / "modes.png").stat().st_size > 10_000
