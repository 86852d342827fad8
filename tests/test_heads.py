"""attnflow.heads: the protocol (Setup, solve, train, OBSERVABLES), priors, Bayes risk, activations, the
oracle identity, drift forms, invariances, fixed point and escape times, pruning, ODE vs SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest
from jax.test_util import check_grads

import attnflow as af
from attnflow import heads as hd
from attnflow.heads import (
    AnisotropicGaussian,
    AutodiffForm,
    BankOptions,
    BayesSoftmax,
    Discrete,
    Dynamics,
    ExpectationForm,
    FieldBank,
    FiniteDDraw,
    FlippedSpike,
    MultiHead,
    NoCopies,
    Overlaps,
    PointMass,
    ScalarTarget,
    Setup,
    SingleLocationTask,
    Softmax,
    Softmax1,
    SteinForm,
    SymmetricSeed,
    bayes_posterior,
    bayes_risk,
    drifting_escape_time,
    from_finite_D,
    generalisation_error,
    half_risk,
    keys_from_overlaps,
    oracle_config,
    order_parameter_field,
    overlaps,
    plateau_rates,
    plateau_state,
    predicted_escape_time,
    prune,
    softmax_floor,
    solve,
    specialisation,
    specialisation_spectrum,
    symmetric_seed,
    train,
    unspecialised_point,
)

REFERENCE_T = hd.REFERENCE_T  # horizon of the protocol test: the reference heads specialise at t ~ 10


def test_protocol_defaults_and_no_recompile_for_a_new_eta():
    """Defaults only: solve and train record the same names on the same clock and agree within the
    documented tolerance at D = 1000; a new learning rate (Python float) compiles nothing."""
    s = Setup()
    th = solve(s, REFERENCE_T)
    sim = train(s, REFERENCE_T, key=0)
    shared = set(th.names) & set(sim.names)
    assert shared == set(hd.OBSERVABLES) - {"b", "c"}
    gaps = af.compare(th, sim)
    for name, gap in gaps.items():
        assert gap < hd.TRAIN_TOLERANCE[name], (name, gap)
    assert float(th["specialisation"][-1]) > 0.5  # the heads specialised within the horizon
    assert gaps["M"] > 1e-3  # a real finite-D run, not the theory again
    with af.count_compilations() as c:
        solve(s.replace(eta=0.7), REFERENCE_T)
        solve(Setup(eta=0.8), REFERENCE_T)
        train(s.replace(eta=0.7), REFERENCE_T, key=1)
    assert c.n == 0, c


def test_risk_and_pruning_refuse_overlaps_that_do_not_fit_the_bank():
    """generalisation_error, half_risk and prune check (M, Q) against the bank before computing: a wrong
    feature count, more heads than the bank, NaN, a Q no keys have."""
    s = Setup()
    bank = FieldBank(s.prior, s.L, s.H, BankOptions(n=64))
    Q = 0.2 * jnp.eye(2)
    for M, Qx, match in (
        (jnp.zeros((2, 2)), Q, r"generalisation_error: M must be \(H, F\) with F = 1"),
        (jnp.zeros((3, 1)), 0.2 * jnp.eye(3), "M has 3 rows .* drawn for H = 2"),
        (jnp.full((2, 1), jnp.nan), Q, "M and Q must be finite"),
        (jnp.ones((2, 1)), Q, "positive semidefinite; its smallest eigenvalue is -1.8"),
    ):
        with pytest.raises(ValueError, match=match):
            generalisation_error(M, Qx, Softmax(), bank)
    with pytest.raises(ValueError, match="half_risk: M has 3 rows"):
        half_risk(jnp.zeros((3, 1)), 0.2 * jnp.eye(3), Softmax(), bank)
    with pytest.raises(ValueError, match="prune: M has 3 rows"):
        prune(jnp.zeros((3, 1)), 0.2 * jnp.eye(3), Softmax(), bank)
    with pytest.raises(ValueError, match="kappa must be finite, got nan"):
        Setup(init=SymmetricSeed(jnp.zeros((2, 1)), Q, kappa=float("nan")))
    with pytest.raises(ValueError, match="t1 must be finite and positive, got -1.0"):
        solve(s, -1.0)
    with pytest.raises(ValueError, match="L must be an integer >= 2, got 1"):
        bayes_risk(s.prior, 1)
    with pytest.raises(ValueError, match="for p = 0.7 give n_plus and H"):
        softmax_floor(4, p=0.7)
    assert softmax_floor(4, p=0.7, n_plus=3, H=4) == pytest.approx(4 / 3 * (0.7 / 16 + 0.3 * 9 / 16))
    # fewer heads than the bank (a pruned model) are fine
    assert np.isfinite(float(generalisation_error(jnp.zeros((1, 1)), 0.2 * jnp.eye(1), Softmax(), bank)))


def test_bank_standard_error_matches_the_spread_over_seeds():
    """generalisation_error(..., stderr=True): the standard error over the independent base draws (support
    points and copies grouped with theirs) matches the spread of E over 12 bank seeds (within the ~20 %
    sampling error of a 12-sample spread), for an enumerated prior with copies and a sampled Gaussian."""
    M, Q = jnp.array([[0.3], [0.1]]), jnp.array([[0.5, 0.05], [0.05, 0.4]])
    for prior in (FlippedSpike(3.0), AnisotropicGaussian(jnp.array([1.0]), jnp.array([4.0]))):
        s = Setup(prior=prior)
        values, errors = [], []
        for seed in range(12):
            bank = FieldBank(s.prior, s.L, s.H, BankOptions(n=256, seed=seed))
            e, se = generalisation_error(M, Q, Softmax(), bank, stderr=True)
            assert float(e) == float(generalisation_error(M, Q, Softmax(), bank))
            values.append(float(e))
            errors.append(float(se))
        assert 0.6 < np.std(values, ddof=1) / np.mean(errors) < 1.6, (np.std(values, ddof=1), np.mean(errors))


def test_sgd_with_the_signal_at_a_fixed_token_follows_the_same_ode():
    """location=l fixes the signal's token for every sample: the model has no positional information, so
    SGD follows the same ODE within the documented tolerance; a location outside [0, L) is refused."""
    s = Setup()
    grid = af.LinearGrid(7)
    theory = solve(s, 6.0, save=grid)
    uniform = train(s, 6.0, key=1, save=grid)
    for location in (0, 3):
        fixed = train(s, 6.0, key=1, save=grid, location=location)
        gap = af.compare(theory, fixed)
        assert all(gap[k] < hd.TRAIN_TOLERANCE[k] for k in hd.TRAIN_TOLERANCE), (location, gap)
        assert af.compare(uniform, fixed)["M"] > 1e-4  # other samples: the location is in effect
    with pytest.raises(ValueError, match="location must be an integer <= 3, got 4"):
        train(s, 6.0, location=4)


def test_setup_validation_names_the_value():
    with pytest.raises(ValueError, match="eta"):
        Setup(eta=-1.0)
    with pytest.raises(ValueError, match="eta"):
        Setup().replace(eta=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        Setup(weight_decay=-0.1)
    with pytest.raises(ValueError, match="H"):
        Setup(H=0)
    with pytest.raises(ValueError, match=r"BayesSoftmax\.b has 3 biases for H = 2"):
        Setup(activation=BayesSoftmax.zeros(3))
    with pytest.raises(ValueError, match="positive semidefinite"):
        Setup(init=Overlaps([[1.0], [0.0]], 0.5 * np.eye(2)))
    with pytest.raises(ValueError, match="Q must be symmetric"):
        Setup(init=Overlaps(np.zeros((2, 1)), [[1.0, 0.2], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"M must be \(H, F\) = \(2, 1\)"):
        Setup(init=Overlaps(np.zeros((3, 1)), np.eye(3)))
    with pytest.raises(ValueError, match="D >= F \\+ H \\+ 1 = 4, got D = 3"):
        Setup(init=FiniteDDraw(0.5, 3))
    with pytest.raises(ValueError, match="no field"):
        Setup().replace(etta=0.1)
    with pytest.raises(ValueError, match=r"setup must be an attnflow\.heads\.Setup"):
        solve(object(), 1.0)
    with pytest.raises(ValueError, match="D must be an integer >= 3"):
        train(Setup(), 1.0, D=2)
    with pytest.raises(ValueError, match=r"D must be > 1 .* got 1"):
        predicted_escape_time(0.5, 1)
    with pytest.raises(ValueError, match="sgd_noise=False is the gradient flow of the theory"):
        train(Setup(sgd_noise=False), 1.0)


def test_bayes_softmax_at_oracle_equals_bayes_posterior():
    prior = Discrete([[2.0, 0.0], [0.0, 3.0], [-1.0, 1.0]], [0.5, 0.3, 0.2])
    M, Q, b = oracle_config(prior)
    bank = FieldBank(prior, 4, 3, BankOptions(n=20000, seed=1, copies=NoCopies()))
    chi, chi_star = bank.fields(M, Q)
    a = jax.vmap(BayesSoftmax(b))(chi)
    np.testing.assert_allclose(a, bayes_posterior(prior, chi_star), atol=1e-13)
    e_bank = float(generalisation_error(M, Q, BayesSoftmax(b), bank))
    assert e_bank == pytest.approx(float(2 * half_risk(M, Q, BayesSoftmax(b), bank)), rel=1e-14)
    e_bayes, se = bayes_risk(prior, 4, key=2, n=200_000)
    assert abs(e_bank - float(e_bayes)) < 4 * (float(se) + 0.5 / np.sqrt(20000)), (e_bank, float(e_bayes))


def test_bayes_risk_closed_cases():
    e, _ = bayes_risk(PointMass([0.0]), 5, n=1000)  # no signal: uniform posterior, E = 1 - 1/L
    assert float(e) == pytest.approx(0.8, abs=1e-12)
    e, _ = bayes_risk(FlippedSpike(12.0, 0.5), 4, n=20000)  # huge signal: location found almost surely
    assert float(e) < 1e-3
    pr = AnisotropicGaussian([0.5], [2.0])  # Gaussian log Z against quadrature of E exp(theta u - theta^2/2)
    u = 0.7
    val = af.gauss_hermite(lambda th: jnp.exp(th[0] * u - 0.5 * th[0] ** 2), 60, jnp.array([0.5]), jnp.array([[2.0]]))
    assert float(pr.log_Z(jnp.array([u]))) == pytest.approx(float(jnp.log(val)), rel=1e-10)


def test_activations():
    chi = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    np.testing.assert_allclose(Softmax()(chi), jnp.mean(jax.nn.softmax(chi, -1), 0), rtol=1e-14)
    np.testing.assert_allclose(BayesSoftmax(jnp.zeros(1))(chi[:1]), jax.nn.softmax(chi[0]), rtol=1e-14)  # H = 1
    assert float(jnp.sum(BayesSoftmax.zeros(3)(chi))) == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(Softmax1(b=-60.0, c=1.0)(chi), Softmax()(chi), rtol=1e-12)  # b -> -inf is softmax
    assert float(jnp.sum(Softmax1(b=40.0, c=1.0)(chi))) < 1e-15  # all heads switched off
    with pytest.raises(TypeError):
        hd.Activation()  # abstract
    with pytest.raises(TypeError):
        hd.Prior()


def test_softmax_floor_formula():
    assert softmax_floor(4) == pytest.approx(0.25 + 1 / 12)
    assert softmax_floor(4, 0.5, n_plus=2, H=4) == pytest.approx(softmax_floor(4))
    # large signal, even split of two heads aligned with +-s: the error approaches the floor from above
    bank = FieldBank(FlippedSpike(30.0, 0.5), 4, 2, BankOptions(n=4000))
    errs = [
        float(
            generalisation_error(
                jnp.array([[sc], [-sc]]), sc**2 * jnp.array([[1.0, -1.0], [-1.0, 1.0]]), Softmax(), bank
            )
        )
        for sc in (0.3, 1.0, 4.0)
    ]
    assert softmax_floor(4) - 1e-6 <= min(errs) < softmax_floor(4) + 0.01
    assert errs[0] < errs[1] < errs[2]  # key norms must grow slower than s


def test_drift_forms_agree():
    """Expectation form = autodiff form exactly in M (both are the reparameterised gradient of the same
    Monte Carlo risk), within MC error in Q; the Stein form within MC error; learned-parameter drift
    = -eta_b dR/db; and dR/dM passes check_grads."""
    prior = AnisotropicGaussian([0.8, 0.0], [1.0, 0.5])
    bank = BankOptions(n=30_000, seed=3, copies=NoCopies())
    M = jnp.array([[0.4, 0.1], [0.2, -0.3]])
    Q = M @ M.T + jnp.array([[0.5, 0.1], [0.1, 0.4]])
    for act in (Softmax(), Softmax1(0.3, 1.2), BayesSoftmax(jnp.array([0.1, -0.2]))):
        s = Setup(prior=prior, activation=act, L=3, eta=0.7, eta_b=0.3, init=Overlaps(M, Q))
        out = {}
        for form in (ExpectationForm(), SteinForm(), AutodiffForm()):
            dyn = Dynamics.build(s, bank, form)
            out[type(form).__name__] = order_parameter_field(0.0, hd.initial_state(s), dyn)
        e, a, st = out["ExpectationForm"], out["AutodiffForm"], out["SteinForm"]
        scale = float(jnp.max(jnp.abs(e["M"])))
        np.testing.assert_allclose(a["M"], e["M"], atol=1e-13)
        assert float(jnp.max(jnp.abs(a["Q"] - e["Q"]))) < 0.03 * scale
        for k in ("M", "Q"):
            assert float(jnp.max(jnp.abs(st[k] - e[k]))) < 0.05 * scale, (type(act), k)
        fb = dyn.bank
        for name in act.learned:
            g = jax.grad(lambda v, name=name: half_risk(M, Q, act.with_params({**act.params(), name: v}), fb))(
                getattr(act, name)
            )
            np.testing.assert_allclose(e["act"][name], -0.3 * g, rtol=1e-10, atol=1e-15)
    check_grads(lambda m: half_risk(m, Q, Softmax(), fb), (M,), order=1, modes=("fwd", "rev"))


def test_symmetries_of_the_monte_carlo_field():
    """Antithetic copies keep M = 0 invariant; cyclic head copies keep the equal-rows manifold invariant."""
    s = Setup(prior=FlippedSpike(2.0, 0.5), H=3, init=Overlaps(np.zeros((3, 1)), 0.3 * np.eye(3) + 0.05))
    dyn = Dynamics.build(s, BankOptions(n=512, seed=1))
    f = order_parameter_field(0.0, hd.initial_state(s), dyn)
    assert float(jnp.max(jnp.abs(f["M"]))) < 1e-15
    M = jnp.full((3, 1), 0.4)
    f = order_parameter_field(0.0, hd.initial_state(s, M, M @ M.T + 0.2 * jnp.eye(3)), dyn)
    assert float(jnp.max(jnp.abs(f["M"] - f["M"][0]))) < 1e-13
    assert float(jnp.max(jnp.abs(jnp.diag(f["Q"]) - f["Q"][0, 0]))) < 1e-13
    with pytest.raises(ValueError, match="sign-symmetric"):
        FieldBank(FlippedSpike(1.0, 0.3), 4, 2, BankOptions(n=16, antithetic=True))


def test_unspecialised_point_converges_from_sigma0_squared_identity():
    """From M = 0, Q = sigma0^2 I (the natural guess), the damped default solver finds the fixed point at
    the settings of the docs; an undamped Newton step overshoots to a Q - M M^T that is not PSD there."""
    bank = BankOptions(n=2048)
    for s, sigma0 in (
        (Setup(), 0.5),
        (Setup(init=FiniteDDraw(0.45)), 0.45),
        (Setup(prior=FlippedSpike(2.0), eta=0.5), 0.5),
    ):
        guess = (jnp.zeros((2, 1)), sigma0**2 * jnp.eye(2))
        y = unspecialised_point(s, guess, bank=bank)
        f = order_parameter_field(0.0, y, Dynamics.build(s, bank))
        assert max(float(jnp.max(jnp.abs(v))) for v in (f["M"], f["Q"])) < 1e-10
        assert np.all(np.isfinite(np.asarray(y["Q"]))) and float(jnp.linalg.eigvalsh(y["Q"])[0]) > 0
    assert float(y["Q"][0, 0]) == pytest.approx(0.0791, abs=1e-3)  # s = 2, eta = 0.5
    with pytest.raises(RuntimeError, match="did not converge"):
        unspecialised_point(s, guess, bank=bank, solver=optx.Newton(rtol=1e-10, atol=1e-12))


def test_unspecialised_point_of_four_heads_is_a_root_of_the_full_field():
    """H = 4: the cyclic copies keep a circulant Q invariant, not equal off-diagonal entries (the
    full field is 4e-6 on that manifold); the point found on the circulant one is a root of the
    full field."""
    s = Setup(H=4)
    bank = BankOptions(n=1024)
    with pytest.warns(UserWarning, match="at rate 0.00084, against 0.084"):  # a drifting plateau, as at H = 3
        y = unspecialised_point(s, (jnp.zeros((4, 1)), 0.25 * jnp.eye(4)), bank=bank)
    f = order_parameter_field(0.0, y, Dynamics.build(s, bank))
    assert max(float(jnp.max(jnp.abs(v))) for v in (f["M"], f["Q"])) < 1e-12
    Q = np.asarray(y["Q"])
    np.testing.assert_allclose(Q, Q.T, atol=1e-15)
    np.testing.assert_allclose([Q[1, 2], Q[2, 3], Q[3, 0]], Q[0, 1], rtol=1e-12)  # circulant
    assert abs(Q[0, 2] - Q[0, 1]) > 1e-4  # opposite heads apart from neighbouring ones


def test_fixed_step_rk4_is_a_solver_option():
    """Spec (integration) [open]: Tsit5 + PID by default, fixed-step RK4 (dt ~ 0.05) as an option,
    through SolverOptions; the two agree to 1e-6 on the default setup."""
    bank = BankOptions(n=1024)
    rk4 = af.SolverOptions.fixed_step(0.05)
    fixed = solve(Setup(), 10.0, bank=bank, solver=rk4, save=af.LinearGrid(3))
    adaptive = solve(Setup(), 10.0, bank=bank, save=af.LinearGrid(3))
    for name in ("M", "Q", "error"):
        np.testing.assert_allclose(fixed[name], adaptive[name], atol=1e-6)
    assert int(fixed.stats["num_steps"]) == 200


@pytest.mark.slow
def test_three_heads_linearise_on_the_drifting_plateau():
    """H = 3: the root of the equal-heads field found from Q = sigma0^2 I (q_hh = 0.051) lies on a
    curve of near-roots (relaxation rate 1.5e-4 against 0.11) far from the flow's plateau
    (q_hh ~ 0.22): `unspecialised_point` warns, and its escape rate misses the growth of the
    flow's antisymmetric part by 15 %; the linearisation at the flow's own symmetrised state
    (`plateau_state`) gives that growth to 2 %."""
    bank = BankOptions(n=2048)
    s = Setup(H=3, init=SymmetricSeed(jnp.zeros((3, 1)), 0.25 * jnp.eye(3), kappa=1.0, D=1e5))
    traj = solve(s, 15.0, bank=bank, save=af.LinearGrid(4))
    S = np.asarray(traj["specialisation"])
    growth = float(np.log(S[3] / S[1]) / (traj.ts[3] - traj.ts[1]))  # over t in [5, 15]
    with pytest.warns(UserWarning, match=r"relaxes onto the root found .* at rate 0.00015, against 0.11"):
        root = unspecialised_point(s, bank=bank)
    assert float(root["Q"][0, 0]) == pytest.approx(0.0511, abs=1e-3)
    lam_root = float(specialisation_spectrum(s, root, bank=bank).lambda_max)
    y = plateau_state(s, traj, 10.0)
    assert float(y["Q"][0, 0]) == pytest.approx(0.224, abs=0.01)
    np.testing.assert_allclose(np.asarray(y["Q"]), np.asarray(y["Q"]).T, atol=1e-15)
    lam_flow = float(specialisation_spectrum(s, y, bank=bank).lambda_max)
    assert abs(lam_root / growth - 1) > 0.1
    assert abs(lam_flow / growth - 1) < 0.02, (lam_flow, growth)
    with pytest.raises(ValueError, match=r"t = 20.0 is outside the saved times \[0, 15\]"):
        plateau_state(s, traj, 20.0)


@pytest.mark.slow
def test_drifting_plateau_escape_time_follows_the_integrated_rate():
    """Spec section 9: on a drifting plateau (H = 3) the heads split where int lambda dt = ln(D)/2
    (+ O(1)); `plateau_rates` integrates the rate along the equal-heads flow and
    `drifting_escape_time` reads the time off it. Between D = 1e3 and 1e6 the solve's escape
    moves by 14.33, the integrated rate predicts 14.30 (the rate at the root, 1/(2 lambda)
    ln 1000, 12.65)."""
    bank = BankOptions(n=2048)

    def seeded(D):
        return Setup(H=3, init=SymmetricSeed(jnp.zeros((3, 1)), 0.25 * jnp.eye(3), kappa=1.0, D=D))

    rates = plateau_rates(seeded(1e3), 40.0, bank=bank, save=af.LinearGrid(81))
    assert {"lambda", "exponent", "M", "Q"} <= set(rates.names)
    np.testing.assert_allclose(rates["M"], 0.0, atol=1e-15)  # on the manifold: no antisymmetric part
    assert float(rates["lambda"][0]) == pytest.approx(0.2374, abs=2e-4)
    measured = [
        float(solve(seeded(D), 100.0, bank=bank, escape=0.5, save=af.LinearGrid(2)).t_event) for D in (1e3, 1e6)
    ]
    predicted = [float(drifting_escape_time(rates, D)) for D in (1e3, 1e6)]
    assert measured[1] - measured[0] == pytest.approx(14.33, abs=0.02)
    assert predicted[1] - predicted[0] == pytest.approx(measured[1] - measured[0], rel=0.01)
    assert np.isnan(float(drifting_escape_time(rates, 1e30)))  # past the saved span
    np.testing.assert_allclose(drifting_escape_time(rates, jnp.array([1e3, 1e6])), predicted, rtol=1e-12)
    with pytest.raises(ValueError, match=r"D must be > 1"):
        drifting_escape_time(rates, 0.5)


def test_anisotropic_gaussian_with_a_full_covariance_is_a_rotated_diagonal_one():
    """``AnisotropicGaussian(mu, C)`` with ``C = R diag(v) R^T``: ``log Z(R u)`` is that of the
    diagonal prior of mean ``R^T mu`` at ``u`` (to rounding), its draws have covariance ``C``, and
    a ``C`` that is not positive semidefinite is refused."""
    th = 0.4
    R = jnp.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    v, mu = jnp.array([9.0, 4.0]), jnp.array([0.3, -0.2])
    full = AnisotropicGaussian(mu, R @ jnp.diag(v) @ R.T)
    diag = AnisotropicGaussian(R.T @ mu, v)
    u = jax.random.normal(jax.random.PRNGKey(0), (5, 2))
    np.testing.assert_allclose(full.log_Z(u @ R.T), diag.log_Z(u), atol=1e-13)
    x = np.asarray(full.sample(jax.random.PRNGKey(1), 100_000))
    np.testing.assert_allclose(np.cov(x.T), np.asarray(full.covariance), atol=0.15)
    np.testing.assert_allclose(x.mean(0), mu, atol=0.03)
    with pytest.raises(ValueError, match="covariance C must be symmetric positive semidefinite"):
        AnisotropicGaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="variances 1-D of its length"):
        AnisotropicGaussian([0.0, 0.0], [[1.0, 0.0, 0.0]])
    # C is positive semidefinite in either form: a zero variance is the same prior both ways
    flat, square = (
        AnisotropicGaussian([0.0, 0.5], [1.0, 0.0]),
        AnisotropicGaussian([0.0, 0.5], jnp.diag(jnp.array([1.0, 0.0]))),
    )
    np.testing.assert_allclose(flat.log_Z(u), square.log_Z(u), atol=1e-13)
    assert np.all(np.asarray(flat.sample(jax.random.PRNGKey(2), 5))[:, 1] == 0.5)


@pytest.mark.slow
def test_spectrum_of_four_heads_lies_in_the_sector_the_cyclic_field_keeps():
    """H = 4 with cyclic copies: the antisymmetric sector is the complement of the cyclically
    invariant states (a circulant Q), which the field's Jacobian keeps invariant, so every
    eigenvalue `specialisation_spectrum` returns is one of the full Jacobian (on the symmetric-Q
    states); the equal-off-diagonal complement holds a circulant direction that is not."""
    s = Setup(H=4)
    bank = BankOptions(n=1024)
    y = unspecialised_point(s, (jnp.zeros((4, 1)), 0.25 * jnp.eye(4)), bank=bank)
    sector = hd.specialisation_spectrum(s, y, bank=bank)
    dyn = Dynamics.build(s, bank)
    basis = hd.antisymmetric_basis(y, circulant=True)
    flat, unravel = jax.flatten_util.ravel_pytree(y)
    J = jax.jacfwd(lambda x: jax.flatten_util.ravel_pytree(order_parameter_field(0.0, unravel(x), dyn))[0])(flat)
    # the sector is invariant: J maps it into itself
    leak = J @ basis - basis @ (basis.T @ J @ basis)
    assert float(jnp.max(jnp.abs(leak))) < 1e-10
    full = np.linalg.eigvals(np.asarray(J))
    for lam in np.asarray(sector.values):
        assert np.min(np.abs(full - lam)) < 1e-8
    assert basis.shape[1] < hd.antisymmetric_basis(y).shape[1]  # the circulant directions are left out


def test_observables_are_measured_on_an_independent_bank():
    """``BankOptions.independent_eval`` (default): the field and so ``M``, ``Q`` are those of
    the bank, the recorded ``error`` that of a second, independent bank (`EVAL_STREAM`)."""
    s = Setup()
    own, fresh = BankOptions(n=256, independent_eval=False), BankOptions(n=256)
    a = hd.solve(s, 2.0, bank=fresh, save=af.LinearGrid(3))
    b = hd.solve(s, 2.0, bank=own, save=af.LinearGrid(3))
    np.testing.assert_array_equal(a["M"], b["M"])
    np.testing.assert_array_equal(a["Q"], b["Q"])
    assert float(jnp.max(jnp.abs(a["error"] - b["error"]))) > 1e-4
    M, Q = a["M"][-1], a["Q"][-1]
    for traj, bank in (
        (a, FieldBank(s.prior, s.L, s.H, fresh, stream=hd.EVAL_STREAM)),
        (b, FieldBank(s.prior, s.L, s.H, own)),
    ):
        assert float(traj["error"][-1]) == pytest.approx(float(generalisation_error(M, Q, Softmax(), bank)), rel=1e-12)


def test_a_root_with_coinciding_keys_is_named():
    """The heads-staged setup with bank seed 8 from Q = sigma0^2 I finds a root with Q - M M^T of
    rank 1, which the flow never nears: `unspecialised_point` warns."""
    s = Setup(prior=AnisotropicGaussian([0.0, 0.0], [9.0, 4.0]), H=4, init=FiniteDDraw(sigma0=0.4, D=2000, seed=1))
    with pytest.warns(UserWarning, match=r"the keys coincide off the signal \(Q - M M\^T has rank 1 of 4"):
        unspecialised_point(s, (jnp.zeros((4, 2)), 0.16 * jnp.eye(4)), bank=BankOptions(n=1024, seed=8))


@pytest.mark.slow  # the heads-specialisation-time experiment makes the same check
def test_escape_time_linear_in_log_D_with_jacobian_slope():
    """Seeds kappa / sqrt(D) at the unspecialised fixed point: t_spec = t0 + ln D / (2 lambda) (equation (12)),
    the escape times being the traceable event times of one sweep over D."""
    s = Setup()
    bank = BankOptions(n=512)
    y = unspecialised_point(s, bank=bank)
    lam = float(specialisation_spectrum(s, y, bank=bank).lambda_max)
    assert lam == pytest.approx(0.36, abs=0.02)
    Ds = np.array([1e4, 1e6, 1e8])
    solver = af.SolverOptions(rtol=1e-8, atol=1e-11)
    t = np.asarray(
        af.sweep(
            lambda D: (
                solve(
                    s.replace(init=SymmetricSeed(y["M"], y["Q"], 1.0, D)),
                    200.0,
                    save=af.LinearGrid(2),
                    solver=solver,
                    bank=bank,
                    escape=0.3,
                ).t_event
            ),
            {"D": Ds},
            progress=False,
        ).values
    )
    assert np.all(np.isfinite(t))
    slope = np.polyfit(np.log(Ds), t, 1)[0]
    assert slope == pytest.approx(1 / (2 * lam), rel=0.03), (slope, 1 / (2 * lam))
    np.testing.assert_allclose(np.diff(t), np.diff(np.asarray(predicted_escape_time(lam, Ds))), rtol=0.05)
    one = solve(
        s.replace(init=SymmetricSeed(y["M"], y["Q"], 1.0, Ds[0])),
        200.0,
        save=af.LinearGrid(2),
        solver=solver,
        bank=bank,
        escape=0.3,
    )
    assert float(one.t_event) == pytest.approx(t[0], rel=1e-6)
    assert float(specialisation(one["M"][-1])) == pytest.approx(0.3, rel=1e-6)  # the final state is the event's
    never = solve(s, 0.5, save=af.LinearGrid(2), solver=solver, bank=bank, escape=0.3)
    assert np.isnan(float(never.t_event)) and float(never.ts[-1]) == 0.5


def test_from_finite_D_statistics_and_seed():
    D, sigma0 = 4000, 0.5
    Ms, Qs = jax.vmap(lambda k: from_finite_D(D, 3, 2, sigma0, key=k))(jnp.arange(400))
    Ms, Qs = np.asarray(Ms), np.asarray(Qs)
    assert np.var(Ms) * D / sigma0**2 == pytest.approx(1.0, rel=0.1)
    assert np.mean(Qs[:, 0, 0]) == pytest.approx(sigma0**2, rel=0.01)
    assert np.var(Qs[:, 1, 1]) * D / sigma0**4 == pytest.approx(2.0, rel=0.2)  # chi^2_D / D has variance 2 / D
    for i, j in ((0, 1), (1, 2)):
        assert np.var(Qs[:, i, j]) * D / sigma0**4 == pytest.approx(1.0, rel=0.2)
    np.testing.assert_array_equal(from_finite_D(D, 3, 2, sigma0, key=5)[1], from_finite_D(D, 3, 2, sigma0, key=5)[1])
    # symmetric_seed normalises u and the direction: the seed has norm kappa / sqrt(D)
    M, Q = symmetric_seed(jnp.full((2, 2), 0.3), 0.2 * jnp.eye(2) + 0.18, 2.0, 400, direction=[3.0, 4.0])
    assert float(specialisation(M)) == pytest.approx(2.0 / 20.0, rel=1e-12)
    np.testing.assert_allclose((M - M.mean(0))[0], 0.05 * np.array([0.6, 0.8]) * np.sqrt(2), rtol=1e-12)
    assert np.linalg.eigvalsh(np.asarray(Q - M @ M.T)).min() > 0


def test_keys_from_overlaps_is_exact():
    task = SingleLocationTask(300, 4, AnisotropicGaussian([0.0, 0.0], [1.0, 2.0]), key=1)
    M = jnp.array([[0.3, 0.1], [-0.2, 0.4], [0.0, 0.1]])
    Q = M @ M.T + jnp.array([[0.2, 0.05, 0.0], [0.05, 0.3, 0.0], [0.0, 0.0, 0.1]])
    ov = overlaps(keys_from_overlaps(M, Q, task.spikes, key=3), task.spikes)
    np.testing.assert_allclose(ov["M"], M, atol=1e-14)
    np.testing.assert_allclose(ov["Q"], Q, atol=1e-14)
    with pytest.raises(ValueError, match="positive semidefinite"):
        keys_from_overlaps(M, 0.01 * jnp.eye(3), task.spikes)


def test_pruning_rules():
    """Duplicated oracle heads of B-softmax prune for free down to |supp|; the softmax-1 mask rule keeps 1/H."""
    prior = Discrete(3.0 * np.eye(2))
    M, _, b = oracle_config(prior)
    M2, b2 = jnp.concatenate([M, M]), jnp.concatenate([b, b]) - jnp.log(2.0)
    bank = FieldBank(prior, 4, 4, BankOptions(n=2000, seed=2))
    res = prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank)
    e = res["error"]
    assert abs(e[2] - e[0]) < 0.01 and e[3] - e[2] > 0.1, e
    assert sorted(res["removed"][:2]) in ([0, 1], [0, 3], [1, 2], [2, 3])  # one copy of each support point kept
    assert prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, [3, 0])["removed"] == [3, 0]
    assert prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, (h for h in (3, 0)))["removed"] == [3, 0]
    assert len(prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, hd.ByMass())["removed"]) == 3
    act = Softmax1(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 1.5, 2.0]), per_head=3)
    chi = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    keep = np.array([0, 2])
    np.testing.assert_allclose(act.restrict(keep, 3)(chi[keep]), jnp.sum(act.head_weights(chi)[keep], 0), rtol=1e-12)
    np.testing.assert_allclose(
        act.restrict(keep, 3, renormalise=True)(chi[keep]), 1.5 * jnp.sum(act.head_weights(chi)[keep], 0), rtol=1e-12
    )
    with pytest.raises(ValueError, match="distinct head indices"):
        prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, [0, 0])
    # an activation for another number of heads (JAX would clamp the head index) and a string order
    with pytest.raises(ValueError, match="BayesSoftmax.b has 2 biases for H = 4 heads"):
        prune(M2, M2 @ M2.T, BayesSoftmax(b), bank)
    with pytest.raises(ValueError, match="Softmax1.b has 3 per-head values for H = 4 heads"):
        prune(M2, M2 @ M2.T, act, bank)
    with pytest.raises(ValueError, match="order must be Greedy\\(\\), ByMass\\(\\).*got 'greedy'"):
        prune(M2, M2 @ M2.T, BayesSoftmax(b2), bank, "greedy")


def test_sgd_held_out_error_matches_theory_error():
    """The held-out SGD error at finite D equals E(M, Q) of the same overlaps within sampling error."""
    M = jnp.array([[1.0], [-0.8]])
    Q = M @ M.T + 0.1 * jnp.eye(2)
    s = Setup(prior=FlippedSpike(2.5), eta=0.1, init=Overlaps(M, Q))
    tr = train(s, 0.01, key=0, save=af.LinearGrid(2))
    np.testing.assert_allclose(tr["M"][0], M, atol=1e-12)
    e_theory = float(generalisation_error(M, Q, Softmax(), FieldBank(s.prior, 4, 2, BankOptions(n=20000, seed=5))))
    assert abs(float(tr["error"][0]) - e_theory) < 0.03, (float(tr["error"][0]), e_theory)
    assert 0.25 < float(tr["attention"][0]) < 1.0


def test_scalar_target_noise_term_matches_sgd():
    """Scalar target with label noise: same drift, different eta^2 term. SGD's Q follows the scalar-target
    ODE and not the token-target one; its held-out error follows E + Delta."""
    s = Setup(prior=FlippedSpike(2.0), target=ScalarTarget(0.5))
    grid = af.LinearGrid(5)
    sim = train(s, 4.0, key=0, save=grid, eval_samples=1000)
    bank = BankOptions(n=1024)
    ode = solve(s, 4.0, save=grid, bank=bank)
    token = solve(s.replace(target=hd.TokenTarget()), 4.0, save=grid, bank=bank)
    gap = {
        "scalar": float(jnp.max(jnp.abs(sim["Q"] - ode["Q"]))),
        "token": float(jnp.max(jnp.abs(sim["Q"] - token["Q"]))),
    }
    assert gap["scalar"] < 0.06 < 0.15 < gap["token"], gap
    se = float(jnp.max(ode["error"])) * np.sqrt(2 / 1000)  # (y - y_hat)^2 ~ E chi^2_1 over 1000 samples
    assert float(jnp.max(jnp.abs(sim["error"] - ode["error"]))) < 4 * se < 0.5
    assert float(ode["error"][0] - token["error"][0]) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="Delta"):
        ScalarTarget(-0.5)


@pytest.mark.slow
def test_minibatch_and_weight_decay_follow_the_ode():
    """Minibatch B on the clock t = steps / D divides the eta^2 term by B; weight decay adds -eta gamma M and
    -2 eta gamma Q. SGD follows the B = 8 ODE, not the B = 1 one."""
    s = Setup(prior=FlippedSpike(2.0), minibatch=8, eta=2.0, weight_decay=0.3)
    grid = af.LinearGrid(9)
    sim = train(s, 4.0, key=0, save=grid, eval_samples=0)
    gap = af.compare(solve(s, 4.0, save=grid), sim)
    gap_b1 = af.compare(solve(s.replace(minibatch=1), 4.0, save=grid), sim)
    assert gap["Q"] < 0.005 < 0.02 < gap_b1["Q"] and gap["M"] < 0.02, (gap, gap_b1)


def test_train_runs_in_the_dimension_of_the_initial_draw():
    s = Setup(prior=FlippedSpike(2.0), init=FiniteDDraw(D=300.0, seed=4))
    grid = af.LinearGrid(3)
    tr = train(s, 0.02, key=0, save=grid, eval_samples=0)
    assert tr.meta["D"] == 300 and tr.meta["steps"] == 6  # t = steps / D
    # at another D the keys still start with the draw's overlaps, where solve starts
    big = train(s, 0.02, key=0, D=400, save=grid, eval_samples=0)
    assert big.meta["D"] == 400
    M0, Q0 = s.initial_overlaps()
    np.testing.assert_allclose(big["M"][0], M0, atol=1e-12)
    np.testing.assert_allclose(big["Q"][0], Q0, atol=1e-12)
    # a setup built inside a swept function holds a traced D: trained at REFERENCE_D, with a warning
    with pytest.warns(UserWarning, match=r"the D of setup.init \(FiniteDDraw\) is traced here.*REFERENCE_D = 1000"):
        af.sweep(
            lambda seed: train(Setup(prior=FlippedSpike(2.0), init=FiniteDDraw(D=300.0, seed=seed)), 0.02, save=grid),
            {"seed": np.arange(2)},
            progress=False,
        )
    swept = af.sweep(
        lambda seed: train(
            Setup(prior=FlippedSpike(2.0), init=FiniteDDraw(D=300.0, seed=seed)), 0.02, D=300, save=grid, eval_samples=0
        ),
        {"seed": np.array([4, 5])},
        progress=False,
    )
    assert swept.values.meta["D"] == 300
    np.testing.assert_allclose(swept.values["M"][0], tr["M"], atol=1e-12)


def test_sgd_learns_only_learned_parameters():
    s = Setup(prior=FlippedSpike(2.0), activation=Softmax1(0.0, 1.0, learn_b=True, learn_c=False, per_head=2))
    tr = train(s, 3.0, key=3, D=300, save=af.LinearGrid(4), eval_samples=0)
    assert float(jnp.max(jnp.abs(tr["b"][-1]))) > 1e-4
    assert "c" not in tr.ys and "error" not in tr.ys


def test_ode_tracks_sgd_and_gap_shrinks_with_D():
    """Each D: two SGD seeds (one sweep over traced keys and initial draws) against the ODEs of the same draws."""
    s = Setup(prior=FlippedSpike(2.0), eta=0.5)
    grid, bank = af.LinearGrid(9), BankOptions(n=2048)
    gaps = []
    for D in (400, 1600):
        sims = af.sweep(
            lambda seed, D=D: train(
                s.replace(init=FiniteDDraw(0.5, D, seed)), 4.0, key=seed, D=D, save=grid, eval_samples=0
            ),
            {"seed": np.arange(2)},
            progress=False,
        ).values
        for i in range(2):
            ode = solve(s.replace(init=FiniteDDraw(0.5, D, i)), 4.0, save=grid, bank=bank)
            gaps.append((D, max(float(jnp.max(jnp.abs(sims[k][i] - ode[k]))) for k in ("M", "Q"))))
    small, large = (np.mean([g for D, g in gaps if d == D]) for d in (400, 1600))
    assert large < small and max(g for D, g in gaps if D == 1600) < 0.03, gaps


def test_float32_sgd_tracks_ode():
    """float32 online SGD (tokens from `attnflow.rng.normal`, Box-Muller) against the float64 ODE at D = 1600."""
    s = Setup(prior=FlippedSpike(2.0), eta=0.5, init=FiniteDDraw(0.5, 1600, 2))
    grid = af.LinearGrid(9)
    sim = train(s, 4.0, key=3, D=1600, save=grid, eval_samples=0, dtype=jnp.float32)
    assert sim["M"].dtype == jnp.float32
    ode = solve(s, 4.0, save=grid, bank=BankOptions(n=2048))
    gap = max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q"))
    assert gap < 0.009, gap


def test_bad_input():
    with pytest.raises(ValueError, match="p must be a probability"):
        FlippedSpike(1.0, 1.5)
    with pytest.raises(ValueError, match="weights must sum"):
        Discrete([[1.0], [2.0]], [0.5, 0.6])
    with pytest.raises(ValueError, match="weight 1 is"):
        Discrete([[1.0], [2.0]], [1.5, -0.5])
    with pytest.raises(ValueError, match=r"BayesSoftmax.zeros\(H\) starts them at 0"):
        BayesSoftmax()
    with pytest.raises(ValueError, match=r"variances must be .*-1"):
        AnisotropicGaussian([0.0, 0.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="H"):
        MultiHead.init(0, 0, 10, Softmax())
    with pytest.raises(ValueError, match=r"c must be finite and positive, got -1\.0"):
        Softmax1(0.0, -1.0)
    with pytest.raises(ValueError, match="finite support"):
        oracle_config(AnisotropicGaussian([0.0], [1.0]))
    with pytest.raises(ValueError, match="p must be a probability"):
        softmax_floor(4, 1.5)
    with pytest.raises(ValueError, match="form must be"):
        Dynamics(Setup(), FieldBank(FlippedSpike(1.0), 4, 2, BankOptions(n=16)), "euler")
    with pytest.raises(ValueError, match="copies must be"):
        BankOptions(copies="cyclic")
    with pytest.raises(ValueError, match="escape"):
        solve(Setup(), 1.0, escape=-0.5)
    with pytest.raises(ValueError, match="direction must have shape"):
        symmetric_seed(jnp.zeros((2, 1)), jnp.eye(2), 1.0, 100, direction=[1.0, 0.0])
    with pytest.raises(ValueError, match="target must be"):
        SingleLocationTask(100, 4, FlippedSpike(1.0), target="scalar")
    with pytest.raises(ValueError, match="independent_eval"):
        BankOptions(independent_eval="yes")
    # started specialised: no escape to time (specialisation_time refuses it alike)
    m0 = jnp.array([[0.8], [-0.8]])
    started = Setup(init=Overlaps(m0, m0 @ m0.T + 0.1 * jnp.eye(2)))
    with pytest.raises(ValueError, match=r"escape = 0.5 must lie above the initial specialisation S\(M0\) = 1.131"):
        solve(started, 1.0, escape=0.5, bank=BankOptions(n=16))
    # in a sweep over the learning rate too, at once; over the threshold the point fails by name
    with pytest.raises(ValueError, match=r"escape = 0.5 must lie above the initial specialisation"):
        af.sweep(lambda eta: solve(started.replace(eta=eta), 1.0, escape=0.5, bank=BankOptions(n=16)).t_event,
                 {"eta": [1.0]}, progress=False)  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"1 of 2 grid points failed: thr=0.5: escape must lie above"):
        res = af.sweep(lambda thr: solve(started, 1.0, escape=thr, bank=BankOptions(n=16)).t_event,
                       {"thr": [0.5, 2.0]}, progress=False)  # fmt: skip
    assert res.status.tolist()[0] > 0 and res.status.tolist()[1] == 0
    # a support point of weight 0 gets no oracle head (its b would be -inf)
    Th, _, b = oracle_config(Discrete([[1.0], [-1.0], [2.0]], [0.5, 0.5, 0.0]))
    assert Th.shape == (2, 1) and np.all(np.isfinite(b))
    BayesSoftmax(oracle_config(FlippedSpike(2.0, 1.0))[2])


@pytest.mark.slow
def test_ode_vs_sgd_at_D_2000_within_finite_size_error():
    """Four SGD seeds at D = 2000 against their seeded ODEs: max gap over M, Q below 3 / sqrt(D)."""
    D = 2000
    s = Setup(prior=FlippedSpike(2.0), eta=0.5)
    grid = af.LinearGrid(9)
    for seed in range(4):
        setup = s.replace(init=FiniteDDraw(0.5, D, 100 + seed))
        sim = train(setup, 8.0, key=seed, D=D, save=grid, eval_samples=0)
        ode = solve(setup, 8.0, save=grid, bank=BankOptions(n=4096))
        gap = max(float(jnp.max(jnp.abs(sim[k] - ode[k]))) for k in ("M", "Q"))
        assert gap < 3 / np.sqrt(D), (seed, gap)


@pytest.mark.slow
def test_sgd_specialisation_time_grows_with_log_D():
    """SGD started from the seed 2 / sqrt(D) at the unspecialised point (2 seeds at D = 500 and 4000): the mean
    escape times differ by ln 8 / (2 lambda) within 15 %, and each is within 1 of the identically seeded ODE."""
    s = Setup(init=FiniteDDraw(0.45))
    bank = BankOptions(n=2048)
    y = unspecialised_point(s, bank=bank)
    lam = float(specialisation_spectrum(s, y, bank=bank).lambda_max)
    means = []
    for D in (500, 4000):
        seeded = s.replace(init=SymmetricSeed(y["M"], y["Q"], 2.0, D))
        t_ode = float(solve(seeded, 30.0, bank=bank, escape=0.5).t_event)
        sims = af.sweep(
            lambda seed, D=D, seeded=seeded: train(
                seeded, 12.0, key=seed, D=D, save=af.LinearGrid(241), eval_samples=0
            ),
            {"seed": np.arange(2)},
            progress=False,
        ).values
        ts = np.asarray(af.first_crossing(sims.ts, sims["specialisation"], 0.5, interpolate=True))
        assert np.max(np.abs(ts - t_ode)) < 1.0, (D, ts, t_ode)
        means.append(ts.mean())
    assert means[1] - means[0] == pytest.approx(np.log(8) / (2 * lam), rel=0.15), (means, lam)


def test_flipped_spike_built_inside_jit_keeps_its_sign_symmetry():
    # the antithetic bank depends on the flag: a prior built under jit must not lose it
    @jax.jit
    def flag(s):
        return jnp.asarray(hd.FlippedSpike(s).sign_symmetric)

    assert bool(flag(3.0)) and hd.FlippedSpike(3.0).sign_symmetric
    assert not hd.FlippedSpike(3.0, 0.4).sign_symmetric


def test_staged_linearises_before_the_earliest_escape_whatever_the_order():
    """heads-staged's plateau state: half the earliest escape, with the variances in any order."""
    from attnflow.heads.experiments import _plateau_index

    ts = np.linspace(0.0, 300.0, 301)
    assert ts[_plateau_index(ts, np.array([20.0, 124.0]), 300.0)] == 10.0
    assert ts[_plateau_index(ts, np.array([190.0, 20.0]), 300.0)] == 10.0  # was 95: feature 2 specialised
    assert ts[_plateau_index(ts, np.array([np.nan, 40.0, np.inf]), 300.0)] == 20.0
    assert ts[_plateau_index(ts, np.array([np.nan, np.inf]), 300.0)] == 150.0


