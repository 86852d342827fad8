"""`attnflow.rng.normal` (Box-Muller on Threefry pairs), compile options, and `use_cpu_cores`."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import attnflow as af
from attnflow import _jit
from attnflow.heads import FlippedSpike, SingleLocationTask

N = 1 << 20


@pytest.fixture(scope="module")
def z():
    return np.asarray(jax.jit(lambda k: af.rng.normal(k, (N,)))(jax.random.PRNGKey(7)), dtype=np.float64)


def test_normal_moments_and_tails(z):
    # each statistic within 5 standard errors of its N(0, 1) value
    assert z.dtype == np.float64 and z.shape == (N,)
    assert abs(z.mean()) < 5 / np.sqrt(N)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / N)
    assert abs(np.mean(z**4) - 3) < 5 * np.sqrt(96 / N)
    assert abs(np.mean(z**3)) < 5 * np.sqrt(15 / N)
    for a in (1.0, 2.0, 3.0, 4.0):
        p = 2 * stats.norm.sf(a)
        assert abs(np.mean(np.abs(z) > a) - p) < 5 * np.sqrt(p * (1 - p) / N), a
    assert np.abs(z).max() <= np.sqrt(-2 * np.log(2.0**-24)) + 1e-5  # |z| <= 5.77 by construction
    assert stats.kstest(z, "norm").statistic < 1.95 / np.sqrt(N)  # KS at the 0.1 % level


def test_normal_pairs_are_independent_with_uniform_angle(z):
    pairs = z.reshape(-1, 2)  # entries 2i, 2i + 1 come from one hash
    m = len(pairs)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 5 / np.sqrt(m)
    assert abs(np.corrcoef(pairs[:, 0] ** 2, pairs[:, 1] ** 2)[0, 1]) < 5 / np.sqrt(m)
    angle = np.arctan2(pairs[:, 1], pairs[:, 0])
    assert stats.kstest(angle, stats.uniform(-np.pi, 2 * np.pi).cdf).statistic < 1.95 / np.sqrt(m)
    radius2 = np.sum(pairs**2, axis=1)  # chi-square with 2 degrees of freedom
    assert stats.kstest(radius2, stats.chi2(2).cdf).statistic < 1.95 / np.sqrt(m)


def test_normal_keys_shapes_dtypes():
    k = jax.random.PRNGKey(3)
    a = af.rng.normal(k, (5, 3))
    assert a.shape == (5, 3) and a.dtype == jnp.float32
    np.testing.assert_array_equal(a, af.rng.normal(k, (5, 3)))  # a function of the key
    # compiled code may contract to FMAs differently: equal to float32 rounding
    np.testing.assert_allclose(a, jax.jit(lambda k: af.rng.normal(k, (5, 3)))(k), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a.ravel(), af.rng.normal(k, 15), rtol=1e-6, atol=1e-6)  # C order: shape only reshapes
    assert not np.allclose(a, af.rng.normal(jax.random.PRNGKey(4), (5, 3)))
    np.testing.assert_array_equal(af.rng.normal(jax.random.key(3), (5, 3)), a)  # typed threefry key, same words
    keys = jax.random.split(k, 4)
    batched = jax.vmap(lambda kk: af.rng.normal(kk, (7,)))(keys)
    np.testing.assert_allclose(batched, np.stack([af.rng.normal(kk, (7,)) for kk in keys]), rtol=1e-6, atol=1e-6)
    assert af.rng.normal(k, 0).shape == (0,) and af.rng.normal(k, ()).shape == ()
    assert af.rng.normal(k, (3,), jnp.bfloat16).dtype == jnp.bfloat16
    # float64 (and non-threefry keys) fall back to jax.random.normal
    np.testing.assert_array_equal(af.rng.normal(k, (6,), jnp.float64), jax.random.normal(k, (6,), jnp.float64))
    rbg = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(af.rng.normal(rbg, (6,)), jax.random.normal(rbg, (6,), jnp.float32))
    with pytest.raises(ValueError, match="floating"):
        af.rng.normal(k, (3,), jnp.int32)


def test_float32_task_tokens():
    """A float32 task (drawn with `normal`): the signal token projects on the spike as theta + N(0, 1),
    the others as N(0, 1), and y is the signal token."""
    D, L, B, s = 64, 4, 4000, 1.5
    task = SingleLocationTask(D, L, FlippedSpike(s, p=1.0), key=2, dtype=jnp.float32)
    X, y, eps = jax.jit(lambda k: task.sample(k, B))(jax.random.PRNGKey(5))
    assert X.dtype == jnp.float32 and X.shape == (B, L, D)
    rows = np.arange(B)
    np.testing.assert_array_equal(y, np.asarray(X)[rows, np.asarray(eps)])
    chi = np.asarray(X @ task.spikes[0] / np.sqrt(D), dtype=np.float64)  # (B, L)
    signal = chi[rows, eps]
    other = np.delete(chi, eps + L * rows)  # the flattened (B, L) minus the signal entries
    assert abs(signal.mean() - s) < 5 / np.sqrt(B) and abs(signal.var() - 1) < 5 * np.sqrt(2 / B)
    assert abs(other.mean()) < 5 / np.sqrt(other.size) and abs(other.var() - 1) < 5 * np.sqrt(2 / other.size)
    assert np.bincount(np.asarray(eps), minlength=L).min() > B / L - 5 * np.sqrt(B)  # locations uniform
    noise = np.asarray(X, dtype=np.float64).copy()
    noise[rows, eps] -= s * np.asarray(task.spikes[0]) / np.sqrt(D)
    assert abs(noise.var() - 1) < 5 * np.sqrt(2 / noise.size)
    with pytest.raises(ValueError, match="floating"):
        SingleLocationTask(D, L, FlippedSpike(s), dtype=jnp.int32)


def test_compile_options_top_level_and_nested(monkeypatch):
    # integrate and simulate called at top level (compiled with the options) and inside a
    # user's jit (options not allowed there) give the same numbers
    field = lambda t, y, a: -a["k"] * y
    top = af.integrate(field, jnp.ones(2), 1.0, args={"k": 2.0}, save=af.LinearGrid(3))["y"]
    nested = jax.jit(lambda k: af.integrate(field, jnp.ones(2), 1.0, args={"k": k}, save=af.LinearGrid(3))["y"])(2.0)
    np.testing.assert_allclose(top, nested, rtol=1e-12)
    np.testing.assert_allclose(top[-1], np.exp(-2.0), rtol=1e-6)
    # a nested call with only concrete arguments is refused the options by JAX and falls back
    const = jax.jit(lambda: af.integrate(field, jnp.ones(2), 1.0, args={"k": 2.0}, save=af.LinearGrid(3))["y"])()
    np.testing.assert_allclose(const, top, rtol=1e-12)
    _jit.cpu_compiler_options.cache_clear()
    monkeypatch.setenv("ATTNFLOW_XLA_DEFAULTS", "0")
    assert _jit.cpu_compiler_options() == {}
    _jit.cpu_compiler_options.cache_clear()
    monkeypatch.delenv("ATTNFLOW_XLA_DEFAULTS")
    opts = _jit.cpu_compiler_options()
    assert set(opts) <= {"xla_cpu_prefer_vector_width", "xla_cpu_experimental_ynn_fusion_type"}
    assert opts.get("xla_cpu_prefer_vector_width", 512) == 512
    # the YNNPACK option is passed exactly when this jaxlib's compiler knows it; an unknown
    # option or value is refused by XLA, and then left out
    assert ("xla_cpu_experimental_ynn_fusion_type" in opts) == _jit._accepted(_jit._YNN_OPTION)
    assert not _jit._accepted({"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_NO_SUCH_TYPE"})
    assert not _jit._accepted({"xla_cpu_no_such_option": 1})
    # looked up first from inside another trace (a nested call with concrete arguments), the
    # options are the same
    _jit.cpu_compiler_options.cache_clear()
    inside = []
    jax.jit(lambda: inside.append(_jit.cpu_compiler_options()) or jnp.zeros(()))()
    assert inside == [opts]


_CORES_SCRIPT = r"""
import json, warnings
import attnflow as af
import jax, jax.numpy as jnp
n = af.use_cpu_cores(3)
count = jax.device_count()
jnp.ones(2).block_until_ready()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    later = af.use_cpu_cores(2)
res = af.sweep(lambda x: x**2, {"x": jnp.arange(5.0)}, progress=False)
print(json.dumps({"n": n, "count": count, "later": later, "warned": any("already" in str(x.message) for x in w),
                  "used": res.meta["devices_used"], "values": res.values.tolist()}))
"""


def test_use_cpu_cores_subprocess():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", _CORES_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"n": 3, "count": 3, "later": 3, "warned": True, "used": 3, "values": [0.0, 1.0, 4.0, 9.0, 16.0]}
    with pytest.raises(ValueError, match="positive integer"):
        af.use_cpu_cores(0)
