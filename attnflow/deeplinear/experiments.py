"""Registered experiment ``deep-linear``: closed form vs integrate vs simulate (GD)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from matplotlib.figure import Figure

from ..ode import integrate
from ..plot import overlay
from ..report import Report, Timer, register
from ..saddle import spectrum
from ..simulate import FullBatch, simulate
from ..trajectory import Trajectory
from .data import Teacher
from .model import TwoLayerLinear
from .theory import conserved, factor_field, matrix_field, mode_field, mode_strength, population_loss

DEFAULTS = {
    "s": [3.0, 2.0, 1.0, 0.5],
    "n_in": 8,
    "n_out": 6,
    "u0": 1e-3,
    "t_end": 14.0,
    "etas": [0.04, 0.02, 0.01],
    "seed": 0,
}


def gd_run(teacher: Teacher, u0: float, eta: float, t_end: float, n_save: int = 60) -> tuple[Trajectory, TwoLayerLinear]:
    """Full-batch GD on the population loss from the aligned balanced initialisation.

    Time is ``t = eta * step`` (gradient flow with ``tau = 1``).
    """
    model = TwoLayerLinear.aligned(teacher, u0)
    steps = int(round(t_end / eta))
    loss = lambda m, _: population_loss(m.W1, m.W2, teacher.A)  # noqa: E731
    observe = lambda m: {  # noqa: E731
        "u": teacher.modes(m.product),
        "loss": population_loss(m.W1, m.W2, teacher.A),
        "conserved": conserved(m.W1, m.W2),
    }
    return simulate(loss, model, optax.sgd(eta), steps, mode=FullBatch(), observe=observe,
                    n_save=n_save, spacing="linear", clock=eta, return_model=True)


@register("deep-linear", defaults=DEFAULTS, headline=True,
          description="Saxe et al. (2014) two-layer linear net: closed form vs integrate vs full-batch GD")
def deep_linear(config: dict, quiet: bool) -> Report:
    s = np.asarray(config["s"], dtype=float)
    teacher = Teacher(s, config["n_in"], config["n_out"], key=config["seed"])
    u0, t_end = float(config["u0"]), float(config["t_end"])
    report = Report("deep-linear", config)

    with Timer() as tm:
        ode = integrate(mode_field, jnp.full(s.shape, u0), t_end, args={"s": jnp.asarray(s), "tau": 1.0},
                        n_save=400, rtol=1e-10, atol=1e-14, progress=not quiet)
        closed = mode_strength(ode.ts[:, None], s, u0)
        theory = ode.with_ys(u=ode["y"], loss=0.5 * jnp.sum((s - ode["y"]) ** 2, axis=-1))
    report.timings["integrate"] = tm.seconds
    report.check("integrate vs closed form (max rel. error)", float(jnp.max(jnp.abs(ode["y"] - closed) / closed)), 1e-8)

    errors = []
    sims = {}
    with Timer() as tm:
        for eta in config["etas"]:
            sim, model = gd_run(teacher, u0, eta, t_end)
            sims[eta] = sim
            exact = mode_strength(sim.ts[:, None], s, u0)
            errors.append(float(jnp.max(jnp.abs(sim["u"] - exact))))
            drift = float(jnp.max(jnp.abs(sim["conserved"] - sim["conserved"][0])))
            report.summary[f"GD eta={eta}: max |u - closed form|"] = errors[-1]
            report.summary[f"GD eta={eta}: drift of W1W1^T - W2^T W2"] = drift
    report.timings["simulate"] = tm.seconds
    etas = np.asarray(config["etas"], dtype=float)
    slope = float(np.polyfit(np.log(etas), np.log(errors), 1)[0])
    report.summary["GD error ~ eta^p: fitted p"] = slope
    report.check("GD error order in eta (|p - 1|)", abs(slope - 1.0), 0.15)

    # Gradient flow of the full matrices from a random small start: conserved quantity (4).
    W0 = TwoLayerLinear.random(config["seed"] + 1, config["n_in"], len(s), config["n_out"], scale=0.05)
    flow = integrate(matrix_field, {"W1": W0.W1, "W2": W0.W2}, t_end, args={"A": teacher.A, "tau": 1.0},
                     n_save=100, rtol=1e-10, atol=1e-12,
                     observe=lambda t, W, a: {"C": conserved(W["W1"], W["W2"]),
                                              "loss": population_loss(W["W1"], W["W2"], teacher.A)})
    report.check("conserved W1W1^T - W2^T W2 along integrated flow (max abs drift)",
                 float(jnp.max(jnp.abs(flow["C"] - flow["C"][0]))), 1e-7)

    # Saddle at the origin of the factor ODE (3): eigenvalues +-s.
    spec = spectrum(factor_field, {"a": jnp.zeros_like(jnp.asarray(s)), "b": jnp.zeros_like(jnp.asarray(s))},
                    {"s": jnp.asarray(s), "tau": 1.0})
    eig = np.sort(np.real(np.asarray(spec.values)))
    want = np.sort(np.concatenate([s, -s]))
    report.check("saddle eigenvalues at origin vs +-s (max abs error)", float(np.max(np.abs(eig - want))), 1e-12)
    report.summary["origin eigenvalues"] = [float(x) for x in eig[::-1]]

    report.trajectories["theory"] = theory
    report.trajectories[f"gd_eta{config['etas'][-1]}"] = sims[config["etas"][-1]]
    labels = [f"s={x:g}" for x in s]
    report.figures["modes"] = overlay(
        theory, sims[config["etas"][0]], ["u", "loss"], labels={"u": "mode strength u(t)", "loss": "population loss"},
        component_labels=labels, time_label="t = eta * step", theory_label="closed-form ODE",
        simulation_label=f"GD, eta={config['etas'][0]}",
        title="Deep linear network: theory (lines) vs gradient descent (markers)", log_y=("loss",),
    )
    fig = Figure(figsize=(4.5, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.loglog(etas, errors, "o-", label="measured max |u_GD - u_theory|")
    ax.loglog(etas, errors[-1] * etas / etas[-1], "k--", label="slope 1")
    ax.set_xlabel("learning rate eta")
    ax.set_ylabel("max error in mode strength")
    ax.set_title("GD approaches gradient flow as O(eta)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    report.figures["error_vs_eta"] = fig
    return report