def test_excursion_even_split_time_is_interpolated_between_saves():
    """heads-excursion's even-split time: where the last head to flip crosses zero, between the
    save times around it (was the save time after it: 87.55 for crossings at 85.8 and 85.2)."""
    from attnflow.heads.experiments import _even_split_time

    ts = np.array([0.0, 10.0, 20.0, 30.0])
    m = np.array([[0.3, 0.2, 0.1, -0.1], [0.3, 0.2, 0.05, -0.1], [0.3, 0.2, -0.15, -0.1], [0.3, 0.1, -0.2, -0.1]])
    assert _even_split_time(ts, m) == pytest.approx(12.5)  # head 2: 0.05 -> -0.15 crosses a quarter in
    two = np.array([[0.3, 0.2, 0.1, 0.1], [0.3, 0.2, 0.04, 0.02], [0.3, 0.2, -0.06, -0.18]])
    assert _even_split_time(ts[:3], two) == pytest.approx(14.0)  # the later of 14 and 11
    assert np.isnan(_even_split_time(ts, np.ones((4, 4))))


def test_prior_edited_with_tree_at_reads_its_new_symmetry():
    """The symmetry is read from a prior's current values: an ``eqx.tree_at`` edit of p = 1/2 to
    0.3 gives the fresh p = 0.3 prior's error, not the p = 1/2 one (the antithetic copies would
    average p with 1 - p: 0.7565 instead of 0.8450, plain Monte Carlo 0.8469)."""
    import equinox as eqx

    M = jnp.array([[0.6], [0.1]])
    Q = M @ M.T + 0.2 * jnp.eye(2)
    opts = BankOptions(n=4096)
    edited = eqx.tree_at(lambda p: p.p, FlippedSpike(2.0, 0.5), jnp.asarray(0.3))
    assert not edited.sign_symmetric and FlippedSpike(2.0, 0.5).sign_symmetric
    E = {
        name: float(generalisation_error(M, Q, Softmax(), FieldBank(pr, 4, 2, opts)))
        for name, pr in (("edited", edited), ("fresh", FlippedSpike(2.0, 0.3)), ("half", FlippedSpike(2.0)))
    }
    assert E["edited"] == pytest.approx(E["fresh"], rel=1e-12)
    assert E["fresh"] == pytest.approx(0.8450, abs=5e-4) and E["half"] == pytest.approx(0.7566, abs=5e-4)
    # the Gaussian mean and the discrete weights alike, both ways
    g = eqx.tree_at(lambda p: p.mean, AnisotropicGaussian([1.0], [2.0]), jnp.zeros(1))
    assert g.sign_symmetric and not eqx.tree_at(lambda p: p.mean, g, jnp.ones(1)).sign_symmetric
    d = Discrete([[1.0], [-1.0]])
    assert d.sign_symmetric and not eqx.tree_at(lambda p: p.weights, d, jnp.array([0.7, 0.3])).sign_symmetric
    assert not Discrete([[1.0], [2.0]]).sign_symmetric
    assert Discrete([[1.0], [-1.0], [3.0]], [0.5, 0.5, 0.0]).sign_symmetric  # an unmirrored point of weight 0


