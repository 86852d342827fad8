"""The core's shapes: option objects, numbers as data, events as arrays, analysis, interop, configs."""

import dataclasses
import functools
import inspect
import os
import re
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow import deeplinear as dl
from attnflow.deeplinear import mode_field
from attnflow.report import config_from

S = jnp.array([3.0, 2.0, 1.0, 0.5])


def _decay(t, y, a):
    return -a["k"] * y


def _exp_observe(t, y, a):
    return {"y": y, "nested": {"twice": 2 * y, "sum": jnp.sum(y)}}


# ----------------------------------------------------------------------------- options
def test_save_grids():
    np.testing.assert_allclose(af.LinearGrid(5).times(0.0, 1.0), [0, 0.25, 0.5, 0.75, 1.0])
    t = np.asarray(af.LogGrid(5, t_min=0.01).times(1.0, 101.0))
    assert t[0] == 1.0 and t[-1] == 101.0
    np.testing.assert_allclose(np.diff(np.log(t[1:] - 1.0)), np.log(100.0 / 0.01) / 3)
    assert list(af.LinearGrid(3).steps(10)) == [0, 5, 10]
    steps = af.LogGrid(20).steps(1000)
    assert steps[0] == 0 and steps[1] == 1 and steps[-1] == 1000 and np.all(np.diff(steps) > 0)
    # a time grid on a run with step dt: total steps and rounded steps
    total, s = af.TimeGrid([0.0, 0.1, 0.52]).steps_for(1.0, 0.01)
    assert total == 100 and list(s) == [0, 10, 52]
    with pytest.raises(ValueError, match=r"save times 0.12 and 0.14 round to the same step 1 \(dt = 0.1\)"):
        af.TimeGrid([0.0, 0.12, 0.14, 0.5, 1.0]).steps_for(1.0, 0.1)  # four points back for five asked
    with pytest.warns(UserWarning, match=r"1 save time\(s\) are not multiples of dt = 0.01.*t = 1.2345 at t = 1.23"):
        _, s = af.TimeGrid([0.0, 0.5, 1.2345, 2.0]).steps_for(2.0, 0.01)
    assert list(s) == [0, 50, 123, 200]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 times a step apart are whole steps to their own precision
        af.TimeGrid(np.arange(21, dtype=np.float32) * np.float32(0.1)).steps_for(2.0, 0.01)
    total, s = af.LogGrid(10, t_min=0.5).steps_for(8.0, 0.01)
    assert total == 800 and s[1] == 50 and s[-1] == 800
    # save times past t1 are refused, as solve refuses them; a t1 between steps saves at its last step
    with pytest.raises(ValueError, match=r"save times must lie in \[0, t1 = 1.0\], got 0.0 .. 1.09"):
        af.TimeGrid([0.0, 0.5, 1.09]).steps_for(1.0, 0.1)
    with pytest.warns(UserWarning, match="t1 = 1.05 is not a multiple of dt = 0.1"):
        total, s = af.TimeGrid([0.0, 0.5, 1.05]).steps_for(1.05, 0.1)
    assert total == 10 and list(s) == [0, 5, 10]
    # the offending time is named in full, and float32 times of t1 (0.30000001) are t1, in train as in solve
    with pytest.raises(ValueError, match=r"got 0.0 .. 1.0000001"):
        af.TimeGrid([0.0, 1.0000001]).steps_for(1.0, 0.1)
    f32 = af.TimeGrid(np.float32([0.0, 0.3]))
    assert list(f32.steps_for(0.3, 0.1)[1]) == [0, 3]
    ode = af.integrate(lambda t, y, a: -y, jnp.array(1.0), 0.3, save=f32)
    assert float(ode.ts[-1]) == 0.3
    for bad, match in (
        (lambda: af.LinearGrid(1), "n .save points. must be an integer >= 2"),
        (lambda: af.LogGrid(10, t_min=-1.0), "t_min must be positive"),
        (lambda: af.TimeGrid([0.0, np.nan]), "finite; entry 1"),
        (lambda: af.TimeGrid([0.0, 2.0, 1.0]), r"strictly increasing; ts\[1\] = 2 >= ts\[2\] = 1"),
        (lambda: af.TimeGrid([[0.0, 1.0]]), "1-D"),
        (lambda: af.SolverOptions(solver="tsit5"), "Diffrax solver"),
        (lambda: af.SolverOptions(dt0=0.0), "dt0"),
        (lambda: af.SolverOptions().replace(rtoll=1e-3), "no option"),
    ):
        with pytest.raises(ValueError, match=match):
            bad()
    assert af.SolverOptions().replace(rtol=1e-4).rtol == 1e-4


def test_python_floats_are_data_not_recompiled():
    y0 = jnp.ones(3)
    af.integrate(_decay, y0, 1.0, args={"k": 0.5}, save=af.LinearGrid(5))
    with af.count_compilations() as c:
        a = af.integrate(
            _decay, y0, 2.0, args={"k": 0.7}, save=af.LinearGrid(5), solver=af.SolverOptions(rtol=1e-9, atol=1e-11)
        )
    assert c.n == 0, c
    np.testing.assert_allclose(a["y"][-1], np.exp(-1.4), rtol=1e-7)
    assert isinstance(af.as_data({"k": 0.5, "n": 3, "name": "x"})["k"], jax.Array)
    assert af.as_data({"n": 3})["n"] == 3  # integers stay static (they set shapes)


def test_gradient_flow_reuses_its_compilation():
    def loss(p):
        return 0.5 * jnp.sum((p["w"] - 2.0) ** 2)

    model = {"w": jnp.zeros(2)}
    af.gradient_flow(loss, model, 1.0, rate=1.0, save=af.LinearGrid(3))
    with af.count_compilations() as c:
        tr = af.gradient_flow(loss, model, 1.0, rate=0.5, save=af.LinearGrid(3))
    assert c.n == 0
    np.testing.assert_allclose(tr["loss"][-1], 4.0 * np.exp(-1.0), rtol=1e-7)  # w = 2 (1 - e^{-t/2})


def test_nested_observe_and_event_time_as_data():
    tr = af.integrate(_decay, jnp.ones(2), 1.0, args={"k": 1.0}, observe=_exp_observe, save=af.LinearGrid(3))
    assert set(tr.names) == {"y", "nested.twice", "nested.sum"} and tr.t_event is None
    # the event time is an array: a sweep returns one per grid point
    t_star = lambda s: np.log(s / 1e-3 - 1) / (2 * s)

    def stop(t, u, a):
        return u[0] - a["s"][0] / 2

    res = af.sweep(
        lambda s0: (
            af.integrate(
                mode_field,
                jnp.full(4, 1e-3),
                50.0,
                args={"s": S.at[0].set(s0), "tau": 1.0},
                save=af.LinearGrid(2),
                event=stop,
            ).t_event
        ),
        {"s0": np.array([0.5, 1.0, 2.0])},
        progress=False,
    )
    np.testing.assert_allclose(res.values, t_star(np.array([0.5, 1.0, 2.0])), rtol=1e-7)
    never = af.integrate(mode_field, jnp.full(4, 1e-3), 0.1, args={"s": S, "tau": 1.0}, event=stop)
    assert np.isnan(float(never.t_event))


# ----------------------------------------------------------------------------- Trajectory
def test_trajectory_validation_rename_and_event_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="non-decreasing"):
        af.Trajectory(jnp.array([0.0, 2.0, 1.0]), {"y": jnp.ones(3)})
    with pytest.raises(ValueError, match="finite"):
        af.Trajectory(jnp.array([0.0, np.nan]), {"y": jnp.ones(2)})
    with pytest.raises(ValueError, match="t_event must have the batch shape"):
        af.Trajectory(jnp.arange(3.0), {"y": jnp.ones(3)}, t_event=jnp.ones(2))
    tr = af.Trajectory(jnp.arange(3.0), {"loss": jnp.arange(3.0), "a": jnp.ones((3, 2))}, {"k": 1}, t_event=1.5)
    r = tr.rename(population_loss="loss")
    assert set(r.names) == {"population_loss", "a"} and float(r.t_event) == 1.5
    with pytest.raises(KeyError, match="no observable 'zz'"):
        tr.rename(x="zz")
    back = af.Trajectory.load(tr.save(tmp_path / "ev"))
    assert float(back.t_event) == 1.5 and back.meta == {"k": 1}


