"""Property-based checks of the public edges: any value a user can pass either works or raises
ValueError or TypeError naming the argument, never a foreign exception.

Each case takes one argument of a public constructor or verb and replaces it by values drawn
from `BAD` (NaN, infinities, zero, negatives, wrong types, wrong shapes); where the drawn
value happens to be valid, the call must simply succeed.
"""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow import deeplinear as dl
from attnflow import focus, heads, qkov

BAD = st.one_of(
    st.sampled_from(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            0.0,
            -1.0,
            -1e-300,
            1e308,
            0,
            -3,
            True,
            None,
            "abc",
            "",
            [],
            [1.0, "x"],
            [[1.0, 2.0]],
            {"a": 1},
            (),
            b"x",
            object(),
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.text(max_size=4),
    st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.none()), max_size=4),
)
# for verbs, which compute when given a valid value: values that are invalid for every numeric
# argument (a valid but huge step count would run for hours)
INVALID = st.one_of(
    st.sampled_from(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            -1.0,
            -1e-300,
            -3,
            None,
            "abc",
            "",
            "1",
            [],
            [1.0, "x"],
            {"a": 1},
            (),
            b"x",
            object(),
        ]
    ),
    st.floats(max_value=-1e-300),
    st.integers(max_value=-1),
    st.text(min_size=1, max_size=4),
)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(call, name, value):
    """``call(value)`` works, or raises ValueError / TypeError whose message names ``name``."""
    try:
        call(value)
    except (ValueError, TypeError) as err:
        assert name in str(err), f"{type(err).__name__} for {name}={value!r} does not name it: {err}"
    except (af.DivergenceError, af.MaxStepsError):
        pass  # documented outcomes of a (valid) number that makes a run diverge
    except FileNotFoundError as err:  # documented for data files: the message names the file
        assert repr(str(value)) in str(err) or str(value) in str(err), err


def _decay(t, y, a):
    return -a * y


def _pop_loss(m, _):
    return dl.population_loss(m.W1, m.W2, dl.Setup().teacher.A)


CONSTRUCTORS = {
    # core options and results
    "LinearGrid.n": (lambda v: af.LinearGrid(v), "n"),
    "LogGrid.n": (lambda v: af.LogGrid(v), "n"),
    "LogGrid.t_min": (lambda v: af.LogGrid(10, t_min=v), "t_min"),
    "TimeGrid.ts": (lambda v: af.TimeGrid(v), "ts"),
    "SolverOptions.rtol": (lambda v: af.SolverOptions(rtol=v), "rtol"),  # 0 is allowed: absolute control
    "SolverOptions.atol": (lambda v: af.SolverOptions(atol=v), "atol"),
    "SolverOptions.dt0": (lambda v: af.SolverOptions(dt0=v), "dt0"),
    "SolverOptions.max_steps": (lambda v: af.SolverOptions(max_steps=v), "max_steps"),
    "SolverOptions.solver": (lambda v: af.SolverOptions(solver=v), "solver"),
    "Trajectory.ts": (lambda v: af.Trajectory(v, {}), "ts"),
    "OnlineSGD.batch_size": (lambda v: af.OnlineSGD(lambda k, b: k, v), "batch_size"),
    "GaussianBank.n": (lambda v: af.GaussianBank(0, v, 2), "n"),
    "GaussianBank.dim": (lambda v: af.GaussianBank(0, 4, v), "dim"),
    "gauss_hermite.n_points": (lambda v: af.gauss_hermite(lambda x: x, v, 0.0, 1.0), "n_points"),
}

VERBS = {
    # core verbs (invalid values fail before computing)
    "integrate.t1": (lambda v: af.integrate(_decay, jnp.ones(2), v, args=1.0, save=af.LinearGrid(2)), "t1"),
    "integrate.t0": (lambda v: af.integrate(_decay, jnp.ones(2), 1.0, t0=v, args=1.0, save=af.LinearGrid(2)), "t0"),
    "integrate.save": (lambda v: af.integrate(_decay, jnp.ones(2), 1.0, args=1.0, save=v), "save"),
    "integrate.solver": (lambda v: af.integrate(_decay, jnp.ones(2), 1.0, args=1.0, solver=v), "solver"),
    "simulate.steps": (
        lambda v: af.simulate(
            _pop_loss, dl.TwoLayerLinear.random(0, 8, 4, 6), optax.sgd(0.01), v, save=af.LinearGrid(2)
        ),
        "steps",
    ),
    "simulate.clock": (
        lambda v: af.simulate(
            _pop_loss, dl.TwoLayerLinear.random(0, 8, 4, 6), optax.sgd(0.01), 2, clock=v, save=af.LinearGrid(2)
        ),
        "clock",
    ),
    "sweep.axes": (lambda v: af.sweep(lambda x: x, {"x": v}, progress=False), "x"),
    "sweep.chunk_size": (
        lambda v: af.sweep(lambda x: x, {"x": np.ones(2)}, chunk_size=v, progress=False),
        "chunk_size",
    ),
    "first_crossing.threshold": (lambda v: af.first_crossing(jnp.arange(3.0), jnp.arange(3.0), v), "threshold"),
    "data_path.name": (lambda v: af.data_path(v), "name"),
}