def test_grad_with_respect_to_prior_parameters_matches_central_differences():
    """A traced p or mean counts as not symmetric, so the copies never average it with its mirror:
    jax.grad of the error at p = 1/2 and at mean 0 matches central differences of the rebuilt
    prior (h = 1e-3; the bank is the same smooth function of the parameter, so to 1e-6)."""
    M = jnp.array([[0.6], [0.1]])
    Q = M @ M.T + 0.2 * jnp.eye(2)
    opts = BankOptions(n=1024)

    def E(prior):
        return generalisation_error(M, Q, Softmax(), FieldBank(prior, 4, 2, opts))

    h = 1e-3
    g_p = float(jax.grad(lambda p: E(FlippedSpike(2.0, p)))(0.5))
    cd_p = (float(E(FlippedSpike(2.0, 0.5 + h))) - float(E(FlippedSpike(2.0, 0.5 - h)))) / (2 * h)
    assert g_p == pytest.approx(cd_p, rel=1e-6) and abs(g_p) > 0.3  # -0.444 (0.0004 with the copies)
    gauss = lambda m: E(AnisotropicGaussian(jnp.reshape(m, (1,)), [2.0]))
    g_m = float(jax.grad(gauss)(0.0))
    cd_m = (float(gauss(h)) - float(gauss(-h))) / (2 * h)
    assert g_m == pytest.approx(cd_m, rel=1e-6) and abs(g_m) > 0.05  # -0.109 (0.0003 with the copies)


