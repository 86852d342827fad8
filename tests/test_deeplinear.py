"""Validation of the core on Saxe, McClelland & Ganguli (2014), items 1-5 and 7 of the issue."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import attnflow as af
from attnflow import deeplinear as dl
from attnflow.deeplinear import (
    Teacher,
    TwoLayerLinear,
    conserved,
    factor_field,
    matrix_field,
    mode_field,
    mode_strength,
    population_loss,
)

S = jnp.array([3.0, 2.0, 1.0, 0.5])
U0 = 1e-3


def test_closed_form_solves_mode_ode():
    # d/dt of the closed form equals the field, via autodiff, at many times
    t = jnp.linspace(0.0, 10.0, 101)
    u = mode_strength(t[:, None], S, U0)
    du = jax.vmap(jax.jacfwd(lambda tt: mode_strength(tt, S, U0)))(t)
    np.testing.assert_allclose(du, 2 * u * (S - u), rtol=1e-10, atol=1e-12)


def test_integrate_matches_closed_form_1e8():
    tr = af.integrate(
        mode_field,
        jnp.full(4, U0),
        14.0,
        args={"s": S, "tau": 1.0},
        save=af.LinearGrid(300),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-14),
    )
    exact = mode_strength(tr.ts[:, None], S, U0)
    rel = jnp.max(jnp.abs(tr["y"] - exact) / exact)
    assert rel < 1e-8, rel


def test_integrate_tau_rescales_time():
    tr = af.integrate(
        mode_field,
        jnp.full(4, U0),
        28.0,
        args={"s": S, "tau": 2.0},
        save=af.LinearGrid(50),
        solver=af.SolverOptions(rtol=1e-10, atol=1e-14),
    )
    exact = mode_strength(tr.ts[:, None], S, U0, tau=2.0)
    assert jnp.max(jnp.abs(tr["y"] - exact) / exact) < 1e-8


def test_gd_matches_closed_form_error_linear_in_eta():
    setup = dl.Setup(s=S, u0=U0)
    errs = []
    for dt in (0.04, 0.02, 0.01, 0.005):
        sim = dl.train(setup, 12.0, dt=dt)
        exact = mode_strength(sim.ts[:, None], S, U0)
        errs.append(float(jnp.max(jnp.abs(sim["u"] - exact))))
    errs = np.array(errs)
    ratios = errs[:-1] / errs[1:]
    # halving eta halves the error: first-order (Euler) convergence to gradient flow
    np.testing.assert_allclose(ratios, 2.0, rtol=0.08)
    assert errs[-1] < 0.04


def test_gd_time_clock_and_learning_rate():
    # eta = 2 with dt = 0.005 is the same gradient descent (learning rate 0.01) as eta = 1 with dt = 0.01,
    # on a clock that runs half as fast
    a = dl.train(dl.Setup(s=S, u0=U0, eta=1.0), 6.0, dt=0.01, save=af.LinearGrid(7))
    b = dl.train(dl.Setup(s=S, u0=U0, eta=2.0), 3.0, dt=0.005, save=af.LinearGrid(7))
    assert float(a.ts[-1]) == pytest.approx(6.0) and float(b.ts[-1]) == pytest.approx(3.0)
    np.testing.assert_allclose(a["u"], b["u"], rtol=1e-12)
    # and the mode ODE with eta = 2 is the eta = 1 solution at twice the time
    th = dl.solve(dl.Setup(s=S, u0=U0, eta=2.0), 3.0, save=af.TimeGrid([1.0, 3.0]))
    np.testing.assert_allclose(th["u"], mode_strength(jnp.array([[2.0], [6.0]]), S, U0), rtol=1e-8)


def test_protocol_defaults_solve_vs_train():
    # the documented tolerance: gradient descent at the default dt = 0.01 is the Euler scheme of the
    # mode ODE, max |u_GD - u| = 0.066 and max |loss_GD - loss| = 0.13 to t = 8 (error O(dt))
    s = dl.Setup()
    th, sim = dl.solve(s, dl.REFERENCE_T), dl.train(s, dl.REFERENCE_T, key=0)
    gap = af.compare(th, sim)
    assert set(gap) == set(dl.OBSERVABLES) == set(dl.TRAIN_TOLERANCE) == {"u", "loss"}
    assert all(gap[k] < tol for k, tol in dl.TRAIN_TOLERANCE.items()), gap
    assert gap["u"] > 0.5 * dl.TRAIN_TOLERANCE["u"]  # the bound is the Euler lag's size, not a loose one
    # online SGD (batch 64) has the same mean gradient: a similar gap, and different seeds differ
    sgd = dl.train(s, 8.0, key=1, batch=64)
    assert af.compare(th, sgd)["u"] < 0.15
    assert not np.allclose(sgd["u"], dl.train(s, 8.0, key=2, batch=64)["u"])


def test_new_learning_rate_compiles_nothing():
    s = dl.Setup()
    dl.solve(s, 8.0)
    dl.train(s, 8.0)
    with af.count_compilations() as c:
        th = dl.solve(s.replace(eta=0.5), 8.0)
        sim = dl.train(dl.Setup(eta=0.5, s=(3.0, 2.0, 1.0, 0.25)), 8.0)
    assert c.n == 0, c
    np.testing.assert_allclose(th["u"][-1], mode_strength(4.0, S, U0), rtol=1e-8)
    assert af.compare(th, sim)["u"] < 0.05


def test_setup_bad_input():
    for kw, match in (
        ({"s": (1.0, -2.0)}, r"mode strengths s must be finite and positive, got \[1.0, -2.0\]"),
        ({"u0": 0.0}, "u0"),
        ({"eta": float("nan")}, "eta"),
        ({"n_in": 2}, "n_in"),
        ({"s": ()}, "non-empty"),
    ):
        with pytest.raises(ValueError, match=match):
            dl.Setup(**kw)
    with pytest.raises(ValueError, match="batch"):
        dl.train(dl.Setup(), 1.0, batch=0)
    with pytest.raises(ValueError, match="Setup"):
        dl.solve({"s": S}, 1.0)
    with pytest.raises(af.DivergenceError, match="at step"):
        dl.train(dl.Setup(eta=400.0), 1.0)


def test_sweep_over_a_setup_field():
    etas = np.array([0.5, 1.0, 2.0])
    res = af.sweep(
        lambda eta: dl.solve(dl.Setup().replace(eta=eta), 2.0, save=af.LinearGrid(2)).final()["u"],
        {"eta": etas},
        progress=False,
    )
    np.testing.assert_allclose(res.values, mode_strength(2.0 * etas[:, None], S, U0), rtol=1e-8)
    seeds = af.sweep(
        lambda seed: dl.train(dl.Setup(), 1.0, key=seed, batch=8, save=af.LinearGrid(2))["u"][-1],
        {"seed": np.arange(3)},
        progress=False,
    )
    assert seeds.values.shape == (3, 4) and not np.allclose(seeds.values[0], seeds.values[1])


def test_saddle_origin_factor_field():
    y0 = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
    args = {"s": S, "tau": 1.0}
    ystar = af.saddle.fixed_point(factor_field, {"a": jnp.full(4, 1e-3), "b": jnp.full(4, -1e-3)}, args)
    # Newton from near the origin lands on a fixed point (a b = s or the origin)
    res = factor_field(0.0, ystar, args)
    assert max(float(jnp.max(jnp.abs(v))) for v in res.values()) < 1e-12
    spec = af.saddle.spectrum(factor_field, y0, args)
    np.testing.assert_allclose(np.sort(np.real(spec.values)), np.sort(np.concatenate([S, -S])), atol=1e-13)
    lam, vecs = spec.unstable()
    np.testing.assert_allclose(np.real(lam), S, atol=1e-13)
    # the top unstable mode is a = b on the strongest mode
    v = vecs[0]
    assert abs(abs(float(v["a"][0])) - 2**-0.5) < 1e-12 and float(v["a"][0] * v["b"][0]) > 0
    assert float(af.saddle.escape_time(spec.lambda_max, 1e-3)) == pytest.approx(np.log(1e3) / 3.0)


def test_saddle_origin_full_matrix_flow():
    teacher = Teacher(S, 5, 4, key=2)
    hidden = 3
    W = {"W1": jnp.zeros((hidden, 5)), "W2": jnp.zeros((4, hidden))}
    spec = af.saddle.spectrum(matrix_field, W, {"A": teacher.A, "tau": 1.0})
    ev = np.real(np.asarray(spec.values))
    # +-s per mode with multiplicity = hidden width, zeros elsewhere
    want = np.sort(
        np.concatenate(
            [np.repeat(np.asarray(S), hidden), -np.repeat(np.asarray(S), hidden), np.zeros(ev.size - 2 * hidden * 4)]
        )
    )
    np.testing.assert_allclose(np.sort(ev), want, atol=1e-12)


def test_conserved_quantity_along_integrated_flow():
    teacher = Teacher(S, 8, 6, key=3)
    m = TwoLayerLinear.random(4, 8, 4, 6, scale=0.1)
    tr = af.integrate(
        matrix_field,
        {"W1": m.W1, "W2": m.W2},
        12.0,
        args={"A": teacher.A, "tau": 1.0},
        solver=af.SolverOptions(rtol=1e-11, atol=1e-13),
        save=af.LinearGrid(80),
        observe=lambda t, W, a: {
            "C": conserved(W["W1"], W["W2"]),
            "loss": population_loss(W["W1"], W["W2"], teacher.A),
        },
    )
    drift = float(jnp.max(jnp.abs(tr["C"] - tr["C"][0])))
    assert drift < 1e-8, drift
    assert float(tr["loss"][-1]) < 1e-6 * float(tr["loss"][0])
    assert bool(jnp.all(jnp.diff(tr["loss"]) <= 1e-14))  # gradient flow never increases the loss


def test_conserved_quantity_gd_drift_is_second_order():
    teacher = Teacher(S, 8, 6, key=3)
    m = TwoLayerLinear.random(4, 8, 4, 6, scale=0.1)
    loss = lambda mm, _: population_loss(mm.W1, mm.W2, teacher.A)
    drifts = []
    for eta in (0.02, 0.01):
        tr = af.simulate(
            loss,
            m,
            optax.sgd(eta),
            int(6.0 / eta),
            clock=eta,
            save=af.LogGrid(20),
            observe=lambda mm: {"C": conserved(mm.W1, mm.W2)},
        )
        drifts.append(float(jnp.max(jnp.abs(tr["C"] - tr["C"][0]))))
    # per-step drift O(eta^2), over 1/eta steps: O(eta) total
    ratio = drifts[0] / drifts[1]
    assert ratio > 1.6 and ratio < 2.4, drifts


def test_per_layer_rates_move_the_product_at_their_geometric_mean():
    """Per-layer rates eta_1 = eta sqrt(rho), eta_2 = eta / sqrt(rho): from the weighted-balanced
    start W1 W1^T / eta_1 = W2^T W2 / eta_2 the product follows the one-rate closed form (2);
    gradient descent at rho = 9 stays within O(dt) of solve, and its conserved form starts at 0.
    From the plain balanced start the same rates leave the closed form."""
    s = dl.Setup(layer_ratio=9.0)
    rates = s.layer_rates
    assert float(rates["W1"]) == pytest.approx(3.0) and float(rates["W2"]) == pytest.approx(1.0 / 3.0)
    m = TwoLayerLinear.aligned(s.teacher, s.u0, layer_ratio=9.0)
    np.testing.assert_allclose(m.W1 @ m.W1.T / rates["W1"], m.W2.T @ m.W2 / rates["W2"], atol=1e-15)
    assert float(jnp.max(jnp.abs(conserved(m.W1, m.W2, 9.0)))) < 1e-15
    grid = af.LinearGrid(9)
    theory = dl.solve(s, 8.0, save=grid)
    gaps = []
    for dt in (0.004, 0.002):
        sim = dl.train(s, 8.0, dt=dt, save=grid)
        gaps.append(float(jnp.max(jnp.abs(sim["u"] - theory["u"]))))
    assert gaps[1] < 0.02 and gaps[0] / gaps[1] == pytest.approx(2.0, rel=0.15), gaps  # O(dt)
    recorded = dl.train(s, 8.0, dt=0.004, save=grid, conserved=True)["conserved"]
    # on the aligned modes descent keeps the weighted balance exactly: its O(dt^2) change per step,
    # dt^2 r^2 (eta_1 b^2 - eta_2 a^2), vanishes where a^2 / eta_1 = b^2 / eta_2
    assert recorded.shape == (9, 4, 4) and float(jnp.max(jnp.abs(recorded))) < 1e-13
    plain = dl.train(s, 8.0, dt=0.002, save=grid, model=TwoLayerLinear.aligned(s.teacher, s.u0))
    assert float(jnp.max(jnp.abs(plain["u"] - theory["u"]))) > 10 * gaps[1]
    with pytest.raises(ValueError, match=r"layer_ratio \(eta_1 / eta_2\) must be finite and positive"):
        dl.Setup(layer_ratio=0.0)


def test_train_warns_past_the_stability_limit_of_gradient_descent():
    # eta dt s_max = 34 * 0.01 * 3 = 1.02: the map's slope at u = s is 1 - 2.04, it oscillates (no NaN to stop it)
    with pytest.warns(UserWarning, match=r"eta dt s_max = 1.02 >= 1"):
        tr = dl.train(dl.Setup(eta=34.0), 1.0)
    assert abs(float(tr.final()["u"][0]) - 3.0) > 0.3  # far from u = s, and finite
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dl.train(dl.Setup(eta=30.0), 1.0)  # 0.9: converges, no warning


def test_u0_is_a_number_or_one_per_mode():
    per_mode = jnp.array([1e-3, 1e-2, 1e-3, 2e-3])
    s = dl.Setup(u0=per_mode)
    th = dl.solve(s, 1.0, save=af.LinearGrid(3))
    np.testing.assert_allclose(th["u"], mode_strength(th.ts[:, None], S, per_mode), rtol=1e-8)
    np.testing.assert_allclose(dl.train(s, 1.0, save=af.LinearGrid(2))["u"][0], per_mode, rtol=1e-12)
    for u0, shape in (([1e-3, 1e-2, 1e-3], r"\(3,\)"), ([[1e-3] * 4], r"\(1, 4\)")):
        with pytest.raises(
            ValueError,
            match=rf"u0 \(initial mode strength\) must be a number or one per mode, "
            rf"shape \(k,\) = \(4,\), got shape {shape}",
        ):
            dl.Setup(u0=u0)
        with pytest.raises(ValueError, match=r"u0 \(initial mode strength\) must be a number or one per mode"):
            dl.Setup().replace(u0=u0)


def test_experiment_refuses_time_steps_past_the_stability_of_gradient_descent():
    from attnflow.deeplinear.experiments import DeepLinearConfig

    # max(dts) * eta * max(s) = 0.5 * 3 = 1.5: the map's fixed point u = s has slope 1 - 3 = -2
    with pytest.raises(
        ValueError,
        match=r"dts must satisfy max\(dts\) \* eta \* max\(s\) < 1 \(eta = 1\).* got max\(dts\) = 0.5 with "
        r"max\(s\) = 3, product 1.5",
    ):
        DeepLinearConfig(dts=(0.5, 0.25))
    with pytest.raises(ValueError, match=r"product 1$"):  # the edge: slope -1, not convergent
        DeepLinearConfig(s=(2.0, 1.0), dts=(0.5, 0.25))
    assert DeepLinearConfig(dts=(0.3, 0.15)).dts == (0.3, 0.15)  # 0.9: converges


def test_model_observables_refuses_a_network_of_other_sizes():
    s = dl.Setup()
    message = r"model must be a TwoLayerLinear with W1 \(h, 8\) and W2 \(6, h\) for this teacher, got TwoLayerLinear"
    for net in (TwoLayerLinear.random(0, 5, 4, 6), TwoLayerLinear.random(0, 8, 4, 5)):
        with pytest.raises(ValueError, match=message):
            dl.model_observables(net, s)
        with pytest.raises(ValueError, match=message):
            dl.model_observables(net, s.teacher)
        with pytest.raises(ValueError, match=message):
            dl.train(s, 1.0, model=net)
    with pytest.raises(ValueError, match=r"model must be a TwoLayerLinear .* got \{'W1': 1\}"):
        dl.model_observables({"W1": 1}, s)
    wide = TwoLayerLinear.random(0, 8, 10, 6)  # any hidden width
    assert float(dl.model_observables(wide, s)["loss"]) == pytest.approx(
        float(population_loss(wide.W1, wide.W2, s.teacher.A)), rel=1e-14
    )


def test_escape_time_refuses_a_threshold_the_loss_never_reaches():
    s = dl.Setup()
    for threshold in (0.0, -1.0):
        with pytest.raises(
            ValueError,
            match=rf"threshold = {threshold} must lie above 0: the loss 1/2 sum_i \(s_i - u_i\)\^2 reaches 0 only "
            r"as t -> inf",
        ):
            dl.escape_time(s, threshold, t1=100.0)
    with pytest.raises(ValueError, match=r"threshold = 9.0 must lie below the start value of 'loss', 7.1185"):
        dl.escape_time(s, 9.0, t1=10.0)
    # traced, a threshold of 0 is never crossed: NaN, as any event that does not fire
    assert np.isnan(float(jax.jit(lambda th: dl.escape_time(s, th, t1=5.0))(0.0)))


def test_escape_time_sensitivity_one_mode_closed_form():
    """One mode: t_esc = [log((s - u0) / u0) + log((s - c) / c)] / (2 s eta), c = sqrt(2 L), from (2)
    at u = s - c; so dt/d eta = -t / eta, dt/du0 = -1 / (2 eta u0 (s - u0)) and
    dt/ds = [1 / (s - u0) + 1 / (s - c)] / (2 s eta) - t / s."""
    s0, u0, eta, L = 2.0, 1e-2, 0.5, 0.5
    c = np.sqrt(2 * L)
    t = (np.log((s0 - u0) / u0) + np.log((s0 - c) / c)) / (2 * s0 * eta)
    res = dl.escape_time_sensitivity(dl.Setup(s=[s0], u0=u0, eta=eta), L, t1=20.0)
    assert float(res.value) == pytest.approx(t, rel=1e-8)
    assert float(res.grad["eta"]) == pytest.approx(-t / eta, rel=1e-7)
    assert float(res.grad["u0"]) == pytest.approx(-1 / (2 * eta * u0 * (s0 - u0)), rel=1e-7)
    assert res.grad["s"].shape == (1,)
    assert float(res.grad["s"][0]) == pytest.approx((1 / (s0 - u0) + 1 / (s0 - c)) / (2 * s0 * eta) - t / s0, rel=1e-7)


def test_escape_time_sensitivity_four_modes_against_the_closed_form():
    """d t_esc / dp = -(dL/dp) / (dL/dt) at L(t_esc) = threshold, L = 1/2 sum (s_i - u_i(t))^2 with
    the closed form (2): per-mode u0, reverse mode."""
    u0 = jnp.array([1e-3, 2e-3, 1e-3, 5e-4])
    setup = dl.Setup(u0=u0)
    res = dl.escape_time_sensitivity(setup, 1.0, t1=10.0, mode="reverse")
    t = float(res.value)
    assert t == pytest.approx(float(dl.escape_time(setup, 1.0, t1=10.0)), rel=1e-12)

    def loss(t, eta, s, u0):
        return 0.5 * jnp.sum((s - mode_strength(t, s, u0, 1.0 / eta)) ** 2)

    assert float(loss(t, 1.0, S, u0)) == pytest.approx(1.0, rel=1e-8)
    dL = jax.grad(loss, (0, 1, 2, 3))(t, 1.0, S, u0)
    want = {"eta": -dL[1] / dL[0], "s": -dL[2] / dL[0], "u0": -dL[3] / dL[0]}
    assert res.grad["s"].shape == res.grad["u0"].shape == (4,)
    for name, value in want.items():
        np.testing.assert_allclose(res.grad[name], value, rtol=1e-6, atol=1e-8, err_msg=name)
    assert float(res.grad["eta"]) == pytest.approx(-t, rel=1e-7)  # time scales as 1 / eta
    with pytest.raises(ValueError, match=r"threshold = 0.0 must lie above 0"):
        dl.escape_time_sensitivity(setup, 0.0, t1=10.0)
    with pytest.raises(ValueError, match=r"mode must be one of"):
        dl.escape_time_sensitivity(setup, 1.0, t1=10.0, mode="sideways")


def test_escape_time_sensitivity_at_the_reference():
    # the numbers of its docstring and of docs/deeplinear.md
    res = dl.escape_time_sensitivity(dl.Setup(), 1.0, t1=10.0)
    assert float(res.value) == pytest.approx(1.9415, abs=1e-4)
    assert float(res.grad["eta"]) == pytest.approx(-1.9415, abs=1e-4)
    assert float(res.grad["u0"]) == pytest.approx(-260.81, abs=1e-2)
    np.testing.assert_allclose(res.grad["s"], [-0.0094, -0.5762, 0.4053, 0.2469], atol=1e-4)
