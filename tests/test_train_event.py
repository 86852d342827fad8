"""`train(..., event=...)` and `event_time`: the time of an event on a run's saved points; one
compilation of a run for every length with as many save points."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import attnflow as af
from attnflow import deeplinear as dl
from attnflow import qkov


def _line(slopes, ts):
    ts = np.broadcast_to(ts, (len(slopes), len(ts)))
    return af.Trajectory(ts, {"y": 1.0 - np.asarray(slopes)[:, None] * ts, "v": np.zeros(ts.shape + (3,))})


def test_event_time_is_the_linear_crossing_between_saves():
    ts = np.linspace(0.0, 2.0, 21)
    traj = _line([1.0, 0.5, 0.1], ts)
    t = af.event_time(traj, lambda t, o: o["y"] - 0.63)
    # y = 1 - a t crosses 0.63 at 0.37 / a; linear in t, so interpolation is exact; a = 0.1 never does
    np.testing.assert_allclose(t[:2], [0.37, 0.74], rtol=1e-12)
    assert np.isnan(t[2])
    # a boolean event: the first save time at which it holds
    tb = af.event_time(traj, lambda t, o: o["y"] < 0.63)
    np.testing.assert_allclose(tb[:2], [0.4, 0.8], rtol=1e-12)
    assert np.isnan(tb[2])
    # the time enters the event too; a failed (NaN) run has no event
    np.testing.assert_allclose(af.event_time(traj, lambda t, o: t - 1.234)[0], 1.234, rtol=1e-12)
    failed = af.Trajectory(np.full(5, np.nan), {"y": np.full(5, np.nan)})
    assert np.isnan(af.event_time(failed, lambda t, o: o["y"]))
    # a boolean event true from the start is at the first save, as a solve stops at once; one save point
    np.testing.assert_allclose(af.event_time(traj, lambda t, o: o["y"] < 2.0), [0.0, 0.0, 0.0])
    one = af.Trajectory(np.array([1.0]), {"y": np.array([0.5])})
    assert (
        np.isnan(af.event_time(one, lambda t, o: o["y"] - 0.1)) and af.event_time(one, lambda t, o: o["y"] > 0) == 1.0
    )
    # traceable: under jit the same numbers
    np.testing.assert_allclose(jax.jit(lambda tr: af.event_time(tr, lambda t, o: o["y"] - 0.63))(traj), t)


def test_event_time_bad_events_are_named():
    traj = _line([1.0], np.linspace(0.0, 1.0, 5))
    with pytest.raises(ValueError, match=r"no observable 'x'.*\['v', 'y'\]"):
        af.event_time(traj, lambda t, o: o["x"])
    with pytest.raises(ValueError, match="one real number"):
        af.event_time(traj, lambda t, o: o["v"])
    with pytest.raises(ValueError, match="callable"):
        af.event_time(traj, 0.5)
    with pytest.raises(ValueError, match="must be a Trajectory"):
        af.event_time({"y": 1}, lambda t, o: o["y"])


def test_deeplinear_train_event_against_solve_and_first_crossing():
    s = dl.Setup()
    event = lambda t, o: o["loss"] - 1.0
    run = dl.train(s, 8.0, event=event)
    flow = dl.solve(s, 8.0, event=event)
    # the same crossing as first_crossing on the saves; within O(dt) + the save spacing of the flow's root
    np.testing.assert_allclose(run.t_event, af.first_crossing(run, "loss", 1.0, above=False, interpolate=True))
    assert abs(float(run.t_event) - float(flow.t_event)) < 0.05 * float(flow.t_event)
    assert float(run.ts[-1]) == 8.0  # a run goes on to t1
    # no event: no t_event; a bad event is refused before training
    assert dl.train(s, 8.0).t_event is None
    with pytest.raises(ValueError, match=r"no observable 'los'"):
        dl.train(s, 8.0, event=lambda t, o: o["los"])
    # one time per seed under vmap
    runs = jax.vmap(lambda k: dl.train(s, 4.0, key=k, batch=8, event=lambda t, o: o["loss"] - 2.0))(jnp.arange(3))
    assert runs.t_event.shape == (3,) and np.all(np.isfinite(runs.t_event))
    assert len(set(np.asarray(runs.t_event).tolist())) == 3


def test_qkov_train_event_flow_descent_and_solve_agree():
    s = qkov.Setup()
    event = lambda t, o: o["loss"] - 1.3
    flow = qkov.train(s, 200.0, event=event)  # gradient flow of the full matrices: stops at the root
    descent = qkov.train(s, 200.0, dt=0.5, event=event)
    theory = qkov.solve(s, 200.0, event=event)
    assert float(flow.ts[-1]) == pytest.approx(float(flow.t_event), rel=1e-12)
    for t in (flow.t_event, descent.t_event):
        assert abs(float(t) - float(theory.t_event)) < 0.01 * float(theory.t_event)


def test_train_compiles_once_for_every_length():
    s = dl.Setup()
    a = dl.train(s, 4.0)
    with af.count_compilations() as c:
        b = dl.train(s, 6.0)
    assert c.n == 0, c
    assert b.meta["steps"] == 600 and float(b.ts[-1]) == 6.0 and a.meta["steps"] == 400
    # the longer run passes through the shorter one's end
    c6 = dl.train(s, 6.0, save=af.TimeGrid([0.0, 4.0, 6.0]))
    np.testing.assert_allclose(c6["u"][1], a["u"][-1], rtol=1e-12)


def test_simulate_step_grid_is_an_argument():
    model = {"w": jnp.ones(3)}

    def loss(m, _):
        return 0.5 * jnp.sum(m["w"] ** 2)

    opt = optax.sgd(0.1)
    first = af.simulate(loss, model, opt, 50, save=af.LinearGrid(6))
    with af.count_compilations() as c:
        second = af.simulate(loss, model, opt, 100, save=af.LinearGrid(6))
    assert c.n == 0, c
    # gradient descent on w^2 / 2: w_n = 0.9^n exactly
    np.testing.assert_allclose(first["loss"], 1.5 * 0.81 ** np.linspace(0, 50, 6), rtol=1e-12)
    np.testing.assert_allclose(second["loss"], 1.5 * 0.81 ** np.linspace(0, 100, 6), rtol=1e-12)
    # steps=None: train to the last step of a TimeGrid; a traced grid inside a compiled function
    third = af.simulate(loss, model, opt, None, save=af.TimeGrid([0, 10, 30]))
    assert third.meta["steps"] == 30
    np.testing.assert_allclose(third["loss"], 1.5 * 0.81 ** np.array([0, 10, 30]), rtol=1e-12)
    run = eqx.filter_jit(lambda st: af.simulate(loss, model, opt, None, save=af.TimeGrid(st)))
    np.testing.assert_allclose(run(np.array([0, 10, 30], np.int32))["loss"], third["loss"], rtol=1e-12)
    assert "steps" not in run(np.array([0, 5, 7], np.int32)).meta
    # steps past the last save: the model returned is the one after `steps`
    _, m = af.simulate(loss, model, opt, 30, save=af.TimeGrid([0, 10]), return_model=True)
    np.testing.assert_allclose(m["w"], 0.9**30, rtol=1e-12)
    with pytest.raises(ValueError, match="last step of the TimeGrid, which must be positive"):
        af.simulate(loss, model, opt, None, save=af.TimeGrid([0]))
    with pytest.raises(ValueError, match="steps=None needs save=TimeGrid"):
        af.simulate(loss, model, opt, None)


def test_train_returns_the_trained_network():
    from attnflow import derive

    s = dl.Setup()
    run, net = dl.train(s, 2.0, return_model=True)
    assert isinstance(net, dl.TwoLayerLinear)
    obs = dl.model_observables(net, s.teacher)
    np.testing.assert_allclose(obs["u"], run.final()["u"], rtol=1e-12)
    np.testing.assert_allclose(dl.train(s, 2.0)["u"], run["u"], rtol=0)  # the same run with or without it
    # a save grid that ends before t1: the run (and the network returned) goes on to t1
    early, net4 = dl.train(s, 4.0, save=af.TimeGrid([0.0, 1.0]), return_model=True)
    assert early.meta["steps"] == 400 and float(early.ts[-1]) == 1.0
    np.testing.assert_allclose(dl.model_observables(net4, s.teacher)["u"], dl.train(s, 4.0).final()["u"], rtol=1e-12)
    q = qkov.Setup()
    for kw in ({}, {"dt": 0.5}):  # gradient flow (the state at t1) and descent
        run, net = qkov.train(q, 50.0, return_model=True, **kw)
        np.testing.assert_allclose(qkov.model_observables(net, q.task)["loss"], run.final()["loss"], rtol=1e-10)
    R0, Q0 = [[0.1, 0.0], [0.0, 0.05]], [[0.5, 0.1], [0.1, 0.4]]
    ds = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=derive.GaussHermite(6))
    run, w = derive.train(ds, 1.0, D=100, return_model=True)
    np.testing.assert_allclose(w["W"] @ w["W_star"].T / 100, run.final()["R"], rtol=1e-12)
    np.testing.assert_allclose(w["W"] @ w["W"].T / 100, run.final()["Q"], rtol=1e-12)


def test_integrate_returns_the_final_state():
    s = dl.Setup()  # eta = 1: the closed form's clock
    o = dl.ode(s)
    traj, u = af.integrate(o, o.y0, 3.0, return_state=True)
    np.testing.assert_allclose(u, traj.final()["u"], rtol=1e-12)
    np.testing.assert_allclose(u, dl.mode_strength(3.0, s.s, s.u0), rtol=1e-7)
    _, u2 = o.solve(3.0, return_state=True)  # the same through the ODE's own solve
    np.testing.assert_allclose(u2, u, rtol=1e-12)
    # continuing from it is the solve to a later time
    later = af.integrate(o, u, 5.0, t0=3.0)
    np.testing.assert_allclose(later.final()["u"], af.integrate(o, o.y0, 5.0).final()["u"], rtol=1e-7)


def test_train_goes_on_from_a_returned_network():
    from attnflow import derive, focus

    s = dl.Setup()
    _, net = dl.train(s, 2.0, return_model=True)
    # gradient descent is deterministic: two halves are the whole run
    np.testing.assert_array_equal(dl.train(s, 2.0, model=net).final()["u"], dl.train(s, 4.0).final()["u"])
    q = qkov.Setup()
    for kw in ({}, {"dt": 0.5}):  # the full-matrix flow (to solver tolerance) and descent (exactly)
        _, qnet = qkov.train(q, 50.0, return_model=True, **kw)
        two = qkov.train(q, 50.0, model=qnet, **kw).final()["loss"]
        np.testing.assert_allclose(two, qkov.train(q, 100.0, **kw).final()["loss"], rtol=1e-8)
    with pytest.raises(ValueError, match=r"model.W_qk has shape \(412, 412\), the setup's start \(416, 416\)"):
        m3 = qkov.Setup(M=3)
        qkov.train(q, 5.0, model=m3.model(m3.initial_state()))
    # SGD packages: the run starts where the network is (its own D), with fresh samples from another key
    R0, Q0 = [[0.1, 0.0], [0.0, 0.05]], [[0.5, 0.1], [0.1, 0.4]]
    ds = derive.Setup(derive.soft_committee, derive.soft_committee, R0, Q0, quadrature=derive.GaussHermite(6))
    first, w = derive.train(ds, 1.0, D=100, return_model=True)
    on = derive.train(ds, 1.0, model=w, key=1)
    assert on.meta["D"] == 100
    np.testing.assert_allclose(on["R"][0], first.final()["R"], rtol=1e-12)
    with pytest.raises(ValueError, match=r"model\['W'\] must have shape \(2, 100\)"):
        derive.train(ds, 1.0, model={"W": w["W"][:1], "W_star": w["W_star"]})
    fs = focus.Setup()
    first, fnet = focus.train(fs, 0.5, return_model=True)
    np.testing.assert_allclose(focus.train(fs, 0.5, model=fnet, key=1)["loss"][0], first.final()["loss"], rtol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        focus.train(fs, 0.5, model=fnet, initial=fs.theta0())
    from attnflow import heads

    hs = heads.Setup()
    first, hnet = heads.train(hs, 0.5, D=200, return_model=True)
    on = heads.train(hs, 0.5, model=hnet, key=1)  # D from the network
    np.testing.assert_allclose(on["M"][0], first.final()["M"], rtol=1e-12)
    with pytest.raises(ValueError, match=r"model.K has shape \(2, 200\), the setup's start \(2, 300\)"):
        heads.train(hs, 0.5, model=hnet, D=300)