def test_antithetic_true_is_checked_per_point_with_traced_prior_parameters():
    """BankOptions(antithetic=True): a concrete prior that is not sign-symmetric is refused at once;
    with a traced p (a sweep) the copies are kept and a point that is not symmetric fails by name,
    while p = 1/2 gives the direct call's value (copies on there by default)."""
    import equinox as eqx

    B = BankOptions(n=64, antithetic=True)
    s = Setup()

    def err(p):
        return solve(s.replace(prior=FlippedSpike(3.0, p)), 0.5, save=af.LinearGrid(2), bank=B)["error"][-1]

    with pytest.raises(
        ValueError,
        match=r"^antithetic copies need a sign-symmetric prior; FlippedSpike is not \(its sign_symmetric is False\): "
        r"use antithetic=None or False$",
    ):
        FieldBank(FlippedSpike(3.0, 0.3), 4, 2, B)
    with pytest.warns(
        RuntimeWarning,
        match=r"1 of 2 grid points failed: p=0.3: antithetic copies need a sign-symmetric prior; this FlippedSpike's "
        r"\(traced\) parameters are not sign-symmetric",
    ):
        res = af.sweep(err, {"p": np.array([0.3, 0.5])}, progress=False)
    direct = float(solve(s, 0.5, save=af.LinearGrid(2), bank=BankOptions(n=64))["error"][-1])
    # traced outside a sweep: the program raises at run time
    with pytest.raises(Exception, match="antithetic copies need a sign-symmetric prior; this FlippedSpike's"):
        jax.block_until_ready(
            eqx.filter_jit(lambda p: FieldBank(FlippedSpike(3.0, p), 4, 2, B).weights)(jnp.asarray(0.3))
        )
    assert res.status.tolist()[0] > 0 and res.status.tolist()[1] == 0
    assert float(res.values[1]) == pytest.approx(direct, rel=1e-12)
    # a Gaussian mean alike: mean 0 in a sweep keeps the copies
    err_mu = lambda mu: solve(
        s.replace(prior=AnisotropicGaussian(mu[None], [2.0])), 0.5, save=af.LinearGrid(2), bank=B
    )["error"][-1]
    direct_mu = float(err_mu(jnp.asarray(0.0)))
    swept = af.sweep(err_mu, {"mu": np.array([0.0])}, progress=False)
    assert float(swept.values[0]) == pytest.approx(direct_mu, rel=1e-12)


