"""``heads-activations`` compiles each of its programs once (issue "Time to result", item "One
compilation per program").

The experiment is one `attnflow.sweep` over the signal strengths: the trained ODEs of the three
activations, the Monte Carlo Bayes risk and the oracle configurations (their BFGS starts one
``vmap``) are one compiled program, and the checks after it run in NumPy. Before, a Python loop
over the signal strengths recompiled the oracle minimisations for every strength and start
(36 ``jit(minimise)``), the bank draws and the eager arithmetic, next to one sweep per
activation: 177 compilations at the defaults; now 12, of which all but the sweep are eager
array transfers (``jit(stage)``, one per output shape in the sweep's gathering) and conversions
in constructors.

The run takes about a minute on one core, nearly all of it compiling the sweep's program (three
ODE solves, 17-20 s each); that program is not kept in the persistent compilation cache, as the
solves carry host callbacks.
"""

import pytest

import attnflow.heads.experiments  # noqa: F401  (registers the experiments)
from attnflow.report import get_experiment

# small: two signal strengths (the swept axis has more than one value), a short horizon, a small
# bank and few Bayes samples; the programs compiled are the same as with the defaults
SMALL = {"signals": (1.0, 4.0), "t_end": 50.0, "bank": 128, "bayes_samples": 20_000}

# the experiment's own jitted programs: the sweep, and what was compiled on its own before it
# (the oracle minimisations, the bank draws, the core of solve); inside the sweep they are inlined
OWN_PROGRAMS = ("jit(batched)", "jit(minimise)", "jit(_draw_bank)", "jit(_solve)")

MAX_COMPILATIONS = 20  # 12 measured (jax 0.10.2), here and at the defaults; 177 before the experiment became one sweep


@pytest.mark.slow  # one full experiment; tests/test_once_qkov.py keeps the guard in the default run
def test_heads_activations_compiles_each_program_once():
    rep = get_experiment("heads-activations").run(SMALL, quiet=True)
    comp = rep.compilations
    repeated = comp["repeated"]
    assert not [name for name in OWN_PROGRAMS if name in repeated], repeated
    assert comp["count"] <= MAX_COMPILATIONS, comp
    # the checks pass at this size too (fixed seeds: the same numbers on every run)
    assert rep.passed, {k: v for k, v in rep.checks.items() if v[0] > v[1]}
