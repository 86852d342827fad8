"""Scale-out: a sweep split into shards over processes and machines sharing a folder, and the
merge ("Time to result", item 5): sharded + merged == one run, under jax.distributed too, and
``attnflow run NAME --shard I/N`` then ``--merge`` == one full run."""

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.cli import main
from attnflow.report import Report, register

# the swept function, as source: the test and its subprocesses define the very same function, so
# that the fingerprint in the shared folder's manifest matches
FN = """
import jax.numpy as jnp

def f(a, b):
    return {"y": jnp.sin(a) * b + a**2, "k": (b > 1.5).astype(jnp.int32)}
"""
AXES = {"a": np.linspace(0.0, 1.0, 6), "b": np.array([1.0, 2.0, 3.0])}


def _fn():
    ns: dict = {}
    exec(FN, ns)
    return ns["f"]


def test_two_shards_and_the_merge_equal_one_sweep(tmp_path):
    f = _fn()
    one = af.sweep(f, AXES, chunk_size=3, progress=False)  # 6 chunks of one row
    folder = tmp_path / "lr"
    r1 = af.sweep(f, AXES, chunk_size=3, out_dir=folder, shard=af.Shard(1, 2), progress=False)
    assert r1.meta["computed_chunks"] == 3 and r1.meta["pending_chunks"] == 3 and not r1.complete
    # rows 0, 2, 4 are shard 1's; the others pending: NaN values (0 for integers), status -1, not failures
    assert r1.pending[:, 0].tolist() == [False, True, False, True, False, True]
    np.testing.assert_array_equal(r1["y"][::2], one["y"][::2])
    assert np.isnan(r1["y"][1::2]).all() and (r1["k"][1::2] == 0).all()
    assert (r1.status[1::2] == -1).all() and r1.failures() == [] and not r1.ok[1::2].any()
    r2 = af.sweep(f, AXES, chunk_size=3, out_dir=folder, shard="2/2", progress=False)
    assert r2.meta["computed_chunks"] == 3 and r2.complete  # shard 1's chunks were already there
    merged = af.sweep(f, AXES, out_dir=folder, progress=False)  # chunk size: the folder's
    assert merged.meta["computed_chunks"] == 0 and merged.meta["chunk_size"] == 3 and merged.complete
    for res in (r2, merged):
        np.testing.assert_array_equal(res["y"], one["y"])
        np.testing.assert_array_equal(res["k"], one["k"])
    assert sorted(p.name for p in folder.iterdir()) == [f"chunk_{i:05d}.npz" for i in range(6)] + ["sweep.json"]

    # a merge after one shard only computes the other shard's chunks; a default sharded chunk is one per shard
    half = tmp_path / "half"
    s1 = af.sweep(f, AXES, out_dir=half, shard=(1, 2), progress=False)
    assert s1.meta["n_chunks"] == 2 and s1.meta["chunk_size"] == 9 and s1.pending.sum() == 9
    done = af.sweep(f, AXES, out_dir=half, progress=False)
    assert done.meta["computed_chunks"] == 1
    np.testing.assert_allclose(done["y"], one["y"], rtol=1e-15, atol=0)

    # a shard that waits a bounded time returns what is there; another function in the folder is refused
    w = af.sweep(f, AXES, chunk_size=3, out_dir=tmp_path / "w", shard=af.Shard(2, 3, wait=0.2), progress=False)
    assert w.meta["pending_chunks"] == 4 and w.pending.sum() == 12
    with pytest.raises(ValueError, match="holds a different sweep: the function"):
        af.sweep(lambda a, b: a * b, AXES, chunk_size=3, out_dir=folder, shard=(1, 2), progress=False)
    with pytest.raises(ValueError, match="needs an out_dir"):
        af.sweep(f, AXES, shard=(1, 2))
    for bad, message in [((0, 2), "need 1 <= I <= N"), ((3, 2), "need 1 <= I <= N"), ((1, 0), "at least 1")]:
        with pytest.raises(ValueError, match=message):
            af.Shard(*bad)
    with pytest.raises(ValueError, match="not of the form I/N"):
        af.Shard.parse("1-2")
    assert af.process_shard() == af.Shard(1, 1, wait=True)  # one process: the whole sweep