def test_solve_stops_past_the_psd_tolerance():
    """Spec section 6: stop where lambda_min(Q - M M^T) < -psd_tolerance tr Q (default
    max(PSD_TOLERANCE, 10 rtol)), the message naming lambda_min and the bound."""
    from attnflow.heads.theory import _check_psd_along
    from attnflow.trajectory import Trajectory

    M = jnp.array([[0.3], [0.1]])
    Q = M @ M.T + jnp.diag(jnp.array([0.25, -5e-11]))  # within check_overlaps' -1e-10 tr Q
    s = Setup(init=Overlaps(M, Q))
    run = lambda **kw: solve(s, 0.2, save=af.LinearGrid(2), bank=BankOptions(n=64), **kw)
    assert np.all(np.isfinite(run()["error"]))  # default 1e-5 tr Q: passes
    with pytest.raises(
        af.DivergenceError,
        match=r"^solve: Q - M M\^T lost positive semidefiniteness at t = 0: lambda_min = -5e-11 < -psd_tolerance "
        r"tr Q = -3.5e-13 \(psd_tolerance 1e-12, tr Q 0.35\); lower rtol or eta$",
    ):
        run(psd_tolerance=1e-12)
    with pytest.raises(ValueError, match=r"^psd_tolerance must be finite and positive, got -1\.0$"):
        run(psd_tolerance=-1.0)
    # the bound is relative to tr Q, also below tr Q = 1: -5e-6 at tr Q = 0.01 is past -1e-5 tr Q
    Ms, Qs = np.zeros((2, 2, 1)), np.array([np.diag([0.01, 0.0]), np.diag([0.01, -5e-6])])
    with pytest.raises(af.DivergenceError, match=r"at t = 1: lambda_min = -5e-06 < -psd_tolerance tr Q = -9.99e-08"):
        _check_psd_along(Trajectory(np.array([0.0, 1.0]), {"M": Ms, "Q": Qs}), hd.DEFAULT_SOLVER)


