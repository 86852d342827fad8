"""Trajectory, integrate, simulate, optim, expect, plot: behaviour and bad input."""

import json
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow.deeplinear import Teacher, TwoLayerLinear, mode_field, mode_strength, population_loss
from attnflow.trajectory import flatten_names

S = jnp.array([3.0, 2.0, 1.0, 0.5])


# ----------------------------------------------------------------------------- Trajectory
def test_trajectory_roundtrip_and_interp(tmp_path):
    ts = jnp.linspace(0, 1, 11)
    tr = af.Trajectory(ts, {"a": ts**2, "b": jnp.stack([ts, -ts], axis=1)}, {"seed": 3, "config": {"x": [1, 2]}})
    p = tr.save(tmp_path / "run")
    assert p.name == "run.npz" and (tmp_path / "run.json").exists()
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["meta"] == {"seed": 3, "config": {"x": [1, 2]}} and "jax" in meta["versions"]
    back = af.Trajectory.load(p)
    np.testing.assert_array_equal(back["b"], tr["b"])
    assert back.meta["seed"] == 3
    v = tr.at([0.05, 0.5])
    np.testing.assert_allclose(v["a"], [0.005, 0.25], atol=1e-15)  # linear interpolation of t^2
    np.testing.assert_allclose(v["b"], [[0.05, -0.05], [0.5, -0.5]])
    assert tr.select("a").names == ("a",)
    np.testing.assert_array_equal(tr.final()["b"], [1.0, -1.0])
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporaries


def test_load_of_float64_without_x64_warns_naming_the_arrays_and_enable_x64(tmp_path):
    """A float64 file (as the CLI writes theory) loads as float64 with JAX's 64-bit mode on; with it
    off JAX rounds it to float32, and the load says so (the rounding is 1e-8 relative, not 1e-16)."""
    ts = np.linspace(0.0, 1.0, 5)
    u = 1.0 / 3.0 + ts  # 1/3 is not a float32: the rounding shows
    steps = np.arange(5)  # integer stats and observables are no loss of precision: not named
    p = af.Trajectory(ts, {"u": u, "steps": steps}, t_event=0.5, stats={"num_steps": 7}).save(tmp_path / "theory")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = af.Trajectory.load(p)
    assert back["u"].dtype == np.float64 and back.ts.dtype == np.float64
    np.testing.assert_array_equal(back["u"], u)
    message = (
        rf"^{re.escape(str(p))} holds float64 arrays \(ts, u, t_event\) but JAX's 64-bit mode is off, so they load "
        r"as float32 \(rounded to about 7 digits\): call attnflow.enable_x64\(\) at the start of the program, or load "
        r"inside `with jax.enable_x64\(True\):`, to keep float64 \(np.load reads the file as saved\)$"
    )
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match=message) as seen:
            low = af.Trajectory.load(p)
        assert low["u"].dtype == np.float32
        with pytest.warns(UserWarning, match="holds float64 arrays"):
            assert af.Trajectory.load(p.with_suffix("")).names == ("u", "steps")  # the name without .npz too
    assert seen[0].filename == __file__  # the warning points at the caller's load
    rel = np.abs(np.asarray(low["u"], np.float64) - u) / u
    assert 1e-9 < rel.max() < 6e-8  # float32 rounding: what the warning is about
    # a float32 file loses nothing in a float32 session: no warning
    p32 = af.Trajectory(ts.astype(np.float32), {"u": u.astype(np.float32)}).save(tmp_path / "sim")
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert af.Trajectory.load(p32)["u"].dtype == np.float32


def test_trajectory_is_a_pytree_and_batches():
    ts = jnp.linspace(0, 1, 5)
    f = jax.vmap(lambda c: af.Trajectory(ts, {"y": c * ts}))
    tr = f(jnp.array([1.0, 2.0, 3.0]))
    assert tr.batch_shape == (3,) and tr["y"].shape == (3, 5)
    np.testing.assert_allclose(tr.at([0.5])["y"][:, 0], [0.5, 1.0, 1.5])
    np.testing.assert_allclose(tr.batch(1)["y"], 2 * ts)


def test_batch_indexes_the_batch_axes_only():
    """An index reaching past the batch axes would slice the save times and feature axes (a
    Trajectory of garbage): it is refused, naming the index and the batch shape; ``...`` stands
    for batch axes only."""
    ts = jnp.linspace(0.0, 4.0, 9)
    rates = jnp.array([1.0, 2.0, 3.0])
    u = rates[:, None] * ts
    B = af.Trajectory(jnp.stack([ts] * 3), {"u": u, "v": u[..., None] * jnp.array([1.0, -1.0])}, t_event=rates)
    last = B.batch((..., 2))  # on one batch axis, (..., 2) is batch(2)
    assert last.batch_shape == () and float(last.t_event) == 3.0
    np.testing.assert_allclose(last["u"], 3 * ts)
    np.testing.assert_allclose(last["v"][-1], [12.0, -12.0])
    said = (
        r"^batch: index \[:, 0\] takes 2 axes, but this trajectory has 1 batch axis \(batch shape \(3,\)\); "
        r"batch indexes the batch axes only \(save times: traj.at\(t\) or traj.resample\(t\); a component: "
        r"traj\[name\]\[\.\.\., j\]\)$"
    )
    with pytest.raises(ValueError, match=said):
        B.batch((slice(None), 0))
    with pytest.raises(ValueError, match=r"^batch: index \[\.\.\., 0, 1\] takes 2 axes, but .* \(batch shape \(3,\)\)"):
        B.batch((..., 0, 1))
    with pytest.raises(ValueError, match=r"^batch: index \[\.\.\., \.\.\.\] has more than one '\.\.\.'$"):
        B.batch((..., ...))
    # two batch axes: (..., j) picks along the last one, a mask takes the axes it spans
    grid = af.Trajectory(jnp.broadcast_to(ts, (2, 3, 9)), {"u": jnp.arange(6.0).reshape(2, 3, 1) * ts})
    np.testing.assert_allclose(grid.batch((..., 1))["u"][:, -1], [4.0, 16.0])  # entries (0, 1), (1, 1): 1 t, 4 t
    assert grid.batch((slice(None), 0)).batch_shape == (2,)
    np.testing.assert_allclose(grid.batch(np.array([True, False]))["u"][..., -1], [[0.0, 4.0, 8.0]])
    with pytest.raises(ValueError, match=r"index \[0, 1, 2\] takes 3 axes, but this trajectory has 2 batch axes"):
        grid.batch((0, 1, 2))


def test_at_takes_one_row_of_times_per_run():
    """``t`` of shape ``batch + (k,)``: each run at its own times (run i: y = (i + 1) t); ``(k,)``:
    every run at the same times; other shapes are refused naming both."""
    ts = jnp.stack([jnp.linspace(0, 1, 11)] * 3)
    slopes = jnp.array([1.0, 2.0, 3.0])
    tr = af.Trajectory(ts, {"y": ts * slopes[:, None], "v": ts[..., None] * jnp.array([1.0, -1.0])})
    own = tr.at(jnp.array([[0.1], [0.5], [0.9]]))
    np.testing.assert_allclose(own["y"], [[0.1], [1.0], [2.7]], atol=1e-15)
    np.testing.assert_allclose(own["v"], [[[0.1, -0.1]], [[0.5, -0.5]], [[0.9, -0.9]]], atol=1e-15)
    two = tr.at(jnp.array([[0.05, 0.1], [0.2, 0.3], [0.4, 0.45]]), "y")["y"]
    np.testing.assert_allclose(two, [[0.05, 0.1], [0.4, 0.6], [1.2, 1.35]], atol=1e-15)
    common = tr.at(jnp.array([0.1, 0.5]), "y")["y"]  # (k,): the same times for every run
    np.testing.assert_allclose(common, slopes[:, None] * jnp.array([0.1, 0.5]), atol=1e-15)
    np.testing.assert_allclose(tr.at(jnp.array([[0.1, 0.5]]), "y")["y"], common, atol=1e-15)  # (1, k) broadcasts
    # under jit, in log time, and on a grid of two batch axes (a sweep over eta and seed)
    np.testing.assert_allclose(
        jax.jit(lambda t: tr.at(t, "y", log_time=True)["y"])(jnp.array([[0.1], [0.5], [0.9]])),
        [[0.1], [1.0], [2.7]],
        atol=1e-12,
    )
    grid = af.Trajectory(
        jnp.broadcast_to(ts[0], (2, 3, 11)), {"y": jnp.broadcast_to(ts[0], (2, 3, 11)) * slopes[:, None]}
    )
    t_own = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])[..., None]
    np.testing.assert_allclose(grid.at(t_own, "y")["y"][..., 0], t_own[..., 0] * slopes, atol=1e-15)
    re = tr.resample(jnp.array([[0.0, 0.5], [0.1, 0.2], [0.5, 1.0]]))
    np.testing.assert_allclose(re.ts, [[0.0, 0.5], [0.1, 0.2], [0.5, 1.0]])
    np.testing.assert_allclose(re["y"], [[0.0, 0.5], [0.2, 0.4], [1.5, 3.0]], atol=1e-15)
    with pytest.raises(
        ValueError, match=r"t of shape \(2, 2\) does not fit a trajectory of batch shape \(3,\): .* \(3, k\)"
    ):
        tr.at(jnp.array([[0.1, 0.2], [0.3, 0.4]]), "y")
    with pytest.raises(ValueError, match=r"t of shape \(3, 1, 1\) does not fit a trajectory of batch shape \(3,\)"):
        tr.at(jnp.zeros((3, 1, 1)), "y")
    with pytest.raises(
        ValueError, match=r"t of shape \(3, 1\) for an unbatched trajectory: give times of shape \(k,\)"
    ):
        tr.batch(0).at(jnp.zeros((3, 1)))


def test_resample_refuses_times_outside_the_saved_span():
    """Resampling past the saved span held the end values and relabelled them as later saves,
    which then passed compare's range check: a theory to t = 4 "agreed" to 0.018 with the same
    curve to t = 8. Refused, naming the time and the span; float32 rounding of an end is inside."""
    t = np.linspace(0.0, 4.0, 81)
    theory = af.Trajectory(t, {"loss": np.exp(-t)})
    said = (
        r"^resample: time 4\.5 lies outside the saved span \[0, 4\]: a trajectory says nothing past its saves "
        r"\(traj\.at\(t\) holds the end values there, if that is what you want\)$"
    )
    with pytest.raises(ValueError, match=said):
        theory.resample(np.linspace(0.0, 8.0, 17))
    with pytest.raises(ValueError, match=r"^resample: time -0\.5 lies outside the saved span \[0, 4\]"):
        theory.resample(np.array([-0.5, 1.0]))
    inside = theory.resample(np.array([0.0, 2.0, 4.0]))
    np.testing.assert_allclose(inside["loss"], np.exp(-np.array([0.0, 2.0, 4.0])), rtol=1e-12)
    # each run against its own span
    runs = af.Trajectory(np.stack([t, t / 2]), {"loss": np.stack([np.exp(-t), np.exp(-t / 2)])})
    with pytest.raises(ValueError, match=r"^resample: time 3 lies outside the saved span \[0, 2\] of run \(1,\)"):
        runs.resample(np.array([[0.0, 3.0], [0.0, 3.0]]))
    # a float32 clock ending at 0.3 (0.30000001 in float32) reads a float64 theory to t = 0.3, as compare takes it
    t64 = np.linspace(0.0, 0.3, 31)
    short = af.Trajectory(t64, {"loss": np.exp(-t64)})
    t32 = np.linspace(0.0, 0.3, 4, dtype=np.float32)
    assert float(t32[-1]) > 0.3
    np.testing.assert_allclose(short.resample(t32)["loss"][-1], np.exp(-0.3), rtol=1e-12)
    with pytest.raises(ValueError, match=r"time 0\.300000012 lies outside"):
        short.resample(t32.astype(np.float64))  # a float64 clock gets float64 slack only