_PROCESS = """
import json, sys
import jax

jax.config.update("jax_enable_x64", True)
address, k, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=k,
                               initialization_timeout=60)
except Exception as err:
    print("jax.distributed did not start:", type(err).__name__, str(err).splitlines()[0][:300], flush=True)
    sys.exit(3)
import numpy as np
import attnflow as af
{fn}
axes = {{"a": np.linspace(0.0, 1.0, 6), "b": np.array([1.0, 2.0, 3.0])}}
res = af.sweep(f, axes, chunk_size=3, out_dir=folder, shard=af.process_shard(), progress=False)
np.save(f"{{folder}}-values-{{k}}.npy", np.asarray(res["y"]))
print(json.dumps({{"index": jax.process_index(), "count": jax.process_count(), "complete": res.complete,
                  "computed": res.meta["computed_chunks"], "local": len(jax.local_devices()),
                  "global": len(jax.devices())}}), flush=True)
jax.distributed.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_jax_distributed_processes_split_a_sweep(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    folder = tmp_path / "sweep"
    address = f"127.0.0.1:{_free_port()}"
    script = _PROCESS.format(fn=FN)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, address, str(k), str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode == 3 for p in procs):
        pytest.skip("jax.distributed cannot start two local processes here: " + " | ".join(o for o, _ in outs))
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # each process computed its 3 of the 6 chunks on its own device, waited for the other's, and has the whole grid
    assert [r["index"] for r in reports] == [0, 1] and all(r["count"] == 2 for r in reports)
    assert all(r["complete"] and r["computed"] == 3 and r["local"] == 1 and r["global"] == 2 for r in reports)
    f = _fn()
    one = af.sweep(f, AXES, chunk_size=3, progress=False)
    for k in range(2):
        np.testing.assert_array_equal(np.load(f"{folder}-values-{k}.npy"), one["y"])
    merged = af.sweep(f, AXES, chunk_size=3, out_dir=folder, progress=False)
    assert merged.meta["computed_chunks"] == 0
    np.testing.assert_array_equal(merged["y"], one["y"])


# a tiny experiment with two sweeps, the second over the first one's results
TINY = "shard-test-tiny"


@dataclass(frozen=True)
class TinyConfig:
    """Options of the test experiment."""

    scale: float = 2.0
    n: int = 5


def _tiny(cfg: TinyConfig, quiet: bool) -> Report:
    rep = Report(TINY, cfg)
    xs = np.linspace(0.0, 1.0, cfg.n)
    ys = np.asarray(af.sweep(lambda x: jnp.sin(cfg.scale * x), {"x": xs}, progress=False).values)
    second = np.asarray(af.sweep(lambda y, k: y**k, {"y": ys, "k": np.array([1.0, 2.0])}, progress=False).values)
    rep.summary["first"] = ys.tolist()
    rep.summary["second"] = second.tolist()
    rep.check("second sweep at k = 1 vs the first (max abs)", float(np.max(np.abs(second[:, 0] - ys))), 1e-12)
    return rep


@pytest.fixture
def tiny():
    from attnflow import report

    register(TINY, config=TinyConfig, description="two small sweeps, the second over the first's results")(_tiny)
    yield TINY
    report._REGISTRY.pop(TINY, None)


def _summary(folder):
    return json.loads((folder / TINY / "summary.json").read_text())


def test_cli_shards_then_merge_equal_one_full_run(tiny, tmp_path, capsys):
    sets = ["--set", "scale=3", "--set", "n=5"]
    assert main(["run", tiny, *sets, "--out", str(tmp_path / "full"), "--quiet"]) == 0
    out = tmp_path / "sharded"
    chunks = out / ".attnflow-sweeps" / tiny
    capsys.readouterr()
    assert main(["run", tiny, *sets, "--shard", "1/2", "--out", str(out), "--quiet"]) == 0
    line = capsys.readouterr().out.strip()
    # shard 1 computed its chunk of sweep 1 and stopped there: sweep 2 needs all of sweep 1
    assert len(line.splitlines()) == 1 and line.startswith(f"[attnflow] {tiny} shard 1/2: computed 1 chunk(s)")
    assert "sweep 1 still lacks 1 of its 2 chunks" in line and f"--out {out} --merge" in line and "scale=3" in line
    assert not (out / tiny).exists() and [p.name for p in chunks.iterdir()] == ["sweep-1"]
    # shard 2 completes sweep 1, goes on to its share of sweep 2, and stops there
    assert main(["run", tiny, *sets, "--shard", "2/2", "--out", str(out), "--quiet"]) == 0
    line = capsys.readouterr().out.strip()
    assert "computed 2 chunk(s)" in line and "sweep 2 still lacks 1 of its 2 chunks" in line
    # another option on the same folder is refused (exit 2): the shards must agree
    assert main(["run", tiny, "--set", "scale=4", "--shard", "1/2", "--out", str(out), "--quiet"]) == 2
    assert "holds a different sweep" in capsys.readouterr().err
    assert main(["run", tiny, *sets, "--merge", "--out", str(out), "--quiet"]) == 0
    full, merged = _summary(tmp_path / "full"), _summary(out)
    assert merged["passed"] and merged["config"] == full["config"]
    np.testing.assert_allclose(merged["summary"]["second"], full["summary"]["second"], rtol=1e-13, atol=0)
    np.testing.assert_allclose(merged["summary"]["first"], full["summary"]["first"], rtol=1e-13, atol=0)
    assert merged["checks"].keys() == full["checks"].keys()
    assert sorted(p.name for p in (chunks / "sweep-2").glob("chunk_*")) == ["chunk_00000.npz", "chunk_00001.npz"]
    # a shard run after everything is done finds every sweep complete
    capsys.readouterr()
    assert main(["run", tiny, *sets, "--shard", "1/2", "--out", str(out), "--quiet"]) == 0
    assert "computed 0 chunk(s); all 2 sweep(s) are complete" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shard", "1"], "--shard '1': shard '1' is not of the form I/N"),
        (["--shard", "a/b"], "is not of the form I/N"),
        (["--shard=-1/2"], "is not of the form I/N"),
        (["--shard", "-1/2"], "--shard '-1/2': shard '-1/2' is not of the form I/N"),
        (["--shard", "0/2"], "--shard '0/2': shard 0/2: need 1 <= I <= N"),
        (["--shard", "3/2"], "need 1 <= I <= N (shard I of N, counting from 1: 1/2 ... 2/2)"),
        (["--shard", "1/0"], "N, the number of shards, must be at least 1"),
        (["--shard", "1/2", "--merge"], "--shard and --merge do not go together"),
        (["--merge"], "deep-linear runs no sweep, so it has no shards to merge; run it without --merge"),
        (["--shard", "1/2"], "deep-linear runs no sweep"),
    ],
)
def test_bad_shard_options_exit_2_before_computing(argv, message, tmp_path, capsys):
    assert main(["run", "deep-linear", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_merge_before_any_shard_exits_2(tmp_path, capsys):
    assert main(["run", "focus-rates", "--merge", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no shard output; run the shards first" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_cli_shards_of_a_real_experiment_merge_to_one_run(tmp_path):
    """focus-rates over two lambdas, each shard in its own process (minutes on a busy CPU)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["MPLBACKEND"] = "Agg"
    base = [sys.executable, "-m", "attnflow.cli", "run", "focus-rates", "--quiet"]
    base += ["--set", "lams=[0.5, 0.7]", "--set", "taus=[1.0]", "--set", "m=4", "--set", "mk=4"]
    for extra in (["--out", str(tmp_path / "full")], ["--shard", "1/2"], ["--shard", "2/2"], ["--merge"]):
        argv = base + (extra if extra[0] == "--out" else [*extra, "--out", str(tmp_path / "sharded")])
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    full, merged = (json.loads((tmp_path / d / "focus-rates/summary.json").read_text()) for d in ("full", "sharded"))
    assert merged["passed"] and merged["checks"].keys() == full["checks"].keys()
    for k, v in full["checks"].items():
        assert merged["checks"][k]["value"] == pytest.approx(v["value"], rel=1e-6, abs=1e-12), k
