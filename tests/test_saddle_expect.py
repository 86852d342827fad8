"""fixed_point and gauss_hermite / GaussianBank.expect on traced input: a failure is reported
(an error under jit / vmap, a failed point in a sweep), never a silently different answer."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af

NOT_CONVERGED = (
    "fixed_point: root find did not converge (traced: the residual is not shown; call it outside jit "
    "for the numbers); try another initial guess, more max_steps, or a damped solver (optx.LevenbergMarquardt)"
)


def _saddle_node(t, y, mu):
    return mu + y**2  # roots -sqrt(-mu), sqrt(-mu) for mu < 0, none for mu > 0


def _root(mu):
    return af.fixed_point(_saddle_node, jnp.array([-2.0]), mu)[0]


def test_fixed_point_traced_non_convergence_fails_like_integrate():
    # converged points are unaffected under jit and vmap, and their derivative is kept
    assert float(jax.jit(_root)(-4.0)) == pytest.approx(-2.0, abs=1e-12)
    np.testing.assert_allclose(jax.vmap(_root)(jnp.array([-1.0, -4.0])), [-1.0, -2.0], atol=1e-12)
    assert float(jax.jit(jax.grad(_root))(-4.0)) == pytest.approx(0.25, abs=1e-10)  # d(-sqrt(-mu))/dmu
    # no root at mu = 1: under jit and vmap an error with the message, as integrate's failed solve
    # (JAX raises equinox's runtime error as a ValueError or RuntimeError, depending on the trace)
    with pytest.raises((RuntimeError, ValueError), match=re.escape(NOT_CONVERGED)):
        jax.block_until_ready(jax.jit(_root)(1.0))
    with pytest.raises((RuntimeError, ValueError), match=re.escape(NOT_CONVERGED)):
        jax.block_until_ready(jax.vmap(_root)(jnp.array([-1.0, 1.0])))
    # in a sweep the point fails, with the message, and the others keep their values
    with pytest.warns(RuntimeWarning, match=r"1 of 2 grid points failed: mu=1.0: fixed_point: root find did not"):
        res = af.sweep(_root, {"mu": np.array([-1.0, 1.0])}, progress=False)
    assert res.status.tolist() == [0, 1]
    assert res.failures() == [({"mu": 1.0}, NOT_CONVERGED)]
    assert float(res.values[0]) == pytest.approx(-1.0, abs=1e-12) and np.isnan(res.values[1])
    # throw=False: the last iterate, under jit too
    last = jax.jit(lambda mu: af.fixed_point(_saddle_node, jnp.array([-2.0]), mu, throw=False)[0])(1.0)
    assert np.isfinite(float(last)) and float(1.0 + last**2) > 1.0  # not a root, and not NaN


COV_TRACED = (
    "cov must be symmetric and positive semidefinite (up to 1e-6 of its largest entry, traced), but a traced "
    "cov (in a jit, vmap, sweep or ODE field) is not; its values are not shown"
)
_INDEFINITE = jnp.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3, -1
_ASYMMETRIC = jnp.array([[1.0, 0.9], [0.1, 1.0]])


def _xy(x):
    return x[0] * x[1]


def _gh(c):
    return af.gauss_hermite(_xy, 3, jnp.zeros(2), c)


def _bank(c):
    return af.GaussianBank(0, 200, 2).expect(_xy, cov=c)


@pytest.mark.parametrize("expect", [_gh, _bank], ids=["gauss_hermite", "GaussianBank"])
def test_traced_cov_is_checked_as_a_concrete_one(expect):
    for cov, eager in [(_INDEFINITE, "its smallest eigenvalue is -1"), (_ASYMMETRIC, r"\|cov - cov\^T\| reaches 0.8")]:
        with pytest.raises(ValueError, match=eager):
            expect(cov)
        with pytest.raises((RuntimeError, ValueError), match=re.escape(COV_TRACED)):
            jax.block_until_ready(jax.jit(expect)(cov))
    # a rounding-size negative eigenvalue (1e-12 of 2) is clipped, not refused: E[x0 x1] = cov_01
    near = jnp.ones((2, 2)) - 1e-12 * jnp.eye(2)
    assert float(jax.jit(_gh)(near)) == pytest.approx(1.0, abs=1e-9)
    # traced, an integration-error-size one too (1e-7 of 2: refused concretely, passed traced)
    off = jnp.ones((2, 2)) - 1e-7 * jnp.eye(2)
    with pytest.raises(ValueError, match="smallest eigenvalue"):
        _gh(off)
    assert float(jax.jit(_gh)(off)) == pytest.approx(1.0, abs=1e-6)
    # in a sweep the point fails with the message; the good point keeps E[x0 x1] (exact for G-H)
    with pytest.warns(RuntimeWarning, match="1 of 2 grid points failed: q=2.0: cov must be symmetric"):
        res = af.sweep(lambda q: expect(jnp.array([[1.0, q], [q, 1.0]])), {"q": np.array([0.5, 2.0])}, progress=False)
    assert res.failures() == [({"q": 2.0}, COV_TRACED)] and np.isnan(res.values[1])
    if expect is _gh:
        assert float(res.values[0]) == pytest.approx(0.5, abs=1e-12)


def test_traced_cov_inside_an_ode_field_is_refused():
    # dq/dt = -E[x0 x1] under cov [[1, q], [q, 1]]: a covariance only for |q| <= 1
    def field(t, q, a):
        return -_gh(jnp.array([[1.0, q], [q, 1.0]]))

    tr = af.integrate(field, 0.5, 1.0, save=af.LinearGrid(2))
    assert float(tr.final()["y"]) == pytest.approx(0.5 * np.exp(-1.0), rel=1e-6)
    with pytest.raises((RuntimeError, ValueError), match=re.escape(COV_TRACED)):
        jax.block_until_ready(af.integrate(field, 2.0, 1.0, save=af.LinearGrid(2))["y"])


def test_gaussian_cov_forms_and_messages_name_what_was_passed():
    # a variance for one variable: both gauss_hermite and a bank of dim 1 take it
    assert float(af.gauss_hermite(lambda x: x**2, 3, 0.0, 3.0)) == pytest.approx(3.0, abs=1e-12)
    assert float(af.gauss_hermite(lambda x: x[0] ** 2, 3, jnp.zeros(1), 3.0)) == pytest.approx(3.0, abs=1e-12)
    bank = af.GaussianBank(0, 100, 1)
    np.testing.assert_allclose(
        bank.expect(lambda x: x[0] ** 2, cov=3.0), bank.expect(lambda x: x[0] ** 2, cov=3.0 * jnp.eye(1)), rtol=1e-15
    )
    with pytest.raises(ValueError) as err:
        af.gauss_hermite(lambda x: x[1] ** 2, 5, jnp.zeros(2), np.array([1.0, 2.0]))
    assert str(err.value) == "cov must have shape (2, 2) for a mean of shape (2,), got shape (2,)"
    with pytest.raises(ValueError) as err:
        af.gauss_hermite(lambda x: x[1] ** 2, 5, jnp.zeros(2), 2.0)
    assert str(err.value) == "cov must have shape (2, 2) for a mean of shape (2,), got shape ()"
    with pytest.raises(ValueError) as err:
        af.gauss_hermite(lambda x: x[0] ** 2, 5, jnp.zeros(1), np.ones(3))
    said = "cov must have shape (1, 1) (or, for one variable, a variance) for a mean of shape (1,), got shape (3,)"
    assert str(err.value) == said
    with pytest.raises(ValueError) as err:
        af.GaussianBank(0, 100, 2).expect(lambda x: x[0], cov=2.0)
    assert str(err.value) == "cov must have shape (2, 2) for this bank, got shape ()"
    with pytest.raises(ValueError) as err:
        bank.expect(lambda x: x[0], cov=np.ones(2))
    assert str(err.value) == "cov must have shape (1, 1) (or, in dim 1, a variance) for this bank, got shape (2,)"


def test_escape_time_traced_out_of_range_is_nan_not_a_negative_time():
    """Concrete bad input raises; traced (a user's jit) it gives NaN, and a sweep point fails."""
    with pytest.raises(ValueError, match="lam .unstable rate. must be finite and positive"):
        af.escape_time(-1.0, 1e-3)
    assert np.isnan(float(jax.jit(af.escape_time)(-1.0, 1e-3)))
    assert np.isnan(float(jax.jit(af.escape_time)(2.0, 2.0)))  # eps not below r = 1
    assert float(jax.jit(af.escape_time)(2.0, 1e-3)) == pytest.approx(np.log(1e3) / 2, rel=1e-14)
    with pytest.warns(RuntimeWarning, match="1 of 3 grid points failed"):
        res = af.sweep(lambda eps: af.escape_time(2.0, eps), {"eps": np.array([1e-3, 1e-2, 2.0])}, progress=False)
    assert res.status[:2].tolist() == [0, 0] and res.status[2] != 0 and np.isnan(res.values[2])
    assert res.failures()[0][1] == "escape_time: lam (unstable rate) and eps must be positive, eps below r"


def test_a_non_finite_traced_cov_is_left_to_the_caller():
    """A NaN covariance (a diverged ODE state) is not called 'not positive semidefinite': the NaN
    reaches the result, where integrate names a diverged state."""
    bad = jnp.full((2, 2), jnp.nan)
    assert np.isnan(float(jax.jit(_gh)(bad)))