def test_trajectory_files_names_and_comparisons_refuse_what_would_mislead(tmp_path):
    """A name with a dot loads what it saved (``load`` read ``eta0.npz`` for ``eta0.5``); a rename
    onto an existing observable, a comparison of observables of other shapes, and a comparison
    past a reference's event are refused, naming what to change."""
    ts = jnp.linspace(0.0, 1.0, 5)
    one, two = af.Trajectory(ts, {"y": ts, "z": 2 * ts}), af.Trajectory(ts, {"y": 3 * ts, "z": ts})
    one.save(tmp_path / "eta0")
    two.save(tmp_path / "eta0.5")
    assert (tmp_path / "eta0.5.npz").exists() and (tmp_path / "eta0.5.json").exists()
    np.testing.assert_array_equal(af.Trajectory.load(tmp_path / "eta0.5")["y"], 3 * ts)
    np.testing.assert_array_equal(af.Trajectory.load(tmp_path / "eta0.5.npz")["y"], 3 * ts)
    np.testing.assert_array_equal(af.Trajectory.load(tmp_path / "eta0")["y"], ts)
    with pytest.raises(ValueError, match="cannot rename onto 'z': this trajectory already has"):
        one.rename(z="y")
    swapped = one.rename(z="y", y="z")  # a swap renames both: nothing is lost
    np.testing.assert_array_equal(swapped["z"], ts)
    wide = af.Trajectory(ts, {"y": jnp.stack([ts, ts], 1)})
    with pytest.raises(ValueError, match=r"observable 'y' has shape \(\) per save time in reference and \(2,\)"):
        af.compare(one, wide)
    stopped = af.integrate(_decay, jnp.ones(1), 5.0, args={"k": 1.0}, event=lambda t, y, a: y[0] - 0.5)
    late = af.Trajectory(jnp.linspace(0.0, 2.0, 3), {"y": jnp.ones((3, 1))})
    with pytest.raises(ValueError, match=r"stopped at its event \(t_event = 0.693147\)"):
        af.compare(stopped, late)
    # a plain number returned by observe is an observable like any other
    tr = af.integrate(
        _decay, jnp.ones(1), 1.0, args={"k": 1.0}, observe=lambda t, y, a: {"c": 3}, save=af.LinearGrid(3)
    )
    np.testing.assert_array_equal(tr["c"], [3.0, 3.0, 3.0])


def test_trajectory_to_xarray_and_pandas():
    pytest.importorskip("xarray")
    ts = jnp.linspace(0, 1, 4)
    tr = jax.vmap(lambda c: af.Trajectory(ts, {"u": c * jnp.stack([ts, ts], 1), "loss": c * ts}))(jnp.array([1.0, 2.0]))
    ds = tr.to_xarray(batch_dims=["seed"])
    assert ds["u"].dims == ("seed", "t", "u_dim0") and ds["loss"].shape == (2, 4)
    np.testing.assert_allclose(ds["t"], ts)
    np.testing.assert_allclose(ds["loss"].sel(seed=1), 2 * ts)
    df = tr.to_pandas()
    assert len(df) == 8 and {"batch0", "t", "loss", "u[0]", "u[1]"} <= set(df.columns)
    np.testing.assert_allclose(df[df.batch0 == 1]["loss"], 2 * ts)
    res = af.sweep(
        lambda c: {"final": c * 2.0, "traj": af.Trajectory(ts, {"y": c * ts})},
        {"c": np.array([1.0, 3.0])},
        progress=False,
    )
    xs = res.to_xarray()
    assert xs["final"].dims == ("c",) and xs["traj.y"].dims == ("c", "traj.t")
    np.testing.assert_allclose(xs["final"], [2.0, 6.0])


# ----------------------------------------------------------------------------- analysis
def test_crossings_and_values_are_traceable():
    ts = jnp.linspace(0.0, 10.0, 101)
    y = jnp.exp(0.3 * ts)
    t_hit = af.first_crossing(ts, y, 5.0, interpolate=True)
    assert float(t_hit) == pytest.approx(np.log(5.0) / 0.3, abs=2e-3)
    assert float(af.first_crossing(ts, y, 5.0)) == pytest.approx(5.4)  # first save past it
    assert np.isnan(float(af.first_crossing(ts, y, 1e9)))
    batch = jax.vmap(lambda r: af.first_crossing(ts, jnp.exp(r * ts), 5.0, interpolate=True))(jnp.array([0.3, 0.6]))
    np.testing.assert_allclose(batch, np.log(5.0) / np.array([0.3, 0.6]), atol=3e-3)
    # one threshold per batch entry (here 101 save times, 2 runs: shapes that do not line up by accident)
    ts2 = jnp.broadcast_to(ts, (2, 101))
    per_run = af.first_crossing(ts2, jnp.exp(0.3 * ts2), jnp.array([5.0, 10.0]), interpolate=True)
    np.testing.assert_allclose(per_run, np.log([5.0, 10.0]) / 0.3, atol=3e-3)
    with pytest.raises(ValueError, match="threshold"):
        af.first_crossing(ts2, ts2, jnp.ones(101))
    # a Trajectory and an observable name, batched too
    runs = af.Trajectory(ts2, {"y": jnp.exp(0.3 * ts2), "v": jnp.zeros((2, 101, 3))})
    np.testing.assert_allclose(af.first_crossing(runs, "y", jnp.array([5.0, 10.0]), interpolate=True), per_run)
    with pytest.raises(ValueError, match=r"observable has shape \(2, 101, 3\)"):
        af.first_crossing(runs, "v", 1.0)
    with pytest.raises(ValueError, match="needs a Trajectory"):
        af.first_crossing(ts, "y", 1.0)
    loss = jnp.exp(-ts)
    a = af.value_at(loss, ts**2, jnp.exp(-2.5), log=True)  # value of t^2 where the loss first reaches e^-2.5
    assert float(a) == pytest.approx(6.25, rel=1e-2)
    assert np.isnan(float(af.value_at(loss, ts, 1e-9)))


def test_growth_plateaus_and_fits():
    ts = np.linspace(0, 20, 401)
    y = 1e-6 * np.exp(0.7 * ts)
    assert af.growth_rate(ts, y, 1e-5, 1e-1) == pytest.approx(0.7, rel=1e-9)
    t = np.geomspace(1e-2, 1e4, 300)
    loss = 1.0 + 0.5 * (t > 10) * -0.5 + 0.0 * t  # two flat stretches, one drop
    plateaus = af.detect_plateaus(t, loss, rel_tol=1e-3)
    assert (
        len(plateaus) == 2
        and plateaus[0]["level"] == pytest.approx(1.0)
        and plateaus[1]["level"] == pytest.approx(0.75)
    )
    x = np.array([500.0, 1000.0, 2000.0, 4000.0])
    fit = af.fit_power_law(x, 3.0 * x**-0.5 * np.array([1.01, 0.99, 1.02, 0.98]))
    assert fit.ci[0] < -0.5 < fit.ci[1] and fit.slope == pytest.approx(-0.5, abs=0.03) and fit.n == 4
    with pytest.raises(ValueError, match="at least 2 finite points"):
        af.fit_line([1.0], [2.0])
    with pytest.warns(RuntimeWarning, match="left out 2 of 6 points that are not positive and finite"):
        kept = af.fit_power_law([*x, 8000.0, 16000.0], [*(3.0 * x**-0.5), 0.0, np.nan])
    assert kept.n == 4 and kept.slope == pytest.approx(-0.5, abs=1e-12)


# ----------------------------------------------------------------------------- Setup, compile count
class _Toy(af.AbstractSetup):
    eta: jax.Array = eqx.field(converter=lambda x: jnp.asarray(x, dtype=float), default=1.0)
    n: int = eqx.field(static=True, default=2)

    def validate(self):
        from attnflow import _validate as V

        V.positive("eta", self.eta)


def test_abstract_setup_replace_validates_and_traces():
    s = _Toy()
    assert float(s.replace(eta=0.5).eta) == 0.5 and isinstance(s.replace(eta=0.5).eta, jax.Array)
    assert s.replace(n=3).n == 3 and s.n == 2
    with pytest.raises(ValueError, match="eta must be finite and positive, got -1"):
        s.replace(eta=-1.0)
    with pytest.raises(ValueError, match="no field"):
        s.replace(zeta=1.0)
    with pytest.raises(ValueError, match="eta"):
        _Toy(eta=0.0)
    out = jax.vmap(lambda e: s.replace(eta=e).eta * 2)(jnp.arange(1.0, 4.0))
    np.testing.assert_allclose(out, [2.0, 4.0, 6.0])


def test_count_compilations():
    f = jax.jit(lambda x: jnp.sin(x) * 3)
    x = jnp.ones(7)
    with af.count_compilations() as c:
        f(x)
        f(x)
    assert c.n == 1 and c.seconds > 0
    with af.count_compilations() as c:
        f(x)
    assert c.n == 0


# ----------------------------------------------------------------------------- expect, saddle
def test_bank_copies_make_estimates_exactly_symmetric():
    key = jax.random.PRNGKey(0)
    draws = {"z": jax.random.normal(key, (100, 3)), "w": jax.random.normal(key, (100, 3))}
    sym = af.expect.antithetic_copies(draws, {"z": True, "w": False})
    assert sym["z"].shape == (200, 3)
    assert float(jnp.max(jnp.abs(jnp.mean(sym["z"], 0)))) < 1e-15  # odd moments vanish exactly
    np.testing.assert_array_equal(sym["w"][100:], draws["w"])
    perms = af.expect.cyclic_permutations(3)
    cop = af.expect.permuted_copies(draws, perms, {"z": None, "w": 1})
    m = jnp.mean(cop["w"], 0)
    np.testing.assert_allclose(m, jnp.full(3, jnp.mean(draws["w"])), rtol=1e-12)  # equivariant: all equal
    assert len(af.expect.all_permutations(3)) == 6
    with pytest.raises(ValueError, match="cyclic_permutations"):
        af.expect.all_permutations(8)