def test_bad_minor_inputs_are_named():
    with pytest.raises(ValueError, match=r"^D must be finite and positive, got inf$"):
        Setup(init=FiniteDDraw(D=float("inf")))
    with pytest.raises(ValueError, match=r"^K must be finite; entry \(0, 1\) is nan$"):
        MultiHead(jnp.array([[1.0, jnp.nan], [0.0, 1.0]]), Softmax())
    with pytest.raises(ValueError, match=r"^n_plus must be a whole number of heads in \[0, H = 2\], got 1\.5$"):
        softmax_floor(4, 0.5, 1.5, 2)
    assert softmax_floor(4, 0.5, 1.0, 2) == pytest.approx(softmax_floor(4, 0.5, 1, 2))


def test_asymmetric_covariance_names_its_largest_asymmetry():
    with pytest.raises(
        ValueError,
        match=r"^the covariance C must be symmetric, got \[\[1\.0, 0\.5\], \[0\.0, 1\.0\]\]: the largest \|C - C\^T\| "
        r"entry is 0\.5 at index \(0, 1\) \(C\[0, 1\] = 0\.5, C\[1, 0\] = 0\)$",
    ):
        AnisotropicGaussian([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(
        ValueError,
        match=r"the largest \|C - C\^T\| entry is 0\.1 at index \(0, 2\) \(C\[0, 2\] = 0\.2, C\[2, 0\] = 0\.1\)$",
    ):
        AnisotropicGaussian(np.zeros(3), [[1.0, 0.0, 0.2], [0.0, 1.0, 0.0], [0.1, 0.0, 1.0]])
    # a symmetric C that is not positive semidefinite keeps the eigenvalue message
    with pytest.raises(
        ValueError,
        match=r"^the covariance C must be symmetric positive semidefinite, got \[\[1\.0, 2\.0\], \[2\.0, 1\.0\]\] "
        r"\(smallest eigenvalue -1\)$",
    ):
        AnisotropicGaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    # an asymmetry at rounding level (below 1e-12 of the largest entry) is accepted
    C = np.array([[2.0, 0.5], [0.5 + 1e-13, 1.0]])
    assert AnisotropicGaussian([0.0, 0.0], C).F == 2


def test_finite_D_draw_checks_a_concrete_D_on_construction():
    for D, shown in ((-5, "-5.0"), (-5.0, "-5.0"), (0.0, "0.0"), (float("inf"), "inf"), (float("nan"), "nan")):
        with pytest.raises(ValueError, match=rf"^D must be finite and positive, got {shown}$"):
            FiniteDDraw(D=D)
    with pytest.raises(ValueError, match=r"^D must be a real number or array of them, got a boolean: True$"):
        FiniteDDraw(D=True)
    with pytest.raises(ValueError, match=r"^sigma0 \(initial key scale\) must be finite and positive, got -0\.5$"):
        FiniteDDraw(sigma0=-0.5)
    with pytest.raises(ValueError, match=r"^D must be finite and positive, got -5\.0$"):
        SymmetricSeed(jnp.zeros((2, 1)), jnp.eye(2), D=-5)
    with pytest.raises(ValueError, match=r"^kappa must be finite"):
        SymmetricSeed(jnp.zeros((2, 1)), jnp.eye(2), kappa=jnp.nan)
    # a traced D still builds: under vmap the overlaps are those of each D drawn alone
    Ds = jnp.array([200.0, 400.0])
    Q = jax.vmap(lambda D: Setup(init=FiniteDDraw(D=D)).initial_overlaps()[1])(Ds)
    for k, D in enumerate((200, 400)):
        np.testing.assert_allclose(Q[k], from_finite_D(D, 2, 1)[1], rtol=1e-12)
    # and a bad traced D marks its sweep point failed, with the same message
    with pytest.warns(RuntimeWarning, match="1 of 2 grid points failed"):
        r = af.sweep(
            lambda D: Setup(init=FiniteDDraw(D=D)).initial_overlaps()[1][0, 0],
            {"D": jnp.array([-5.0, 400.0])},
            progress=False,
        )
    assert "D must be finite and positive" in str(r.failures())
    assert np.isnan(r.values[0]) and r.values[1] == pytest.approx(float(from_finite_D(400, 2, 1)[1][0, 0]), rel=1e-12)


def test_discrete_refuses_one_dimensional_points():
    # [-3, 3] could be two points of F = 1 or one point of F = 2: two different priors
    with pytest.raises(
        ValueError,
        match=r"^points must have shape \(J, F\), one row per point, got the 1-D \[-3\.0, 3\.0\]: the F = 1 prior",
    ):
        Discrete(jnp.array([-3.0, 3.0]))
    with pytest.raises(ValueError, match=r"^points must have shape \(J, F\), one row per point, got \(2, 1, 1\)$"):
        Discrete(np.zeros((2, 1, 1)))
    two = Discrete([[-3.0], [3.0]])
    assert (two.F, two.points.shape, float(two.weights[0])) == (1, (2, 1), 0.5)
    one = PointMass([1.0, 2.0])  # one point in F = 2
    assert (one.F, one.points.shape) == (2, (1, 2))
