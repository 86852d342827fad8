"""`AbstractSetup.replace` converts and validates a new value exactly as the constructor does."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import deeplinear as dl
from attnflow import focus, heads

# (package, one scalar learning-rate-like array field, its name in error messages)
CASES = [
    pytest.param(dl, "eta", r"eta \(learning rate\)", id="deeplinear"),
    pytest.param(heads, "eta", "eta", id="heads"),
    pytest.param(focus, "tau", r"tau \(score scale\)", id="focus"),
]


@pytest.mark.parametrize("P, field, label", CASES)
def test_replace_converts_as_the_constructor(P, field, label):
    setup = P.Setup()
    made, replaced = getattr(P.Setup(**{field: 2}), field), getattr(setup.replace(**{field: 2}), field)
    assert isinstance(replaced, jax.Array) and type(replaced) is type(made)
    assert replaced.dtype == made.dtype == jnp.result_type(float) and replaced.shape == made.shape == ()
    assert float(replaced) == 2.0
    for value in (np.float32(2.5), np.array(2.5), jnp.asarray(2.5)):  # already arrays: the field's dtype
        assert getattr(setup.replace(**{field: value}), field).dtype == made.dtype

    # integers are data, not static values: a new one reuses the compiled function
    double = eqx.filter_jit(lambda s: getattr(s, field) * 2.0)
    assert float(double(setup.replace(**{field: 2}))) == 4.0
    with af.count_compilations() as c:
        out = [float(double(setup.replace(**{field: v}))) for v in (3, 4, 5.0)]
    assert c.n == 0, c.by_name
    assert out == [6.0, 8.0, 10.0]


@pytest.mark.parametrize("P, field, label", CASES)
def test_replace_refuses_what_the_constructor_refuses(P, field, label):
    setup = P.Setup()
    for value, what in (
        (True, "a boolean: True"),
        (np.bool_(False), "a boolean: False"),
        (1 + 0j, r"a complex number: \(1\+0j\)"),
        (np.complex128(2.0), r"a complex number: np.complex128\(2\+0j\)"),
    ):
        message = f"{label} must be a real number or array of them, got {what}"
        with pytest.raises(ValueError, match=message):
            setup.replace(**{field: value})
        with pytest.raises(ValueError, match=message):
            P.Setup(**{field: value})
    with pytest.raises(ValueError, match=f"{label} must be a real number or array of them, got 'fast'"):
        setup.replace(**{field: "fast"})
    with pytest.raises(ValueError, match=rf"^{field}\b.* must be finite and positive, got -1"):
        setup.replace(**{field: -1})


@pytest.mark.parametrize("P, field, label", CASES)
def test_replace_takes_traced_values(P, field, label):
    setup = P.Setup()
    out = jax.jit(lambda v: getattr(setup.replace(**{field: v}), field) * 2.0)(3)
    assert float(out) == 6.0
    batch = jax.vmap(lambda v: getattr(setup.replace(**{field: v}), field))(jnp.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(batch, [1.0, 2.0, 3.0])


def test_deeplinear_replace_lists_shapes_and_solves_under_jit():
    setup = dl.Setup()
    two = setup.replace(s=[2.0, 1.0], u0=[1e-3, 2e-3])
    assert isinstance(two.s, jax.Array) and two.s.dtype == jnp.result_type(float)
    np.testing.assert_array_equal(two.s, [2.0, 1.0])
    np.testing.assert_array_equal(two.u0, [1e-3, 2e-3])
    assert setup.replace(s=(2.0, 1.0)).s.shape == (2,)
    # a static field is stored as given, and validated
    assert setup.replace(n_in=10).n_in == 10
    with pytest.raises(ValueError, match="n_in"):
        setup.replace(n_in=2)
    with pytest.raises(ValueError, match=r"u0 \(initial mode strength\) must be a number or one per mode"):
        setup.replace(s=[2.0, 1.0, 0.5], u0=[1e-3, 2e-3])
    # a traced learning rate through replace, inside the user's jit: the closed form at eta t
    final = jax.jit(lambda eta: dl.solve(setup.replace(eta=eta), 2.0, save=af.LinearGrid(2)).final()["u"])(0.5)
    np.testing.assert_allclose(final, dl.mode_strength(1.0, setup.s, setup.u0), rtol=1e-8)
    res = af.sweep(
        lambda s0: dl.solve(setup.replace(s=jnp.array([3.0, 2.0, 1.0, s0])), 2.0, save=af.LinearGrid(2)).final()["u"],
        {"s0": np.array([0.5, 0.25])},
        progress=False,
    )
    np.testing.assert_allclose(res.values[:, 3], dl.mode_strength(2.0, np.array([0.5, 0.25]), 1e-3), rtol=1e-8)


def test_float_fields_without_array_field_refuse_booleans_and_complex_numbers_too():
    """heads' eta_b and derive's rates convert through the same check as `array_field`."""
    from attnflow import derive

    with pytest.raises(ValueError, match="eta_b must be a real number or array of them, got a boolean"):
        heads.Setup(eta_b=True)
    with pytest.raises(ValueError, match=r"eta \(learning rate of W\) must be a real number .* got a complex number"):
        derive.Setup(derive.soft_committee, derive.soft_committee, 0.1 * jnp.eye(2), 0.5 * jnp.eye(2), eta=1.0 + 0.5j)
    assert float(heads.Setup(eta_b=2).eta_b) == 2.0


class _PlainRate(af.AbstractSetup):
    """A user's setup with a plain float field (no converter)."""

    lr: float = 0.1


def test_replace_makes_a_plain_float_field_data():
    """Without a converter a float still becomes an array: a Python float would be a static leaf of a
    compiled function and every new value would compile again."""
    s = _PlainRate()

    @eqx.filter_jit
    def run(setup):
        return setup.lr * 2.0

    run(s.replace(lr=0.5))
    with af.count_compilations() as c:
        values = [float(run(s.replace(lr=x))) for x in (0.25, 0.75, 1.5)]
    assert values == [0.5, 1.5, 3.0] and c.n == 0
    assert isinstance(s.replace(lr=0.5).lr, jax.Array)