def _rot(t, y, a):
    # a saddle: unstable along (1, 1)/sqrt2 at rate a, stable along (1, -1) at -a
    return a * jnp.array([y[1], y[0]])


def test_spectrum_on_a_subspace_and_fixed_point_cache():
    B = jnp.array([[1.0], [-1.0]]) / jnp.sqrt(2.0)
    full = af.spectrum(_rot, jnp.zeros(2), 2.0)
    sub = af.spectrum(_rot, jnp.zeros(2), 2.0, basis=B)
    np.testing.assert_allclose(np.real(full.values), [2.0, -2.0], atol=1e-12)
    np.testing.assert_allclose(np.real(sub.values), [-2.0], atol=1e-12)
    np.testing.assert_allclose(np.abs(sub.vectors[0]), np.abs(B[:, 0]), atol=1e-12)
    with pytest.raises(ValueError, match="basis must have shape"):
        af.spectrum(_rot, jnp.zeros(2), 2.0, basis=jnp.ones((3, 1)))

    import optimistix as optx

    def shifted(t, y, a):
        return y**3 + y - a

    y = af.fixed_point(shifted, jnp.array([0.3]), 2.0)
    assert float(y[0]) == pytest.approx(1.0, rel=1e-10)
    with af.count_compilations() as c:
        y = af.fixed_point(shifted, jnp.array([0.2]), 10.0)
    assert c.n == 0 and float(y[0]) == pytest.approx(2.0, rel=1e-10)
    lm = af.fixed_point(shifted, jnp.array([0.2]), 10.0, solver=optx.LevenbergMarquardt(rtol=1e-12, atol=1e-12))
    assert float(lm[0]) == pytest.approx(2.0, rel=1e-8)
    with pytest.raises(ValueError, match="Optimistix"):
        af.fixed_point(shifted, jnp.array([0.2]), 1.0, solver="newton")


# ----------------------------------------------------------------------------- data, configs
def test_data_path_names_both_places(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("abc")
    assert af.data_path("corpus.txt", tmp_path) == tmp_path / "corpus.txt"
    monkeypatch.setenv("ATTNFLOW_DATA", str(tmp_path))
    assert af.data_path("corpus.txt") == tmp_path / "corpus.txt"
    monkeypatch.delenv("ATTNFLOW_DATA")
    with pytest.raises(FileNotFoundError, match=r"data_dir = .*ATTNFLOW_DATA not set"):
        af.data_path("missing.txt", tmp_path)


@dataclasses.dataclass(frozen=True)
class _Cfg:
    eta: float = 0.1
    steps: int = 10
    ratios: tuple[float, ...] = (1.0, 2.0)
    name: str = "a"
    flag: bool = False
    bound: float | None = None
    kind: Literal["x", "y"] = "x"


def test_typed_configs_parse_set_values():
    c = config_from(
        _Cfg, {"eta": "1", "steps": "20", "ratios": "[0.5, 3]", "flag": "true", "bound": "2.5", "kind": "y"}
    )
    assert c == _Cfg(eta=1.0, steps=20, ratios=(0.5, 3.0), flag=True, bound=2.5, kind="y")
    assert config_from(_Cfg, {"bound": "null"}).bound is None
    for key, value, match in (
        ("eta", "abc", "expects float"),
        ("steps", "2.5", "expects int"),
        ("ratios", "3", "list of float"),
        ("kind", "z", "expects one of x, y"),
        ("nope", "1", "has no option 'nope'"),
        ("flag", "2", "bool"),
    ):
        with pytest.raises(ValueError, match=match):
            config_from(_Cfg, {key: value}, "toy")


def test_simulate_throw_false_returns_the_divergence_step():
    def loss(p, _):
        return jnp.sum(p["w"] ** 4)

    tr, step = af.simulate(loss, {"w": jnp.ones(2)}, optax.sgd(1.0), 50, throw=False)
    assert int(step) >= 0
    with pytest.raises(af.DivergenceError, match=f"at step {int(step)}"):
        af.check_divergence(tr, step, 1.0)
    _, ok = af.simulate(loss, {"w": jnp.full(2, 0.1)}, optax.sgd(0.1), 20, throw=False)
    assert int(ok) == -1 and af.check_divergence(tr, ok) is tr


def test_foreign_files_are_named_and_json_is_strict(tmp_path):
    import json

    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match=r"bad.npz is not a trajectory saved by attnflow"):
        af.Trajectory.load(bad)
    ok = af.Trajectory(jnp.arange(3.0), {"y": jnp.array([1.0, jnp.nan, 2.0])}, {"x": float("nan")}).save(
        tmp_path / "ok"
    )
    (tmp_path / "ok.json").write_text("{oops")
    with pytest.raises(ValueError, match="ok.json is not the metadata"):
        af.Trajectory.load(ok)
    rep = af.Report("r", {"a": 1}, summary={"nan": float("nan"), "inf": float("inf"), "arr": np.array([1.0, np.nan])})
    rep.write(tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "summary.json").read_text(), parse_constant=lambda c: 1 / 0)
    assert data["summary"] == {"nan": None, "inf": None, "arr": [1.0, None]}


def test_nan_observables_are_errors_in_simulate_as_in_integrate():
    def loss(p, _):
        return 0.5 * jnp.sum(p["w"] ** 2)

    with pytest.raises(
        af.DivergenceError, match=r"observable 'logw' became non-finite at step \d+ .*parameters stayed finite"
    ):
        af.simulate(
            loss,
            {"w": jnp.ones(2)},
            optax.sgd(1.0),
            5,
            save=af.LinearGrid(6),
            observe=lambda p: {"logw": jnp.log(p["w"][0])},
        )
    with pytest.raises(af.DivergenceError, match="observable 'y' became non-finite.*state stayed finite"):
        af.integrate(lambda t, y, a: -y, jnp.ones(1), 1.0, observe=lambda t, y, a: {"y": jnp.log(y - 0.5)})