CONSTRUCTORS |= {
    # deeplinear
    "dl.Setup.s": (lambda v: dl.Setup(s=v), "s"),
    "dl.Setup.u0": (lambda v: dl.Setup(u0=v), "u0"),
    "dl.Setup.eta": (lambda v: dl.Setup(eta=v), "eta"),
    "dl.Setup.n_in": (lambda v: dl.Setup(n_in=v), "n_in"),
    "dl.Setup.teacher_seed": (lambda v: dl.Setup(teacher_seed=v), "teacher_seed"),
}

VERBS |= {
    "dl.solve.t1": (lambda v: dl.solve(dl.Setup(), v, save=af.LinearGrid(2)), "t1"),
    "dl.train.t1": (lambda v: dl.train(dl.Setup(), v, save=af.LinearGrid(2)), "t1"),
    "dl.train.dt": (lambda v: dl.train(dl.Setup(), 0.1, dt=v, save=af.LinearGrid(2)), "dt"),
    "dl.train.batch": (lambda v: dl.train(dl.Setup(), 0.1, batch=v, save=af.LinearGrid(2)), "batch"),
    "dl.train.key": (lambda v: dl.train(dl.Setup(), 0.1, key=v, batch=2, save=af.LinearGrid(2)), "key"),
}


CONSTRUCTORS_THEORIES = {
    "qkov.Setup.eta_qk": (lambda v: qkov.Setup(eta_qk=v), "eta_qk"),
    "qkov.Setup.eta_ov": (lambda v: qkov.Setup(eta_ov=v), "eta_ov"),
    "qkov.Setup.mu0": (lambda v: qkov.Setup(mu0=v), "mu0"),
    "qkov.Setup.parametrisation": (lambda v: qkov.Setup(parametrisation=v), "parametrisation"),
    "qkov.Setup.M": (lambda v: qkov.Setup(M=v), "M"),
    "qkov.Setup.b": (lambda v: qkov.Setup(b=v), "b"),
    "qkov.Setup.n_common": (lambda v: qkov.Setup(n_common=v), "n_common"),
    "qkov.Setup.query_mode": (lambda v: qkov.Setup(query_mode=v), "query_mode"),
    "qkov.Setup.score_scale": (lambda v: qkov.Setup(score_scale=v), "score_scale"),
    "focus.Setup.tau": (lambda v: focus.Setup(tau=v), "tau"),
    "focus.Setup.eps": (lambda v: focus.Setup(eps=v), "eps"),
    "focus.Setup.eta": (lambda v: focus.Setup(eta=v), "eta"),
    "focus.Setup.m": (lambda v: focus.Setup(m=v), "m"),
    "focus.Setup.init_seed": (lambda v: focus.Setup(init_seed=v), "init_seed"),
    "focus.MarkovChain.pi": (lambda v: focus.MarkovChain(v, np.eye(4)), "pi"),
    "focus.MarkovChain.P": (lambda v: focus.MarkovChain(focus.SYNTHETIC_PI, v), "P"),
    "focus.MarkovChain.lazy.lam": (lambda v: focus.MarkovChain.lazy(focus.SYNTHETIC_PI, v), "lam"),
    "focus.perturbed_pi.delta": (lambda v: focus.perturbed_pi(0.75, 4, v), "delta"),
    "heads.Setup.eta": (lambda v: heads.Setup(eta=v), "eta"),
    "heads.Setup.eta_b": (lambda v: heads.Setup(eta_b=v), "eta_b"),
    "heads.Setup.weight_decay": (lambda v: heads.Setup(weight_decay=v), "weight_decay"),
    "heads.Setup.L": (lambda v: heads.Setup(L=v), "L"),
    "heads.Setup.H": (lambda v: heads.Setup(H=v), "H"),
    "heads.Setup.minibatch": (lambda v: heads.Setup(minibatch=v), "minibatch"),
    "heads.Setup.prior": (lambda v: heads.Setup(prior=v), "prior"),
    "heads.Setup.activation": (lambda v: heads.Setup(activation=v), "activation"),
    "heads.FlippedSpike.s": (lambda v: heads.FlippedSpike(v), "s"),
    "heads.FlippedSpike.p": (lambda v: heads.FlippedSpike(2.0, v), "p"),
    "heads.Discrete.points": (lambda v: heads.Discrete(v), "points"),
    "heads.Discrete.weights": (lambda v: heads.Discrete([[1.0], [-1.0]], v), "weights"),
    "heads.BayesSoftmax.b": (lambda v: heads.BayesSoftmax(v), "b"),
    "heads.Softmax1.b": (lambda v: heads.Softmax1(b=v), "b"),
    "heads.FiniteDDraw.sigma0": (lambda v: heads.FiniteDDraw(sigma0=v), "sigma0"),
    "heads.FiniteDDraw.D": (lambda v: heads.FiniteDDraw(D=v), "D"),
    "heads.FiniteDDraw.seed": (lambda v: heads.FiniteDDraw(seed=v), "seed"),
    "heads.MultiHead.K": (lambda v: heads.MultiHead(v, heads.Softmax()), "K"),
}

