"""The experiment registry: imports every package's ``experiments`` module.

This is the one place that knows the theory packages; the core does not import them.
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


def load_all() -> dict[str, Experiment]:
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)
    return experiments()


def headline() -> list[Experiment]:
    """The headline experiment of each package, in registry order."""
    return [e for e in load_all().values() if e.headline]


__all__ = ["EXPERIMENT_MODULES", "load_all", "headline", "get_experiment"]
