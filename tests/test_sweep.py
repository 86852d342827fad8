"""sweep: vmap == loop, sharding over 4 host devices, chunked resume (issue items 4, 6, 7)."""

import dataclasses
import enum
import functools
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from unittest import mock

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.deeplinear import mode_field
from attnflow.sweep import SweepError

S = jnp.array([3.0, 2.0, 1.0, 0.5])


def saxe_at(eta):
    """Mode strengths of the Saxe ODE with tau = 1/eta, on a step clock t in [0, 1500].

    Tight tolerances: vectorised and scalar XLA code differ in the last bit, which can flip
    one accept/reject decision of the adaptive controller; at rtol=1e-12 such a flip moves
    the solution by < 1e-13 (at rtol=1e-9 it moved 3 of 256 runs by ~2e-9).
    """
    tr = af.integrate(
        mode_field,
        jnp.full(4, 1e-3),
        1500.0,
        args={"s": S, "tau": 1.0 / eta},
        save=af.LinearGrid(16),
        solver=af.SolverOptions(rtol=1e-12, atol=1e-14),
    )
    return tr


ETAS = np.geomspace(1e-3, 5e-2, 256)


def test_sweep_256_learning_rates_equals_loop():
    res = af.sweep(lambda eta: saxe_at(eta), {"eta": ETAS}, progress=False)
    assert res.shape == (256,)
    assert isinstance(res.values, af.Trajectory) and res.values["y"].shape == (256, 16, 4)
    single = jax.jit(saxe_at)
    for i in range(0, 256, 1):
        tr = single(ETAS[i])
        np.testing.assert_allclose(res.values["y"][i], tr["y"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(res.values.ts[i], tr.ts, rtol=0, atol=0)
    # labelled access
    near = res.sel(eta=ETAS[17])
    np.testing.assert_array_equal(near["y"], res.values["y"][17])


def test_sweep_cartesian_grid_and_chunks():
    f = lambda a, b: {"sum": a + b, "prod": a * b * jnp.ones(3)}
    res = af.sweep(f, {"a": np.arange(5.0), "b": np.array([1.0, 10.0, 100.0])}, chunk_size=4, progress=False)
    assert res.dims == ("a", "b") and res.shape == (5, 3)
    a, b = np.meshgrid(np.arange(5.0), [1.0, 10.0, 100.0], indexing="ij")
    np.testing.assert_array_equal(res["sum"], a + b)
    np.testing.assert_array_equal(res["prod"], (a * b)[..., None] * np.ones(3))
    # chunk_size 4 rounds down to whole rows of the first axis (one row of 3): 5 nested chunks
    assert res.meta["nested"] and res.meta["n_chunks"] == 5 and res.meta["chunk_size"] == 3
    np.testing.assert_array_equal(res.sel(b=10.0)["sum"], np.arange(5.0) + 10)
    flat = af.sweep(
        f, {"a": np.arange(5.0), "b": np.array([1.0, 10.0, 100.0])}, chunk_size=4, nest=False, progress=False
    )
    assert not flat.meta["nested"] and flat.meta["n_chunks"] == 4
    np.testing.assert_array_equal(flat["prod"], res["prod"])
    # a chunk smaller than one row cannot nest: the default falls back to the flat layout
    assert not af.sweep(f, {"a": np.arange(5.0), "b": np.arange(3.0)}, chunk_size=2, progress=False).meta["nested"]


def test_nested_sweep_shares_work_across_axes():
    # A seed-only computation runs once per seed when nested, once per grid point when flat.
    calls = []

    def f(r, seed):
        x = jax.random.normal(jax.random.PRNGKey(seed), (3,))
        jax.debug.callback(lambda v: calls.append(1), x)
        return {"y": r * x}

    axes = {"r": np.geomspace(0.1, 10.0, 7), "seed": np.arange(4)}
    nested = af.sweep(f, axes, progress=False)
    n_nested = len(calls)
    calls.clear()
    flat = af.sweep(f, axes, nest=False, progress=False)
    assert (n_nested, len(calls)) == (4, 28)
    np.testing.assert_allclose(nested["y"], flat["y"], rtol=1e-15)
    for i, r in enumerate(axes["r"]):
        for j, seed in enumerate(axes["seed"]):
            np.testing.assert_allclose(
                nested["y"][i, j], r * jax.random.normal(jax.random.PRNGKey(seed), (3,)), rtol=1e-15
            )


def test_sweep_resumes_after_interruption(tmp_path):
    f = lambda eta: saxe_at(eta).final()["y"]
    etas = ETAS[:40]
    calls = []

    def interrupt_after_two(i, n):
        calls.append(i)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        af.sweep(f, {"eta": etas}, chunk_size=8, out_dir=tmp_path, progress=False, on_chunk=interrupt_after_two)
    saved = sorted(p.name for p in tmp_path.glob("chunk_*.npz"))
    assert saved == ["chunk_00000.npz", "chunk_00001.npz"]
    recomputed = []
    res = af.sweep(
        f, {"eta": etas}, chunk_size=8, out_dir=tmp_path, progress=False, on_chunk=lambda i, n: recomputed.append(i)
    )
    assert recomputed == [2, 3, 4]  # finished chunks were loaded, not recomputed
    assert res.meta["computed_chunks"] == 3
    full = af.sweep(f, {"eta": etas}, chunk_size=8, progress=False)
    np.testing.assert_array_equal(res.values, full.values)
    # a different grid in the same folder is refused, not silently mixed
    with pytest.raises(
        ValueError, match="different sweep: the values of axis 'eta' changed, first at index 0: saved 0.001, now 0.002"
    ):
        af.sweep(f, {"eta": etas * 2}, chunk_size=8, out_dir=tmp_path, progress=False)


_SCALE = 1.0


def _times_scale(eta):
    return eta * _SCALE


def test_resume_refuses_another_function(tmp_path):
    # same grid, same output shapes, other function: the old chunks must not come back
    def a2(eta):
        return {"a2": eta**2}

    def w(eta):
        return {"w": eta**3}

    grid = {"eta": np.arange(1.0, 5.0)}
    af.sweep(a2, grid, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"the function \(its code, or the values it reads\) changed: its code \("):
        af.sweep(w, grid, out_dir=tmp_path, progress=False)
    # a closure over another value is another function
    scale = 2.0
    af.sweep(lambda eta: eta * scale, grid, out_dir=tmp_path / "c", progress=False)
    scale = 3.0
    with pytest.raises(ValueError, match="the function"):
        af.sweep(lambda eta: eta * scale, grid, out_dir=tmp_path / "c", progress=False)
    # a module-level value the function reads is part of it too
    global _SCALE
    _SCALE = 2.0
    af.sweep(_times_scale, grid, out_dir=tmp_path / "g", progress=False)
    _SCALE = 3.0
    with pytest.raises(ValueError, match="the function"):
        af.sweep(_times_scale, grid, out_dir=tmp_path / "g", progress=False)
    # the same function again resumes (and a manifest that is not JSON is named)
    assert af.sweep(lambda eta: eta * scale, grid, out_dir=tmp_path / "d", progress=False).meta["computed_chunks"] == 1
    again = af.sweep(lambda eta: eta * scale, grid, out_dir=tmp_path / "d", progress=False)
    assert again.meta["computed_chunks"] == 0 and np.allclose(again.values, 3.0 * grid["eta"])
    (tmp_path / "d" / "sweep.json").write_text("{garbage")
    with pytest.raises(ValueError, match=r"sweep.json is not a sweep manifest"):
        af.sweep(lambda eta: eta * scale, grid, out_dir=tmp_path / "d", progress=False)


def _blowup(t, y, a):
    return a["k"] * y**2


def test_one_diverging_point_does_not_kill_the_sweep():
    # y' = k y^2 from y = 1 blows up at t = 1/k: k = 2 diverges before t1 = 1, the others do not
    ks = np.array([0.25, 0.5, 2.0, 0.75])
    f = lambda k: af.integrate(
        _blowup, jnp.ones(1), 1.0, args={"k": k}, save=af.LinearGrid(2), solver=af.SolverOptions(max_steps=500)
    )["y"][-1, 0]
    with pytest.warns(RuntimeWarning, match=r"1 of 4 grid points failed: k=2.0: integrate: solver failed"):
        res = af.sweep(f, {"k": ks}, progress=False)
    np.testing.assert_allclose(np.asarray(res.values)[[0, 1, 3]], 1.0 / (1.0 - ks[[0, 1, 3]]), rtol=1e-7)
    assert np.isnan(res.values[2]) and list(res.ok) == [True, True, False, True]
    ((point, message),) = res.failures()
    assert point == {"k": 2.0} and "max_steps=500" in message
    with pytest.raises(SweepError, match="k=2.0"):
        af.sweep(f, {"k": ks}, progress=False, on_error="raise")


def test_a_diverging_point_under_jvp_vmap_or_grad_fails_alone():
    """Inside a sweep point, a failure traced under ``jax.jvp``, a ``vmap`` of the user's or
    reverse mode marks the point failed, as without them (it raised, stopping the sweep; a
    reverse-mode derivative alone read 0 at the failed point). y' = k y^2, y(0) = 1: y(1) =
    1 / (1 - k), dy(1)/dk = 1 / (1 - k)^2; k = 2 diverges before t = 1."""
    ks = np.array([0.25, 2.0, 0.5])
    good = np.array([True, False, True])

    def end(k, mode="forward"):
        solver = af.solver_for_mode(mode, af.SolverOptions(max_steps=500))
        return af.integrate(_blowup, jnp.ones(1), 1.0, args={"k": k}, save=af.LinearGrid(2), solver=solver)["y"][-1, 0]

    cases = {
        "jvp": lambda k: jax.jvp(end, (k,), (jnp.ones_like(k),)),
        "tangent only": lambda k: jax.jvp(end, (k,), (jnp.ones_like(k),))[1],
        "vmap inside": lambda k: jax.vmap(end)(jnp.stack([k, 0.25 * k])),  # the point fails if a lane does
        "grad only": lambda k: jax.grad(functools.partial(end, mode="reverse"))(k),
    }
    values = {"jvp": (1 / (1 - ks), 1 / (1 - ks) ** 2), "tangent only": 1 / (1 - ks) ** 2}
    values["vmap inside"] = np.stack([1 / (1 - ks), 1 / (1 - 0.25 * ks)], axis=1)
    values["grad only"] = 1 / (1 - ks) ** 2
    for name, fn in cases.items():
        with pytest.warns(RuntimeWarning, match=r"1 of 3 grid points failed: k=2.0: integrate: solver failed"):
            res = af.sweep(fn, {"k": ks}, progress=False)
        assert res.ok.tolist() == good.tolist(), name
        assert res.failures()[0][0] == {"k": 2.0} and "max_steps=500" in res.failures()[0][1], name
        for got, want in zip(jax.tree_util.tree_leaves(res.values), jax.tree_util.tree_leaves(values[name])):
            np.testing.assert_allclose(np.asarray(got)[good], want[good], rtol=1e-6, err_msg=name)
            assert np.all(np.isnan(np.asarray(got)[~good])), name
    with pytest.raises(RuntimeError, match="integrate: solver failed"):  # called directly, it still raises
        jax.block_until_ready(jax.jvp(end, (2.0,), (1.0,)))
    # inside the user's own jit (or scan, cond, custom_jvp, checkpoint) the failure cannot be kept
    # to its point: a SweepError names the chunk's points and the run's own message
    inside = r"chunk 0 \(k in \[0.25, 0.5, 2.0\]\) failed inside a jax.jit.*max_steps=500"
    with pytest.raises(af.SweepError, match=inside):
        af.sweep(jax.jit(end), {"k": ks}, progress=False)
    # the same from a later chunk, whose program is already compiled (it raises another type)
    with pytest.raises(af.SweepError, match=r"chunk 1 \(k in \[2.0\]\) failed inside a jax.jit"):
        af.sweep(jax.jit(end), {"k": ks}, progress=False, chunk_size=1)


def test_sweep_bad_input():
    f = lambda a, b: a * b
    said = "sweep: axes must be a non-empty dict name -> values, as {'eta': etas, 'seed': seeds}; got "
    with pytest.raises(ValueError) as err:
        af.sweep(lambda: 0.0, {})
    assert str(err.value) == said + "{}"
    with pytest.raises(ValueError) as err:  # a list of pairs: not read as axis names
        af.sweep(f, [("a", [1.0]), ("b", [2.0])])
    assert str(err.value) == said + "[('a', [1.0]), ('b', [2.0])]"
    with pytest.raises(ValueError) as err:
        af.sweep(f, {"a": [[1.0, 2.0], [3.0]], "b": [1.0]})
    assert str(err.value) == (
        "sweep axis 'a' must be a non-empty 1-D array of values, got nested lists of different lengths: "
        "[[1.0, 2.0], [3.0]]"
    )
    with pytest.raises(ValueError) as err:
        af.sweep(lambda **kw: 0.0, {0: [1.0], "b": [1.0]})
    assert str(err.value) == (
        "sweep: axis name 0 (int) is not a string: fn receives each axis as a keyword argument named after it"
    )
    with pytest.raises(ValueError, match="'eta'"):
        af.sweep(lambda eta: eta, {"eta": np.array([1.0, np.nan])})
    with pytest.raises(ValueError, match="chunk_size"):
        af.sweep(lambda eta: eta, {"eta": np.ones(3)}, chunk_size=0)
    with pytest.raises(ValueError, match="nest must be.*'yes'"):
        af.sweep(lambda eta: eta, {"eta": np.ones(3)}, nest="yes")
    with pytest.raises(ValueError, match="on_error"):
        af.sweep(lambda eta: eta, {"eta": np.ones(3)}, on_error="ignore")
    with pytest.raises(TypeError, match="fn must be callable"):
        af.sweep("f", {"eta": np.ones(3)})


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.deeplinear import mode_field
    S = jnp.array([3.0, 2.0, 1.0, 0.5])
    etas = np.geomspace(1e-3, 5e-2, 64)
    f = lambda eta: af.integrate(mode_field, jnp.full(4, 1e-3), 1500.0, args={"s": S, "tau": 1.0 / eta},
                                 save=af.LinearGrid(8), solver=af.SolverOptions(rtol=1e-9, atol=1e-12))["y"]
    res = af.sweep(f, {"eta": etas}, chunk_size=32, progress=False)
    np.save(sys.argv[1], np.asarray(res.values))
    # a nested 2-D grid: blocks of the first axis split over the devices
    g = af.sweep(lambda a, b: a * 10.0 + b, {"a": np.arange(6.0), "b": np.arange(3.0)}, chunk_size=7, progress=False)
    ok = bool(np.all(np.asarray(g.values) == np.arange(6.0)[:, None] * 10 + np.arange(3.0)))
    # an integrate with a terminating event does not trace under shard_map (equinox's closure
    # conversion in the event root find): the sweep falls back to jit sharding and says so
    import warnings
    ev = lambda eta: af.integrate(mode_field, jnp.full(4, 1e-3), 1500.0, args={"s": S, "tau": 1.0 / eta},
                                  save=af.LinearGrid(2), event=lambda t, y, a: y[0] - 1.5).ts[-1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = af.sweep(ev, {"eta": etas[:8]}, progress=False)
        e = af.sweep(ev, {"eta": etas[:8]}, progress=False)  # remembered: no second warning
    fallback = [str(w.message)[:40] for w in caught if "shard_map" in str(w.message)]
    np.save(sys.argv[1].replace(".npy", "_event.npy"), np.asarray(e.values))
    # each device runs its own adaptive loop: no cross-device op (the stopping test of the
    # vmapped while loop would otherwise be an all-reduce at every step)
    from attnflow.sweep import _CACHE
    compiled = next(c for k, (c, _) in _CACHE.items() if getattr(k[0], "obj", k[0]) is f)
    hlo = compiled.lower({"eta": jnp.asarray(etas[:32])}).compile().as_text()
    collectives = sum(hlo.count(op + "(") for op in ("all-reduce", "all-gather", "collective-permute", "all-to-all"))
    print(json.dumps({"device_count": jax.device_count(), "devices_used": res.meta["devices_used"],
                      "nested_devices": g.meta["devices_used"], "nested_ok": ok, "collectives": collectives,
                      "shard_map": [res.meta["shard_map"], e.meta["shard_map"]], "fallback_warnings": len(fallback)}))
    """
)


def test_sweep_shards_over_four_host_devices(tmp_path):
    script = tmp_path / "sharded.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "y.npy")], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {
        "device_count": 4,
        "devices_used": 4,
        "nested_devices": 4,
        "nested_ok": True,
        "collectives": 0,
        "shard_map": [True, False],
        "fallback_warnings": 1,
    }
    sharded = np.load(tmp_path / "y.npy")
    etas = np.geomspace(1e-3, 5e-2, 64)
    f = lambda eta: af.integrate(
        mode_field,
        jnp.full(4, 1e-3),
        1500.0,
        args={"s": S, "tau": 1.0 / eta},
        save=af.LinearGrid(8),
        solver=af.SolverOptions(rtol=1e-9, atol=1e-12),
    )["y"]
    one = af.sweep(f, {"eta": etas}, chunk_size=32, progress=False)
    assert one.meta["n_devices"] == jax.device_count()
    np.testing.assert_allclose(sharded, one.values, rtol=1e-12, atol=1e-14)
    # the event time of u_1 = s_1 / 2 from the closed form: t = tau ln((s/u0 - 1)) / (2 s)
    t_event = np.load(tmp_path / "y_event.npy")
    tau = 1.0 / etas[:8]
    np.testing.assert_allclose(t_event, tau * np.log(3.0 / 1e-3 - 1.0) / 6.0, rtol=1e-6)


def test_sweep_of_an_integrate_with_an_event_on_one_device():
    """The event root find (equinox closure conversion) inside the vmapped sweep; the
    crossing time of u_1 = s_1 / 2 against the closed form tau ln(s / u0 - 1) / (2 s)."""
    etas = np.geomspace(1e-3, 5e-2, 6)
    ev = lambda eta: af.integrate(
        mode_field,
        jnp.full(4, 1e-3),
        1500.0,
        args={"s": S, "tau": 1.0 / eta},
        save=af.LinearGrid(2),
        event=lambda t, y, a: y[0] - 1.5,
    ).ts[-1]
    res = af.sweep(ev, {"eta": etas}, progress=False, devices=jax.devices()[:1])
    assert res.meta["shard_map"] is False
    np.testing.assert_allclose(res.values, np.log(3.0 / 1e-3 - 1.0) / (6.0 * etas), rtol=1e-6)


def test_a_users_own_jit_inside_a_sweep_keeps_its_errors_inside():
    import equinox as eqx
    import optax

    @eqx.filter_jit
    def run(lr):
        return af.simulate(
            lambda p, _: jnp.sum(p["w"] ** 2), {"w": jnp.ones(2)}, optax.sgd(lr), 20, save=af.LinearGrid(2)
        )["loss"][-1]

    res = af.sweep(run, {"lr": np.array([0.1, 0.2])}, progress=False)
    np.testing.assert_allclose(res.values, 2.0 * (1 - 2 * np.array([0.1, 0.2])) ** 40, rtol=1e-10)


# ----------------------------------------------------------------------------- Static axes
def _sized(D, a, b=0.0):
    # D sets a shape: only a Python int works here
    x = jnp.arange(D, dtype=jnp.float32)
    return {"s": a * jnp.sum(x) + b, "v": jnp.stack([a, b * D])}


def test_static_axis_loops_over_shapes_and_keeps_the_axis_order(tmp_path):
    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0])
    res = af.sweep(_sized, {"a": a, "D": af.Static([4, 10]), "b": b}, progress=False)
    assert res.dims == ("a", "D", "b") and res.shape == (3, 2, 2)
    assert res["s"].shape == (3, 2, 2) and res["v"].shape == (3, 2, 2, 2)
    for i, x in enumerate(a):
        for j, D in enumerate((4, 10)):
            for k, y in enumerate(b):
                assert float(res["s"][i, j, k]) == pytest.approx(x * D * (D - 1) / 2 + y)
                np.testing.assert_allclose(np.asarray(res["v"][i, j, k]), [x, y * D])
    assert float(res.sel(a=2.0, D=10, b=-1.0)["s"]) == pytest.approx(2.0 * 45 - 1.0)
    assert res.meta["n_programs"] == 2 and res.meta["static_axes"] == ["D"]
    # with an out_dir each static point is its own resumable sweep; a rerun loads every chunk
    first = af.sweep(_sized, {"D": af.Static([4, 10]), "a": a}, out_dir=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D=10", "D=4"]
    again = af.sweep(_sized, {"D": af.Static([4, 10]), "a": a}, out_dir=tmp_path, progress=False)
    assert again.meta["computed_chunks"] == 0
    np.testing.assert_array_equal(np.asarray(first["s"]), np.asarray(again["s"]))
    # only static axes: one program per point
    only = af.sweep(lambda D: jnp.sum(jnp.ones(D)), {"D": af.Static([2, 3, 5])}, progress=False)
    np.testing.assert_allclose(np.asarray(only.values), [2.0, 3.0, 5.0])


_STATIC_LR = 0.1


def test_a_static_sweep_of_the_same_fn_does_not_retrace_and_names_what_changed(tmp_path):
    """A second sweep of the same function object with a Static axis reuses each static value's
    trace (it retraced every time), and a refused resume names the user's global, not the
    internal partial's "argument 0"."""
    global _STATIC_LR
    traces = mock.Mock()  # counts calls, and (a library's object) counts by its class in the fingerprint

    def fn(D, r):
        traces(D)
        return r * _STATIC_LR * jnp.ones(D).sum()

    axes = {"D": af.Static([2, 3]), "r": np.arange(3.0)}
    for out_dir in (None, tmp_path):
        traces.reset_mock()
        for _ in range(3):
            res = af.sweep(fn, axes, out_dir=out_dir, progress=False)
            np.testing.assert_allclose(res.values, 0.1 * np.array([[0.0, 2.0, 4.0], [0.0, 3.0, 6.0]]))
        # one trace per static value for all three sweeps (with an out_dir the fingerprint is part
        # of the compile key: one trace more than without, at its first sweep)
        assert [c.args for c in traces.call_args_list] == [(2,), (3,)]
    try:
        _STATIC_LR = 0.2
        with pytest.raises(ValueError) as err:
            af.sweep(fn, axes, out_dir=tmp_path, progress=False)
    finally:
        _STATIC_LR = 0.1
    assert str(err.value) == (
        f"sweep: {tmp_path / 'D=2'} holds a different sweep: the function (its code, or the values it reads) "
        "changed: global '_STATIC_LR' (against the saved sweep's); its chunks are not reused. Use a fresh out_dir "
        "or delete the old one"
    )


def test_static_axis_rejects_bad_values_and_shape_changes():
    with pytest.raises(ValueError, match="distinct"):
        af.Static([3, 3])
    with pytest.raises(ValueError, match="at least one value"):
        af.Static([])
    with pytest.raises(ValueError, match="numbers or strings"):
        af.Static([[1, 2]])
    with pytest.raises(ValueError, match="same shapes for every Static value"):
        af.sweep(lambda D, a: a * jnp.ones(D), {"D": af.Static([2, 3]), "a": np.ones(2)}, progress=False)


def test_a_size_axis_without_static_is_named_with_the_way_out():
    """A shape or scan length from a traced axis: JAX's own error (same type, so a user's
    ``except`` still catches it) carries a note naming the traced axes and af.Static; an error
    of fn's that is not about a traced value gets no note."""

    def size(D, r):
        return r * jnp.ones(D).sum()

    def steps(r, n_steps):
        return jax.lax.scan(lambda x, _: (x * r, None), 1.0, None, length=n_steps)[0]

    way_out = (
        "reach fn traced (one compiled program covers all their values). If the value JAX needed concrete comes "
        "from one of them (a size, a scan length, a step count, a Python branch), wrap that axis in "
        "af.Static([...]), one compiled program per value: "
    )
    with pytest.raises(TypeError, match="Shapes must be 1D sequences of concrete values") as err:
        af.sweep(size, {"D": np.array([2, 3]), "r": np.arange(2.0)}, progress=False)
    assert err.value.__notes__[0] == f"attnflow.sweep: the axes 'D', 'r' {way_out}{{'D': af.Static([...])}}"
    with pytest.raises(jax.errors.ConcretizationTypeError) as err:
        af.sweep(steps, {"r": np.array([2.0]), "n_steps": np.array([1, 2])}, progress=False)
    assert err.value.__notes__[0] == (
        f"attnflow.sweep: the axes 'r', 'n_steps' {way_out}{{'n_steps': af.Static([...])}}"
    )
    # the same axis in af.Static runs, and another TypeError of fn's is left as it is
    res = af.sweep(steps, {"r": np.array([2.0]), "n_steps": af.Static([1, 3])}, progress=False)
    np.testing.assert_array_equal(res.values, [[2.0, 8.0]])
    with pytest.raises(TypeError, match="^unsupported operand") as err:
        af.sweep(lambda r: r + "x", {"r": np.arange(2.0)}, progress=False)
    assert not [n for n in getattr(err.value, "__notes__", []) if "attnflow.sweep" in n]


def test_static_axis_merges_the_metadata_of_returned_trajectories():
    """``train`` records its step count and ``dt`` (heads and derive: ``D``) in the metadata, which
    is pytree structure: a Static sweep over ``dt`` returning the runs stacks them, with the entries
    that differ as lists over the static values (it raised after computing every point)."""
    from attnflow import deeplinear as dl

    s = dl.Setup()
    res = af.sweep(
        lambda dt, eta: dl.train(s.replace(eta=eta), 0.5, dt=dt, save=af.LinearGrid(3)),
        {"dt": af.Static([0.01, 0.02]), "eta": np.array([0.5, 1.0])},
        progress=False,
    )
    assert res.values.batch_shape == (2, 2)
    assert res.values.meta["dt"] == [0.01, 0.02] and res.values.meta["steps"] == [50, 25]
    assert res.values.meta["theory"] == "deeplinear"  # equal entries stay as they are
    one = dl.train(s.replace(eta=1.0), 0.5, dt=0.02, save=af.LinearGrid(3))
    np.testing.assert_allclose(res.values.batch((1, 1))["loss"], one["loss"], rtol=1e-12)
    with pytest.raises(ValueError, match="different structure at"):
        af.sweep(
            lambda D: af.Trajectory(jnp.arange(2.0), {"a" if D == 1 else "b": jnp.zeros(2)}),
            {"D": af.Static([1, 2])},
            progress=False,
        )


def test_axis_names_that_fn_cannot_take_raise_before_computing():
    with pytest.raises(ValueError, match=r"axis names as keywords \(seed\), but fn\(k\) does not accept them"):
        af.sweep(lambda k: k, {"seed": np.arange(3)}, progress=False)
    # defaults and **kwargs are fine
    assert af.sweep(lambda seed, scale=2: seed * scale, {"seed": np.arange(3)}, progress=False).values.tolist() == [
        0,
        2,
        4,
    ]
    assert af.sweep(lambda **p: p["seed"], {"seed": np.arange(2)}, progress=False).values.tolist() == [0, 1]


def test_a_value_a_setup_refuses_fails_its_sweep_point(tmp_path):
    from attnflow import deeplinear as dl

    s = dl.Setup()

    def final(eta):
        return dl.solve(s.replace(eta=eta), 2.0, save=af.LinearGrid(2)).final()["loss"]

    with pytest.warns(RuntimeWarning, match="1 of 3 grid points failed"):
        res = af.sweep(final, {"eta": np.array([1.0, -1.0, 2.0])}, progress=False)
    assert res.failures() == [({"eta": -1.0}, "eta (learning rate) must be finite and positive")]
    values = np.asarray(res.values)
    assert np.isnan(values[1]) and np.all(np.isfinite(values[[0, 2]]))
    np.testing.assert_allclose(values[0], float(final(1.0)), rtol=1e-12)
    with pytest.raises(af.SweepError, match="eta = -1.0|eta=-1.0"):
        af.sweep(final, {"eta": np.array([-1.0])}, progress=False, on_error="raise")


def test_sel_refuses_values_off_the_grid_and_meta_changes_are_named(tmp_path):
    res = af.sweep(lambda a, b: a + b, {"a": np.array([0.5, 1.0]), "b": np.array([1.0, 2.0, 3.0])}, progress=False)
    with pytest.warns(UserWarning, match=r"a = 0.6 is not on the sweep's axis a: taking the nearest point, a = 0.5"):
        assert float(res.sel(a=0.6, b=3.0)) == 3.5  # nearest inside the range
    r32 = af.sweep(lambda eta: 2 * eta, {"eta": jnp.linspace(0.1, 0.7, 3)}, progress=False)  # float32 axis
    assert float(r32.sel(eta=0.7)) == pytest.approx(1.4)
    with pytest.raises(ValueError, match=r"a = 100 is outside the sweep's axis a \(from 0.5 to 1\)"):
        res.sel(a=100.0)
    grid = {"eta": np.array([1.0, 2.0])}
    af.sweep(_times_scale, grid, out_dir=tmp_path, progress=False, meta={"options": {"taus": [1.0, 2.0], "n": 3}})
    with pytest.raises(ValueError, match=r"other settings: options.taus: \[1.0, 2.0\] vs \[1.0\]"):
        af.sweep(_times_scale, grid, out_dir=tmp_path, progress=False, meta={"options": {"taus": [1.0], "n": 3}})


def test_a_refused_resume_names_the_axis_that_changed(tmp_path):
    """Not two truncated texts of the first axis: the axis that changed, where, in full precision."""
    a = np.linspace(0, 1, 40)
    f = lambda a, b=1.0, c=1.0: a * b * c
    af.sweep(f, {"a": a, "b": np.array([1.0, 2.0, 0.1 + 0.2])}, out_dir=tmp_path, progress=False)
    rest = "; its chunks are not reused. Use a fresh out_dir or delete the old one"
    cases = [
        (
            {"a": a, "b": np.array([1.0, 2.0, 0.3])},
            "the values of axis 'b' changed, first at index 2: saved 0.30000000000000004, now 0.3",
        ),
        (
            {"a": a[:-1], "b": np.array([1.0, 2.0, 0.3])},
            "axis 'a' has 39 values, the saved sweep 40 (saved [0.0, 0.02564102564102564, ..., 1.0], now "
            "[0.0, 0.02564102564102564, ..., 0.9743589743589743])",
        ),
        ({"a": a, "c": np.array([1.0])}, "the axes changed (saved ['a', 'b'], now ['a', 'c']: 'c' added; 'b' removed)"),
        (
            {"b": np.array([1.0, 2.0, 0.3]), "a": a},
            "the axes changed (saved ['a', 'b'], now ['b', 'a']: another order)",
        ),
    ]
    for axes, said in cases:
        with pytest.raises(ValueError) as err:
            af.sweep(f, axes, out_dir=tmp_path, progress=False)
        assert str(err.value) == f"sweep: {tmp_path} holds a different sweep: {said}{rest}"


def test_sweep_result_saves_and_loads_whole(tmp_path):
    from attnflow._errors import fail_if

    ts = jnp.linspace(0.0, 1.0, 4)

    def fn(a, seed):
        traj = af.Trajectory(ts, {"y": a * ts + seed, "v": jnp.stack([ts, -ts], 1)}, {"model": "toy"})
        bad = fail_if(a, a > 2.5, "a too large")  # the last grid point fails
        return {"traj": traj, "pair": (bad, jnp.arange(3.0) * a), "none": None}

    with pytest.warns(RuntimeWarning, match="2 of 6 grid points failed"):
        res = af.sweep(fn, {"a": np.array([1.0, 2.0, 3.0]), "seed": np.arange(2)}, progress=False, meta={"run": 7})
    path = res.save(tmp_path / "grid")
    assert path.name == "grid.npz" and (tmp_path / "grid.json").exists()
    back = af.SweepResult.load(tmp_path / "grid")
    assert back.dims == ("a", "seed") and back.shape == (3, 2) and back.meta["run"] == 7
    np.testing.assert_array_equal(back.coords["a"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(back.status, res.status)
    assert back.failures() == res.failures() and back.failures()[0][1] == "a too large"
    assert isinstance(back.values["traj"], af.Trajectory) and back.values["traj"].meta["model"] == "toy"
    np.testing.assert_array_equal(back.values["traj"]["y"], res.values["traj"]["y"])
    assert isinstance(back.values["pair"], tuple) and back.values["none"] is None
    np.testing.assert_array_equal(back.sel(a=2.0, seed=1)["pair"][1], [0.0, 2.0, 4.0])
    mean = back.values["traj"].mean(axis=1)
    np.testing.assert_allclose(mean["y"][0], ts + 0.5)
    assert bool(np.all(np.isnan(mean["y"][2]))) and bool(np.all(np.isnan(mean.ts[2])))  # the failed row
    with pytest.raises(FileNotFoundError, match="no saved sweep result"):
        af.SweepResult.load(tmp_path / "nothing")
    (tmp_path / "grid.json").write_text("[1]")
    with pytest.raises(ValueError, match="is not a sweep result saved by attnflow"):
        af.SweepResult.load(path)


def test_sweep_result_load_of_float64_trajectories_without_x64_warns_as_trajectory_load(tmp_path):
    """SweepResult.load rounded float64 trajectories to float32 without a word (a 2e-10 effect
    read as 0) where Trajectory.load warns: the same warning, naming the arrays by their path;
    array leaves, axes and statuses stay NumPy arrays, as saved."""
    ts = np.linspace(0.0, 1.0, 5)
    traj = af.Trajectory(np.stack([ts, ts]), {"u": 1 + 1e-10 * np.outer([1.0, 2.0], ts)}, t_event=np.array([0.5, 0.7]))
    res = af.SweepResult(("rate",), {"rate": np.array([1.0, 2.0])}, {"run": traj, "final": np.array([1 / 3, 2 / 3])})
    path = res.save(tmp_path / "sw64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = af.SweepResult.load(path)
    assert float(back.values["run"]["u"][1, -1]) - 1 == pytest.approx(2e-10, rel=1e-6)
    said = (
        rf"^{re.escape(str(path))} holds float64 arrays \(run.ts, run.u, run.t_event\) but JAX's 64-bit mode is "
        r"off, so they load as float32 \(rounded to about 7 digits\): call attnflow.enable_x64\(\) at the start "
        r"of the program, or load inside `with jax.enable_x64\(True\):`, to keep float64 \(np.load reads the "
        r"file as saved\)$"
    )
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match=said) as seen:
            low = af.SweepResult.load(path)
        assert len(seen) == 1 and seen[0].filename == __file__
        assert low.values["run"]["u"].dtype == np.float32 and float(low.values["run"]["u"][1, -1]) == 1.0
        assert low.values["final"].dtype == np.float64 and low.coords["rate"].dtype == np.float64
        # a float32 sweep loses nothing: no warning
        p32 = af.SweepResult(("rate",), res.coords, af.Trajectory(ts.astype(np.float32), {"u": ts.astype(np.float32)}))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert af.SweepResult.load(p32.save(tmp_path / "sw32")).values["u"].dtype == np.float32


def test_a_sweep_point_with_bad_solve_inputs_fails_alone():
    """Traced t1 <= t0, save times past t1 and a NaN start fail their own point, named, while
    the others run (integrate checks traced inputs in the program)."""

    def decay(t, y, a):
        return -y

    def to(t1):
        return af.integrate(decay, 1.0, t1, save=af.LinearGrid(3))["y"][-1]

    def saved(t1):
        return af.integrate(decay, 1.0, t1, save=af.TimeGrid([0.0, 1.0, 2.0]))["y"][-1]

    def start(k):
        return af.integrate(decay, jnp.sqrt(k), 1.0, save=af.LinearGrid(2))["y"][-1]

    cases = [
        (to, {"t1": np.array([1.0, -1.0])}, "t1 must be greater than t0"),
        (saved, {"t1": np.array([3.0, 1.5])}, "save times must rise within"),
        (start, {"k": np.array([1.0, -1.0])}, "the initial state y0 is not finite"),
    ]
    for fn, axes, message in cases:
        with pytest.warns(RuntimeWarning, match="1 of 2 grid points failed"):
            res = af.sweep(fn, axes, progress=False)
        ((point, why),) = res.failures()
        ((name, values),) = axes.items()
        assert message in why and point == {name: float(values[1])}
        assert np.isnan(res.values[1]) and np.isfinite(res.values[0])
    np.testing.assert_allclose(af.sweep(to, {"t1": np.array([1.0])}, progress=False).values, [np.exp(-1.0)], rtol=1e-7)


# ----------------------------------------------------------------------------- resume: what the fingerprint reads
class _Slotted:
    __slots__ = ("t1",)

    def __init__(self, t1):
        self.t1 = t1


def test_resume_reads_settings_held_by_plain_objects(tmp_path):
    import argparse

    grid = {"eta": np.array([1.0, 2.0])}
    args = argparse.Namespace(t1=2.0)
    slots = _Slotted(1.0)

    def fn(eta):
        return eta * args.t1 + slots.t1

    assert af.sweep(fn, grid, out_dir=tmp_path, progress=False).meta["computed_chunks"] == 1
    assert af.sweep(fn, grid, out_dir=tmp_path, progress=False).meta["computed_chunks"] == 0  # same values: reused
    args.t1 = 4.0  # a setting read through the object changed: the old chunks must not come back
    with pytest.raises(ValueError, match=r"the function .* changed: closure value 'args' \(against the saved"):
        af.sweep(fn, grid, out_dir=tmp_path, progress=False)
    args.t1, slots.t1 = 2.0, 3.0  # the same through __slots__
    with pytest.raises(ValueError, match="the function .* changed"):
        af.sweep(fn, grid, out_dir=tmp_path, progress=False)
    args.me = args  # an object that holds itself is read once
    slots.t1 = 1.0
    res = af.sweep(lambda eta: eta * args.t1, grid, out_dir=tmp_path / "cycle", progress=False)
    np.testing.assert_array_equal(res.values, [2.0, 4.0])


class _ClassSettings:
    t1 = 2.0
    unread = 1


class _DerivedSettings(_ClassSettings):
    pass


def test_resume_reads_settings_held_by_a_users_class(tmp_path):
    """A setting held by the user's own class (``Cfg.t1``), or as an instance's class-level
    default, counts like an instance's attribute; an attribute the code does not name does not."""
    grid = {"eta": np.array([1.0, 2.0])}
    inst = _DerivedSettings()

    def by_class(eta):
        return eta * _ClassSettings.t1

    def by_instance(eta):
        return eta * inst.t1

    for k, fn in enumerate((by_class, by_instance)):
        out = tmp_path / f"runs{k}"
        try:
            assert af.sweep(fn, grid, out_dir=out, progress=False).meta["computed_chunks"] == 1
            _ClassSettings.unread = 2  # not named by the code
            assert af.sweep(fn, grid, out_dir=out, progress=False).meta["computed_chunks"] == 0
            _ClassSettings.t1 = 4.0  # inherited by the instance's class
            with pytest.raises(ValueError, match="the function .* changed"):
                af.sweep(fn, grid, out_dir=out, progress=False)
            res = af.sweep(fn, grid, out_dir=tmp_path / f"fresh{k}", progress=False)
            np.testing.assert_array_equal(res.values, [4.0, 8.0])
        finally:
            _ClassSettings.t1, _ClassSettings.unread = 2.0, 1


class _Runner:
    t1 = 2.0

    def run(self, x):
        return x * self.t1


class _Mode(enum.Enum):
    A = 1
    B = 2


class _Nested:
    class Inner:
        k = 1


def test_fingerprint_reads_settings_through_methods_nested_classes_and_enums():
    """What a method of the user's class reads from self (model.run reading self.t1), a setting of a
    nested class (Cfg.Inner.k) and an enum member count; the same values give the same fingerprint."""
    from attnflow.sweep import _fingerprint

    model = _Runner()
    settings = {"mode": _Mode.A}

    def fn(x):
        return model.run(x) + _Nested.Inner.k + (settings["mode"] is _Mode.A)

    before = _fingerprint(fn)
    assert _fingerprint(fn) == before
    for change, undo in (
        (lambda: setattr(_Runner, "t1", 4.0), lambda: setattr(_Runner, "t1", 2.0)),
        (lambda: setattr(_Nested.Inner, "k", 2), lambda: setattr(_Nested.Inner, "k", 1)),
        (lambda: settings.update(mode=_Mode.B), lambda: settings.update(mode=_Mode.A)),
    ):
        change()
        try:
            assert _fingerprint(fn) != before
        finally:
            undo()
        assert _fingerprint(fn) == before


def test_resume_reads_settings_of_the_users_own_modules(tmp_path, monkeypatch):
    """``cfg.T1`` read from the user's own module (a config.py) counts like an object's setting;
    a module's other attributes and a library's modules do not."""
    import importlib

    (tmp_path / "af_test_cfg.py").write_text("T1 = 2.0\nOTHER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = importlib.import_module("af_test_cfg")
    grid = {"eta": np.array([1.0, 2.0])}

    def fn(eta):
        return eta * cfg.T1 + np.sqrt(4.0)

    out = tmp_path / "runs"
    assert af.sweep(fn, grid, out_dir=out, progress=False).meta["computed_chunks"] == 1
    cfg.OTHER = 2  # not read by fn
    assert af.sweep(fn, grid, out_dir=out, progress=False).meta["computed_chunks"] == 0
    cfg.T1 = 4.0
    with pytest.raises(ValueError, match=r"the function .* changed: closure value 'cfg'"):
        af.sweep(fn, grid, out_dir=out, progress=False)
    res = af.sweep(fn, grid, out_dir=tmp_path / "fresh", progress=False)
    np.testing.assert_array_equal(res.values, [6.0, 10.0])
    # two functions of the user's reading different attributes of one module: each attribute counts
    (tmp_path / "af_test_helpers.py").write_text(
        "import af_test_cfg as cfg\n\ndef g1(x):\n    return x * cfg.T1\n\n"
        "def g2(x):\n    return x + cfg.OTHER\n\ndef both(x):\n    return g2(g1(x))\n"
    )
    helpers = importlib.import_module("af_test_helpers")
    from attnflow.sweep import _fingerprint

    def nested(eta):
        return helpers.both(eta)

    before = _fingerprint(nested)
    cfg.OTHER = 3  # read by g2 only, after g1 read the module for T1
    assert _fingerprint(nested) != before


def test_fingerprints_ignore_caches_and_the_state_of_library_objects(tmp_path):
    """What an object caches (a Path's string and salted hash, a slot named with ``_``) and the
    state of a library's objects (a logger) do not change the fingerprint; a Path's text does."""
    import argparse
    import logging
    import pathlib

    from attnflow.sweep import _fingerprint

    args = argparse.Namespace(out=pathlib.Path(tmp_path) / "runs", t1=2.0)
    log = logging.getLogger("attnflow-test-fingerprint")

    def fn(eta):
        log.debug("eta %s", eta)
        return eta * args.t1 + len(str(args.out))

    before = _fingerprint(fn)
    hash(args.out), str(args.out)  # fill the Path's caches
    logging.getLogger("attnflow-test-another-logger").info("x")
    assert _fingerprint(fn) == before
    args.progress = True  # an attribute fn does not read (a flag, a shard index) does not count
    assert _fingerprint(fn) == before
    args.out = pathlib.Path(tmp_path) / "other"
    assert _fingerprint(fn) != before


class _CountingRate:
    """A public setting, and a counter and a start time behind underscores."""

    def __init__(self, lr):
        self.lr = lr
        self._calls = 0
        self._t_start = time.time()

    def __call__(self, r):
        self._calls += 1
        return r * self.lr


def test_underscore_attributes_are_left_out_of_the_fingerprint(tmp_path):
    """``_``-named attributes hold counters, start times and caches that change from run to run
    (the trace itself bumps ``_calls``): leaving them out lets the same sweep resume, in this
    process or a fresh one; a public setting counts."""
    from attnflow.sweep import _fingerprint

    axes = {"r": np.array([1.0, 2.0, 3.0])}
    model = _CountingRate(0.1)
    np.testing.assert_allclose(af.sweep(model, axes, out_dir=tmp_path, progress=False).values, [0.1, 0.2, 0.3])
    assert model._calls > 0
    assert af.sweep(model, axes, out_dir=tmp_path, progress=False).meta["computed_chunks"] == 0
    assert af.sweep(_CountingRate(0.1), axes, out_dir=tmp_path, progress=False).meta["computed_chunks"] == 0
    assert _fingerprint(_CountingRate(0.1)) == _fingerprint(model)
    with pytest.raises(ValueError, match=r"the function \(its code, or the values it reads\) changed: the function "):
        af.sweep(_CountingRate(0.5), axes, out_dir=tmp_path, progress=False)


_ENV = os.environ
_GETENV = os.environ.get


def test_fingerprint_reads_os_environ_by_name_through_an_alias(monkeypatch):
    """``os.environ`` reached through a module-level alias (or its bound ``get``) counts by name,
    as through ``os``: the shards of a Slurm array differ in SLURM_* variables and must share
    their chunks. A value read from it before the sweep counts."""
    from attnflow.sweep import _fingerprint, _fingerprint_parts

    by_alias = lambda x: x * float(_ENV.get("ATTNFLOW_TEST_T1", "1"))
    by_method = lambda x: x * float(_GETENV("ATTNFLOW_TEST_T1", "1"))
    monkeypatch.setenv("ATTNFLOW_TEST_T1", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    before = {f: _fingerprint_parts(f) for f in (by_alias, by_method)}
    monkeypatch.setenv("ATTNFLOW_TEST_T1", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("ATTNFLOW_TEST_OTHER", "x")
    assert {f: _fingerprint_parts(f) for f in (by_alias, by_method)} == before
    t1 = float(os.environ["ATTNFLOW_TEST_T1"])
    read_before = lambda x: x * t1
    first = _fingerprint(read_before)
    t1 = 4.0
    assert _fingerprint(read_before) != first


_ACT = jnp.tanh


def _student(x):
    return _ACT(x)


class _Model(eqx.Module):
    w: jax.Array
    act: Callable = eqx.field(static=True)  # a static pytree field: a function, as a derive Setup's student


def test_resume_reads_the_code_of_the_functions_a_model_holds(tmp_path):
    global _ACT
    grid = {"x": np.array([0.5, 1.0])}
    model = _Model(jnp.array(2.0), _student)

    def fn(x):
        return model.w * model.act(x)

    af.sweep(fn, grid, out_dir=tmp_path, progress=False)
    try:
        _ACT = jax.scipy.special.erf  # the student's nonlinearity, read by the function in the static field
        with pytest.raises(ValueError, match=r"the function .* changed: closure value 'model' \("):
            af.sweep(fn, grid, out_dir=tmp_path, progress=False)
    finally:
        _ACT = jnp.tanh
    assert af.sweep(fn, grid, out_dir=tmp_path, progress=False).meta["computed_chunks"] == 0

    from attnflow.sweep import _fingerprint

    def helper(x, k):
        return x * k

    def other(x, k):
        return x + k

    # a jitted helper and a partial count by the code they wrap; a user's class by its methods' code
    assert _fingerprint(jax.jit(helper)) != _fingerprint(jax.jit(other))
    assert _fingerprint(functools.partial(helper, k=2.0)) != _fingerprint(functools.partial(other, k=2.0))
    assert _fingerprint(functools.partial(helper, k=2.0)) == _fingerprint(functools.partial(helper, k=2.0))

    def make(scale):
        class Model:
            def __call__(self, x):
                return x * scale

        return Model

    assert _fingerprint(make(2.0)) != _fingerprint(make(3.0)) and _fingerprint(make(2.0)) == _fingerprint(make(2.0))


@dataclasses.dataclass
class _MutableRate:  # a plain dataclass: __eq__ without __hash__, so unhashable
    lr: float

    def __call__(self, r):
        return r * self.lr


class _ArrayRate(eqx.Module):  # an Equinox module with an array field: its hash fails on the array
    w: jax.Array

    def __call__(self, r):
        return r * self.w


def test_an_unhashable_callable_is_swept_and_compiled_at_each_sweep(tmp_path):
    """An unhashable callable (a plain dataclass, an Equinox module with an array field) is swept;
    it is not cached (it may change between sweeps, and a cache would keep it alive), so a changed
    object gives its new values. With an out_dir its fingerprint guards the chunks."""
    from attnflow.sweep import _CACHE

    axes = {"r": np.array([1.0, 2.0])}
    for make in (_MutableRate, lambda lr: _ArrayRate(jnp.array(lr))):
        first, second = make(0.1), make(0.3)
        np.testing.assert_allclose(af.sweep(first, axes, progress=False).values, [0.1, 0.2])
        np.testing.assert_allclose(af.sweep(second, axes, progress=False).values, [0.3, 0.6])
        assert not [k for k in _CACHE if any(getattr(k[0], "obj", None) is o for o in (first, second))]
    mutable = _MutableRate(1.0)
    np.testing.assert_allclose(af.sweep(mutable, axes, progress=False).values, [1.0, 2.0])
    mutable.lr = 3.0
    np.testing.assert_allclose(af.sweep(mutable, axes, progress=False).values, [3.0, 6.0])
    np.testing.assert_allclose(af.sweep(mutable, {"r": af.Static([1.0, 2.0])}, progress=False).values, [3.0, 6.0])
    folder = tmp_path / "m"
    af.sweep(_ArrayRate(jnp.array(0.1)), axes, out_dir=folder, progress=False)
    assert af.sweep(_ArrayRate(jnp.array(0.1)), axes, out_dir=folder, progress=False).meta["computed_chunks"] == 0
    with pytest.raises(ValueError, match=r"the function .* changed: the function \("):
        af.sweep(_ArrayRate(jnp.array(0.3)), axes, out_dir=folder, progress=False)


@dataclasses.dataclass(frozen=True)
class _ScaledRate:  # equal whatever its scale (compare=False): equal objects, other values
    scale: float = dataclasses.field(compare=False)

    def __call__(self, r):
        return r * self.scale


def test_a_sweep_of_an_equal_but_other_callable_uses_its_own_values():
    """Programs are cached per callable object (a bound method per object and function): an
    equal object whose ``__eq__`` skips a field got the first object's program and values."""
    for axes in ({"r": np.array([1.0, 2.0])}, {"r": af.Static([1.0, 2.0])}):
        np.testing.assert_allclose(af.sweep(_ScaledRate(1.0), axes, progress=False).values, [1.0, 2.0])
        np.testing.assert_allclose(af.sweep(_ScaledRate(5.0), axes, progress=False).values, [5.0, 10.0])


_PROBE = """
import argparse, functools
import equinox as eqx, jax, jax.numpy as jnp
from collections.abc import Callable
MODES = {"fast", "slow", "exact"}
ARGS = argparse.Namespace(t1=2.0, tags={"a", "b", "c"})
class Model(eqx.Module):
    w: jax.Array
    act: Callable = eqx.field(static=True)
def student(x):
    return jnp.tanh(x) if "fast" in {"fast", "slow", "exact", "a", "b", "c", "d", "e"} else x
MODEL = Model(jnp.arange(3.0), student)
def fn(x, mode="fast"):
    exact = mode in {"exact", "f", "g", "h", "i", "j", "k", "l"}
    return MODEL.w * MODEL.act(x) * ARGS.t1 if mode in MODES and not exact else x
FN = functools.partial(fn, mode="fast")
"""


def test_fingerprints_are_stable_across_processes():
    # set and frozenset constants iterate in the order of salted string hashes: a fresh process
    # with another hash seed must read the same fingerprint
    from attnflow.sweep import _fingerprint

    here: dict = {"__name__": "fingerprint_probe"}
    exec(_PROBE, here)
    script = (
        "import jax\njax.config.update('jax_enable_x64', True)\nfrom attnflow.sweep import _fingerprint\n"
        f"here = {{'__name__': 'fingerprint_probe'}}\nexec({_PROBE!r}, here)\nprint(_fingerprint(here['FN']))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == _fingerprint(here["FN"])


def test_a_folder_without_chunks_says_its_manifest_may_be_deleted(tmp_path):
    """A folder whose run stopped before its first chunk is not taken over (a shard may still be
    computing that chunk), but the refusal says that deleting its manifest starts the new sweep."""
    grid = {"eta": np.arange(1.0, 5.0)}
    af.sweep(lambda eta: eta**2, grid, out_dir=tmp_path, chunk_size=2, progress=False)
    for chunk in tmp_path.glob("chunk_*.npz"):  # as a run interrupted before its first chunk leaves it
        chunk.unlink()
    with pytest.raises(ValueError, match=r"the function .* changed.*it holds no chunk yet .*delete .*sweep.json"):
        af.sweep(lambda eta: eta**3, grid, out_dir=tmp_path, chunk_size=2, progress=False)
    (tmp_path / "sweep.json").unlink()
    res = af.sweep(lambda eta: eta**3, grid, out_dir=tmp_path, chunk_size=2, progress=False)
    np.testing.assert_array_equal(res.values, grid["eta"] ** 3)
    with pytest.raises(ValueError, match="its chunks are not reused"):  # with chunks: the usual refusal
        af.sweep(lambda eta: eta**2, grid, out_dir=tmp_path, chunk_size=2, progress=False)


def test_chunks_without_a_manifest_are_refused_never_loaded(tmp_path):
    """Chunks whose sweep.json was deleted belong to an unknown function: another function on the
    folder is refused (it loaded sin's chunks as cos's values), and after the chunks are deleted
    it computes its own."""
    axes = {"a": np.linspace(0, 1, 4), "b": np.array([1.0, 2.0])}
    af.sweep(lambda a, b: jnp.sin(a) * b, axes, out_dir=tmp_path, chunk_size=2, progress=False)
    (tmp_path / "sweep.json").unlink()
    g = lambda a, b: jnp.cos(a) * b
    with pytest.raises(ValueError) as err:
        af.sweep(g, axes, out_dir=tmp_path, chunk_size=2, progress=False)
    assert str(err.value) == (
        f"sweep: {tmp_path} holds chunk files (chunk_00000.npz, chunk_00001.npz, chunk_00002.npz, ...) but no "
        "sweep.json manifest, so nothing says which function and grid they belong to and they are never reused; "
        "delete the folder (or its chunk_*.npz files) or use a fresh out_dir"
    )
    assert not (tmp_path / "sweep.json").exists()  # the refusal writes no manifest over the foreign chunks
    for chunk in tmp_path.glob("chunk_*.npz"):
        chunk.unlink()
    res = af.sweep(g, axes, out_dir=tmp_path, chunk_size=2, progress=False)
    assert res.meta["computed_chunks"] == 4
    np.testing.assert_allclose(res.values, np.cos(axes["a"])[:, None] * axes["b"], rtol=1e-6)


def test_the_same_chunk_size_resumes_on_another_device_count(tmp_path):
    f = lambda a, b: a * 10.0 + b
    axes = {"a": np.arange(5.0), "b": np.arange(3.0)}

    def stop(i, n):
        raise KeyboardInterrupt

    # chunk_size=4 on 2 devices: whole rows of 3, rounded up to 2 rows, so chunks of 6 points; on one
    # device here that layout is chunk_size=6, saved as asked for with 4
    with pytest.raises(KeyboardInterrupt):
        af.sweep(f, axes, chunk_size=6, out_dir=tmp_path, progress=False, on_chunk=stop)
    manifest = tmp_path / "sweep.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "chunk_size_asked": 4}))
    res = af.sweep(f, axes, chunk_size=4, out_dir=tmp_path, progress=False)  # 1 device would round 4 to 3
    assert res.meta["chunk_size"] == 6 and res.meta["computed_chunks"] == 2
    np.testing.assert_array_equal(res.values, np.arange(5.0)[:, None] * 10 + np.arange(3.0))
    # another chunk_size: refused, naming the device count and the way out
    with pytest.raises(ValueError, match=r"chunk_size=9 gives 9 on 1 device\(s\).*leave chunk_size out"):
        af.sweep(f, axes, chunk_size=9, out_dir=tmp_path, progress=False)


def test_meta_may_not_overwrite_the_sweeps_own_entries(tmp_path):
    calls = []

    def fn(eta):
        calls.append(1)
        return eta

    with pytest.raises(ValueError, match=r"meta keys \['computed_chunks'\] are the sweep's own entries"):
        af.sweep(fn, {"eta": np.ones(2)}, meta={"computed_chunks": 99, "note": "x"}, progress=False)
    with (
        pytest.raises(ValueError, match=r"sweep_defaults: meta keys \['n_chunks'\]"),
        af.sweep_defaults(tmp_path, meta={"n_chunks": 1}),
    ):
        af.sweep(fn, {"eta": np.ones(2)}, progress=False)
    assert not calls  # refused before anything ran
    assert af.sweep(fn, {"eta": np.ones(2)}, meta={"note": "x"}, progress=False).meta["note"] == "x"


def test_to_xarray_keeps_the_time_axis_when_a_point_failed():
    pytest.importorskip("xarray")
    ts = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [np.nan] * 3])  # the failed point's times are NaN
    traj = af.Trajectory(ts, {"loss": np.array([[3.0, 2.0, 1.0], [3.0, 1.0, 0.5], [np.nan] * 3])})
    res = af.SweepResult(["eta"], {"eta": np.array([1.0, 2.0, 3.0])}, traj, status=[0, 0, 1], messages=["bad"])
    ds = res.to_xarray()
    assert ds["loss"].dims == ("eta", "t") and "ts" not in ds
    np.testing.assert_array_equal(ds["t"], [0.0, 1.0, 2.0])
    # save times that differ between points that ran stay a variable
    ts[1] = [0.0, 1.5, 2.0]
    traj = af.Trajectory(ts, {"loss": np.asarray(traj["loss"])})
    res = af.SweepResult(["eta"], {"eta": np.array([1.0, 2.0, 3.0])}, traj, status=[0, 0, 1], messages=["bad"])
    assert res.to_xarray()["loss"].dims == ("eta", "ts_dim0")


@pytest.mark.parametrize("axis", [[1.0, 2.0], [0.25, 0.5, 0.75]])
def test_to_xarray_names_the_time_axis_time_when_a_sweep_axis_is_t(axis):
    """An axis named t keeps its coordinates (with 3 values it was replaced by the 3 save times,
    with 2 xarray raised "conflicting sizes"); the time axis becomes "time"."""
    pytest.importorskip("xarray")
    t_axis = np.array(axis)
    ts = np.tile([0.0, 0.5, 1.0], (len(axis), 1))
    loss = t_axis[:, None] + 10 * np.arange(3.0)  # (t, time)
    res = af.SweepResult(["t"], {"t": t_axis}, af.Trajectory(ts, {"loss": loss}))
    ds = res.to_xarray()
    assert ds["loss"].dims == ("t", "time")
    np.testing.assert_array_equal(ds["t"], t_axis)
    np.testing.assert_array_equal(ds["time"], [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(ds["loss"].sel(t=axis[1]), loss[1])
    # save times that differ between points: the variable ts on its own axis, renamed beside an axis ts
    ts[1, 1] = 0.7
    res = af.SweepResult(["ts"], {"ts": t_axis}, af.Trajectory(ts, {"loss": loss}))
    ds = res.to_xarray()
    assert ds["loss"].dims == ("ts", "ts_value_dim0") and ds["ts_value"].dims == ("ts", "ts_value_dim0")
    # axes t and time, or an axis t and an observable time: the time axis takes the next free name
    ts[1, 1] = 0.5
    res = af.SweepResult(
        ["t", "time"],
        {"t": t_axis, "time": np.arange(2.0)},
        af.Trajectory(
            np.broadcast_to(ts[:, None], (len(axis), 2, 3)), {"loss": np.broadcast_to(loss[:, None], (len(axis), 2, 3))}
        ),
    )
    assert res.to_xarray()["loss"].dims == ("t", "time", "time_")
    res = af.SweepResult(["t"], {"t": t_axis}, af.Trajectory(ts, {"loss": loss, "time": loss}))
    ds = res.to_xarray()
    assert ds["time"].dims == ("t", "time_") and ds["loss"].dims == ("t", "time_")


def test_sweep_refuses_axes_it_cannot_trace_and_names_them():
    """Strings, objects and complex numbers are not traceable axis values (a Static axis takes
    labels); NaN is refused in a Static axis as in an array axis; no devices is an error."""
    f = lambda eta: eta * 2.0
    for bad in (np.array(["a", "b"]), None, np.array([0.5, "x"], dtype=object), np.array([1 + 1j])):
        with pytest.raises(ValueError, match=r"sweep axis 'eta' must hold real numbers.*af\.Static"):
            af.sweep(f, {"eta": bad}, progress=False)
    with pytest.raises(ValueError, match=r"Static axis values must be finite, got \[nan\]"):
        af.Static([1.0, float("nan")])
    with pytest.raises(ValueError, match="devices must name at least one device"):
        af.sweep(f, {"eta": np.ones(2)}, devices=[], progress=False)


def test_a_seed_axis_of_floats_is_refused_before_computing():
    """An axis named ``seed`` or ``key`` holds integer seeds (each becomes a PRNG key): floats
    are refused, naming the axis and its values, before ``fn`` runs (traced, a float key
    failed deep inside each package's run with another message)."""
    from attnflow import deeplinear as dl

    calls = []

    def run(eta, seed):
        calls.append(eta)
        return dl.train(dl.Setup(eta=eta), 0.1, key=seed, batch=4, save=af.LinearGrid(2))["loss"]

    message = (
        r"sweep axis 'seed' must hold integer seeds \(each becomes a PRNG key\), got float64 values "
        r"\[0.0, 1.0\]: pass integers, e.g. np.arange\(2\)"
    )
    with pytest.raises(ValueError, match=message):
        af.sweep(run, {"eta": np.array([0.5]), "seed": np.array([0.0, 1.0])}, progress=False)
    with pytest.raises(ValueError, match=r"sweep axis 'key' must hold integer seeds .* got bool values \[True"):
        af.sweep(lambda key: key, {"key": np.array([True, False])}, progress=False)
    assert calls == []
    res = af.sweep(run, {"eta": np.array([0.5]), "seed": np.arange(2)}, progress=False)
    assert res.ok.all() and not np.allclose(res.values[0, 0], res.values[0, 1])  # two seeds, two runs


def test_without_float64_an_axis_that_32_bits_would_merge_is_refused():
    f = lambda seed: seed * 1.0
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"'seed' has integers outside 32 bits \(\[4294967297\]\).*enable_x64"):
            af.sweep(f, {"seed": np.array([1, 2**32 + 1])}, progress=False)
        with pytest.raises(ValueError, match=r"'eta' has values that are equal in float32"):
            af.sweep(lambda eta: eta * 1.0, {"eta": np.array([0.1, 0.1 + 1e-9])}, progress=False)
        assert af.sweep(lambda eta: eta * 2, {"eta": np.array([0.1, 0.2])}, progress=False).ok.all()


def test_a_resume_without_float64_names_the_dtype_and_x64(tmp_path):
    """A float64 folder resumed with JAX's 64-bit mode off: the dtypes differ (it was reported as a
    shape change, with the sweep's own status leaf in the message)."""
    f = lambda r, seed: {"y": jnp.sin(r) * seed, "n": seed}
    axes = {"r": np.array([0.5, 1.0]), "seed": np.arange(2)}
    af.sweep(f, axes, out_dir=tmp_path, progress=False)
    rest = "; its chunks are not reused. Use a fresh out_dir or delete the old one"
    with jax.enable_x64(False), pytest.raises(ValueError) as err:
        af.sweep(f, axes, out_dir=tmp_path, progress=False)
    assert str(err.value) == (
        f"sweep: {tmp_path} holds a different sweep: the dtype of output leaf 0 changed (int64 saved, int32 now): "
        "JAX's 64-bit mode (jax_enable_x64) is off in this run; call attnflow.enable_x64() first to resume it" + rest
    )
    manifest = tmp_path / "sweep.json"
    saved = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**saved, "leaves": [[[], "int64"], [[3], "float64"], [[], "int32"]]}))
    with pytest.raises(ValueError) as err:
        af.sweep(f, axes, out_dir=tmp_path, progress=False)
    assert str(err.value) == (
        f"sweep: {tmp_path} holds a different sweep: the shape of output leaf 1 changed (saved (3,) float64, now () "
        "float64)" + rest
    )
    manifest.write_text(json.dumps({**saved, "leaves": saved["leaves"][1:]}))  # malformed: shown without status
    with pytest.raises(ValueError) as err:
        af.sweep(f, axes, out_dir=tmp_path, progress=False)
    assert str(err.value) == (
        f"sweep: {tmp_path} holds a different sweep: the shapes of fn's output changed (saved [[[], 'float64']], now "
        "[[[], 'int64'], [[], 'float64']])" + rest
    )


def test_static_sweep_reports_failures_over_the_whole_grid_and_raises_after_it():
    """Failures of a grid with a Static axis are counted and named over the whole grid (the
    static coordinate included); on_error="raise" computes every static value first."""
    seen = []

    def f(eta, seed):
        seen.append(eta)
        y = af.integrate(lambda t, y, a: a * y, jnp.ones(()), 50.0, args=eta * 1.0, save=af.LinearGrid(2))["y"][-1]
        return y + seed

    axes = {"eta": af.Static([20.0, -1.0, 0.5]), "seed": np.arange(2)}
    with pytest.warns(RuntimeWarning, match=r"sweep: 2 of 6 grid points failed: eta=20.0, seed=0: ") as caught:
        res = af.sweep(f, axes, progress=False)
    assert len([w for w in caught if "grid points failed" in str(w.message)]) == 1
    assert res.failures()[0][0] == {"eta": 20.0, "seed": 0} and res.ok.tolist() == [
        [False, False],
        [True] * 2,
        [True] * 2,
    ]
    only_static = af.sweep(lambda eta: f(eta, 0.0), {"eta": af.Static([20.0, -1.0])}, on_error="nan", progress=False)
    assert [p for p, _ in only_static.failures()] == [{"eta": 20.0}]  # no placeholder axis in the names
    seen.clear()
    with pytest.raises(SweepError, match="2 of 6 grid points failed"):
        # a new function object: f's traces of 20.0 and -1.0 are cached and would not run again
        fresh = lambda eta, seed: f(eta, seed)
        af.sweep(fresh, {"eta": af.Static([20.0, -1.0, 0.25]), "seed": np.arange(2)}, on_error="raise", progress=False)
    assert sorted(set(seen)) == [-1.0, 0.25, 20.0]  # every static value computed before raising


def test_shards_of_a_static_sweep_share_its_chunks(tmp_path):
    """Chunks are numbered across the static values, so N shards of a sweep over sizes each
    compute about 1/N of the whole grid (they took every size's first chunk alone)."""
    f = lambda D, seed: jnp.mean(jnp.linspace(0, 1, D) ** 2) + seed
    axes = {"D": af.Static([3, 5, 7, 9]), "seed": np.arange(2)}
    calls = []
    for i in (1, 2, 3, 4):
        part = af.sweep(
            f, axes, out_dir=tmp_path, shard=af.Shard(i, 4), progress=False, on_chunk=lambda *a: calls.append(a)
        )
        assert part.meta["computed_chunks"] == 2 and part.meta["n_chunks"] == 8
    assert sorted(c[0] for c in calls) == list(range(8)) and {c[1] for c in calls} == {8}
    assert part.complete and np.allclose(part.values, af.sweep(f, axes, progress=False).values)


def test_sweep_result_reduces_over_named_axes_and_to_xarray_keeps_the_status():
    """``res.mean("seed")`` / ``res.std("seed", ddof=1)``: the other axes kept, a failure in a
    group fails the group; to_xarray has a status variable and renames a leaf named like an axis."""
    res = af.SweepResult(
        ("eta", "seed"),
        {"eta": np.array([1.0, 2.0]), "seed": np.arange(3)},
        {"loss": jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, np.nan]]), "eta": jnp.zeros((2, 3))},
        status=np.array([[0, 0, -3], [0, 0, 1]]),
        messages=["diverged", "oscillates"],
    )
    m = res.mean("seed")
    assert m.dims == ("eta",) and np.allclose(m["loss"][0], 2.0) and np.isnan(m["loss"][1])
    assert m.failures() == [({"eta": 2.0}, "diverged")] and m.warnings() == [({"eta": 1.0}, "oscillates")]
    assert float(res.std("seed", ddof=1)["loss"][0]) == pytest.approx(1.0)
    assert res.ok.tolist() == [[True, True, True], [True, True, False]]  # a warned point ran
    with pytest.raises(ValueError, match=r"\['sed'\] are not axes of this sweep"):
        res.mean("sed")
    with pytest.raises(ValueError, match="leaves no grid"):
        res.mean(["eta", "seed"])
    pytest.importorskip("xarray")
    ds = res.to_xarray()
    assert ds["status"].values.tolist() == [[0, 0, -3], [0, 0, 1]] and "eta_value" in ds


def test_sweep_result_is_a_mapping_of_its_named_values_like_a_trajectory():
    """``name in res``, ``res.keys()``, ``res.items()`` and ``dict(res)`` read the names of the
    values (a dict's keys, a Trajectory's observables); iterating raises, as for a Trajectory."""
    r = af.sweep(lambda x: {"a": x, "b": 2 * x}, {"x": np.linspace(0, 1, 3)}, progress=False)
    assert "a" in r and "b" in r and "z" not in r and 0 not in r
    assert r.keys() == ("a", "b") and [k for k, _ in r.items()] == ["a", "b"]
    as_dict = dict(r)
    assert sorted(as_dict) == ["a", "b"]
    np.testing.assert_allclose(as_dict["b"], [0.0, 1.0, 2.0])
    message = (
        r"a SweepResult is not iterable: iterate over res.keys\(\) \(or res.items\(\), dict\(res\)\) for the "
        r"named values, res.dims and res.coords for the axes"
    )
    with pytest.raises(TypeError, match=message):
        list(r)
    ts = jnp.linspace(0.0, 1.0, 3)
    runs = af.sweep(lambda x: af.Trajectory(ts, {"y": x * ts, "z": ts}), {"x": np.array([1.0, 2.0])}, progress=False)
    assert "y" in runs and runs.keys() == ("y", "z")
    np.testing.assert_allclose(dict(runs)["y"][1], [0.0, 1.0, 2.0])
    plain = af.sweep(lambda x: 2 * x, {"x": np.array([1.0, 2.0])}, progress=False)
    assert "x" not in plain
    with pytest.raises(TypeError, match=r"this sweep's values are an array, not named: read res.values"):
        plain.keys()
    pair = af.sweep(lambda x: (x, 2 * x), {"x": np.array([1.0, 2.0])}, progress=False)
    np.testing.assert_allclose(pair[1], [2.0, 4.0])  # a tuple's entries by position, as before
    with pytest.raises(TypeError, match=r"this sweep's values are a tuple, not named"):
        dict(pair)


def test_reducing_every_axis_names_how_to_average_the_values():
    """``res.mean("seed")`` of a sweep over seeds alone leaves no grid: the error names the
    reductions of the values that do it, and they give the mean over the seeds."""
    ts = jnp.linspace(0.0, 1.0, 3)
    runs = af.sweep(lambda seed: af.Trajectory(ts, {"loss": seed * ts}), {"seed": np.arange(3)}, progress=False)
    with pytest.raises(ValueError) as caught:
        runs.mean("seed")
    assert str(caught.value) == (
        "mean: reducing every axis ('seed',) leaves no grid; keep one axis, or reduce the values themselves: "
        "res.values.mean() where they are a Trajectory (its batch axes are the sweep's), np.mean(res[name], "
        "axis=0) for an array"
    )
    with pytest.raises(ValueError, match=r"res.values.std\(ddof=1\) .* np.std\(res\[name\], axis=0, ddof=1\)"):
        runs.std("seed", ddof=1)
    np.testing.assert_allclose(runs.values.mean()["loss"], ts)  # seeds 0, 1, 2: mean 1
    np.testing.assert_allclose(np.mean(runs["loss"], axis=0), ts)
    np.testing.assert_allclose(runs.values.std(ddof=1)["loss"], ts)  # sample std of 0, 1, 2: 1
    grid = af.SweepResult(("a", "b"), {"a": np.arange(2), "b": np.arange(2)}, {"x": np.ones((2, 2))})
    with pytest.raises(ValueError, match=r"np.mean\(res\[name\], axis=\(0, 1\)\) for an array"):
        grid.mean(["a", "b"])


def test_a_warning_of_a_traced_point_is_named_by_the_sweep(tmp_path):
    """Gradient descent past its stability limit (eta dt s_max >= 1) warns when called, and in
    a sweep over eta the point keeps its values and is named (SweepResult.warnings)."""
    from attnflow import deeplinear as dl

    s = dl.Setup()  # s_max = 3, dt = 0.01: the limit is eta = 33.3
    final = lambda eta: dl.train(s.replace(eta=eta), 2.0, save=af.LinearGrid(2))["loss"][-1]
    with pytest.warns(RuntimeWarning, match=r"1 of 2 grid points ran with a warning: eta=40.0: gradient descent"):
        res = af.sweep(final, {"eta": np.array([1.0, 40.0])}, progress=False)
    assert res.ok.all() and np.all(np.isfinite(res.values))
    assert [p for p, _ in res.warnings()] == [{"eta": 40.0}]
    with pytest.warns(UserWarning, match="eta dt s_max = 1.2 >= 1"):
        direct = final(40.0)
    assert float(direct) == pytest.approx(float(res.values[1]), rel=1e-12)
    pytest.importorskip("xarray")  # every point warned: the time axis is still one coordinate
    runs = af.sweep(
        lambda eta: dl.train(s.replace(eta=eta), 2.0, save=af.LinearGrid(3)), {"eta": np.array([40.0, 50.0])},
        progress=False,
    )  # fmt: skip
    assert runs.status.tolist() != [0, 0] and runs.to_xarray()["loss"].dims[:2] == ("eta", "t")
    again = af.sweep(final, {"eta": np.array([1.0, 40.0])}, out_dir=tmp_path, progress=False)
    assert (
        af.sweep(final, {"eta": np.array([1.0, 40.0])}, out_dir=tmp_path, progress=False).warnings() == again.warnings()
    )


def test_sel_takes_lists_of_values_along_each_axis():
    r = af.sweep(lambda a, b: {"x": a * 10 + b}, {"a": np.arange(4.0), "b": np.arange(3.0)}, progress=False)
    np.testing.assert_array_equal(r.sel(a=[1.0, 3.0])["x"], [[10, 11, 12], [30, 31, 32]])
    np.testing.assert_array_equal(r.sel(a=[1.0, 3.0], b=[0.0, 2.0])["x"], [[10, 12], [30, 32]])  # not jointly
    np.testing.assert_array_equal(r.sel(a=2.0, b=[2.0, 1.0])["x"], [22, 21])
    with pytest.raises(ValueError, match="outside the sweep's axis a"):
        r.sel(a=[1.0, 9.0])
    # NumPy values (a loaded result) stay NumPy, their float64 too, whatever JAX's precision
    loaded = af.SweepResult(
        ("a", "seed"), {"a": np.arange(2.0), "seed": np.arange(2)}, {"x": np.array([[1.0, 1.0 + 1e-12], [2.0, 2.0]])}
    )
    for picked in (loaded.sel(a=[0.0])["x"], loaded.mean("seed")["x"], loaded.std("seed")["x"]):
        assert type(picked) is np.ndarray and picked.dtype == np.float64
    assert loaded.mean("seed")["x"][0] - 1.0 == pytest.approx(5e-13, rel=1e-3)
    with pytest.raises(ValueError, match="ddof = 2 needs more than 2 runs, got 2"):  # as Trajectory.std
        loaded.std("seed", ddof=2)


def test_a_static_sweep_is_one_sweep_of_its_sweep_defaults_block(tmp_path):
    """Its static values are subfolders of one sweep-k (it took one number per value, so a static
    value added shifted every later sweep's folder); one log entry; ShardPending names its folder."""
    f = lambda D, seed: jnp.mean(jnp.linspace(0, 1, D) ** 2) + seed
    axes = {"D": af.Static([3, 5, 7]), "seed": np.arange(4)}
    g = lambda x: x * 2

    def program():
        return af.sweep(f, axes, progress=False), af.sweep(g, {"x": np.arange(4.0)}, progress=False)

    with pytest.raises(af.ShardPending) as pending, af.sweep_defaults(tmp_path, shard="1/2", chunk_size=2):
        program()
    assert pending.value.sweep == 1 and pending.value.out_dir == tmp_path / "sweep-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep-1"]
    with pytest.raises(af.ShardPending) as pending, af.sweep_defaults(tmp_path, shard="2/2", chunk_size=2):
        program()  # the static sweep is complete now: shard 2 goes on to the next sweep, number 2
    assert pending.value.sweep == 2 and pending.value.out_dir == tmp_path / "sweep-2"
    with af.sweep_defaults(tmp_path, chunk_size=2) as log:
        static, _ = program()
    assert [(e["sweep"], e["out_dir"].split("/")[-1], e["n_chunks"], e["loaded"]) for e in log] == [
        (1, "sweep-1", 6, 6),
        (2, "sweep-2", 2, 1),
    ]
    np.testing.assert_allclose(static.values, af.sweep(f, axes, progress=False).values, rtol=1e-15)


def test_load_names_a_checkpoint_folder_plain_or_static(tmp_path):
    f = lambda D, x: x * D
    af.sweep(lambda x: x * 2, {"x": np.arange(2.0)}, out_dir=tmp_path / "plain", progress=False)
    af.sweep(f, {"D": af.Static([1, 2]), "x": np.arange(2.0)}, out_dir=tmp_path / "static", progress=False)
    for name in ("plain", "static"):
        with pytest.raises(FileNotFoundError, match="is a sweep's out_dir .* run the same af.sweep"):
            af.SweepResult.load(tmp_path / name)


def test_sweep_to_xarray_keeps_an_observable_named_t_event_and_clashing_mapping_keys():
    xr = pytest.importorskip("xarray")
    del xr

    def point(eta):
        ts = jnp.linspace(0.0, 1.0, 3)
        traj = af.Trajectory(ts, {"u": eta * ts, "t_event": ts + eta}, t_event=eta + 0.5)
        return {"run": traj, "eta": -eta, "eta_value": 2 * eta}

    res = af.sweep(point, {"eta": np.array([0.0, 0.2])}, progress=False)
    ds = res.to_xarray()
    names = set(ds.data_vars)
    assert {"run.t_event", "run.t_event_value", "eta_value", "eta_value_value"} <= names
    np.testing.assert_allclose(ds["run.t_event"].values, [0.5, 0.7])  # the trajectory's event time
    np.testing.assert_allclose(ds["run.t_event_value"].values[1], [0.2, 0.7, 1.2])  # the observable
    np.testing.assert_allclose(sorted([ds["eta_value"].values[1], ds["eta_value_value"].values[1]]), [-0.2, 0.4])