def test_to_xarray_and_pandas_rename_observables_named_like_their_own_columns():
    """An observable named t, time, t_event or like a batch axis overwrote (or clashed with) the
    time coordinate, the event times or the batch column: stored as <name>_value, as
    SweepResult.to_xarray stores a value named like an axis."""
    pytest.importorskip("xarray")
    t = np.linspace(0.0, 1.0, 5)
    for name in ("t", "time", "t_event", "seed"):
        tr = af.Trajectory(
            np.stack([t, 2 * t]), {name: np.stack([t**2, t**3]), "u": np.stack([t, t])}, t_event=np.array([0.5, 0.7])
        )
        ds = tr.to_xarray(batch_dims=["seed"])
        assert sorted(ds.data_vars) == sorted([f"{name}_value", "u", "t_event"])
        np.testing.assert_allclose(ds[f"{name}_value"].values, [t**2, t**3])
        np.testing.assert_allclose(ds["time"].values, [t, 2 * t])  # the runs' own times, untouched
        np.testing.assert_allclose(ds["t_event"].values, [0.5, 0.7])
        df = tr.to_pandas()
        column = f"{name}_value" if name != "seed" else "seed"  # pandas' batch column is batch0
        assert list(df.columns) == ["batch0", "t", column, "u"]
        np.testing.assert_allclose(df["t"], np.concatenate([t, 2 * t]))
        np.testing.assert_allclose(df[column], np.concatenate([t**2, t**3]))
    shared = af.Trajectory(t, {"t": t**2, "t_value": -t, "batch0": np.stack([t, -t], -1)})
    ds = shared.to_xarray()
    assert sorted(ds.data_vars) == ["batch0", "t_value", "t_value_value"] and ds["batch0"].dims == ("t", "batch0_dim0")
    np.testing.assert_allclose(ds["t"].values, t)
    np.testing.assert_allclose(ds["t_value_value"].values, t**2)
    np.testing.assert_allclose(ds["t_value"].values, -t)
    batched = af.Trajectory(np.stack([t, t]), {"batch0": np.stack([t, -t])})
    assert list(batched.to_pandas().columns) == ["batch0", "t", "batch0_value"]


def test_trajectory_bad_input():
    with pytest.raises(ValueError, match="'y'"):
        af.Trajectory(jnp.arange(3.0), {"y": jnp.ones(4)})
    with pytest.raises(ValueError, match="mapping"):
        af.Trajectory(jnp.arange(3.0), [1, 2, 3])
    with pytest.raises(KeyError, match="no observable 'z'"):
        af.Trajectory(jnp.arange(3.0), {"y": jnp.ones(3)})["z"]
    with pytest.raises(FileNotFoundError):
        af.Trajectory.load("/nonexistent/x.npz")


def test_compare_theory_vs_simulation_grid():
    ts = jnp.linspace(0, 2, 201)
    theory = af.Trajectory(ts, {"u": jnp.sin(ts)})
    sim = af.Trajectory(jnp.array([0.3, 1.1, 1.7]), {"u": jnp.sin(jnp.array([0.3, 1.1, 1.7])) + 1e-3})
    err = af.compare(theory, sim)
    assert err["u"] == pytest.approx(1e-3, abs=2e-5)


def test_mean_and_std_over_batch_axes():
    ts = jnp.linspace(0, 1, 5)
    u = jnp.arange(30.0).reshape(3, 2, 5)
    t_event = jnp.arange(6.0).reshape(3, 2)
    tr = af.Trajectory(jnp.broadcast_to(ts, (3, 2, 5)), {"u": u, "v": jnp.ones((3, 2, 5, 4))}, t_event=t_event)
    m = tr.mean()
    assert m.batch_shape == () and float(m.t_event) == 2.5 and m.meta["reduced"] == "mean"
    np.testing.assert_allclose(tr.mean(0).t_event, [2.0, 3.0])  # event times averaged over seeds too
    np.testing.assert_allclose(tr.std(1, ddof=1).t_event, np.full(3, np.sqrt(0.5)))
    missed = af.Trajectory(tr.ts, tr.ys, t_event=t_event.at[0, 0].set(jnp.nan)).mean(1).t_event
    assert np.isnan(missed[0]) and float(missed[1]) == 2.5  # an event that did not fire: NaN group
    np.testing.assert_allclose(m["u"], u.mean(axis=(0, 1)))
    np.testing.assert_allclose(tr.mean(-1)["u"], u.mean(axis=1))
    np.testing.assert_allclose(tr.std(0)["u"], u.std(axis=0))
    assert tr.std(axis=(0, 1))["v"].shape == (5, 4)
    with pytest.raises(ValueError, match="different save times"):
        af.Trajectory(jnp.stack([ts, 2 * ts]), {"u": jnp.zeros((2, 5))}).mean()
    with pytest.raises(ValueError, match=r"axis must be batch axes in \[-2, 2\), got 3"):
        tr.mean(3)
    with pytest.raises(ValueError, match="no batch axes"):
        m.mean()


def test_failed_runs_keep_the_others_mean_and_std_takes_ddof():
    ts = jnp.linspace(0, 1, 4)
    good = jnp.stack([ts, 3 * ts])  # two seeds of a run that finished
    bad = jnp.full((2, 4), jnp.nan)  # two seeds of a failed sweep point (NaN-filled, times too)
    tr = af.Trajectory(jnp.stack([jnp.stack([ts, ts]), bad]), {"u": jnp.stack([good, bad])})
    m = tr.mean(axis=1)
    np.testing.assert_allclose(m.ts[0], ts)
    np.testing.assert_allclose(m["u"][0], 2 * ts)
    assert bool(jnp.all(jnp.isnan(m.ts[1]))) and bool(jnp.all(jnp.isnan(m["u"][1])))
    np.testing.assert_allclose(tr.std(axis=1)["u"][0], ts)  # spread of [t, 3t]: t
    np.testing.assert_allclose(tr.std(axis=1, ddof=1)["u"][0], np.sqrt(2) * ts)
    with pytest.raises(ValueError, match="ddof must be an integer >= 0, got -1"):
        tr.std(ddof=-1)
    with pytest.raises(ValueError, match=r"ddof = 2 needs more than 2 runs, got 2"):
        tr.std(axis=1, ddof=2)
    one = tr.batch((1, 0))  # one failed run on its own, and every axis reduced at once
    assert one.batch_shape == () and bool(jnp.all(jnp.isnan(one.ts)))
    assert bool(jnp.all(jnp.isnan(tr.mean().ts))) and bool(jnp.all(jnp.isnan(tr.mean()["u"])))
    with pytest.raises(ValueError, match=r"ts must be finite; entry \(1,\) is nan"):
        af.Trajectory(jnp.array([0.0, jnp.nan, 1.0]), {"u": jnp.zeros(3)})  # NaN inside a run that has times


def test_compare_log_time_names_and_span():
    ts = jnp.linspace(0, 2, 201)  # every save grid starts at t = 0
    theory = af.Trajectory(ts, {"u": jnp.sin(ts), "v": ts})
    t_sim = jnp.array([0.0, 0.5, 1.0, 2.0])
    sim = af.Trajectory(t_sim, {"u": jnp.sin(t_sim) + 1e-3, "v": t_sim})
    err = af.compare(theory, sim, log_time=True)
    assert np.isfinite(err["u"]) and err["u"] == pytest.approx(1e-3, abs=3e-5)
    assert set(af.compare(theory, sim, names="u")) == {"u"}  # one string is one name
    assert set(theory.at([0.5], "v")) == {"v"}
    with pytest.raises(ValueError, match=r"^compare: reference has no observable 'w'; it has \['u', 'v'\]$"):
        af.compare(theory, sim.with_ys(w=t_sim), names=["w"])
    # float32 grids that end at the same time up to rounding (dt * steps against linspace)
    t32 = jnp.linspace(0.0, 0.09, 4, dtype=jnp.float32)
    steps32 = jnp.arange(4, dtype=jnp.float32) * jnp.float32(0.03)
    assert np.asarray(steps32)[-1] != np.asarray(t32)[-1]  # they differ in the last bit
    assert np.asarray(t32)[-1] > np.asarray(steps32)[-1]
    assert af.compare(af.Trajectory(steps32, {"u": steps32}), af.Trajectory(t32, {"u": t32}))["u"] < 1e-6
    later = af.Trajectory(jnp.array([0.0, 3.0]), {"u": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"other is saved on \[0, 3\] but reference covers only \[0, 2\]"):
        af.compare(theory, later)


def test_compare_names_must_be_on_both_sides_and_a_sweep_result_is_refused():
    """Without names compare covers the shared observables (training records other extras than
    the theory); a name given explicitly must be on both sides, none shared is an error, and a
    SweepResult is refused pointing at res.values (it raised AttributeError 'names')."""
    t = np.linspace(0.0, 4.0, 41)
    theory = af.Trajectory(t, {"u": 1 - np.exp(-t), "loss": np.exp(-2 * t)})
    sim = af.Trajectory(t, {"u": 1.01 - np.exp(-t), "population_loss": np.exp(-2 * t) + 0.5})
    assert af.compare(theory, sim) == {"u": pytest.approx(0.01, abs=1e-12)}  # shared only
    with pytest.raises(
        ValueError, match=r"^compare: other has no observable 'loss'; it has \['population_loss', 'u'\]$"
    ):
        af.compare(theory, sim, "loss")
    assert af.compare(theory, sim.rename(loss="population_loss"), "loss") == {"loss": pytest.approx(0.5, abs=1e-12)}
    said = (
        r"^compare: no common observables: reference has \['loss', 'u'\], other has \['population_loss'\]; "
        r"rename one side's \(traj.rename\(loss='population_loss'\)\) or compare other quantities$"
    )
    with pytest.raises(ValueError, match=said):
        af.compare(theory, sim.select("population_loss"))
    with pytest.raises(ValueError, match=r"^compare: names is empty"):
        af.compare(theory, sim, [])
    res = af.sweep(
        lambda seed: af.Trajectory(jnp.asarray(t), {"u": 1 - jnp.exp(-jnp.asarray(t)) + 0.01 * seed}),
        {"seed": np.arange(3)},
        progress=False,
    )
    said = (
        r"^compare: other is a SweepResult over \('seed',\); pass its trajectories, res.values \(batch shape "
        r"\(3,\), one run per grid point\), or one point, res.sel\(seed=\.\.\.\)$"
    )
    with pytest.raises(ValueError, match=said):
        af.compare(theory, res)
    with pytest.raises(ValueError, match=r"^compare: reference is a SweepResult over \('seed',\)"):
        af.compare(res, theory)
    np.testing.assert_allclose(af.compare(theory, res.values, "u", per_run=True)["u"], [0.0, 0.01, 0.02], atol=1e-12)


def test_compare_batched_runs_against_one_reference_or_run_by_run():
    ts = jnp.linspace(0, 2, 201)
    theory = af.Trajectory(ts, {"u": jnp.sin(ts)})
    t_sim = jnp.array([[0.3, 1.1, 1.7], [0.2, 0.9, 1.9]])  # two runs on their own grids, offsets 1e-3 and 4e-3
    sim = af.Trajectory(t_sim, {"u": jnp.sin(t_sim) + jnp.array([[1e-3], [4e-3]])})
    np.testing.assert_allclose(af.compare(theory, sim, per_run=True)["u"], [1e-3, 4e-3], atol=3e-5)
    assert af.compare(theory, sim)["u"] == pytest.approx(4e-3, abs=3e-5)  # the max over runs
    assert af.compare(theory, sim.batch(0))["u"] == pytest.approx(1e-3, abs=3e-5)
    # a reference with the same batch shape is paired run by run
    theories = af.Trajectory(jnp.stack([ts, ts]), {"u": jnp.stack([jnp.sin(ts), jnp.sin(ts) + 4e-3])})
    np.testing.assert_allclose(af.compare(theories, sim, per_run=True)["u"], [1e-3, 0.0], atol=3e-5)
    with pytest.raises(ValueError, match=r"reference has batch shape \(2,\) and other \(3,\)"):
        af.compare(theories, af.Trajectory(jnp.stack([ts] * 3), {"u": jnp.zeros((3, 201))}))
    # a theory per rate against runs per rate and seed: each curve with the seeds of its rate
    seeds = af.Trajectory(jnp.stack([t_sim] * 3, 1), {"u": jnp.sin(jnp.stack([t_sim] * 3, 1)) + 1e-3})  # (2, 3, T)
    gaps = af.compare(theories, seeds, per_run=True)["u"]
    assert gaps.shape == (2, 3)
    np.testing.assert_allclose(gaps, [[1e-3] * 3, [3e-3] * 3], atol=3e-5)
    with pytest.raises(ValueError, match=r"batch axes lead other's"):
        af.compare(theories, af.Trajectory(jnp.stack([jnp.stack([ts] * 2)] * 3), {"u": jnp.zeros((3, 2, 201))}))


# ----------------------------------------------------------------------------- integrate
def test_integrate_log_spacing_and_pytree_state():
    y0 = {"a": jnp.full(4, 0.03), "b": jnp.full(4, 0.03)}
    from attnflow.deeplinear import factor_field

    tr = af.integrate(
        factor_field,
        y0,
        10.0,
        args={"s": S, "tau": 1.0},
        save=af.LogGrid(50),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-13),
    )
    assert tr.names == ("a", "b") and tr.ts[0] == 0 and tr.ts[-1] == 10.0
    assert np.all(np.diff(np.log(np.asarray(tr.ts[1:]))) == pytest.approx(np.log(1e6) / 48))
    # balanced factors: u = a b follows the closed form with u0 = 0.03^2
    np.testing.assert_allclose(tr["a"] * tr["b"], mode_strength(tr.ts[:, None], S, 0.03**2), rtol=1e-8)


