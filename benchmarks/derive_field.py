"""The derived order-parameter field of `attnflow.derive` against the hand-written closed form.

Saad & Solla (1995) soft committee machine, g = erf(x / sqrt 2), K = M = 2, squared loss: the
closed form is the I3/I4 arcsine integrals of the tests (tests/test_derive.py, vectorised over
all unit pairs and quadruples), run in JAX (jitted) and in NumPy (the form research code takes). The derived
field (autodiff of the loss, Gaussian expectations by quadrature) is evaluated with tensor
Gauss-Hermite rules, plain and with compressed nodes (``scale = 0.8``), at one point (one call)
and at a batch of 256 points (one vmapped call). Printed per rule: nodes, max error against the
closed form, median time and its ratio to each closed form (at one point, to NumPy: the median
of the per-round ratios, the derived field and the NumPy closed form timed in turn). Every
JAX program here (closed form included) is compiled with attnflow's CPU compiler options, as
`derive.vector_field`, `integrate` and `sweep` compile their own top-level calls
(`attnflow._jit.cpu_compiler_options`);
``--xla-defaults`` compiles them with XLA's defaults instead.
Usage: python benchmarks/derive_field.py [--reps N] [--xla-defaults]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from attnflow import derive  # noqa: E402
from attnflow._jit import cpu_compiler_options  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
try:  # the closed form is the tests' own, and tests/test_derive.py imports pytest
    from test_derive import closed_form as saad_solla
except ImportError as e:
    raise SystemExit(
        f"derive_field.py takes its closed form from tests/test_derive.py, which needs pytest ({e}); "
        'install it with pip install -e ".[bench]"'
    ) from e

K = M = 2
BATCH = 256


def closed_form(R, Q, xp):
    """``{"R": dR/dt, "Q": dQ/dt}`` at eta = 1, unit readouts, T = I: the closed form written out in
    ``tests/test_derive.py`` (Saad & Solla 1995, the I3 and I4 integrals), in the array library
    ``xp`` (``numpy`` or ``jax.numpy``)."""
    field, _ = saad_solla(R, Q, xp.eye(M), xp.ones(K), xp.ones(M), 1.0, 0.0, xp=xp)
    return {"R": field["R"], "Q": field["Q"]}


def hand_integrand(R, Q, rule):
    """The same quadrature with the integrand written out by hand (``delta_k = (sum g(nu) -
    sum g(lambda)) g'(lambda_k)``): what autodiff of the loss costs per node, against nothing."""
    from attnflow.expect import psd_sqrt

    z, w = rule
    S = psd_sqrt(derive.covariance(R, Q, jnp.eye(M)))
    g = z @ S.T
    lam, nu = g[:, :K], g[:, K:]
    err = jnp.sum(derive.erf_activation(nu), 1) - jnp.sum(derive.erf_activation(lam), 1)
    delta = err[:, None] * jnp.sqrt(2 / jnp.pi) * jnp.exp(-(lam**2) / 2)
    wd = w[:, None] * delta
    return {"R": wd.T @ nu, "Q": wd.T @ lam + lam.T @ wd + wd.T @ delta}


def median_time(fn, *args, reps):
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def interleaved(fn, args, numpy_peer, reps):
    """Median time of ``fn(*args)`` and the median of its per-round ratios to the NumPy closed
    form, the two timed one after the other in each of ``reps`` rounds: a load change on a
    shared machine then moves both sides of the ratio alike. (Not the jitted closed form: one
    call of it is mostly dispatch, which takes three times as long right after another
    program as back to back.)"""
    jax.block_until_ready(fn(*args))
    times, to_np = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        t1 = time.perf_counter()
        numpy_peer()
        t2 = time.perf_counter()
        times.append(t1 - t0)
        to_np.append((t1 - t0) / (t2 - t1))
    return float(np.median(times)), float(np.median(to_np))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=31, help="timed repetitions per measurement (median)")
    parser.add_argument("--xla-defaults", action="store_true", help="compile with XLA's default options")
    args = parser.parse_args()
    reps = args.reps
    options = {} if args.xla_defaults else cpu_compiler_options()
    jit = functools.partial(jax.jit, compiler_options=options or None)
    R = jnp.array([[0.3, 0.1], [0.05, 0.2]])
    Q = jnp.array([[0.5, 0.1], [0.1, 0.4]])
    Rb = R + 0.01 * jax.random.normal(jax.random.PRNGKey(0), (BATCH, K, M))
    Qb = jnp.broadcast_to(Q, (BATCH, K, K))

    cf = jit(lambda R, Q: closed_form(R, Q, jnp))
    cf_batch = jit(jax.vmap(lambda R, Q: closed_form(R, Q, jnp)))
    ref = cf(R, Q)
    Rn, Qn = np.asarray(R), np.asarray(Q)
    t_jax = median_time(cf, R, Q, reps=reps)
    t_jax_b = median_time(cf_batch, Rb, Qb, reps=reps)
    t_np = median_time(lambda: closed_form(Rn, Qn, np), reps=reps)
    t_np_b = median_time(lambda: [closed_form(Rn + 0.0 * i, Qn, np) for i in range(BATCH)], reps=max(3, reps // 10))
    print(f"devices: {jax.devices()}; compiler options: {options or 'XLA defaults'}")
    print(f"closed form, JAX jit : {t_jax * 1e6:9.1f} us at one point, {t_jax_b * 1e3:8.3f} ms for {BATCH} (vmap)")
    print(f"closed form, NumPy   : {t_np * 1e6:9.1f} us at one point, {t_np_b * 1e3:8.3f} ms for {BATCH} (loop)")
    print()
    print(
        f"{'rule':>28} {'nodes':>7} {'max error':>10} | {'one point':>10} {'/JAX':>7} {'/NumPy':>7} |"
        f" {'batch':>10} {'/JAX':>7} {'/NumPy':>7}"
    )
    for points, scale in [(6, 1.0), (7, 0.8), (8, 0.8), (10, 0.8), (12, 0.8), (16, 1.0), (16, 0.8), (24, 1.0)]:
        quad = derive.GaussHermite(points, scale=scale)
        with warnings.catch_warnings():
            # GaussHermite(24) has 331,776 nodes, over the default budget: measuring such a rule is
            # the point of its row, so the budget warning says nothing here
            warnings.filterwarnings(
                "ignore", message=r".*times the default budget HERMITE_BUDGET", category=UserWarning
            )
            s = derive.Setup(derive.soft_committee, derive.soft_committee, R, Q, quadrature=quad)
            rl = derive.rule(s)  # passed as an argument: a constant would be folded into the program
        one = jit(lambda R, Q, r, s=s: derive.vector_field(s, R, Q, None, r))
        batch = jit(jax.vmap(lambda R, Q, r, s=s: derive.vector_field(s, R, Q, None, r), (0, 0, None)))
        out = one(R, Q, rl)
        err = max(float(jnp.max(jnp.abs(out[k] - ref[k]))) for k in ("R", "Q"))
        t1, r_np = interleaved(one, (R, Q, rl), lambda: closed_form(Rn, Qn, np), reps=reps)
        r_jax = t1 / t_jax
        tb = median_time(batch, Rb, Qb, rl, reps=max(3, reps // 5))
        name = f"GaussHermite({points}{'' if scale == 1.0 else f', scale={scale}'})"
        if (points, scale) == (16, 1.0):
            hand = jit(jax.vmap(hand_integrand, (0, 0, None)))
            th = median_time(hand, Rb, Qb, rl, reps=max(3, reps // 5))
            print(
                f"{'(hand-written integrand)':>28} {rl[0].shape[0]:>7} {'':>10} | {'':>10} {'':>7} {'':>7} |"
                f" {th * 1e3:8.2f}ms {th / t_jax_b:6.0f}x {th / t_np_b:6.1f}x"
            )
        print(
            f"{name:>28} {rl[0].shape[0]:>7} {err:>10.1e} | {t1 * 1e6:8.1f}us {r_jax:6.1f}x {r_np:6.1f}x |"
            f" {tb * 1e3:8.2f}ms {tb / t_jax_b:6.0f}x {tb / t_np_b:6.1f}x"
        )


if __name__ == "__main__":
    main()
