"""Per-circuit learning rates.

Parameters are labelled by circuit (``"qk"``, ``"ov"``, ...) and each label gets its own
optimizer whose learning rate is an array held in the optimizer state
(``optax.inject_hyperparams``). Because the rates are data, not constants baked into a
trace, a ``vmap`` over learning-rate ratios compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from . import _validate as V

__all__ = ["per_circuit", "label_by_path", "learning_rates", "linear_ramp"]


def label_by_path(model: Any, rule: Callable[[str], str] | Mapping[str, str], filter_spec: Any = eqx.is_inexact_array) -> Any:
    """Label every trainable leaf of ``model`` by circuit.

    ``rule`` maps a leaf's path string (``jax.tree_util.keystr``, e.g. ``".W_QK"``) to a
    label; a mapping ``{substring: label}`` picks the first substring found in the path.
    Returns a pytree of labels with the structure of ``eqx.filter(model, filter_spec)``.
    """
    params, _ = eqx.partition(model, filter_spec)
    if isinstance(rule, Mapping):
        table = dict(rule)

        def rule(path: str) -> str:  # noqa: F811 - the mapping becomes a function
            for key, label in table.items():
                if key in path:
                    return label
            raise ValueError(f"parameter {path!r} matches none of the circuit keys {sorted(table)}")

    return jax.tree_util.tree_map_with_path(lambda p, _: rule(jax.tree_util.keystr(p)), params)


def per_circuit(
    labels: Any,
    rates: Mapping[str, Any],
    base: Callable[..., optax.GradientTransformation] = optax.sgd,
    **base_kwargs: Any,
) -> optax.GradientTransformation:
    """One optimizer per circuit label, each with its own (array) learning rate.

    Parameters
    ----------
    labels:
        Pytree of labels matching the trainable parameters (see `label_by_path`), or a
        function params -> labels.
    rates:
        ``{label: learning rate}``; scalars or 0-d arrays, possibly traced (vmap over rates),
        or Optax schedules ``step -> rate`` (e.g. `linear_ramp`).
    base:
        Optax optimizer constructor taking ``learning_rate`` (default ``optax.sgd``).
    """
    if not rates:
        raise ValueError("rates must name at least one circuit")
    for name, lr in rates.items():
        if not callable(lr):
            V.positive(f"learning rate for circuit {name!r}", lr)
    is_fn = callable(labels) and not isinstance(labels, eqx.Module)
    if not is_fn:
        used = set(jax.tree_util.tree_leaves(labels))
        missing = used - set(rates)
        if missing:
            raise ValueError(f"no learning rate given for circuit(s) {sorted(missing)}; rates has {sorted(rates)}")
    transforms = {
        name: optax.inject_hyperparams(base)(learning_rate=lr if callable(lr) else jnp.asarray(lr), **base_kwargs)
        for name, lr in rates.items()
    }
    # A labels *tree* may itself be callable (an Equinox module with __call__): hand optax a
    # function so it never mistakes the tree for one.
    return optax.partition(transforms, labels if is_fn else (lambda _params: labels))


def linear_ramp(base: Any, factor: Any, total_steps: int) -> optax.Schedule:
    """``base * (1 + (factor - 1) step / total_steps)``: the QK ramp of the QK/OV paper
    (spec `qkov.md` section 4); ``base`` and ``factor`` may be traced."""
    V.positive("base learning rate", base)
    V.positive("ramp factor", factor)
    total = V.positive_int("total_steps", total_steps)
    return lambda step: jnp.asarray(base) * (1.0 + (jnp.asarray(factor) - 1.0) * step / total)


def learning_rates(opt_state: Any) -> dict[str, jax.Array]:
    """Read the current per-circuit learning rates back from a `per_circuit` state."""
    out = {}
    for name, inner in opt_state.inner_states.items():
        out[name] = inner.inner_state.hyperparams["learning_rate"]
    return out
