"""Warnings of the library name the line of the user's code that called it, not a wrapper
inside attnflow (the verbs are wrapped by `attnflow._keywords`, Setups by Equinox)."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import deeplinear, focus


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    assert caught, "no warning"
    return [(w.filename, str(w.message)) for w in caught]


@pytest.mark.parametrize(
    "call, start",
    [
        (lambda: deeplinear.train(deeplinear.Setup(), 1.0, dt=0.5, key=0), "gradient descent with eta dt s_max"),
        (lambda: af.fit_power_law(np.array([1.0, 2.0, 4.0]), np.array([1.0, 0.0, 0.25])), "fit_power_law: left out 1"),
        (
            lambda: focus.train(focus.Setup(chain=focus.MarkovChain.lazy(focus.SYNTHETIC_PI, 0.95)), 0.1, key=0),
            "the chain's autocorrelation time",
        ),
    ],
    ids=["deeplinear.train", "fit_power_law", "focus.train"],
)
def test_warning_names_the_callers_line(call, start):
    messages = _caught(call)
    mine = [m for f, m in messages if m.startswith(start)]
    assert mine, messages
    assert all(f == __file__ for f, m in messages if m.startswith(start)), messages


def test_deeplinear_warning_states_the_rate():
    # the deeplinear warning states the rate it refused: eta dt s_max
    s = deeplinear.Setup()
    rate = float(s.eta) * 0.5 * float(jnp.max(s.s))
    (msg,) = [m for _, m in _caught(lambda: deeplinear.train(s, 1.0, dt=0.5, key=0)) if "s_max" in m]
    assert f"s_max = {rate:.3g} >= 1" in msg