def test_integrate_event_terminates_at_threshold():
    tr = af.integrate(
        mode_field,
        jnp.full(4, 1e-3),
        50.0,
        args={"s": S, "tau": 1.0},
        save=af.LinearGrid(100),
        event=lambda t, u, a: u[3] - 0.25,
        solver=af.SolverOptions(rtol=1e-10, atol=1e-13),
    )
    # closed form: u(t*) = s/2 at t* = log(s/u0 - 1) / (2 s) for s = 0.5
    t_star = np.log(0.5 / 1e-3 - 1) / (2 * 0.5)
    assert float(tr.ts[-1]) == pytest.approx(t_star, rel=1e-8)
    assert float(tr.t_event) == pytest.approx(t_star, rel=1e-8)
    assert float(tr.final()["y"][3]) == pytest.approx(0.25, rel=1e-8)
    assert np.all(np.diff(np.asarray(tr.ts)) >= 0)


def test_unrolled_tsit5_equals_diffrax_tsit5():
    import diffrax

    from attnflow.deeplinear import factor_field

    y0 = {"a": jnp.full(4, 0.03), "b": jnp.full(4, 0.02)}
    kw = dict(args={"s": S, "tau": 2.0}, save=af.LogGrid(60))
    ours = af.integrate(factor_field, y0, 40.0, solver=af.SolverOptions(rtol=1e-9, atol=1e-12), **kw)
    ref = af.integrate(factor_field, y0, 40.0, solver=af.SolverOptions(diffrax.Tsit5(), rtol=1e-9, atol=1e-12), **kw)
    for k in ("a", "b"):  # same tableau, steps and dense output: equal to round-off
        np.testing.assert_allclose(ours[k], ref[k], rtol=1e-12, atol=1e-15)

    # same accepted/rejected steps, and the FSAL state survives a jump (jump_ts)
    def steps(solver, **extra):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(mode_field),
            solver,
            0.0,
            30.0,
            None,
            jnp.full(4, 1e-3),
            {"s": S, "tau": 1.0},
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10, **extra),
        )
        return sol.ys[-1], int(sol.stats["num_steps"]), int(sol.stats["num_rejected_steps"])

    for extra in ({}, {"jump_ts": jnp.array([3.3, 7.1])}):
        (ya, na, ra), (yb, nb, rb) = steps(af.UnrolledTsit5(), **extra), steps(diffrax.Tsit5(), **extra)
        assert (na, ra) == (nb, rb)
        np.testing.assert_allclose(ya, yb, rtol=1e-12)
        np.testing.assert_allclose(ya, mode_strength(30.0, S, 1e-3), rtol=1e-7)

    # the default: unrolled for a small field, Diffrax's rolled stage loop for a large one
    assert ours.meta["integrator"] == "UnrolledTsit5"

    def big_field(t, y, a):
        for _ in range(af.ode.UNROLL_MAX_PRIMITIVES):
            y = y * 1.0
        return -y

    big = af.integrate(big_field, jnp.ones(2), 1.0, save=af.LinearGrid(2))
    assert big.meta["integrator"] == "Tsit5"
    np.testing.assert_allclose(big["y"][-1], np.exp(-1.0) * np.ones(2), rtol=1e-7)

    # reverse-mode through the unrolled stages
    check_grads(
        lambda u0: af.integrate(
            mode_field,
            jnp.full(4, u0),
            2.0,
            args={"s": S, "tau": 1.0},
            save=af.LinearGrid(2),
            solver=af.SolverOptions(rtol=1e-11, atol=1e-14),
        )["y"][-1],
        (1e-2,),
        order=1,
        modes=["rev"],
        eps=1e-7,
    )


def test_integrate_records_solver_statistics_per_solve(tmp_path):
    """Trajectory.stats holds Diffrax's step counts: per grid point under a sweep, indexed by
    batch, kept by select/with_ys/resample, saved and loaded; a wrong shape is refused."""

    def relax(t, y, lam):
        return -lam * (y - jnp.cos(t))

    res = af.sweep(
        lambda lam: af.integrate(relax, jnp.zeros(1), 5.0, args=lam, save=af.LinearGrid(5)),
        {"lam": np.array([1.0, 100.0, 1000.0])},
        progress=False,
    )
    tr = res.values
    n = np.asarray(tr.stats["num_steps"])
    assert n.shape == (3,) and np.all(n == tr.stats["num_accepted_steps"] + tr.stats["num_rejected_steps"])
    assert n[0] < n[1] < n[2] and n[2] > 1000  # Tsit5 is held at its stability limit, h ~ 3 / lam
    one = tr.batch(2)
    assert int(one.stats["num_steps"]) == n[2]
    assert int(one.select("y").with_ys(z=one["y"]).resample(jnp.linspace(0, 5, 3)).stats["num_steps"]) == n[2]
    back = af.Trajectory.load(one.save(tmp_path / "relax.npz"))
    assert {k: int(v) for k, v in back.stats.items()} == {k: int(v) for k, v in one.stats.items()}
    with pytest.raises(ValueError, match=r"stats\['num_steps'\] must have the batch shape \(\)"):
        af.Trajectory(one.ts, one.ys, stats={"num_steps": jnp.ones(2)})


def test_integrate_endpoint_saves_match_the_save_loop():
    # LinearGrid(2) saves t0 and t1 outside the step loop; it must equal TimeGrid([t0, t1])
    kw = dict(args={"s": S, "tau": 1.0}, solver=af.SolverOptions(rtol=1e-10, atol=1e-13))
    a = af.integrate(mode_field, jnp.full(4, 1e-3), 20.0, save=af.LinearGrid(2), **kw)
    b = af.integrate(mode_field, jnp.full(4, 1e-3), 20.0, save=af.TimeGrid(jnp.array([0.0, 20.0])), **kw)
    np.testing.assert_array_equal(a.ts, b.ts)
    np.testing.assert_allclose(a["y"], b["y"], rtol=1e-14)
    # with an event the last save is the event time
    e = af.integrate(
        mode_field, jnp.full(4, 1e-3), 50.0, save=af.LinearGrid(2), event=lambda t, u, a: u[3] - 0.25, **kw
    )
    assert float(e.ts[-1]) == pytest.approx(np.log(0.5 / 1e-3 - 1) / (2 * 0.5), rel=1e-8)


def test_integrate_max_steps_error_names_time():
    with pytest.raises(
        af.MaxStepsError, match=r"max_steps=7 reached at t = [0-9.e-]+ before t1 = 100.*Increase max_steps"
    ):
        af.integrate(
            mode_field, jnp.full(4, 1e-3), 100.0, args={"s": S, "tau": 1.0}, solver=af.SolverOptions(max_steps=7)
        )


def test_integrate_divergence_is_an_error():
    import diffrax

    euler = af.SolverOptions(diffrax.Euler(), dt0=0.1, stepsize_controller=diffrax.ConstantStepSize(), max_steps=100)
    fixed = af.integrate(lambda t, y, a: -y, jnp.ones(1), 1.0, solver=euler)
    assert fixed.meta["controller"] == "ConstantStepSize" and "rtol" not in fixed.meta  # tolerances unused
    # fixed steps: the NaN propagates and is reported with its time
    with pytest.raises(af.DivergenceError, match="non-finite at t = "):
        af.integrate(lambda t, y, a: y**2, jnp.ones(1), 3.0, save=af.LinearGrid(31), solver=euler)
    # adaptive: blow-up at t = 1 stalls the controller; the error says so
    with pytest.raises((af.MaxStepsError, af.DivergenceError), match="t = 1"):
        af.integrate(lambda t, y, a: y**2, jnp.ones(1), 3.0, solver=af.SolverOptions(max_steps=2000))
    # with the default max_steps the controller's dtmin (1e-12 of the span) stops the blow-up,
    # and a field non-finite from the start (a learning rate of 1e308), after a few rejected
    # steps rather than max_steps of them
    with pytest.raises(
        af.MaxStepsError,
        match=r"step size fell below the floor SolverOptions.dtmin \(default 1e-12 \(t1 - t0\)\) "
        r"at t = 1 before t1 = 3",
    ):
        af.integrate(lambda t, y, a: y**2, jnp.ones(1), 3.0)
    with pytest.raises(af.DivergenceError, match="non-finite at t = 0 "):
        af.integrate(lambda t, y, a: y * jnp.inf, jnp.ones(1), 3.0)
    # inside jit the failure still stops the program
    with pytest.raises(Exception, match="non-finite|solver failed"):
        jax.jit(lambda y: af.integrate(lambda t, y, a: y**2, y, 3.0, solver=euler)["y"])(
            jnp.ones(1)
        ).block_until_ready()


