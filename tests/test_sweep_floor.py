"""`sweep(..., lanes=k)`: the grid run as consecutive groups of k points inside one compiled call
gives the values of the plain sweep (to 1e-12), keeps failure statuses, and loops over groups."""

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow._lanes import vmap_lanes
from attnflow.deeplinear import mode_field

S = jnp.array([3.0, 2.0, 1.0, 0.5])
ETAS = np.geomspace(1e-3, 5e-2, 37)  # not a multiple of the lane counts: the last group is padded


def saxe(eta):
    """The Saxe mode ODE of ``benchmarks/sweep_vs_loop.py`` (62 to 195 steps over these rates)."""
    return af.integrate(
        mode_field,
        jnp.full(4, 1e-3),
        1500.0,
        args={"s": S, "tau": 1.0 / eta},
        save=af.LinearGrid(5),
        solver=af.SolverOptions(rtol=1e-8, atol=1e-10),
    )


def test_lanes_sweep_equals_plain_sweep():
    plain = af.sweep(saxe, {"eta": ETAS}, progress=False)
    grouped = af.sweep(saxe, {"eta": ETAS}, progress=False, lanes=8)  # 5 groups, the last one padded
    assert isinstance(grouped.values, af.Trajectory) and grouped.values["y"].shape == (37, 5, 4)
    np.testing.assert_allclose(grouped.values["y"], plain.values["y"], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(grouped.values.ts, plain.values.ts)
    assert grouped.ok.all()


def test_nested_lanes_group_rows_of_the_first_axis():
    f = lambda eta, u0: af.integrate(
        mode_field,
        jnp.full(4, u0),
        1500.0,
        args={"s": S, "tau": 1.0 / eta},
        save=af.LinearGrid(2),
        solver=af.SolverOptions(rtol=1e-8, atol=1e-10),
    )["y"][-1]
    axes = {"eta": ETAS[::4], "u0": np.array([1e-3, 1e-4])}
    plain = af.sweep(f, axes, progress=False)
    grouped = af.sweep(f, axes, progress=False, lanes=6)  # 3 rows of 2 points per group
    assert plain.meta["nested"] and grouped.meta["nested"]
    np.testing.assert_allclose(grouped.values, plain.values, rtol=1e-12, atol=1e-12)


def _blowup(t, y, a):
    return a["k"] * y**2


def test_failing_points_keep_their_status_in_lanes():
    ks = np.array([0.25, 0.5, 2.0, 0.75, 3.0])
    f = lambda k: af.integrate(
        _blowup, jnp.ones(1), 1.0, args={"k": k}, save=af.LinearGrid(2), solver=af.SolverOptions(max_steps=500)
    )["y"][-1, 0]
    with pytest.warns(RuntimeWarning, match="2 of 5 grid points failed"):
        res = af.sweep(f, {"k": ks}, progress=False, lanes=2)
    assert list(res.ok) == [True, True, False, True, False]
    np.testing.assert_allclose(np.asarray(res.values)[res.ok], 1.0 / (1.0 - ks[res.ok]), rtol=1e-7)
    assert [p for p, _ in res.failures()] == [{"k": 2.0}, {"k": 3.0}]


def test_vmap_lanes_is_vmap_in_groups():
    f = lambda p: {"s": jnp.sin(p["a"]) * p["b"], "v": p["a"] * jnp.arange(3.0)}
    x = {"a": jnp.linspace(0.0, 1.0, 10), "b": jnp.arange(10.0)}
    want = jax.vmap(f)(x)
    for lanes in (None, 1, 3, 10, 50):
        got = jax.jit(vmap_lanes(f, lanes))(x)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_lanes_loop_over_groups_inside_one_program():
    """The compiled program of a 37-point sweep with lanes=8 loops over 5 groups (lax.map),
    with the adaptive solve's while loop inside."""
    from attnflow.sweep import _CACHE

    res = af.sweep(saxe, {"eta": ETAS}, progress=False, lanes=8, devices=jax.devices()[:1])
    assert res.meta["n_chunks"] == 1
    compiled = next(
        c for k, (c, _) in _CACHE.items() if getattr(k[0], "obj", k[0]) is saxe and k[4] == 8 and len(k[1]) == 1
    )
    hlo = compiled.lower({"eta": jnp.asarray(ETAS)}).compile().as_text()
    trips = [int(n) for n in re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', hlo)]
    assert 5 in trips


def test_lanes_bad_values():
    for bad in (0, -3, 1.5, True, "8"):
        with pytest.raises(ValueError, match="lanes must be a positive integer"):
            af.sweep(lambda eta: eta, {"eta": np.ones(3)}, lanes=bad)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.deeplinear import mode_field
    S = jnp.array([3.0, 2.0, 1.0, 0.5])
    etas = np.geomspace(1e-3, 5e-2, 50)
    f = lambda eta: af.integrate(mode_field, jnp.full(4, 1e-3), 1500.0, args={"s": S, "tau": 1.0 / eta},
                                 save=af.LinearGrid(2), solver=af.SolverOptions(rtol=1e-8, atol=1e-10))["y"][-1]
    plain = af.sweep(f, {"eta": etas}, progress=False)
    grouped = af.sweep(f, {"eta": etas}, progress=False, lanes=5)
    gap = float(np.max(np.abs(np.asarray(plain.values) - np.asarray(grouped.values))))
    print(json.dumps({"devices": grouped.meta["devices_used"], "shard_map": grouped.meta["shard_map"], "gap": gap}))
    """
)


def test_lanes_on_four_host_devices(tmp_path):
    """Each device runs its block of 13 points (52 padded) in groups of 5: the plain values."""
    script = tmp_path / "lanes.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["devices"] == 4 and info["shard_map"] is True
    assert info["gap"] <= 1e-12