def test_compilation_cache_folder_and_switch(tmp_path, monkeypatch):
    from attnflow import cache

    monkeypatch.setenv("ATTNFLOW_CACHE", "off")
    assert cache.cache_dir() is None and cache.use_compilation_cache() is None
    monkeypatch.setenv("ATTNFLOW_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "entry").write_bytes(b"x")
    assert cache.clear_compilation_cache() == 1 and not (tmp_path / "c").exists()
    monkeypatch.delenv("ATTNFLOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "attnflow" / "jax"


def test_a_truncated_cache_entry_is_compiled_again(tmp_path):
    """Processes share the cache folder and JAX writes an entry in place: an entry cut short (read
    while another process writes it, or left by a writer that was killed) is read as an error, and
    JAX warns and compiles the program instead (the cache module says so; nothing else guards it)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from attnflow.cache import use_compilation_cache\n"
        "use_compilation_cache(sys.argv[1])\n"
        "import jax, jax.numpy as jnp\n"
        "print(float(jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.float32(0.5))))\n"
    )

    def run():
        return subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
        )

    expected = f"{float(np.float32(np.sin(np.float32(0.5)) * 3.0 + 0.25)):.6f}"
    assert f"{float(run().stdout):.6f}" == expected
    entries = [p for p in tmp_path.iterdir() if p.name.startswith("jit__lambda") and p.name.endswith("-cache")]
    assert len(entries) == 1
    whole = entries[0].read_bytes()
    entries[0].write_bytes(whole[: len(whole) // 2])
    again = run()
    assert f"{float(again.stdout):.6f}" == expected
    assert "Error reading persistent compilation cache entry" in again.stderr


def test_solves_and_training_compile_without_host_callbacks():
    """Under the command's and the tests' EQX_ON_ERROR=nan no solve or training program holds a
    host callback, so JAX's persistent cache can store them (it refuses programs with one); an
    attnflow failure inside a user's jit still raises."""
    import logging

    assert os.environ.get("EQX_ON_ERROR") == "nan"  # set by conftest, as by attnflow_command.py
    refused: list[str] = []

    class Refusals(logging.Handler):
        def emit(self, record):
            if "host callbacks" in record.getMessage():
                refused.append(record.getMessage())

    log = logging.getLogger("jax._src.compiler")
    handler, level = Refusals(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        s = dl.Setup(s=(2.7, 1.3, 0.45))  # shapes of its own: compiled here, not found in a cache
        dl.solve(s, 3.1, save=af.LinearGrid(17))
        dl.train(s, 3.1, key=0, save=af.LinearGrid(17))
        af.sweep(lambda eta: dl.solve(s.replace(eta=eta), 3.1, save=af.LinearGrid(17)).ys["loss"], {"eta": [0.5, 1.0]})
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert refused == []

    @jax.jit
    def diverging(y0):
        return af.integrate(lambda t, y, a: y**2, y0, 10.0, save=af.LinearGrid(3)).ys["y"]

    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="integrate: "):
        diverging(jnp.ones(1))


@pytest.mark.parametrize(
    "make",
    [
        lambda: __import__("attnflow.deeplinear").deeplinear.Setup(eta=[1.0, 2.0]),
        lambda: __import__("attnflow.qkov").qkov.Setup(eta_qk=[1.0, 2.0]),
        lambda: __import__("attnflow.heads").heads.Setup(eta=[1.0, 2.0]),
        lambda: __import__("attnflow.focus").focus.Setup(eta=[1.0, 2.0]),
    ],
)
def test_learning_rates_must_be_scalars(make):
    # (derive takes one rate per student unit, shape (K,); other shapes: tests/test_derive.py)
    with pytest.raises(ValueError, match=r"eta.* must be a scalar, got shape \(2,\)"):
        make()


def test_per_circuit_array_rates_must_fit_their_parameters():
    """An array rate is a rate per entry, with the axes of each parameter of its circuit (a (2, 1)
    rate: one per row of W1 (2, 4)); a (4,) rate on W1 would scale its columns by NumPy's
    broadcasting and a (2,) one cannot broadcast: both are refused, naming the circuit and both
    shapes. A non-positive ratio of `weighted_balance` is refused, naming it."""
    from attnflow.deeplinear import Teacher, TwoLayerLinear, population_loss

    teacher = Teacher([3.0, 2.0], n_in=4, n_out=3)
    model = TwoLayerLinear.aligned(teacher, 0.1)  # W1 (2, 4), W2 (3, 2)
    labels = af.label_by_path(model, {"W1": "first", "W2": "second"})
    loss = lambda m, b: population_loss(m.W1, m.W2, teacher.A)
    for rate in (jnp.array([0.01, 0.02, 0.03, 0.04]), jnp.array([0.01, 0.02]), jnp.ones((1, 2, 4))):
        opt = af.per_circuit(labels, {"first": rate, "second": 0.01})
        with pytest.raises(
            ValueError,
            match=rf"learning rate for circuit 'first' has shape {re.escape(str(rate.shape))}: an array rate is a "
            r"rate per entry, with the axes of each parameter of the circuit, each of size 1 or the parameter's, "
            r"but \.W1 has shape \(2, 4\)",
        ):
            af.simulate(loss, model, opt, 2, save=af.LinearGrid(2))
    # one rate per row of W1, exactly gradient descent with those rates
    rows = jnp.array([[0.03], [0.01]])
    opt = af.per_circuit(labels, {"first": rows, "second": 0.02})
    _, trained = af.simulate(loss, model, opt, 1, save=af.LinearGrid(2), return_model=True)
    g = jax.grad(lambda m: loss(m, None))(model)
    np.testing.assert_allclose(trained.W1, model.W1 - rows * g.W1, rtol=1e-14)
    np.testing.assert_allclose(trained.W2, model.W2 - 0.02 * g.W2, rtol=1e-14)
    for ratio in (-1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match=rf"ratio \(eta_A / eta_B\) must be finite and positive, got {ratio}"):
            af.weighted_balance(jnp.eye(2), jnp.eye(2), ratio)
    A, B = af.weighted_balance(jnp.eye(2), jnp.eye(2), 16.0)
    np.testing.assert_allclose(A, 2.0 * jnp.eye(2))
    np.testing.assert_allclose(B, 0.5 * jnp.eye(2))


_EVENT_CASES = {
    "deeplinear": ("attnflow.deeplinear", {}, 8.0, "loss"),
    "qkov": ("attnflow.qkov", {}, 50.0, "loss"),
    "focus": ("attnflow.focus", {}, 60.0, "loss"),
    "heads": ("attnflow.heads", {}, 40.0, "error"),
}


@pytest.mark.parametrize(
    "package",
    [
        "deeplinear",
        "qkov",
        pytest.param("focus", marks=pytest.mark.slow),  # about a minute on 2 busy cores
        pytest.param("heads", marks=pytest.mark.slow),
    ],
)
def test_every_solve_stops_at_an_event_on_its_observables(package):
    """``solve(setup, T, event=lambda t, o: o[name] - target)`` stops where the observable
    crosses the target: the crossing on a dense save grid (linear interpolation, 2000 points)
    and the value at the event. The other protocol events (qkov ``loss_target``, heads
    ``escape``, derive's ``event``, `focus.escape_time`) have their own tests."""
    import importlib

    module, kw, T, name = _EVENT_CASES[package]
    P = importlib.import_module(module)
    s = P.Setup(**kw)
    dense = P.solve(s, T, save=af.LinearGrid(2000))  # the event solve below uses the same grid
    y = np.asarray(dense[name])
    target = 0.5 * (y[0] + y[-1])
    t_cross = float(af.first_crossing(dense.ts, dense[name], target, above=False, interpolate=True))
    ev = P.solve(s, T, save=af.LinearGrid(2000), event=lambda t, o: o[name] - target)
    assert float(ev.t_event) == pytest.approx(t_cross, rel=2e-3)
    assert float(ev.final()[name]) == pytest.approx(target, rel=1e-6)
    never = P.solve(s, T, save=af.LinearGrid(2), event=lambda t, o: o[name] + 1.0)  # never crosses
    assert np.isnan(float(never.t_event))
    with pytest.raises(ValueError, match="no observable 'nope'"):
        P.solve(s, T, event=lambda t, o: o["nope"])


def test_purely_absolute_error_control():
    tr = af.integrate(
        _decay,
        jnp.array([1.0, 0.0]),
        2.0,
        args={"k": 1.0},
        save=af.LinearGrid(3),
        solver=af.SolverOptions(rtol=0.0, atol=1e-12),
    )
    assert abs(float(tr["y"][-1, 0]) - np.exp(-2.0)) < 1e-10 and float(tr["y"][-1, 1]) == 0.0
    with pytest.raises(ValueError, match="atol must be finite and positive, got 0.0"):
        af.SolverOptions(atol=0.0)


# ----------------------------------------------------------------------------- the protocol
def test_every_setup_has_the_initial_state_solve_starts_from():
    from attnflow import derive, focus, heads, qkov

    s = dl.Setup(s=(2.0, 1.0, 0.5), u0=0.03)
    np.testing.assert_array_equal(s.initial_state(), [0.03, 0.03, 0.03])
    q = qkov.Setup()
    assert set(q.initial_state()) == {"mu_ov", "mu_qk"}
    h = heads.Setup()
    M0, Q0 = h.initial_overlaps()
    y = h.initial_state()
    assert set(y) == {"M", "Q", "act"}
    np.testing.assert_array_equal(y["M"], M0)
    np.testing.assert_array_equal(y["Q"], Q0)
    R, Q = 0.1 * jnp.eye(2), 0.5 * jnp.eye(2)
    d = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q, v0=jnp.ones(2))
    assert set(d.initial_state()) == {"R", "Q", "v"}
    np.testing.assert_array_equal(d.initial_state()["R"], R)
    f = focus.Setup(m=4, mk=4)
    theta = f.initial_state()
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(jnp.array_equal, theta, f.theta0()))
    assert f.initial_state(theta) == theta  # a start of one's own, checked and kept
    with pytest.raises(ValueError, match="initial must be a dict with keys"):
        f.initial_state({"W0": theta["W0"]})
    with pytest.raises(ValueError, match=r"initial\['W0'\] must have shape \(4, m\)"):
        f.initial_state({**theta, "W0": theta["W0"][:3]})
    with pytest.raises(ValueError, match=r"initial\['WQ'\] must have shape \(4, 4\) for d = 4, m = 4, mk = 4"):
        f.initial_state({**theta, "WQ": theta["WQ"][:, :3]})


def test_setups_print_their_numbers_and_record_as_data(tmp_path):
    import json

    from attnflow import focus, heads, qkov

    s = dl.Setup(eta=0.7)
    assert repr(s) == (
        "Setup(s=[3.0, 2.0, 1.0, 0.5], u0=0.001, eta=0.7, layer_ratio=1.0, n_in=8, n_out=6, teacher_seed=0)"
    )
    h = heads.Setup().replace(eta=0.7)
    assert "eta=0.7" in repr(h) and "prior=FlippedSpike(s=3.0, p=0.5" in repr(h)
    for setup in (qkov.Setup(), focus.Setup(m=2, mk=2), h):
        json.dumps(setup.record())  # JSON-ready
    assert focus.Setup(m=2, mk=2).record()["chain"]["pi"] == [0.75, 0.19, 0.05, 0.01]
    tr = dl.solve(s, 1.0, save=af.LinearGrid(3))
    # the verbs leave the setup out of the metadata (static data: setups must stack and branch)
    other = dl.solve(s.replace(eta=0.9), 1.0, save=af.LinearGrid(3))
    jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), tr, other)
    tr.with_meta(setup=s.record()).save(tmp_path / "tr")
    back = af.Trajectory.load(tmp_path / "tr")
    assert back.meta["setup"]["eta"] == 0.7 and back.meta["theory"] == "deeplinear"
    assert jax.jit(lambda e: dl.Setup(eta=e).record()["eta"] == "traced")(0.5)
    from attnflow.setup import _record

    assert _record(jax.random.key(3)) == [0, 3]  # a typed key as its data
    assert _record(functools.partial(print)) == "partial"  # no memory address in a record


