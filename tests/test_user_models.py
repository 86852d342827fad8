"""A user's own model through the core verbs: float32 events and tolerances in `integrate`, the
progress bar of `simulate`, Python-float fields of a model, and what `simulate(throw=False)` records
after a divergence."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimistix as optx
import pytest

import attnflow as af
import attnflow._io
from attnflow import ode as ode_module


def logistic(t, u, a):
    return 2.0 * a["eta"] * u * (a["s"] - u)


def half(t, u, a):
    return u - 0.5 * a["s"]


def t_half_exact(s):
    """``du/dt = 2 u (s - u)`` from ``u = 1e-3`` reaches ``s / 2`` at ``log(s / 1e-3 - 1) / (2 s)``."""
    return np.log(s / 1e-3 - 1) / (2 * s)


class Lin(eqx.Module):
    a: jax.Array
    b: jax.Array


def lin_loss(m, batch):
    return 0.5 * (2.0 - m.a * m.b) ** 2


# --- 1. float32: the event's root find and tolerances below the dtype's resolution ---------------


def test_float32_events_agree_with_the_closed_form():
    # the root find's tolerance was 1e-12 in every dtype: 12 of these 15 float32 solves raised
    # "root find (Newton) ... failed (nonlinear_max_steps_reached)"
    errors = []
    for s in np.linspace(0.5, 4.0, 15):
        traj = af.integrate(
            logistic, 1e-3, 30.0, args={"s": float(s), "eta": 1.0}, dtype=jnp.float32, event=half,
            save=af.LinearGrid(2),
        )  # fmt: skip
        assert traj.t_event.dtype == jnp.float32
        errors.append(abs(float(traj.t_event) - t_half_exact(s)) / t_half_exact(s))
    assert max(errors) <= 5e-7  # measured 1.35e-7: about one float32 ulp of t*


def test_float32_boolean_event_with_x64_on():
    # with 64-bit mode on (as in these tests) Diffrax's root find failed to trace a float32 solve
    # ("cond branches must have equal output types"); a boolean event fires at the end of its step
    traj = af.integrate(
        logistic, 1e-3, 30.0, args={"s": 2.0, "eta": 1.0}, dtype=jnp.float32, event=lambda t, u, a: u > 1.0,
        save=af.LinearGrid(2),
    )  # fmt: skip
    t_event = float(traj.t_event)
    assert 0 < t_event - t_half_exact(2.0) < 0.02  # measured 6.6e-3: within the step that crosses u = 1
    assert float(traj.ts[-1]) == t_event and float(traj.final()["y"]) > 1.0


def test_event_tolerance_follows_the_dtype():
    assert ode_module._event_tolerance(jnp.float64) == 1e-12  # float64 as before
    assert ode_module._event_tolerance(jnp.float32) == pytest.approx(8 * 2.0**-23)


def test_float64_event_unchanged():
    # the float64 root finder is Newton(rtol=1e-12, atol=1e-12), as it always was: same event time
    ev = af.integrate(logistic, 1e-3, 30.0, args={"s": 2.0, "eta": 1.0}, event=half, save=af.LinearGrid(2))
    assert abs(float(ev.t_event) - t_half_exact(2.0)) < 1e-8
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(logistic), af.UnrolledTsit5(), 0.0, 30.0, None, jnp.asarray(1e-3),
        {"s": jnp.asarray(2.0), "eta": jnp.asarray(1.0)},
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10, dtmin=30.0 * 1e-12, force_dtmin=False),
        event=diffrax.Event(lambda t, y, args, **kw: half(t, y, args), optx.Newton(rtol=1e-12, atol=1e-12)),
        saveat=diffrax.SaveAt(t1=True), max_steps=100_000,
    )  # fmt: skip
    assert float(ev.t_event) == float(sol.ts[0])


def test_float32_event_of_large_terms_names_the_rescaling():
    # at s = 35 the event's value near its root is rounding noise of ~eps * 17, above the tolerance
    with pytest.raises(RuntimeError, match=r"In float32 the event's value near its root is rounding noise") as err:
        af.integrate(
            logistic, 1e-3, 30.0, args={"s": 35.0, "eta": 1.0}, dtype=jnp.float32, event=half, save=af.LinearGrid(2)
        )
    assert "divide the event by the size of its terms" in str(err.value)
    # the remedy it names works
    traj = af.integrate(
        logistic, 1e-3, 30.0, args={"s": 35.0, "eta": 1.0}, dtype=jnp.float32,
        event=lambda t, u, a: (u - 0.5 * a["s"]) / a["s"], save=af.LinearGrid(2),
    )  # fmt: skip
    assert abs(float(traj.t_event) - t_half_exact(35.0)) / t_half_exact(35.0) <= 1e-6


def test_tolerances_below_the_dtype_warn_before_solving():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(af.MaxStepsError):
            af.integrate(
                logistic, 1e-3, 8.0, args={"s": 2.0, "eta": 1.0}, dtype=jnp.float32, save=af.LinearGrid(2),
                solver=af.SolverOptions(rtol=1e-12, atol=1e-14),
            )  # fmt: skip
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1
    assert messages[0].startswith(
        "integrate: rtol=1e-12 and atol=1e-14 lie below the resolution of float32 (eps = 1.19e-07)"
    )
    assert caught[0].filename == __file__  # names the caller's line


@pytest.mark.parametrize(
    "dtype, rtol, atol",
    [
        (jnp.float32, 1e-8, 1e-10),  # the defaults: more steps than needed, but they work
        (jnp.float32, 1e-14, 1e-6),  # atol dominates: works
        (jnp.float64, 1e-12, 1e-14),
    ],
)
def test_workable_tolerances_do_not_warn(dtype, rtol, atol):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traj = af.integrate(
            logistic, 1e-3, 8.0, args={"s": 2.0, "eta": 1.0}, dtype=dtype, save=af.LinearGrid(2),
            solver=af.SolverOptions(rtol=rtol, atol=atol),
        )  # fmt: skip
    assert abs(float(traj.final()["y"]) - 2.0) < 1e-5


# --- 2. simulate(progress=True): ticks after their segment, close last, a total ---------------


class _RecordingBar:
    def __init__(self, events, **kwargs):
        self.events, self.total, self.n = events, kwargs.get("total"), 0
        events.append(("open", self.total))

    def update(self, k):
        self.n += k
        self.events.append(("update", self.n))

    def close(self):
        self.events.append(("close", self.n))


def test_simulate_progress_order_and_total(monkeypatch):
    events = []
    monkeypatch.setattr(attnflow._io, "progress_bar", lambda **kw: _RecordingBar(events, **kw))

    def loss(m, batch):  # each optimizer step leaves a mark, to see when the ticks come
        jax.debug.callback(lambda a: events.append(("step",)), m.a)
        return lin_loss(m, batch)

    model = Lin(jnp.array(0.1), jnp.array(0.1))
    af.simulate(
        loss, model, optax.sgd(0.01), 23, progress=True, save=af.TimeGrid([0, 5, 10, 20]), observe=lambda m: {"a": m.a}
    )
    seen, steps = [], 0
    for e in events:
        if e[0] == "step":
            steps += 1
        else:
            seen.append((e, steps))
    # the bar's total is the number of steps; each tick comes after the steps it counts; the
    # close comes after the 3 steps past the last save step, last of all
    assert seen == [
        (("open", 23), 5),
        (("update", 5), 5),
        (("update", 10), 10),
        (("update", 20), 20),
        (("update", 23), 23),
        (("close", 23), 23),
    ]


def test_simulate_progress_once_per_vmapped_run(monkeypatch):
    events = []
    monkeypatch.setattr(attnflow._io, "progress_bar", lambda **kw: _RecordingBar(events, **kw))
    model = Lin(jnp.array(0.1), jnp.array(0.1))
    mode = af.OnlineSGD(lambda k, n: jax.random.normal(k, (n,)), 1)

    def run(seed):
        return af.simulate(
            lambda m, x: lin_loss(m, None) + 0.01 * jnp.sum(x) * m.a, model, optax.sgd(0.01), 10, mode=mode,
            key=seed, progress=True, save=af.LinearGrid(3), observe=lambda m: {"a": m.a},
        )  # fmt: skip

    jax.vmap(run)(jnp.arange(3))
    assert [e for e in events if e[0] != "update" or e[1] != 10] == [("open", 10), ("update", 5), ("close", 10)]
    assert events[-1] == ("close", 10)


# --- 3. Python-float fields of a model -----------------------------------------------------------


def test_python_float_field_warns_and_stays_fixed():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traj, trained = af.simulate(
            lin_loss, Lin(0.1, jnp.array(0.1)), optax.sgd(0.05), 100, save=af.LinearGrid(2), return_model=True
        )
    messages = [str(w.message) for w in caught]
    assert messages == [
        "simulate: Python float(s) in the model do not train and stay fixed (model.a = 0.1); only JAX or NumPy "
        "float arrays train: give them as arrays (jnp.asarray(0.1)), or declare a constant eqx.field(static=True)"
    ]
    assert caught[0].filename == __file__
    assert trained.a == 0.1  # as the warning says
    assert float(trained.b) == pytest.approx(1.0707711481776536, rel=1e-12)
    assert np.asarray(traj["loss"]) == pytest.approx([1.98005, 1.79157852], rel=1e-8)


def test_model_of_python_floats_only_is_refused():
    expected = (
        "nothing in the model trains: its floats are Python floats (model.a = 0.1, model.b = 0.1); only JAX or NumPy "
        "float arrays train"
    )
    with pytest.raises(ValueError, match=r"^simulate: " + expected.replace("(", r"\(").replace(")", r"\)")):
        af.simulate(lin_loss, Lin(0.1, 0.1), optax.sgd(0.05), 100, save=af.LinearGrid(2))
    with pytest.raises(ValueError, match=r"^gradient_flow: " + expected.replace("(", r"\(").replace(")", r"\)")):
        af.gradient_flow(lambda m: lin_loss(m, None), Lin(0.1, 0.1), 5.0, save=af.LinearGrid(2))


def test_gradient_flow_python_float_field_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traj = af.gradient_flow(lambda m: lin_loss(m, None), Lin(0.1, jnp.array(0.1)), 5.0, save=af.LinearGrid(2))
    assert [str(w.message)[:76] for w in caught] == [
        "gradient_flow: Python float(s) in the model do not train and stay fixed (mod"
    ]
    # only b flows: db/dt = a (2 - a b), so b(t) = (2 - (2 - a b0) exp(-a^2 t)) / a with a = 0.1
    b = (2 - (2 - 0.01) * np.exp(-0.01 * 5.0)) / 0.1
    assert float(traj["loss"][-1]) == pytest.approx(0.5 * (2 - 0.1 * b) ** 2, rel=1e-7)


class Config(eqx.Module):
    w: jax.Array
    width: int  # integers and booleans are configuration: no warning
    relu: bool
    scale: float = eqx.field(static=True, default=0.5)


def test_integers_booleans_and_static_floats_do_not_warn():
    def loss(m, batch):
        return jnp.sum((m.scale * m.w - 1.0) ** 2) * m.width * (2 if m.relu else 1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traj = af.simulate(loss, Config(jnp.zeros(3), 3, True), optax.sgd(0.01), 10, save=af.LinearGrid(2))
    assert float(traj["loss"][0]) == 18.0


# --- 4. what simulate(throw=False) records after a divergence ------------------------------------


def test_divergence_records_the_frozen_parameters():
    traj, model, step = af.simulate(
        lin_loss, Lin(jnp.array(0.1), jnp.array(0.1)), optax.sgd(3.0), 100, throw=False, return_model=True,
        save=af.LinearGrid(11),
    )  # fmt: skip
    # the loss overflows at step 7 (a = b = -2.4e194, finite): the parameters freeze there
    assert int(step) == 7
    assert float(model.a) == pytest.approx(-2.3829622341206e194, rel=1e-10)
    assert np.isfinite(float(model.b))
    loss = np.asarray(traj["loss"])
    assert loss[0] == pytest.approx(1.98005)
    # the saves from the divergence on record the frozen parameters' loss, which is inf
    assert np.all(np.isposinf(loss[1:]))