def test_integrate_bad_input():
    f = lambda t, y, a: -y
    with pytest.raises(ValueError, match="y0.*finite.*nan"):
        af.integrate(f, jnp.array([1.0, jnp.nan]), 1.0)
    with pytest.raises(ValueError, match="t1 must be greater"):
        af.integrate(f, jnp.ones(2), -1.0)
    with pytest.raises(ValueError, match="rtol.*-1"):
        af.SolverOptions(rtol=-1.0)
    with pytest.raises(ValueError, match="max_steps"):
        af.SolverOptions(max_steps=0)
    with pytest.raises(ValueError, match="save must be a SaveGrid"):
        af.integrate(f, jnp.ones(2), 1.0, save="log")
    with pytest.raises(ValueError, match="solver must be SolverOptions"):
        af.integrate(f, jnp.ones(2), 1.0, solver=1e-6)
    with pytest.raises(ValueError, match=r"save times must lie in \[t0, t1\]"):
        af.integrate(f, jnp.ones(2), 1.0, save=af.TimeGrid([0.0, 2.0]))
    with pytest.raises(ValueError, match="observable 'bad' must be an array"):
        af.integrate(f, jnp.ones(2), 1.0, observe=lambda t, y, a: {"bad": "text"})
    with pytest.raises(ValueError, match="does not match the state"):
        af.integrate(lambda t, y, a: jnp.ones(3), jnp.ones(2), 1.0)


def test_integrate_requires_x64_or_explicit_dtype():
    with jax.enable_x64(False):
        with pytest.raises(RuntimeError, match="enable_x64"):
            af.integrate(lambda t, y, a: -y, jnp.ones(2), 1.0)
        tr = af.integrate(
            lambda t, y, a: -y, jnp.ones(2), 1.0, dtype=jnp.float32, solver=af.SolverOptions(rtol=1e-5, atol=1e-7)
        )
        assert tr["y"].dtype == jnp.float32
        assert float(tr["y"][-1, 0]) == pytest.approx(np.exp(-1), rel=1e-4)


def test_integrate_gradient_through_solution():
    # d u(T)/d u0 of the closed form vs autodiff through the solver
    def uT(u0):
        return af.integrate(
            mode_field,
            jnp.full(4, u0),
            2.0,
            args={"s": S, "tau": 1.0},
            save=af.LinearGrid(2),
            solver=af.SolverOptions(rtol=1e-11, atol=1e-14),
        )["y"][-1, 0]

    g = jax.grad(uT)(1e-2)
    g_exact = jax.grad(lambda u0: mode_strength(2.0, S, u0)[0])(1e-2)
    assert float(g) == pytest.approx(float(g_exact), rel=1e-6)


# ----------------------------------------------------------------------------- simulate
def _linear_problem():
    teacher = Teacher(S, 8, 6, key=0)
    model = TwoLayerLinear.random(1, 8, 4, 6, scale=0.1)
    return teacher, model


def test_simulate_online_sgd_tracks_population_loss():
    teacher, model = _linear_problem()
    loss = lambda m, batch: 0.5 * jnp.mean(jnp.sum((m(batch[0]) - batch[1]) ** 2, axis=1))
    observe = lambda m: {"loss": population_loss(m.W1, m.W2, teacher.A)}
    tr = af.simulate(
        loss, model, optax.sgd(0.01), 3000, mode=af.OnlineSGD(teacher.sample, 64), key=0, observe=observe, clock=0.01
    )
    gd = af.simulate(lambda m, _: population_loss(m.W1, m.W2, teacher.A), model, optax.sgd(0.01), 3000, clock=0.01)
    # same clock, same save steps; SGD noise is small at batch 64 (measured: < 2% while loss > 1e-2)
    np.testing.assert_array_equal(tr.ts, gd.ts)
    assert float(tr["loss"][-1]) < 1e-8 * float(tr["loss"][0])
    big = gd["loss"] > 1e-2
    rel = jnp.max(jnp.abs(tr["loss"] - gd["loss"])[big] / gd["loss"][big])
    assert rel < 0.05, rel


def test_simulate_minibatch_and_seeds_vmap():
    teacher, model = _linear_problem()
    x = jax.random.normal(jax.random.PRNGKey(5), (512, 8))
    data = (x, x @ teacher.A.T)
    loss = lambda m, batch: 0.5 * jnp.mean(jnp.sum((m(batch[0]) - batch[1]) ** 2, axis=1))
    run = lambda seed: af.simulate(
        loss,
        model,
        optax.sgd(0.02),
        500,
        mode=af.Minibatch(data, 32),
        key=seed,
        observe=lambda m: {"loss": loss(m, data)},
        save=af.LogGrid(10),
    )["loss"]
    many = jax.jit(jax.vmap(run))(jnp.arange(3))
    assert many.shape[0] == 3
    np.testing.assert_allclose(many[1], run(1), rtol=1e-10)
    assert not np.allclose(many[0], many[1])  # different seeds, different batches
    assert bool(jnp.all(many[:, -1] < 0.05 * many[:, 0]))
    # a NumPy dataset trains alike; NaN data is refused, naming the entry, before any step
    as_numpy = af.simulate(
        loss,
        model,
        optax.sgd(0.02),
        500,
        mode=af.Minibatch(tuple(map(np.asarray, data)), 32),
        key=1,
        observe=lambda m: {"loss": loss(m, data)},
        save=af.LogGrid(10),
    )["loss"]
    np.testing.assert_allclose(as_numpy, many[1], rtol=1e-10)
    bad = np.asarray(x).copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"dataset\[0\] must be finite; entry \(3, 2\) is nan"):
        af.Minibatch((bad, data[1]), 32)
    with pytest.raises(ValueError, match=r"data\[0\] must be finite; entry \(3, 2\) is nan"):
        af.FullBatch((bad, data[1]))


def test_simulate_save_steps_are_log_spaced_and_exact():
    s = af.LogGrid(30).steps(10_000)
    assert s[0] == 0 and s[-1] == 10_000 and np.all(np.diff(s) > 0)
    teacher, model = _linear_problem()
    loss = lambda m, _: population_loss(m.W1, m.W2, teacher.A)
    tr = af.simulate(loss, model, optax.sgd(0.01), 10_000, save=af.LogGrid(30), clock=0.01)
    np.testing.assert_allclose(tr.ts, 0.01 * s)
    # explicit steps must be whole numbers in [0, steps], named when not
    with pytest.raises(ValueError, match="whole numbers; entry 1 is 2.7"):
        af.simulate(loss, model, optax.sgd(0.01), 10, save=af.TimeGrid([0, 2.7, 10]))
    with pytest.raises(ValueError, match=r"in \[0, 10\]"):
        af.simulate(loss, model, optax.sgd(0.01), 10, save=af.TimeGrid([0, 11]))


def test_simulate_divergence_names_step():
    teacher, model = _linear_problem()
    loss = lambda m, _: population_loss(m.W1, m.W2, teacher.A)
    with pytest.raises(af.DivergenceError, match=r"at step \d+ \(t = "):
        af.simulate(loss, model, optax.sgd(5.0), 200)


def test_simulate_bad_input():
    teacher, model = _linear_problem()
    loss = lambda m, _: population_loss(m.W1, m.W2, teacher.A)
    with pytest.raises(ValueError, match="steps"):
        af.simulate(loss, model, optax.sgd(0.1), 0)
    with pytest.raises(ValueError, match="optimizer"):
        af.simulate(loss, model, "sgd", 10)
    with pytest.raises(ValueError, match="observe"):
        af.simulate(loss, model, optax.sgd(0.1), 10, mode=af.OnlineSGD(teacher.sample, 4))
    with pytest.raises(ValueError, match="batch_size"):
        af.OnlineSGD(teacher.sample, 0)
    with pytest.raises(ValueError, match="clock"):
        af.simulate(loss, model, optax.sgd(0.1), 10, clock=-1.0)


# ----------------------------------------------------------------------------- per-circuit
def test_per_circuit_rates_vmap_compiles_once():
    teacher, model = _linear_problem()
    labels = af.label_by_path(model, {"W1": "in", "W2": "out"})
    assert labels.W1 == "in" and labels.W2 == "out"
    loss = lambda m, _: population_loss(m.W1, m.W2, teacher.A)
    traces = []

    def run(ratio):
        traces.append(1)
        opt = af.per_circuit(labels, {"in": 0.01 * ratio, "out": 0.01})
        return af.simulate(loss, model, opt, 100, save=af.LogGrid(5), observe=lambda m: {"W1": m.W1, "W2": m.W2})

    out = jax.jit(jax.vmap(run))(jnp.array([0.5, 1.0, 2.0]))
    assert len(traces) == 1
    with pytest.raises(ValueError, match=r"rates names circuit\(s\) \['ot'\] that no parameter has"):
        af.per_circuit(labels, {"in": 0.01, "out": 0.01, "ot": 0.02})  # a typo
    af.per_circuit(labels, {"in": 0.01, "out": 0.01, "ot": 0.02}, allow_unused=True)
    # one step by hand: W1 moves with eta_in, W2 with eta_out
    g = jax.grad(lambda m: loss(m, None))(model)
    single = af.simulate(
        loss,
        model,
        af.per_circuit(labels, {"in": 0.02, "out": 0.01}),
        1,
        save=af.LinearGrid(2),
        observe=lambda m: {"W1": m.W1, "W2": m.W2},
    )
    np.testing.assert_allclose(single["W1"][-1], model.W1 - 0.02 * g.W1, rtol=1e-12)
    np.testing.assert_allclose(single["W2"][-1], model.W2 - 0.01 * g.W2, rtol=1e-12)
    np.testing.assert_allclose(
        out["W1"][2, -1],
        af.simulate(
            loss,
            model,
            af.per_circuit(labels, {"in": 0.02, "out": 0.01}),
            100,
            save=af.LogGrid(5),
            observe=lambda m: {"W1": m.W1},
        )["W1"][-1],
        rtol=1e-12,
    )
    # None freezes a circuit
    frozen = af.simulate(
        loss,
        model,
        af.per_circuit(labels, {"in": None, "out": 0.01}),
        3,
        save=af.LinearGrid(2),
        observe=lambda m: {"W1": m.W1, "W2": m.W2},
    )
    np.testing.assert_array_equal(frozen["W1"][-1], model.W1)
    assert not np.allclose(frozen["W2"][-1], model.W2)