def _ode_case(package):
    """A small setup of each theory package, a horizon, the package's own field at the
    ODE's start, and the extra keywords of ``ode``/``solve``."""
    import importlib

    P = importlib.import_module(f"attnflow.{package}")
    if package == "deeplinear":
        s = P.Setup(s=(2.0, 1.0, 0.5), u0=0.03, eta=0.7)
        return P, s, 3.0, {}, lambda o: 2 * 0.7 * o.y0 * (jnp.array([2.0, 1.0, 0.5]) - o.y0)
    if package == "qkov":
        s = P.Setup()
        return P, s, 50.0, {}, lambda o: P.reduced_field(0.0, o.y0, s)
    if package == "focus":
        s = P.Setup(m=4, mk=4)
        return P, s, 5.0, {}, lambda o: P.flow_field(0.0, o.y0, s)
    if package == "heads":
        s = P.Setup()
        kw = {"bank": P.BankOptions(n=256)}
        return P, s, 2.0, kw, lambda o: P.order_parameter_field(0.0, o.y0, P.Dynamics.build(s, kw["bank"]))
    R, Q = 0.1 * jnp.eye(2) + 0.01, 0.5 * jnp.eye(2) + 0.02
    s = P.Setup(P.soft_committee, P.soft_committee, R, Q, quadrature=P.GaussHermite(6))
    return P, s, 2.0, {}, lambda o: P.field(0.0, o.y0, (s, P.rule(s)))


@pytest.mark.parametrize("package", ["deeplinear", "qkov", "focus", "heads", "derive"])
def test_every_package_gives_the_ode_its_solve_integrates(package):
    """``P.ode(setup)`` is the ODE ``P.solve`` integrates: ``ode.solve``, ``af.integrate(ode, ...)``
    and ``P.solve`` give the same trajectory to the bit; ``ode(t, y)`` is the package's field;
    ``ode.observables`` is the first saved row; the core's saddle verbs take the ODE."""
    P, s, T, kw, own_field = _ode_case(package)
    o = P.ode(s, **kw)
    assert isinstance(o, af.ODE)
    save = af.LinearGrid(5)
    ref = P.solve(s, T, save=save, **kw)
    for traj in (o.solve(T, save=save), af.integrate(o, o.y0, T, save=save)):
        assert traj.names == ref.names and traj.meta == ref.meta
        np.testing.assert_array_equal(traj.ts, ref.ts)
        for name in ref.names:
            np.testing.assert_array_equal(traj[name], ref[name], err_msg=name)
    dy = o(0.0, o.y0)
    jax.tree_util.tree_map(np.testing.assert_array_equal, dy, own_field(o))
    first = o.observables(o.y0)
    assert sorted(first) == sorted(ref.names)
    for name in ref.names:
        np.testing.assert_allclose(first[name], ref[name][0], rtol=1e-12, atol=1e-14, err_msg=name)
    J = af.jacobian(o, o.y0)
    np.testing.assert_array_equal(J, af.jacobian(o.field, o.y0, o.args))
    n = jax.flatten_util.ravel_pytree(o.y0)[0].shape[0]
    assert J.shape == (n, n)
    with pytest.raises(ValueError, match="an ODE carries its own args"):
        af.spectrum(o, o.y0, o.args)
    with pytest.raises(ValueError, match=f"must be an attnflow.{package}.Setup"):
        P.ode("not a setup")
    # a solve shorter than the start of the package's default (log) grid runs on it
    short = P.solve(s, 0.005, **kw)
    assert float(short.ts[-1]) == pytest.approx(0.005, rel=1e-12) and np.all(np.diff(short.ts) > 0)


@pytest.mark.parametrize("package", ["deeplinear", "qkov", "focus", "heads", "derive"])
def test_model_observables_of_the_returned_network_are_what_train_recorded(package):
    """Every package: ``P.model_observables(net, setup)`` of the network ``train(...,
    return_model=True)`` returns equals the trajectory's last row (same two arguments in every
    package); anything else as ``setup`` is refused by name."""
    P, s, _, _, _ = _ode_case(package)
    T, kw = {"deeplinear": (1.0, {}), "qkov": (5.0, {}), "focus": (0.2, {"context": 32, "batch": 8})}.get(
        package, (0.25, {"D": 64})
    )
    if package == "heads":
        kw["eval_samples"] = 500
    run, net = P.train(s, T, return_model=True, save=af.LinearGrid(3), **kw)
    extra = {"eval_samples": 500} if package == "heads" else {}
    obs = P.model_observables(net, s, **extra)
    assert sorted(obs) == sorted(run.names)
    last = run.final()
    for name in run.names:
        np.testing.assert_allclose(obs[name], last[name], rtol=1e-9, atol=1e-12, err_msg=name)
    with pytest.raises(ValueError, match="setup"):
        P.model_observables(net, "not a setup")


def test_an_ode_is_data_for_jit_vmap_and_the_saddle_verbs():
    """The mode ODE under ``vmap`` over the learning rate matches the closed form; its fixed
    point and spectrum are the known ones (``u = s``, eigenvalues ``-2 eta s``)."""
    s = dl.Setup(s=(2.0, 1.0, 0.5), u0=0.03, eta=0.7)

    def final_u(eta):
        return dl.ode(s.replace(eta=eta)).solve(4.0, save=af.LinearGrid(2)).final()["u"]

    etas = jnp.array([0.3, 0.7, 1.1])
    u = jax.vmap(final_u)(etas)
    exact = jax.vmap(lambda e: dl.mode_strength(4.0, s.s, s.u0, tau=1 / e))(etas)
    np.testing.assert_allclose(u, exact, rtol=1e-7)
    o = dl.ode(s)
    u_star = af.fixed_point(o, jnp.array([1.9, 1.1, 0.45]))
    np.testing.assert_allclose(u_star, s.s, rtol=1e-10)
    sp = af.spectrum(o, u_star)
    np.testing.assert_allclose(sp.values, -2 * 0.7 * jnp.array([0.5, 1.0, 2.0]), rtol=1e-10)
    assert jax.tree_util.tree_structure(o) == jax.tree_util.tree_structure(dl.ode(s.replace(eta=0.1)))
    with pytest.raises(ValueError, match="field must be callable"):
        af.ODE("f", None, jnp.zeros(2))
    with pytest.raises(ValueError, match="save must be a SaveGrid"):
        af.ODE(_decay, {"k": 1.0}, jnp.ones(2), save=10)
    with pytest.raises(ValueError, match="meta values must be hashable"):
        af.ODE(_decay, {"k": 1.0}, jnp.ones(2), meta=(("sizes", [1, 2]),))
    with pytest.raises(
        ValueError, match=r"ode.observables\(y\): y must be a state shaped like ode.y0, \(3,\); got \(2,\)"
    ):
        o.observables(jnp.ones(2))
    own = af.ODE(_decay, {"k": 2.0}, jnp.ones(2))  # a user's own ODE: the state is observed as "y"
    np.testing.assert_allclose(own.solve(1.0, save=af.LinearGrid(2))["y"][-1], np.exp(-2.0), rtol=1e-7)


def test_a_size_given_a_traced_value_says_to_sweep_it_as_static():
    s = dl.Setup()
    with pytest.raises(ValueError, match=r"n_in must be a concrete number here \(it fixes array shapes.*af\.Static"):
        af.sweep(
            lambda n_in: dl.solve(s.replace(n_in=n_in), 1.0, save=af.LinearGrid(2)).final()["loss"],
            {"n_in": np.array([8, 12])},
            progress=False,
        )
    with pytest.raises(ValueError, match=r"t1 must be a concrete number here.*af\.Static"):
        jax.vmap(lambda t1: dl.train(s, t1).final()["loss"])(jnp.array([1.0, 2.0]))


def test_saddle_tools_need_float64_and_say_where_a_root_find_ran():
    from attnflow import focus, qkov

    o = dl.ode(dl.Setup())
    with jax.enable_x64(False):  # float32 rounding (1e-7 |J|) would pass null directions off as unstable
        with pytest.raises(RuntimeError, match="fixed_point runs in float64 but JAX 64-bit mode is off"):
            af.fixed_point(o, jnp.ones(4))
        with pytest.raises(RuntimeError, match="spectrum runs in float64"):
            af.unstable_subspace(o, jnp.ones(4))
    with pytest.raises(ValueError, match="pi is float32.*after attnflow.enable_x64"):  # made before x64 was on
        focus.check_pi(jnp.array([0.75, 0.19, 0.05, 0.01], dtype=jnp.float32))
    # qkov's reduced flow has no root: Newton runs off to where the field decays; the message says so
    q = qkov.ode(qkov.Setup())
    with pytest.raises(RuntimeError, match=r"\|field\| = .* and max \|y\| = .*the iterates ran away from it"):
        af.fixed_point(q, q.y0)