VERBS_THEORIES = {
    "qkov.solve.t1": (lambda v: qkov.solve(qkov.Setup(), v, save=af.LinearGrid(2)), "t1"),
    "qkov.solve.loss_target": (
        lambda v: qkov.solve(qkov.Setup(), 10.0, loss_target=v, save=af.LinearGrid(2)),
        "loss_target",
    ),
    "qkov.train.t1": (lambda v: qkov.train(qkov.Setup(), v, save=af.LinearGrid(2)), "t1"),
    "qkov.train.batch": (lambda v: qkov.train(qkov.Setup(), 1.0, batch=v, save=af.LinearGrid(2)), "batch"),
    "qkov.train.dt": (lambda v: qkov.train(qkov.Setup(), 1.0, dt=v, save=af.LinearGrid(2)), "dt"),
    "qkov.state_at_loss.loss_target": (lambda v: qkov.state_at_loss(qkov.Setup(), v), "loss_target"),
    "focus.solve.t1": (lambda v: focus.solve(focus.Setup(m=4, mk=4), v, save=af.LinearGrid(2)), "t1"),
    "focus.train.t1": (lambda v: focus.train(focus.Setup(m=4, mk=4), v, save=af.LinearGrid(2)), "t1"),
    "focus.train.context": (
        lambda v: focus.train(focus.Setup(m=4, mk=4), 0.1, context=v, save=af.LinearGrid(2)),
        "context",
    ),
    "focus.train.batch": (lambda v: focus.train(focus.Setup(m=4, mk=4), 0.1, batch=v, save=af.LinearGrid(2)), "batch"),
    "focus.train.dt": (lambda v: focus.train(focus.Setup(m=4, mk=4), 0.1, dt=v, save=af.LinearGrid(2)), "dt"),
    "focus.init_theta.eps": (lambda v: focus.init_theta(0, 4, 4, 4, v), "eps"),
    "heads.solve.t1": (lambda v: heads.solve(heads.Setup(), v, save=af.LinearGrid(2)), "t1"),
    "heads.train.t1": (lambda v: heads.train(heads.Setup(), v, D=50, save=af.LinearGrid(2)), "t1"),
    "heads.train.D": (lambda v: heads.train(heads.Setup(), 0.1, D=v, save=af.LinearGrid(2)), "D"),
    "heads.train.key": (lambda v: heads.train(heads.Setup(), 0.1, D=50, key=v, save=af.LinearGrid(2)), "key"),
    "heads.train.eval_samples": (
        lambda v: heads.train(heads.Setup(), 0.1, D=50, eval_samples=v, save=af.LinearGrid(2)),
        "eval_samples",
    ),
    "heads.bayes_risk.n": (lambda v: heads.bayes_risk(heads.FlippedSpike(2.0), 4, n=v), "n"),
    "heads.bayes_risk.L": (lambda v: heads.bayes_risk(heads.FlippedSpike(2.0), v, n=100), "L"),
}

# the core's cases and the theory packages' in one parametrisation each
CONSTRUCTORS.update(CONSTRUCTORS_THEORIES)
VERBS.update(VERBS_THEORIES)


@pytest.mark.parametrize("case", sorted(CONSTRUCTORS))
@SETTINGS
@given(value=BAD)
def test_constructors_name_invalid_input(case, value):
    call, name = CONSTRUCTORS[case]
    _check(call, name, value)


@pytest.mark.parametrize("case", sorted(VERBS))
@SETTINGS
@given(value=INVALID)
def test_verbs_name_invalid_input_before_computing(case, value):
    call, name = VERBS[case]
    _check(call, name, value)