def test_per_circuit_bad_input():
    _, model = _linear_problem()
    labels = af.label_by_path(model, {"W1": "qk", "W2": "ov"})
    with pytest.raises(ValueError, match="circuit 'qk'.*-0.1"):
        af.per_circuit(labels, {"qk": -0.1, "ov": 0.1})
    with pytest.raises(ValueError, match=r"no learning rate.*\['ov'\]"):
        af.per_circuit(labels, {"qk": 0.1})
    with pytest.raises(ValueError, match="matches none"):
        af.label_by_path(model, {"W1": "qk"})
    with pytest.raises(ValueError, match=r"'.W1' matches the circuit keys \['W', 'W1'\] with different labels"):
        af.label_by_path(model, {"W": "all", "W1": "first"})
    same = af.label_by_path(model, {"W": "all", "W1": "all"})  # overlapping keys of one label are fine
    assert set(jax.tree_util.tree_leaves(same)) == {"all"}


# ----------------------------------------------------------------------------- expectations
def test_gaussian_bank_moments_and_antithetic():
    bank = af.GaussianBank(0, 2**14, 3)
    mean = jnp.array([0.5, -1.0, 2.0])
    A = jnp.array([[1.0, 0.3, 0.0], [0.3, 2.0, -0.4], [0.0, -0.4, 0.5]])
    # odd moments of z vanish exactly with antithetic pairs
    assert float(jnp.max(jnp.abs(bank.expect(lambda x: x, cov=A)))) < 1e-15
    m = bank.expect(lambda x: x, mean=mean, cov=A)
    np.testing.assert_allclose(m, mean, atol=1e-14)
    c = bank.expect(lambda x: jnp.outer(x - mean, x - mean), mean=mean, cov=A)
    se = bank.stderr(lambda x: jnp.outer(x - mean, x - mean), mean=mean, cov=A)
    assert float(jnp.max(jnp.abs(c - A) / se)) < 5.0
    # E exp(a.x) = exp(a.mu + a^T A a / 2) within Monte Carlo error
    a = jnp.array([0.2, -0.1, 0.3])
    val = bank.expect(lambda x: jnp.exp(a @ x), mean=mean, cov=A)
    err = bank.stderr(lambda x: jnp.exp(a @ x), mean=mean, cov=A)
    exact = jnp.exp(a @ mean + 0.5 * a @ A @ a)
    assert abs(float(val - exact)) < 4 * float(err)
    with pytest.raises(ValueError, match="even"):
        af.GaussianBank(0, 7, 2)


def test_gauss_hermite_exact_for_closed_forms():
    mean = jnp.array([0.5, -1.0])
    A = jnp.array([[1.0, 0.3], [0.3, 0.5]])
    a = jnp.array([0.4, -0.7])
    val = af.gauss_hermite(lambda x: jnp.exp(a @ x), 30, mean, A)
    assert float(val) == pytest.approx(float(jnp.exp(a @ mean + 0.5 * a @ A @ a)), rel=1e-12)
    # fourth moment of a scalar Gaussian: 3 sigma^4, exact with 3 nodes; a scalar mean gives f a scalar
    fourth = af.gauss_hermite(lambda x: x**4, 3, 0.0, 2.0)
    assert fourth.shape == () and float(fourth) == pytest.approx(12.0, rel=1e-13)
    # the same variable as a vector of one: f gets shape (1,), the result keeps it
    assert af.gauss_hermite(lambda x: x**4, 3, jnp.zeros(1), 2.0 * jnp.eye(1)).shape == (1,)
    # E[sigmoid-like] of N(0,1) symmetric function identity: E tanh(x) = 0
    assert abs(float(af.gauss_hermite(jnp.tanh, 40, 0.0, 1.0))) < 1e-15
    with pytest.raises(ValueError, match="cov of a scalar mean must be a variance"):
        af.gauss_hermite(jnp.tanh, 5, 0.0, jnp.ones(3))
    with pytest.raises(ValueError, match="cov must have shape"):
        af.gauss_hermite(lambda x: x, 5, jnp.zeros(2), jnp.eye(3))


def test_psd_sqrt_value_and_grads():
    key = jax.random.PRNGKey(0)
    B = jax.random.normal(key, (4, 4))
    P = B @ B.T + 0.5 * jnp.eye(4)
    R = af.psd_sqrt(P)
    np.testing.assert_allclose(R @ R, P, atol=1e-12)
    np.testing.assert_allclose(R, R.T, atol=1e-14)
    check_grads(af.psd_sqrt, (P,), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    # degenerate eigenvalues: the JVP stays finite (autodiff through eigh would be NaN)
    J = jax.jacfwd(af.psd_sqrt)(jnp.eye(3))
    assert bool(jnp.all(jnp.isfinite(J)))
    dP = jnp.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    _, dR = jax.jvp(af.psd_sqrt, (jnp.eye(3),), (dP,))
    np.testing.assert_allclose(dR, dP / 2, atol=1e-14)  # sqrt(I + e dP) = I + e dP / 2 + O(e^2)
    # a singular P (rank one, as at coinciding keys): eigh returns its zeros as +-1e-18, which
    # count as zeros; the derivative along the null space is the zero of the exact case
    v = jnp.ones(4) / 2
    u = jnp.array([1.0, -1.0, 1.0, -1.0]) / 2
    for c in (0.0321, 0.05):
        _, dS = jax.jvp(af.psd_sqrt, (c * 4 * jnp.outer(v, v),), (jnp.outer(u, u),))
        np.testing.assert_allclose(dS, 0.0, atol=1e-12)
    exact = jnp.diag(jnp.array([0.3, 0.0, 0.0]))
    _, dS = jax.jvp(af.psd_sqrt, (exact,), (jnp.diag(jnp.array([0.0, 1.0, 0.0])),))
    np.testing.assert_allclose(dS, 0.0, atol=1e-15)
    # in float32 eigh's zeros are +-1e-8: n eps of the largest count as zero (was |dS| ~ 2e3)
    for c in (0.0321, 0.05, 0.3):
        P32 = (c * 4 * jnp.outer(v, v)).astype(jnp.float32)
        _, dS = jax.jvp(af.psd_sqrt, (P32,), (jnp.outer(u, u).astype(jnp.float32),))
        assert dS.dtype == jnp.float32 and float(jnp.max(jnp.abs(dS))) < 1e-5


# ----------------------------------------------------------------------------- plot
def test_overlay_figure(tmp_path):
    ts = jnp.linspace(0, 1, 20)
    theory = af.Trajectory(ts, {"u": jnp.stack([ts, ts**2], 1), "loss": jnp.exp(-ts)})
    sims = jax.vmap(
        lambda c: af.Trajectory(ts[::4], {"u": c * jnp.stack([ts, ts**2], 1)[::4], "loss": jnp.exp(-ts[::4])})
    )(jnp.array([0.9, 1.1]))
    fig = af.overlay(theory, sims, ["u", "loss"], log_y=("loss",), component_labels=["a", "b"])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2 and axes[0].get_xlabel() == "t" and axes[1].get_yscale() == "log"
    assert axes[0].get_ylabel() == "u"
    path = af.save_figure(fig, tmp_path / "f.png")
    assert path.stat().st_size > 5000
    single = [ax for ax in af.overlay(theory, sims, "loss").axes if ax.get_visible()]
    assert len(single) == 1 and single[0].get_ylabel() == "loss"  # one string is one name
    with pytest.raises(KeyError, match="no observable 'los'"):
        af.overlay(theory, sims, ["los"])
    with pytest.raises(KeyError, match=r"log_y names \['los'\], which are not among the panels \['u', 'loss'\]"):
        af.overlay(theory, sims, ["u", "loss"], log_y=("los",))  # was drawn on a linear axis
    with pytest.raises(ValueError, match=r"theory has batch shape \(2,\)"):
        af.overlay(sims, None, ["loss"])


def test_overlay_refuses_a_grid_of_runs_and_says_which_panel_has_no_simulation():
    """Runs over (rate, seed) as one batched trajectory were pooled into one band "of 6": refused
    as the SweepResult over them is, naming the batch shape and how to pick a point. A panel whose
    observable the simulation (or theory) lacks says so in its legend."""
    t = jnp.linspace(0.0, 4.0, 41)
    rates, seeds = jnp.array([0.5, 2.0]), jnp.arange(3.0)
    grid = af.Trajectory(
        jnp.broadcast_to(t, (2, 3, 41)), {"loss": jnp.exp(-rates[:, None, None] * t) * (1 + 0.01 * seeds[:, None])}
    )
    theory = af.Trajectory(t, {"loss": jnp.exp(-2.0 * t)})
    said = (
        r"^overlay: simulations has batch shape \(2, 3\), more than one batch axis \(a grid of parameters and "
        r"seeds\?\), and a band is drawn over one axis of seeds: pick a point with traj.batch\(i\) \(its runs "
        r"along the last axis\), or res.sel\(\.\.\.\) of its SweepResult, or draw the points side by side with "
        r"af.family$"
    )
    for sims in (grid, [grid], {"runs": grid}):
        with pytest.raises(ValueError, match=said):
            af.overlay(theory, sims)
    with pytest.raises(ValueError, match=r"batch shape \(1, 2, 3\).*traj.batch\(\(i, j\)\)"):
        af.overlay(theory, af.Trajectory(grid.ts[None], {"loss": grid["loss"][None]}))
    ax = next(x for x in af.overlay(theory, grid.batch(1)).axes if x.get_visible())  # the seeds of rate 2
    assert ax.get_legend_handles_labels()[1] == ["theory", "simulation (mean, min-max of 3)"]
    np.testing.assert_allclose(ax.lines[1].get_ydata()[-1], np.exp(-8.0) * 1.01, rtol=1e-6)
    # observables on one side only
    both = theory.with_ys(u=1 - jnp.exp(-t))
    sim = af.Trajectory(t, {"u": 1 - jnp.exp(-t), "population_loss": jnp.exp(-2 * t) + 0.5})
    fig = af.overlay(both, sim, ["u", "loss", "population_loss"])
    legends = [ax.get_legend_handles_labels()[1] for ax in fig.axes if ax.get_visible()]
    assert legends == [
        ["theory", "simulation"],
        ["theory", "simulation (no 'loss' recorded)"],
        ["theory (no 'population_loss' recorded)", "simulation"],
    ]


def test_overlay_draws_runs_on_other_clocks_one_by_one():
    """Runs saved at different times are not averaged index by index (that mixed ``a(8)`` with
    ``b(4)``): each is drawn at its own times; runs on one grid keep their band."""
    long, short = jnp.linspace(0, 8, 9), jnp.linspace(0, 4, 9)
    a, b = af.Trajectory(long, {"y": long}), af.Trajectory(short, {"y": 10 * short})
    ax = next(x for x in af.overlay(None, [a, b], "y").axes if x.get_visible())
    assert len(ax.lines) == 2 and "2 runs, own save times" in ax.get_legend_handles_labels()[1][0]
    np.testing.assert_allclose(ax.lines[0].get_xdata(), long)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), 10 * short)
    ax = next(x for x in af.overlay(None, [a, af.Trajectory(long, {"y": 3 * long})], "y").axes if x.get_visible())
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 2 * long)  # same grid: the mean
    assert "(mean, min-max of 2)" in ax.get_legend_handles_labels()[1][0]