def test_messages_of_an_odes_event_and_a_sensitivity():
    o = dl.ode(dl.Setup())
    with pytest.raises(ValueError, match=r"event\(t, obs\) failed.*af.integrate\(ode, y0, t1, event=...\)"):
        o.solve(1.0, event=lambda t, y, a: y[0] - 1.0)
    assert (
        repr(af.sensitivity(lambda a, b: a**2 * b, a=2.0, b=3.0))
        == "Sensitivity(value=12.0, grad={'a': 12.0, 'b': 4.0})"
    )
    assert (
        repr(af.sensitivity(lambda a: jnp.arange(20.0) * a, a=2.0)) == "Sensitivity(value=f8[20], grad={'a': f8[20]})"
    )
    jax.jit(lambda a: repr(af.sensitivity(lambda x: x**2, x=a)) and a)(1.0)  # printing inside a trace works


def test_log_time_interpolation_is_linear_before_the_first_positive_save():
    ts = np.array([0.0, 0.1, 1.0, 10.0])
    tr = af.Trajectory(ts, {"y": ts.copy()})
    np.testing.assert_allclose(tr.at([0.05], log_time=True)["y"], [0.05], rtol=1e-12)  # y = t: linear in t there
    # past it, in log t: between 1 and 10 at t = sqrt(10), halfway in log
    np.testing.assert_allclose(tr.at([10**0.5], log_time=True)["y"], [5.5], rtol=1e-12)


def test_spectrum_of_a_general_jacobian_in_a_sweep():
    def oscillator(t, y, a):  # damped: eigenvalues -gamma/2 +- i sqrt(k - gamma^2/4)
        return jnp.array([y[1], -a["k"] * y[0] - a["gamma"] * y[1]])

    def rate(k):
        sp = af.spectrum(oscillator, jnp.zeros(2), {"k": k, "gamma": 0.5})
        return jnp.real(sp.values[0]), jnp.abs(jnp.imag(sp.values[0]))

    res = af.sweep(rate, {"k": np.array([1.0, 4.0])}, progress=False)
    re, im = res.values
    np.testing.assert_allclose(re, [-0.25, -0.25], rtol=1e-12)
    np.testing.assert_allclose(im, np.sqrt(np.array([1.0, 4.0]) - 0.0625), rtol=1e-12)
    host = af.spectrum(oscillator, jnp.zeros(2), {"k": 4.0, "gamma": 0.5})  # outside a trace: NumPy's eig
    np.testing.assert_allclose(host.lambda_max, -0.25, rtol=1e-12)
    # a batched Spectrum (vmap) has one lambda_max per point
    batched = jax.vmap(lambda g: af.spectrum(oscillator, jnp.zeros(2), {"k": 4.0, "gamma": g}))(jnp.array([0.5, 1.0]))
    np.testing.assert_allclose(batched.lambda_max, [-0.25, -0.5], rtol=1e-12)
    # symmetric=True on a Jacobian that is not, under a trace: an error as it runs (not another matrix's eigh)
    with pytest.raises(Exception, match="symmetric=True, but the Jacobian is not symmetric"):
        jax.jit(lambda k: af.spectrum(oscillator, jnp.zeros(2), {"k": k, "gamma": 0.5}, symmetric=True).values)(4.0)
    # a float32 guess is solved in float64
    assert af.fixed_point(oscillator, jnp.ones(2, jnp.float32), {"k": 4.0, "gamma": 0.5}).dtype == jnp.float64
    # eigenvalues are differentiable (lambda_max = -gamma/2 when complex; (-gamma + sqrt(gamma^2 - 4k))/2
    # when real), and the eigenvectors stay paired with them
    lam = lambda g, k: af.spectrum(oscillator, jnp.zeros(2), {"k": k, "gamma": g}).lambda_max
    assert float(jax.grad(lam)(0.5, 4.0)) == pytest.approx(-0.5, rel=1e-12)
    g, k = 5.0, 4.0  # real eigenvalues -1 and -4: d lambda_max / d gamma = (-1 + gamma / sqrt(gamma^2 - 4k)) / 2
    assert float(jax.grad(lam)(g, k)) == pytest.approx((-1 + g / 3.0) / 2, rel=1e-10)
    check_grads(lambda g: lam(g, 4.0), (5.0,), order=1, modes=("fwd", "rev"))
    # eigenvectors paired with their eigenvalues, in the same order in and out of a trace: real distinct,
    # a complex-conjugate pair beside a real one
    rng = np.random.default_rng(0)
    S = rng.normal(size=(3, 3))
    for D in (np.diag([-1.0, -4.0, 2.0]), np.array([[-1.0, 2.0, 0.0], [-2.0, -1.0, 0.0], [0.0, 0.0, -1.0]])):
        A = S @ D @ np.linalg.inv(S)
        linear = lambda t, y, a: a @ y
        eager = af.spectrum(linear, jnp.zeros(3), jnp.asarray(A))
        traced = jax.jit(lambda a: af.spectrum(linear, jnp.zeros(3), a))(jnp.asarray(A))
        np.testing.assert_allclose(traced.values, eager.values, atol=1e-12)
        for sp in (eager, traced):
            for w, v in zip(sp.values, sp.vectors, strict=True):
                np.testing.assert_allclose(A @ v, w * v, atol=1e-12)
    assert float(np.imag(traced.values[0])) == pytest.approx(-2.0)  # -1 - 2i, -1, -1 + 2i: by imaginary part


def _pitchfork(t, y, a):
    return a["mu"] * y - y**3


def _fold(t, y, a):  # saddle-node: fixed points -sqrt(-mu) (stable) for mu < 0, none for mu > 0
    return a["mu"] + y**2


def test_fixed_point_branch_follows_a_pitchfork_and_flags_a_fold():
    mus = np.linspace(2.0, 0.1, 20)
    br = af.fixed_point_branch(lambda mu: af.ODE(_pitchfork, {"mu": mu}, jnp.ones(1)), mus, jnp.array([1.5]))
    np.testing.assert_allclose(br.states[:, 0], np.sqrt(mus), rtol=1e-12)  # the branch y = sqrt(mu)
    np.testing.assert_allclose(br.lambda_max, -2 * mus, rtol=1e-10)  # stable, eigenvalue mu - 3 y^2 = -2 mu
    assert bool(br.converged().all())
    # towards the fold at mu = 0 and past it: converged before, flagged after
    mus = np.array([-1.0, -0.5, -0.2, -0.05, 0.2, 0.5])
    fold = af.fixed_point_branch(lambda mu: af.ODE(_fold, {"mu": mu}, jnp.ones(1)), mus, jnp.array([-1.0]))
    np.testing.assert_allclose(fold.states[:4, 0], -np.sqrt(-mus[:4]), rtol=1e-10)
    assert fold.converged().tolist() == [True] * 4 + [False] * 2
    # a theory's ODE along a learning rate: deeplinear's learned point u = s, eigenvalues -2 eta s
    s = dl.Setup()
    etas = np.array([0.5, 1.0, 2.0])
    dlb = af.fixed_point_branch(lambda eta: dl.ode(s.replace(eta=eta)), etas, jnp.array([2.9, 2.1, 0.9, 0.6]))
    np.testing.assert_allclose(dlb.states, np.broadcast_to(s.s, (3, 4)), rtol=1e-10)
    np.testing.assert_allclose(dlb.lambda_max, -2 * etas * 0.5, rtol=1e-10)
    with pytest.raises(ValueError, match="ode_of\\(value\\) must return an af.ODE"):
        af.fixed_point_branch(lambda mu: _pitchfork, mus, jnp.ones(1))
    with pytest.raises(ValueError, match="values must be a 1-D array"):
        af.fixed_point_branch(lambda mu: af.ODE(_pitchfork, {"mu": mu}, jnp.ones(1)), 1.0, jnp.ones(1))


def _sum_pinned(t, y, a):  # roots: the line y0 + y1 = a (a null direction of the Jacobian everywhere)
    s = a - y[0] - y[1]
    return jnp.stack([s, s])


