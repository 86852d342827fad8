"""The experiment registry: imports every package's ``experiments`` module.

This is the one place that knows the theory packages; the core does not import them. It
also knows which of their experiments run `attnflow.sweep` (`SWEEPING`), so that ``attnflow
run NAME --shard I/N`` and ``--merge`` refuse an experiment without sweeps before running it.
"""

from __future__ import annotations

import importlib

from .report import Experiment, experiments, get_experiment

EXPERIMENT_MODULES = (
    "attnflow.deeplinear.experiments",
    "attnflow.qkov.experiments",
    "attnflow.qkov.text_experiments",
    "attnflow.focus.experiments",
    "attnflow.heads.experiments",
    "attnflow.derive.experiments",
    "attnflow.finite_size_experiment",
)


SWEEPING = frozenset(
    {
        "derive-committee",
        "finite-size",
        "focus-finite",
        "focus-rates",
        "focus-symmetry",
        "heads-activations",
        "heads-ode-vs-sgd",
        "heads-specialisation-time",
        "qkov-fixed-attention",
        "qkov-optimal-ratio",
        "qkov-parametrisations",
        "qkov-ratio-sweep",
        "qkov-reduced",
    }
)
"""The experiments of `EXPERIMENT_MODULES` whose function calls `attnflow.sweep`, directly or
through attnflow functions that do (``tests/test_cli_registry.py`` checks this set against the
source). The others run no sweep, whatever their options."""


def runs_sweeps(exp: Experiment) -> bool | None:
    """Whether experiment ``exp`` runs `attnflow.sweep`: its ``register(..., sweeps=...)`` if
    given, else for the experiments of `EXPERIMENT_MODULES` membership of `SWEEPING`; None
    (not known) for an experiment registered elsewhere without ``sweeps=``."""
    if exp.sweeps is not None:
        return exp.sweeps
    if getattr(exp.fn, "__module__", None) in EXPERIMENT_MODULES:
        return exp.name in SWEEPING
    return None


def load_all() -> dict[str, Experiment]:
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)
    return experiments()


def headline() -> list[Experiment]:
    """The headline experiment of each package, in registry order."""
    return [e for e in load_all().values() if e.headline]


__all__ = ["EXPERIMENT_MODULES", "SWEEPING", "load_all", "headline", "get_experiment", "runs_sweeps"]