def test_small_input_checks_name_the_value():
    # a whole float max_steps (1e5) is the int Diffrax needs; a fractional one is refused by name
    opts = af.SolverOptions(max_steps=1e3)
    assert opts.max_steps == 1000 and type(opts.max_steps) is int
    tr = af.integrate(lambda t, y, a: -y, 1.0, 1.0, save=af.LinearGrid(2), solver=opts)
    assert float(tr.final()["y"]) == pytest.approx(np.exp(-1.0), rel=1e-7)
    with pytest.raises(ValueError) as err:
        af.SolverOptions(max_steps=100.5)
    assert str(err.value) == "max_steps must be an integer >= 1, got 100.5"
    # the confidence level of fit_line / fit_power_law lies in (0, 1)
    for level in (1.5, 0.0, 1.0, float("nan")):
        for fit in (af.fit_line, af.fit_power_law):
            with pytest.raises(ValueError) as err:
                fit([1.0, 2.0, 4.0, 8.0], [1.0, 2.1, 3.9, 8.2], level=level)
            assert str(err.value) == f"level (the confidence of the interval) must be in (0, 1), got {level!r}"
    with pytest.raises(ValueError) as err:  # as fit_line says it, not NumPy's broadcast error
        af.fit_power_law([1.0, 2.0, 3.0], [1.0, 2.0])
    assert str(err.value) == "x and y must have the same number of points, got 3 and 2"
    # spectrum at a non-finite state, or where the field's Jacobian is not finite
    with pytest.raises(ValueError) as err:
        af.spectrum(lambda t, y, a: y - y**3, jnp.array([jnp.nan]), None)
    assert str(err.value) == "spectrum: y must be finite; entry (0,) is nan"
    with pytest.raises(ValueError) as err:
        af.spectrum(lambda t, y, a: jnp.sqrt(y), jnp.array([0.0, 1.0]), None)
    assert str(err.value) == "spectrum: the Jacobian of the field at y is not finite; entry (0, 0) is inf"
    # Trajectory metadata is JSON: an entry that is not is refused by key (not stored as its repr)
    tr = af.Trajectory(jnp.linspace(0.0, 1.0, 3), {"u": jnp.ones(3)}, {"seed": 1})
    with pytest.raises(ValueError) as err:
        tr.with_meta(config={"sizes": {1, 2}})
    assert str(err.value) == (
        "meta['config'] must be JSON-serialisable (numbers, strings, lists, dicts, arrays), got dict "
        "{'sizes': {1, 2}} (set is not JSON-serialisable)"
    )
    with pytest.raises(ValueError, match=r"^meta\['dtype'\] must be JSON-serialisable .* got _ScalarMeta"):
        af.Trajectory(tr.ts, tr.ys, {"dtype": jnp.float64})
    for value in (np.complex128(1 + 2j), np.datetime64("2020-01-01"), np.array([1j])):  # once stored as repr
        with pytest.raises(ValueError, match=r"^meta\['x'\] must be JSON-serialisable"):
            tr.with_meta(x=value)
    kept = tr.with_meta(sizes=np.arange(2), scale=np.float64(0.5), folder=Path("/tmp/run"))
    assert kept.meta == {"seed": 1, "sizes": [0, 1], "scale": 0.5, "folder": "/tmp/run"}


def test_integrate_refuses_complex_states_naming_the_leaf():
    split = (
        "attnflow integrates real states (its error norms and checks are for real numbers): split a complex "
        "state z into real and imaginary parts, {'re': z.real, 'im': z.imag}, with the field returning "
        "{'re': dz.real, 'im': dz.imag}"
    )
    with pytest.raises(ValueError) as err:  # not cast to float64 with the imaginary part dropped
        af.integrate(lambda t, z, a: 1j * z, jnp.array([1.0 + 1.0j]), 1.0)
    assert str(err.value) == f"integrate: y0 is complex, dtype complex128; {split}"
    with pytest.raises(ValueError) as err:
        af.integrate(lambda t, y, a: -y, {"a": 1.0, "b": jnp.ones(2) * 1j}, 1.0)
    assert str(err.value) == f"integrate: y0 is complex (at ['b']), dtype complex128; {split}"
    with pytest.raises(ValueError) as err:  # a complex field on a real state: not Diffrax's error
        af.integrate(lambda t, y, a: -y * (1 + 1j), jnp.ones(1), 1.0)
    assert str(err.value) == f"integrate: field returns a complex dy/dt, dtype complex128; {split}"
    with pytest.raises(ValueError) as err:
        af.integrate(lambda t, y, a: -y, jnp.ones(1), 1.0, dtype=jnp.complex128)
    assert str(err.value) == f"integrate: dtype must be a real floating dtype, got complex128; {split}"
    # the split form: z' = i z from 1 + i, z(pi / 2) = i (1 + i) = -1 + i
    tr = af.integrate(
        lambda t, z, a: {"re": -z["im"], "im": z["re"]},
        {"re": jnp.ones(1), "im": jnp.ones(1)},
        np.pi / 2,
        save=af.LinearGrid(2),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-12),
    )
    np.testing.assert_allclose([tr["re"][-1, 0], tr["im"][-1, 0]], [-1.0, 1.0], atol=1e-8)


def test_detect_plateaus_skips_repeated_save_times_and_refuses_a_non_positive_curve():
    # y = 1 / t, then the saves after an event repeat t = 8: no plateau (the repeats are no time)
    assert af.detect_plateaus([1.0, 2.0, 4.0, 8.0, 8.0, 8.0], [1.0, 0.5, 0.25, 0.125, 0.125, 0.125]) == []
    got = af.detect_plateaus([1.0, 2.0, 4.0, 8.0, 8.0], [1.0, 1.0, 1.0, 0.5, 0.5])
    assert got == [{"t_start": 1.0, "t_end": 4.0, "level": 1.0}]
    # an event-terminated solve: L = (1 - u)^2 falls fastest at the event, where no plateau is
    tr = af.integrate(
        lambda t, u, a: u * (1 - u),
        1e-4,
        50.0,
        observe=lambda t, u, a: {"loss": (1 - u) ** 2},
        event=lambda t, u, a: u - 0.99,
        save=af.LogGrid(100, t_min=1e-2),
    )
    plateaus = af.detect_plateaus(tr.ts, tr["loss"], rel_tol=1e-2)
    assert len(plateaus) == 1 and plateaus[0]["t_start"] == pytest.approx(0.01)
    assert plateaus[0]["t_end"] < 3.0 < float(tr.t_event)
    with pytest.raises(ValueError) as err:
        af.detect_plateaus([0.0, 1.0, 2.0], [-5.0, 1.0, -1.0])  # t = 0 is skipped
    assert str(err.value) == "detect_plateaus needs a positive curve (a loss: its log is taken), but y = -1 at t = 2"


def test_host_analysis_takes_one_run():
    """detect_plateaus and growth_rate read one curve: a batch of runs was read as one curve (the
    plateaus of both runs in one list) or raised a bare IndexError."""
    t = np.linspace(0.0, 10.0, 201)
    loss = np.stack([1.0 / (1 + np.exp(3 * (t - c))) + 0.1 for c in (3.0, 6.0)])
    assert [p["t_end"] for p in af.detect_plateaus(t, loss[1], rel_tol=0.05)] == pytest.approx([4.2, 10.0])
    said = (
        r"^{} takes one run: ts and y must be 1-D, got shapes \(2, 201\) and \(2, 201\); pass one run "
        r"\(traj.batch\(i\).ts, traj.batch\(i\)\[name\]\) or loop over the runs$"
    )
    with pytest.raises(ValueError, match=said.format("detect_plateaus")):
        af.detect_plateaus(np.stack([t, t]), loss, rel_tol=0.05)
    y = 1e-3 * np.exp(np.outer([2.0, 0.5], t))
    assert af.growth_rate(t, y[1], 1e-3, 1e-1) == pytest.approx(0.5, rel=1e-12)
    with pytest.raises(ValueError, match=said.format("growth_rate")):
        af.growth_rate(np.stack([t, t]), y, 1e-3, 1e-1)
    with pytest.raises(ValueError, match=r"^growth_rate: ts and y must have one value per save time, got shapes"):
        af.growth_rate(t, y[0, :-1], 1e-3, 1e-1)


def test_overlay_unbatches_each_batched_item_of_a_list():
    """A batched trajectory inside a list (or a mapping's list) is its runs, as a lone one is:
    three seeds and one run on its own clock are four runs, one legend entry."""
    ts = jnp.linspace(0, 4, 9)
    seeds = af.Trajectory(jnp.stack([ts] * 3), {"y": jnp.stack([ts, 2 * ts, 3 * ts])})
    other = af.Trajectory(jnp.linspace(0, 4, 5), {"y": -jnp.linspace(0, 4, 5)})
    for sims in ([seeds, other], {"simulation": [seeds, other]}):
        ax = next(x for x in af.overlay(None, sims, "y").axes if x.get_visible())
        assert ax.get_legend_handles_labels()[1] == ["simulation (4 runs, own save times)"]
        assert [len(line.get_xdata()) for line in ax.lines] == [9, 9, 9, 5]
        np.testing.assert_allclose(ax.lines[2].get_ydata(), 3 * ts)
        assert len(ax.get_legend().get_texts()) == 1
    ax = next(x for x in af.overlay(None, [seeds, seeds], "y").axes if x.get_visible())  # one clock: one band
    assert ax.get_legend_handles_labels()[1] == ["simulation (mean, min-max of 6)"]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 2 * ts)
    with pytest.raises(ValueError) as err:
        af.overlay(None, [seeds, "run"], "y")
    said = "overlay: simulations[1] must be a Trajectory (batched or not) or a SweepResult of runs, got str"
    assert str(err.value) == said


def test_overlay_draws_labelled_groups_of_runs_apart():
    """``{label: runs}``: each group its own marker and legend entry (runs at two sizes are not
    merged into one band); a batched group is its mean and band."""
    ts = jnp.linspace(0, 1, 5)
    small = af.Trajectory(jnp.stack([ts, ts]), {"y": jnp.stack([ts, 3 * ts])})  # two seeds
    large = af.Trajectory(ts, {"y": 2 * ts})
    theory = af.Trajectory(ts, {"y": 2 * ts})
    ax = next(x for x in af.overlay(theory, {"D=250": small, "D=1000": large}, "y").axes if x.get_visible())
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["theory", "D=250 (mean, min-max of 2)", "D=1000"]
    assert [line.get_marker() for line in ax.lines] == ["None", "o", "s"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), 2 * ts)
    np.testing.assert_allclose(ax.lines[2].get_ydata(), 2 * ts)