def test_fixed_point_with_null_directions_and_its_derivative():
    """A Jacobian with a null direction (a family of roots, as a state holding q_12 and q_21): the default
    Newton finds a root, and the derivative of the root is the pseudo-inverse (minimum-norm) one,
    dy/da = (1/2, 1/2), in both modes; a non-singular root keeps its exact derivative (check_grads)."""
    root = af.fixed_point(_sum_pinned, jnp.array([0.3, -0.1]), 2.0)
    assert float(root[0] + root[1]) == pytest.approx(2.0, abs=1e-12)

    def y_star(a):
        return af.fixed_point(_sum_pinned, jnp.array([0.3, -0.1]), a)

    for jac in (jax.jacfwd, jax.jacrev):
        np.testing.assert_allclose(jac(y_star)(2.0), [0.5, 0.5], atol=1e-12)
    # the pitchfork's branch y = sqrt(mu): dy/dmu = 1 / (2 sqrt(mu))
    branch = lambda mu: af.fixed_point(_pitchfork, jnp.array([1.5]), {"mu": mu})[0]
    assert float(jax.grad(branch)(2.0)) == pytest.approx(1 / (2 * np.sqrt(2.0)), rel=1e-10)
    check_grads(branch, (2.0,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("package", ["deeplinear", "qkov", "focus", "heads", "derive"])
def test_every_solve_names_itself_when_float64_is_off(package):
    """Without 64-bit mode each package's solve says which verb needs it (not the ``integrate``
    underneath, whose advice to pass ``dtype=`` does not apply to the verbs)."""
    P, s, T, kw, _ = _ode_case(package)
    with jax.enable_x64(False):
        with pytest.raises(RuntimeError, match=rf"^{package}\.solve runs in float64 but JAX 64-bit mode is off"):
            P.solve(s, T, **kw)
        if package == "qkov":
            with pytest.raises(RuntimeError, match=r"^qkov\.train \(gradient flow, dt=None"):
                P.train(s, T)


@pytest.mark.parametrize(
    "verb",
    [
        "qkov.reach_loss",
        "qkov.ratio_sensitivity",
        "qkov.optimal_ratio",
        "qkov.pareto_front",
        "focus.escape_time",
        "heads.specialisation_time",
        "heads.unspecialised_point",
        "heads.specialisation_spectrum",
        "derive.plateau",
    ],
)
def test_every_verb_that_integrates_names_itself_when_float64_is_off(verb):
    """The verbs built on a package's solve or on the saddle tools name themselves, not the
    ``solve`` or ``fixed_point`` they call, before computing anything."""
    import importlib

    package, name = verb.split(".")
    P = importlib.import_module(f"attnflow.{package}")
    if package == "derive":
        s = P.Setup(P.soft_committee, P.soft_committee, 0.01 * jnp.ones((2, 2)), 0.2 * jnp.eye(2))
    else:
        s = P.Setup()
    args = {
        "qkov.reach_loss": (0.5,),
        "qkov.ratio_sensitivity": (0.5,),
        "qkov.optimal_ratio": (0.5, 10.0),
        "qkov.pareto_front": (0.5, [1.0, 2.0]),
        "heads.specialisation_spectrum": ({"M": jnp.zeros((2, 2)), "Q": jnp.eye(2)},),
    }.get(verb, ())
    with jax.enable_x64(False), pytest.raises(RuntimeError, match=rf"^{verb} runs in float64 but JAX 64-bit mode"):
        getattr(P, name)(s, *args)


def test_specialisation_spectrum_names_a_state_that_is_not_one():
    from attnflow import heads

    with pytest.raises(ValueError, match=r'y must be a state \{"M", "Q", "act"\}.*got 1.0'):
        heads.specialisation_spectrum(heads.Setup(), 1.0)


def _record_cases():
    from attnflow import derive, focus, heads, qkov

    committee = {"R0": jnp.array([[0.2, 0.0], [0.0, 0.1]]), "Q0": 0.5 * jnp.eye(2)}
    return [
        lambda: qkov.Setup(parametrisation="FAFO", eta_qk=0.3),
        lambda: focus.Setup(chain=focus.MarkovChain.lazy(lam=0.3), m=4),
        lambda: heads.Setup(),
        lambda: heads.Setup(
            prior=heads.Discrete([[1.0], [-1.0]], [0.3, 0.7]), activation=heads.BayesSoftmax(jnp.zeros(2))
        ),
        lambda: heads.Setup(init=heads.SymmetricSeed(jnp.zeros((2, 1)), jnp.eye(2))),
        lambda: heads.Setup(prior=heads.AnisotropicGaussian(jnp.zeros(2), jnp.ones(2))),
        lambda: dl.Setup(s=(2.0, 1.0), eta=0.5),
        lambda: derive.Setup(derive.soft_committee, derive.soft_committee, **committee),
    ]


@pytest.mark.parametrize("case", range(8))
def test_a_setup_comes_back_from_its_record(case, tmp_path):
    """``P.Setup.from_record(s.record())`` after a JSON round trip (a saved trajectory's metadata) is
    the same setup: the same record and pytree structure, nested modules rebuilt from their type,
    functions from their name."""
    s = _record_cases()[case]()
    traj = af.Trajectory(jnp.arange(2.0), {"x": jnp.zeros(2)}).with_meta(setup=s.record())
    traj.save(tmp_path / "run")
    back = type(s).from_record(af.Trajectory.load(tmp_path / "run").meta["setup"])
    assert back.record() == s.record()
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(s)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(s), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_record_says_what_it_cannot_give_back():
    from attnflow import derive, focus, qkov

    with pytest.raises(ValueError, match=r"the record is of a 'MarkovChain', not of attnflow.qkov"):
        qkov.Setup.from_record(focus.Setup().chain.__dict__ | {"type": "MarkovChain"})
    with pytest.raises(ValueError, match=r"setup: Setup has no field \['chain', 'eps', .*another class"):
        qkov.Setup.from_record(focus.Setup().record())  # a focus record given to qkov
    with pytest.raises(ValueError, match=r"setup.eta_ov was traced \(inside a sweep\)"):
        qkov.Setup.from_record(qkov.Setup().record() | {"eta_ov": "traced"})
    with pytest.raises(ValueError, match=r"setup.chain.P was recorded by its shape only \(f64\[27, 27\]"):
        chain = {"type": "MarkovChain", "pi": [1.0], "P": "f64[27, 27]"}
        focus.Setup.from_record(focus.Setup().record() | {"chain": chain})
    with pytest.raises(ValueError, match=r"setup.data: the record's type 'Torus' is not a class of attnflow.derive"):
        derive.Setup.from_record({"student": "soft_committee", "teacher": "soft_committee", "data": {"type": "Torus"}})
    with pytest.raises(ValueError, match="from_record needs the dict of Setup.record"):
        qkov.Setup.from_record("CACO")
    # what the shape-only error asks for: the array itself in the record
    s = focus.Setup()
    chain = {"type": "MarkovChain", "pi": np.asarray(s.chain.pi), "P": np.asarray(s.chain.P)}
    back = focus.Setup.from_record(s.record() | {"chain": chain})
    np.testing.assert_array_equal(back.chain.P, s.chain.P)


@pytest.mark.parametrize("package", ["deeplinear", "qkov", "focus", "heads", "derive"])
@pytest.mark.parametrize("save", [20, [0.0, 1.0], 0])
def test_every_train_refuses_a_save_that_is_not_a_grid(package, save):
    """As solve, integrate and simulate do: named before any computing (was AttributeError on
    steps_for; qkov took 0 for the default grid)."""
    import importlib

    from attnflow import derive

    P = importlib.import_module(f"attnflow.{package}")
    s = (
        derive.Setup(derive.soft_committee, derive.soft_committee, [[0.1]], [[0.5]])
        if package == "derive"
        else P.Setup()
    )
    kw = {"dt": 0.5} if package in ("deeplinear", "qkov", "focus") else {}
    with pytest.raises(ValueError, match=r"save must be a SaveGrid \(LinearGrid, LogGrid or TimeGrid\), got"):
        P.train(s, 1.0, save=save, **kw)


def test_every_train_records_its_clock_step_and_batch():
    """The same meta keys from every package's `train`: ``theory``, ``clock`` (what t counts),
    ``dt`` (t per step; None for gradient flow) and ``batch`` (samples per step; None for the
    full batch), so that a user's code reads a run of any theory the same way."""
    from attnflow import deeplinear, derive, focus, heads, qkov

    committee = derive.Setup(derive.soft_committee, derive.soft_committee, 0.1 * jnp.ones((2, 2)), 0.5 * jnp.eye(2))
    runs = {
        "qkov": qkov.train(qkov.Setup(), 1.0, dt=0.5, batch=4, save=af.LinearGrid(2)),
        "focus": focus.train(focus.Setup(), 0.1, dt=0.05, save=af.LinearGrid(2)),
        "heads": heads.train(heads.Setup(), 0.02, D=100, save=af.LinearGrid(2)),
        "deeplinear": deeplinear.train(deeplinear.Setup(), 0.1, dt=0.05, save=af.LinearGrid(2)),
        "derive": derive.train(committee, 0.02, D=100, save=af.LinearGrid(2)),
    }
    runs["qkov generator"] = qkov.train_on_generator("CACO", 0.1, 0.1, 4, batch=2, save=af.LinearGrid(2))[0]
    want = {"qkov": (0.5, 4), "focus": (0.05, 64), "heads": (0.01, 1), "deeplinear": (0.05, None), "derive": (0.01, 1)}
    want["qkov generator"] = (1.0, 2)
    for name, tr in runs.items():
        meta = tr.meta
        assert meta["theory"] == name.split()[0] and meta["clock"].startswith("t = steps"), (name, meta["clock"])
        assert meta["dt"] == pytest.approx(want[name][0]) and meta["batch"] == want[name][1], (name, meta)


def test_escape_time_is_one_verb_in_every_package():
    """``P.escape_time(setup, threshold, *, t1)``: the first time the package's loss (``error`` in
    derive) falls to ``threshold``, as `af.crossing_time` on ``P.ode(setup)``: the observable is
    ``threshold`` there (read off a solve stopped at it), qkov's equals `reach_loss`'s ``t``, and
    deeplinear's derivative in the learning rate matches central differences."""
    from attnflow import deeplinear, derive, qkov

    committee = derive.Setup(
        derive.soft_committee, derive.soft_committee, 0.1 * jnp.ones((2, 2)) + 0.01 * jnp.eye(2), 0.5 * jnp.eye(2)
    )
    cases = ((qkov, qkov.Setup(), "loss", 1.0, 1e4), (deeplinear, deeplinear.Setup(), "loss", 3.5, 50.0))
    cases += ((derive, committee, "error", 0.1, 200.0),)
    for P, setup, name, threshold, t1 in cases:
        t_esc = float(P.escape_time(setup, threshold, t1=t1))
        stopped = P.solve(setup, t1, event=lambda t, o, n=name, x=threshold: o[n] - x)
        assert t_esc == pytest.approx(float(stopped.t_event), rel=1e-12)
        assert float(stopped[name][-1]) == pytest.approx(threshold, rel=1e-6), P.__name__
    assert float(qkov.escape_time(qkov.Setup(), 1.0, t1=1e4)) == pytest.approx(
        float(qkov.reach_loss(qkov.Setup(), 1.0)["t"])
    )
    d = deeplinear.Setup()
    sens = af.sensitivity(lambda eta: deeplinear.escape_time(d.replace(eta=eta), 3.5, t1=50.0), eta=1.0)
    fd = af.central_difference(lambda eta: deeplinear.escape_time(d.replace(eta=eta), 3.5, t1=50.0), eta=1.0)
    assert float(sens.grad["eta"]) == pytest.approx(float(fd["eta"]), rel=1e-5)
    with pytest.raises(ValueError, match=r"threshold = 9.0 must lie below the start value of 'loss', 7.1185"):
        deeplinear.escape_time(d, 9.0, t1=50.0)
    with pytest.raises(ValueError, match=r"observable 'u' has shape \(4,\): crossing_time needs a scalar one"):
        af.crossing_time(deeplinear.ode(d), "u", 0.1, 50.0)
    with pytest.raises(ValueError, match=r"the ODE has no observable 'los'"):
        af.crossing_time(deeplinear.ode(d), "los", 0.1, 50.0)


def test_escape_time_threshold_is_data_and_a_missed_event_has_nan_derivatives():
    """The threshold of `af.crossing_time` travels as data: a new one reuses the compiled solve,
    and it can be traced (jit, grad, two sweeps in one process). Its derivative is 1 / (dL/dt)
    at the crossing. An event that never fires gives NaN, and `af.sensitivity` NaN derivatives
    in both modes, while a user's own ``jax.grad`` keeps the 0 that ``nanmean`` masks rely on."""
    from attnflow import deeplinear

    s = deeplinear.Setup()
    t_star = float(deeplinear.escape_time(s, 1.0, t1=10.0))
    h = 1e-4
    around = deeplinear.solve(s, t_star + h, save=af.TimeGrid([t_star - h, t_star + h]))["loss"]
    dL_dt = float(around[1] - around[0]) / (2 * h)
    grad = float(jax.grad(lambda th: deeplinear.escape_time(s, th, t1=10.0))(1.0))
    assert grad == pytest.approx(1.0 / dL_dt, rel=1e-6)
    assert float(jax.jit(lambda th: deeplinear.escape_time(s, th, t1=10.0))(1.0)) == pytest.approx(t_star, rel=1e-12)
    for grid in (np.array([1.0, 0.5]), np.array([0.25, 0.5])):
        res = af.sweep(lambda th: {"t": deeplinear.escape_time(s, th, t1=10.0)}, {"th": grid}, progress=False)
        assert np.all(np.isfinite(np.asarray(res["t"])))
    # a threshold on the wrong side of the start fails its point, not read as "not reached"
    with pytest.warns(RuntimeWarning, match="threshold must lie below the start value of 'loss'"):
        res = af.sweep(lambda th: deeplinear.escape_time(s, th, t1=10.0), {"th": np.array([1.0, 9.0])}, progress=False)
    assert res.status.tolist()[0] == 0 and res.status.tolist()[1] != 0
    missed = af.sensitivity(lambda eta: deeplinear.escape_time(s.replace(eta=eta), 0.25, t1=2.0), eta=1.0)
    assert np.isnan(float(missed.value)) and np.isnan(float(missed.grad["eta"]))
    fw = af.solver_for_mode("forward", deeplinear.DEFAULT_SOLVER)
    missed = af.sensitivity(
        lambda eta: deeplinear.escape_time(s.replace(eta=eta), 0.25, t1=2.0, solver=fw), mode="forward", eta=1.0
    )
    assert np.isnan(float(missed.grad["eta"]))
    own = jax.grad(lambda eta: deeplinear.escape_time(s.replace(eta=eta), 0.25, t1=2.0))(1.0)
    assert float(own) == 0.0  # a user's own jax.grad keeps the 0 that nanmean masks rely on


def test_crossing_time_of_a_rising_observable():
    """``rising=True``: the first time an observable rises to the threshold; heads' specialisation
    S(M) so gives `heads.escape_time`, and a falling threshold for it names the option."""
    from attnflow import heads

    s, bank = heads.Setup(), heads.BankOptions(n=256)
    t = af.crossing_time(heads.ode(s, bank=bank), "specialisation", 0.5, 60.0, rising=True)
    assert float(t) == pytest.approx(float(heads.escape_time(s, 0.5, bank=bank)), rel=1e-9)
    with pytest.raises(ValueError, match=r"must lie below the start value of 'specialisation'.*rising=True"):
        af.crossing_time(heads.ode(s, bank=bank), "specialisation", 0.5, 60.0)


@pytest.mark.parametrize(
    "verb, key, says",
    [
        ("heads.train", "batch", r"heads.Setup\(minibatch=\.\.\.\)"),
        ("heads.train", "dt", r"t = steps / D"),
        ("heads.solve", "initial", r"heads.Setup\(init=heads.Overlaps\(M, Q\)\)"),
        ("derive.train", "batch", r"derive.Setup\(\.\.\., minibatch=\.\.\.\)"),
        ("deeplinear.solve", "loss_target", r"deeplinear.escape_time\(setup, L, t1=\.\.\.\)"),
        ("focus.solve", "loss_target", r"obs\['loss'\] - L"),
        ("qkov.train", "D", r"qkov.Setup\(m=\.\.\., n=\.\.\., b=\.\.\., M=\.\.\.\)"),
        ("qkov.solve", "evnt", r"did you mean 'event'\?"),
        ("focus.train", "bach", r"did you mean 'batch'\?"),
    ],
)
def test_a_keyword_of_another_package_is_answered_with_this_ones_way(verb, key, says):
    """A keyword a verb does not take (one another package's verb takes, or a misspelling) raises
    TypeError before anything runs, naming the keyword, where this package has it (or the
    closest spelling), and the keywords the verb takes."""
    import importlib

    pkg, name = verb.split(".")
    fn = getattr(importlib.import_module(f"attnflow.{pkg}"), name)
    message = rf"{verb}\(\) got an unexpected keyword argument '{key}': .*{says}.*takes: setup, t1"
    with pytest.raises(TypeError, match=message):
        fn(None, 1.0, **{key: 1})
    assert list(inspect.signature(fn).parameters)[:2] == ["setup", "t1"]  # the verb's own signature


def test_focus_finite_figure_keeps_its_legends_off_the_data():
    """``focus-finite``'s figure: the stage markers (on all three panels) are named in one legend
    below the panels, outside every panel; the first panel's own legend crosses none of its curves,
    bands or markers (a legend of five long entries there hid the Stage I drop); the SGD entry has
    one pair of parentheses."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import attnflow.focus.experiments  # noqa: F401  (registers the experiments)
    from attnflow.registry import get_experiment

    small = {"m": 2, "mk": 2, "seeds": 2, "n_save": 10, "context": 32, "batch": 4, "dt": 0.2, "t_end": 40.0}
    rep = get_experiment("focus-finite").run(small, quiet=True)
    fig = rep.figures["flow_vs_sgd"]
    FigureCanvasAgg(fig).draw()
    row = "time of Stage I escape (log d plateau) from t = 0: predicted (R8) T_I, measured (SGD), ratio"
    t_sgd = rep.summary[row][1]
    (below,) = fig.legends
    assert [t.get_text() for t in below.get_texts()] == [
        "Stage I escape (log d plateau): theory (R8) t=15",
        f"Stage I escape (log d plateau): SGD t={t_sgd:.3g} (mean of 2)",
        "Stage II escape (H(pi) plateau): theory (R8) t=102 (off the axis)",  # t_end = 40
    ]
    box = below.get_window_extent()
    assert box.y0 >= 0 and not [ax for ax in fig.axes if box.overlaps(ax.get_window_extent())]
    for ax in fig.axes:
        inner = ax.get_legend()
        assert [t.get_text() for t in inner.get_texts()] == [
            "population flow: solve",
            "online SGD: train (mean, min-max of 2)",
        ]
    ax = fig.axes[0]
    inner = ax.get_legend().get_window_extent()
    drawn = [ln for ln in ax.lines if len(ln.get_xydata())] + list(ax.collections)
    assert len(drawn) == 8  # the flow, the SGD mean, Stage I's theory line, per seed a line and a triangle, the band
    hidden = []
    for artist in drawn:
        for path in artist.get_paths() if hasattr(artist, "get_paths") else [artist.get_path()]:
            if artist.get_transform().transform_path(path).intersects_bbox(inner, filled=False):
                hidden.append(artist.get_label())
    assert not hidden