def test_overlay_names_matrix_entries_and_draws_a_symmetric_matrix_once():
    ts = jnp.linspace(0, 1, 6)
    R = ts[:, None, None] * jnp.array([[1.0, 2.0], [3.0, 4.0]])
    Q = ts[:, None, None] * jnp.array([[1.0, 0.5], [0.5, 2.0]]) + jnp.eye(2)  # symmetric at every time
    theory = af.Trajectory(ts, {"R": R, "Q": Q})
    fig = af.overlay(theory, theory, ["R", "Q"], component_labels={"Q": ["a", "b", "b'", "c"]})
    ax_r, ax_q = [a for a in fig.axes if a.get_visible()]
    labels_r = ax_r.get_legend_handles_labels()[1]
    assert labels_r == ["theory R[0,0]", "theory R[0,1]", "theory R[1,0]", "theory R[1,1]", "simulation"]
    assert len(ax_r.lines) == 8  # four entries, theory and simulation
    # Q: Q[1,0] (= Q[0,1]) is not drawn again; the labels given for Q by flattened entry
    assert ax_q.get_legend_handles_labels()[1] == ["theory a", "theory b", "theory c", "simulation"]
    np.testing.assert_allclose(ax_q.lines[2].get_ydata(), Q[:, 1, 1])
    assert ax_q.lines[1].get_color() == ax_q.lines[4].get_color()  # an entry's theory and runs share a colour
    # a run that is not symmetric where the theory is: every entry drawn
    run = af.Trajectory(ts, {"Q": Q.at[:, 1, 0].add(0.3)})
    ax = next(a for a in af.overlay(theory, run, "Q").axes if a.get_visible())
    assert len(ax.lines) == 8
    with pytest.raises(ValueError, match=r"component_labels has 2 labels, but 'R' has 4 entries"):
        af.overlay(theory, None, "R", component_labels=["a", "b"])


def test_family_of_a_sweep_or_a_batched_trajectory():
    ts = jnp.linspace(0, 1, 5)
    res = af.sweep(lambda c: af.Trajectory(ts, {"y": c * ts}), {"c": np.array([0.5, 2.0])}, progress=False)
    ax = next(a for a in af.family(res, "y").axes if a.get_visible())
    assert ax.get_legend_handles_labels()[1] == ["c=0.5", "c=2"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), 2 * ts)
    ax = next(a for a in af.family(res.values, ["y"]).axes if a.get_visible())
    assert ax.get_legend_handles_labels()[1] == ["0", "1"]
    with pytest.raises(ValueError, match="must be a mapping label -> Trajectory"):
        af.family([res.values], ["y"])
    with pytest.raises(KeyError, match="no observable 'z'"):
        af.family(res, ["z"])
    # a matrix observable: every entry, in its member's colour, one legend entry per member
    mats = {f"c={c}": af.Trajectory(ts, {"M": c * ts[:, None, None] * jnp.ones((5, 2, 3))}) for c in (1.0, 3.0)}
    ax = next(a for a in af.family(mats, "M").axes if a.get_visible())
    assert len(ax.lines) == 12 and ax.get_legend_handles_labels()[1] == ["c=1.0", "c=3.0"]
    assert {ln.get_color() for ln in ax.lines[:6]} != {ln.get_color() for ln in ax.lines[6:]}
    np.testing.assert_allclose(ax.lines[11].get_ydata(), 3 * ts)


def test_plots_leave_failed_sweep_points_out():
    from attnflow._errors import fail_if

    ts = jnp.linspace(0, 1, 5)

    def run(c):
        return fail_if(af.Trajectory(ts, {"y": c * ts}), c > 1.5, "c too large")

    with pytest.warns(RuntimeWarning, match="1 of 3 grid points failed"):
        res = af.sweep(run, {"c": np.array([0.5, 1.0, 2.0])}, progress=False)
    ax = next(a for a in af.family(res, "y").axes if a.get_visible())
    assert ax.get_legend_handles_labels()[1] == ["c=0.5", "c=1"]
    assert "failed, left out: c=2" in ax.get_legend().get_title().get_text()
    ax = next(a for a in af.overlay(None, res.values, "y").axes if a.get_visible())
    assert "(1 failed runs left out)" in ax.get_legend_handles_labels()[1][0]
    # a group whose runs all failed keeps its legend entry
    failed = res.values.batch(2)
    ax = next(
        a for a in af.overlay(None, {"D=250": failed, "D=1000": res.values.batch(0)}, "y").axes if a.get_visible()
    )
    assert ax.get_legend_handles_labels()[1] == ["D=250 (the run failed)", "D=1000"]
    np.testing.assert_allclose(res.values.mean(axis=0)["y"], np.full(5, np.nan))  # the group holds a failure


def _band_edges(ax, t):
    """The lower and upper edge at the times ``t`` of the one band (fill_between) on ``ax``."""
    (band,) = ax.collections
    v = band.get_paths()[0].vertices
    lo = np.array([v[np.isclose(v[:, 0], x), 1].min() for x in t])
    hi = np.array([v[np.isclose(v[:, 0], x), 1].max() for x in t])
    return lo, hi


def test_overlay_band_is_the_min_max_the_std_or_the_standard_error():
    ts = np.linspace(0.0, 1.0, 5)
    ys = np.stack([ts, 2 * ts, 6 * ts])  # three seeds: mean 3 t, sample sd sqrt(7) t, min t, max 6 t
    runs = af.Trajectory(np.broadcast_to(ts, (3, 5)), {"y": ys})
    sd = np.sqrt(7.0) * ts
    cases = {
        "minmax": (ts, 6 * ts, "(mean, min-max of 3)"),
        "std": (3 * ts - sd, 3 * ts + sd, "(mean ± std of 3)"),
        "sem": (3 * ts - sd / np.sqrt(3), 3 * ts + sd / np.sqrt(3), "(mean ± s.e.m. of 3)"),
        2: (3 * ts - 2 * sd, 3 * ts + 2 * sd, "(mean ± 2 std of 3)"),
    }
    for band, (lo, hi, label) in cases.items():
        ax = next(a for a in af.overlay(None, runs, "y", band=band).axes if a.get_visible())
        got_lo, got_hi = _band_edges(ax, ts)
        np.testing.assert_allclose(got_lo, lo, atol=1e-12, err_msg=str(band))
        np.testing.assert_allclose(got_hi, hi, atol=1e-12, err_msg=str(band))
        np.testing.assert_allclose(ax.lines[0].get_ydata(), 3 * ts)  # the markers: the mean
        assert ax.get_legend_handles_labels()[1] == [f"simulation {label}"]
    ax = next(a for a in af.overlay(None, runs, "y", band=None).axes if a.get_visible())
    assert not ax.collections and ax.get_legend_handles_labels()[1] == ["simulation (mean of 3)"]
    for bad in ("iqr", 0.0, -1.0, np.inf, True):
        with pytest.raises(ValueError, match=r"band must be 'minmax', 'std', 'sem', None or a positive number"):
            af.overlay(None, runs, "y", band=bad)


def test_heatmap_of_a_sweep_over_two_axes():
    grid = {"a": np.array([1.0, 2.0]), "b": np.array([0.0, 0.1, 0.2])}
    res = af.sweep(lambda a, b: 10 * a + b, grid, progress=False)
    want = 10 * grid["a"][:, None] + grid["b"][None, :]  # (a, b)
    fig = af.heatmap(res)  # y: the first axis, x: the second
    (ax, _colorbar) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("b", "a")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "0.1", "0.2"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    np.testing.assert_allclose(ax.images[0].get_array(), want)
    ax = af.heatmap(res, x="a", ylabel="offset b").axes[0]  # the other way round: the transpose
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("a", "offset b")
    np.testing.assert_allclose(ax.images[0].get_array(), want.T)
    # a mapping of values: name picks one, and labels the colour bar
    both = af.sweep(lambda a, b: {"sum": a + b, "prod": a * b}, grid, progress=False)
    fig = af.heatmap(both, name="prod")
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), grid["a"][:, None] * grid["b"][None, :])
    assert fig.axes[1].get_ylabel() == "prod"
    # Trajectory values: the observable at the last save time
    ts = jnp.linspace(0.0, 2.0, 3)
    runs = af.sweep(lambda a, b: af.Trajectory(ts, {"y": a * ts + b}), grid, progress=False)
    np.testing.assert_allclose(
        af.heatmap(runs, name="y").axes[0].images[0].get_array(), 2 * grid["a"][:, None] + grid["b"]
    )
    with pytest.raises(ValueError, match=r"name the value to draw, one of \['prod', 'sum'\]"):
        af.heatmap(both)
    with pytest.raises(KeyError, match="no observable 'loss' in the sweep's trajectories; they have \\['y'\\]"):
        af.heatmap(runs, name="loss")
    with pytest.raises(ValueError, match=r"x must name an axis of the sweep, one of \('a', 'b'\), got 'c'"):
        af.heatmap(res, x="c")
    with pytest.raises(ValueError, match=r"must have two axes, got dims \('a',\)"):
        af.heatmap(af.sweep(lambda a: a, {"a": grid["a"]}, progress=False))
    vec = af.sweep(lambda a, b: jnp.stack([a, b]), grid, progress=False)
    with pytest.raises(ValueError, match=r"has shape \(2,\) per grid point"):
        af.heatmap(vec)
    # an array still needs its ticks and labels, and its shape is checked against them
    with pytest.raises(ValueError, match="needs xlabel and ylabel"):
        af.heatmap(want, grid["b"], grid["a"])
    with pytest.raises(ValueError, match=r"values must have shape \(len\(y\), len\(x\)\) = \(3, 2\), got \(2, 3\)"):
        af.heatmap(want, grid["a"], grid["b"], xlabel="a", ylabel="b")


# ----------------------------------------------------------------------------- rng
def test_threefry_is_jax_threefry_bit_for_bit():
    from jax.extend.random import threefry2x32_p

    k = jax.random.key_data(jax.random.PRNGKey(123))
    x0 = jnp.arange(4099, dtype=jnp.uint32)
    x1 = x0 * jnp.uint32(7) + jnp.uint32(3)
    ours = jax.jit(af.rng.threefry2x32)(k[0], k[1], x0, x1)
    ref = threefry2x32_p.bind(k[0], k[1], x0, x1)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


def test_save_grids_and_horizons_refuse_what_they_cannot_honour():
    from attnflow import deeplinear as dl

    s = dl.Setup()
    with pytest.raises(ValueError, match=r"LogGrid: t_min = 5 must be below t1 - t0 = 1"):
        af.LogGrid(10, 5.0).times(0.0, 1.0)
    with pytest.raises(ValueError, match=r"LogGrid: t_min = 5 must be below t1 - t0 = 1"):
        af.LogGrid(10, 5.0).steps_for(1.0, 0.01)
    with pytest.raises(ValueError, match=r"t1 = 1 is shorter than one step dt = 2"):
        dl.train(s, 1.0, dt=2.0)
    # fit_span (the packages' default grids): a span shorter than t_min starts at 1e-3 of it,
    # a longer one from t_min as without it, traced spans alike
    fit = af.LogGrid(5, 5.0, fit_span=True)
    np.testing.assert_allclose(fit.times(0.0, 1.0), [0.0, 1e-3, 10**-2.0, 10**-1.0, 1.0], rtol=1e-12)
    np.testing.assert_allclose(fit.times(0.0, 50.0), af.LogGrid(5, 5.0).times(0.0, 50.0), rtol=1e-15)
    np.testing.assert_allclose(jax.jit(fit.times)(0.0, 1.0), fit.times(0.0, 1.0), rtol=1e-12)
    # in a run's time units: the solve's times (1e-3, 1e-2, 1e-1, 1) rounded to steps of 0.01
    np.testing.assert_array_equal(fit.steps_for(1.0, 0.01)[1], [0, 1, 10, 100])
    np.testing.assert_array_equal(af.LogGrid(2).steps_for(5.0, 0.01)[1], [0, 500])  # the end, as solve saves
    np.testing.assert_array_equal(af.LogGrid(2).steps(500), [0, 500])
    np.testing.assert_allclose(
        af.LogGrid(150).steps_for(300.0, 1 / 32)[1][-40:] / 32, af.LogGrid(150).times(0.0, 300.0)[-40:], atol=1 / 64
    )
    with pytest.warns(
        UserWarning,
        match=r"t1 = 1 is not a multiple of dt = 0.3: the run ends at the last step before it, step 3, t = 0.9",
    ):
        total, steps = af.LinearGrid(4).steps_for(1.0, 0.3)
    assert total == 3 and steps.tolist() == [0, 1, 2, 3]
    # never past t1 (14 / 0.03 = 466.7: step 466, not the nearest 467 at t = 14.01, past a theory to 14)
    with pytest.warns(UserWarning, match=r"the run ends at the last step before it, step 466, t = 13.98"):
        assert af.LinearGrid(4).steps_for(14.0, 0.03)[0] == 466
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert af.LinearGrid(4).steps_for(0.3, 0.1)[0] == 3  # 0.3 / 0.1 = 2.9999999999999996
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a multiple up to rounding: no warning
        assert af.LinearGrid(3).steps_for(100.0, 0.02)[0] == 5000


def test_saddle_and_expectation_tools_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match=r"fixed_point: field returns .*shape=\(1,\).* does not match the state"):
        af.fixed_point(lambda t, y, a: y[:1] - 1.0, jnp.array([0.3, 0.3]), None)
    with pytest.raises(ValueError, match="symmetric=True, but the Jacobian is not symmetric"):
        af.spectrum(lambda t, y, a: jnp.array([y[1], -y[0]]), jnp.zeros(2), symmetric=True)
    rotation = af.spectrum(lambda t, y, a: jnp.array([y[1], -y[0]]), jnp.zeros(2))  # detected: eig
    np.testing.assert_allclose(sorted(np.imag(np.asarray(rotation.values))), [-1.0, 1.0], atol=1e-12)
    with pytest.raises(ValueError, match=r"basis must have orthonormal columns, but \|B\^T B - I\| reaches 1"):
        af.spectrum(lambda t, y, a: -y, jnp.zeros(2), basis=[[1.0], [1.0]])
    with pytest.raises(ValueError, match="cov must be positive semidefinite, but its smallest eigenvalue is -1"):
        af.gauss_hermite(lambda x: x[0] ** 2, 5, jnp.zeros(2), jnp.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="cov must be symmetric"):
        af.gauss_hermite(lambda x: x[0] * x[1], 5, jnp.zeros(2), jnp.array([[1.0, 0.9], [0.0, 1.0]]))
    bank = af.GaussianBank(0, 256, 2)
    with pytest.raises(ValueError, match=r"cov must have shape \(2, 2\) for this bank, got shape \(3, 3\)"):
        bank.expect(lambda x: x[0], cov=jnp.eye(3))
    with pytest.raises(ValueError, match="eps = 2.0 must be below r = 1.0"):
        af.escape_time(1.0, 2.0)
    assert float(af.gauss_hermite(lambda x: x[0] ** 2, 5, jnp.zeros(2), jnp.array([[2.0, 0.5], [0.5, 1.0]]))) == (
        pytest.approx(2.0, rel=1e-12)
    )


def test_simulate_and_integrate_name_a_bad_loss_or_field_before_computing():
    teacher = Teacher([3.0, 2.0], n_in=4, n_out=3)
    model = TwoLayerLinear.aligned(teacher, 0.1)
    with pytest.raises(ValueError, match="loss must be callable"):
        af.simulate(3, model, optax.sgd(0.01), 10)
    with pytest.raises(ValueError, match=r"loss\(model, batch\) failed on the initial model: TypeError"):
        af.simulate(lambda m: population_loss(m.W1, m.W2, teacher.A), model, optax.sgd(0.01), 10)
    with pytest.raises(ValueError, match=r"must return one real number, got ShapeDtypeStruct\(shape=\(2, 4\)"):
        af.simulate(lambda m, b: m.W1, model, optax.sgd(0.01), 10)
    with pytest.raises(ValueError, match=r"field\(t, y, args\) failed on the initial state: TypeError"):
        af.integrate(lambda t, y: -y, 1.0, 1.0)


def test_a_trajectory_reads_as_a_dict_of_observables_and_refuses_iteration():
    t = af.Trajectory(jnp.linspace(0, 1, 3), {"y": jnp.zeros(3), "z": jnp.ones(3)})
    assert list(dict(t)) == ["y", "z"] and t.keys() == ("y", "z") and [k for k, _ in t.items()] == ["y", "z"]
    with pytest.raises(TypeError, match=r"not iterable: iterate over traj.names .* traj.ts for the save times"):
        list(t)


def test_rk4_fixed_steps_are_fourth_order():
    """`af.RK4` with `SolverOptions.fixed_step`: on y' = -y to t = 1 the error falls 16-fold per
    halving of the step (order 4), and a step count of t1 / dt exactly."""
    errors = []
    for dt in (0.1, 0.05):
        traj = af.integrate(
            lambda t, y, a: {"y": -y["y"]},
            {"y": jnp.array(1.0)},
            1.0,
            solver=af.SolverOptions.fixed_step(dt),
            save=af.LinearGrid(2),
        )
        errors.append(abs(float(traj["y"][-1]) - np.exp(-1.0)))
        assert int(traj.stats["num_steps"]) == round(1.0 / dt) and traj.meta["dt0"] == dt
    assert errors[0] / errors[1] == pytest.approx(16.0, rel=0.05)
    with pytest.raises(ValueError, match="dt must be finite and positive"):
        af.SolverOptions.fixed_step(0.0)
    # no error estimate: an adaptive controller would grow its steps unchecked (a silent blow-up)
    with pytest.raises(ValueError, match="RK4 has no error estimate"):
        af.SolverOptions(solver=af.RK4())
    with pytest.raises(ValueError, match=r"fixed_step sets \['dt0'\] itself"):
        af.SolverOptions.fixed_step(0.1, dt0=0.2)
    # a run that cannot reach t1 in max_steps is refused before it starts, with the number to give
    with pytest.raises(ValueError, match=r"need 1000 steps to t1 = 1, more than max_steps = 10: .*max_steps=1000"):
        af.integrate(lambda t, y, a: -y, jnp.array(1.0), 1.0, solver=af.SolverOptions.fixed_step(1e-3, max_steps=10))


def test_compare_checks_each_reference_curve_against_its_own_runs():
    """A theory swept over a rate, each curve solved to its own horizon, against runs over (rate,
    seed): each run must lie within its own curve's span (as `trajectory_gap` checks), not within
    the shortest curve's."""
    tref = np.stack([np.linspace(0, 5, 11), np.linspace(0, 10, 11)])  # curve 0 to t = 5, curve 1 to t = 10
    ref = af.Trajectory(tref, {"a": np.sin(tref)})
    tos = np.stack([np.stack([np.linspace(0, 5, 6)] * 2), np.stack([np.linspace(0, 10, 6)] * 2)])
    runs = af.Trajectory(tos, {"a": np.sin(tos) + 0.01})
    gap = af.compare(ref, runs, per_run=True)["a"]
    np.testing.assert_allclose(gap, np.asarray(af.trajectory_gap(ref, runs)), atol=0.02)
    late = af.Trajectory(_late(tos), {"a": np.sin(tos)})
    with pytest.raises(
        ValueError,
        match=r"^compare: other run \(0, 1\) is saved on \[0, 6\] but reference curve \(0,\) covers only \[0, 5\]",
    ):
        af.compare(ref, late)


def _late(tos):
    t = np.array(tos)
    t[0, 1] = np.linspace(0, 6, 6)
    return t


def test_overlay_takes_a_sweep_over_seeds_as_family_does():
    """A SweepResult of runs (a sweep over seeds) is its runs: the same band as its values."""
    ts = np.linspace(0.0, 1.0, 5)
    theory = af.Trajectory(ts, {"y": ts})
    res = af.sweep(
        lambda seed: af.Trajectory(jnp.asarray(ts), {"y": jnp.asarray(ts) + 0.1 * seed}), {"seed": np.arange(3)}
    )
    paths = [
        [p.vertices for c in af.overlay(theory, runs, band="std").axes[0].collections for p in c.get_paths()]
        for runs in (res, res.values)
    ]
    assert len(paths[0]) == len(paths[1]) > 0
    for a, b in zip(*paths, strict=True):
        np.testing.assert_allclose(a, b)
    with pytest.raises(ValueError, match="overlay: a SweepResult of runs must have Trajectory values"):
        af.overlay(theory, af.sweep(lambda seed: seed * 1.0, {"seed": np.arange(2)}, progress=False))
    other = af.sweep(lambda eta: af.Trajectory(jnp.asarray(ts), {"y": eta * jnp.asarray(ts)}), {"eta": np.arange(2.0)})
    with pytest.raises(ValueError, match=r"over seeds only .* this one is over \('eta',\).*af.family"):
        af.overlay(theory, other)  # runs of different parameters are not seeds of one band


def test_state_names_that_collide_once_joined_are_refused():
    """A dict state {"a.b": x, "a": {"b": y}} would record one observable "a.b" and drop the other."""

    def field(t, y, args):
        return {"a.b": -y["a.b"], "a": {"b": -2.0 * y["a"]["b"]}}

    with pytest.raises(ValueError, match=r"observable names collide: two entries are both named 'a\.b'"):
        af.integrate(field, {"a.b": jnp.asarray(1.0), "a": {"b": jnp.asarray(1.0)}}, 1.0)
    with pytest.raises(ValueError, match="both named '1'"):
        flatten_names({1: 1.0, "1": 2.0})
    assert flatten_names({"a": {"b": 1.0, "c": {"d": 2.0}}, "e": 3.0}) == {"a.b": 1.0, "a.c.d": 2.0, "e": 3.0}


def test_integer_save_times_become_float_times():
    """Steps as a JAX integer array are times: at, resample and compare interpolate in them."""
    traj = af.Trajectory(jnp.arange(4), {"u": jnp.arange(4.0) ** 2})
    assert jnp.issubdtype(traj.ts.dtype, jnp.floating)
    np.testing.assert_allclose(traj.at(1.5)["u"], 2.5)
    assert af.compare(traj, traj.resample(jnp.array([0.5, 2.5]))) == {"u": 0.0}
    with pytest.raises(ValueError, match="ts must be an array of real save times, got dtype bool"):
        af.Trajectory(jnp.array([True, False]), {"u": jnp.zeros(2)})
