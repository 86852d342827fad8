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

__all__ = ["per_circuit", "label_by_path", "weighted_balance"]


def label_by_path(
    model: Any, rule: Callable[[str], str] | Mapping[str, str], filter_spec: Any = eqx.is_inexact_array
) -> Any:
    """Label every trainable leaf of ``model`` by circuit.

    ``rule`` maps a leaf's path string (``jax.tree_util.keystr``, e.g. ``".W_QK"``) to a
    label; a mapping ``{substring: label}`` gives the label of the substrings found in the path
    (``ValueError`` when none is found, or when several are found with different labels).
    Returns a pytree of labels with the structure of ``eqx.filter(model, filter_spec)``.
    """
    params, _ = eqx.partition(model, filter_spec)
    if isinstance(rule, Mapping):
        table = dict(rule)

        def rule(path: str) -> str:
            hits = [(key, label) for key, label in table.items() if key in path]
            if not hits:
                raise ValueError(f"parameter {path!r} matches none of the circuit keys {sorted(table)}")
            if len({label for _, label in hits}) > 1:
                # the first key would win by the order of a dict: a silent mislabel
                raise ValueError(
                    f"parameter {path!r} matches the circuit keys {[k for k, _ in hits]} with different labels "
                    f"{[lab for _, lab in hits]}: make the keys unambiguous (e.g. '.{hits[-1][0]}') or give a "
                    "function path -> label"
                )
            return hits[0][1]

    return jax.tree_util.tree_map_with_path(lambda p, _: rule(jax.tree_util.keystr(p)), params)


def per_circuit(
    labels: Any,
    rates: Mapping[str, Any],
    base: Callable[..., optax.GradientTransformation] = optax.sgd,
    *,
    allow_unused: bool = False,
    **base_kwargs: Any,
) -> optax.GradientTransformation:
    """One optimizer per circuit label, each with its own (array) learning rate.

    Parameters
    ----------
    labels:
        Pytree of labels matching the trainable parameters (see `label_by_path`), or a
        function params -> labels.
    rates:
        ``{label: learning rate}``; numbers or 0-d arrays, possibly traced (vmap over rates),
        Optax schedules ``step -> rate``, or ``None``: that circuit is frozen (its updates
        are zero, ``optax.set_to_zero``). An array of more dimensions is a rate per entry: it
        has the axes of every parameter of its circuit, each of size 1 or the parameter's
        (shape ``(K, 1)``: one rate per row of a ``(K, D)`` weight); otherwise ``ValueError``
        names the circuit and both shapes when the optimizer is initialised.
    base:
        Optax optimizer constructor taking ``learning_rate`` (default ``optax.sgd``).
    allow_unused:
        ``False`` (default): a rate for a circuit that no parameter has (a typo) is an error.
        ``True`` for a rule shared by models of which some lack a circuit.
    """
    if not rates:
        raise ValueError("rates must name at least one circuit")
    for name, lr in rates.items():
        if lr is not None and not callable(lr):
            V.positive(f"learning rate for circuit {name!r}", lr)
    is_fn = callable(labels) and not isinstance(labels, eqx.Module)
    if not is_fn:
        used = set(jax.tree_util.tree_leaves(labels))
        missing = used - set(rates)
        if missing:
            raise ValueError(f"no learning rate given for circuit(s) {sorted(missing)}; rates has {sorted(rates)}")
        unknown = set(rates) - used
        if unknown and not allow_unused:
            raise ValueError(f"rates names circuit(s) {sorted(unknown)} that no parameter has; labels: {sorted(used)}")
    transforms = {
        name: optax.set_to_zero()
        if lr is None
        else _entrywise(
            name,
            jnp.shape(lr) if not callable(lr) else (),
            optax.inject_hyperparams(base)(learning_rate=lr if callable(lr) else jnp.asarray(lr), **base_kwargs),
        )
        for name, lr in rates.items()
    }
    # A labels *tree* may itself be callable (an Equinox module with __call__): hand optax a
    # function so it never mistakes the tree for one.
    return optax.partition(transforms, labels if is_fn else (lambda _params: labels))


def _entrywise(name: str, shape: tuple[int, ...], inner: optax.GradientTransformation) -> Any:
    """``inner`` whose ``init`` refuses parameters that a rate of ``shape`` is not a rate per entry
    of: a (4,) rate on a (2, 4) weight would otherwise scale its columns silently, a (2,) one fail
    inside the trace with a bare broadcasting error."""
    if shape == ():
        return inner

    def init(params: Any) -> Any:
        # the params of this circuit (optax.partition masks the others out)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            leaf_shape = tuple(jnp.shape(leaf))
            # as many axes as the parameter, not NumPy's trailing broadcast: a (4,) rate would
            # silently scale the columns of a (2, 4) weight where one rate was meant
            fits = len(shape) == len(leaf_shape) and all(r in (1, p) for r, p in zip(shape, leaf_shape, strict=True))
            if not fits:
                raise ValueError(
                    f"learning rate for circuit {name!r} has shape {shape}: an array rate is a rate per entry, with "
                    f"the axes of each parameter of the circuit, each of size 1 or the parameter's, but "
                    f"{jax.tree_util.keystr(path)} has shape {leaf_shape} (give a number, or a 0-d array, for one "
                    "rate)"
                )
        return inner.init(params)

    return inner._replace(init=init)


def weighted_balance(A: Any, B: Any, ratio: Any) -> tuple[jax.Array, jax.Array]:
    """Balanced factors ``A^T A = B B^T`` of a product ``W = A B`` made weighted-balanced for
    factor learning rates ``eta_A / eta_B = ratio``: ``(A ratio^(1/4), B ratio^(-1/4))``, so that
    ``A^T A / eta_A = B B^T / eta_B``, the quantity gradient flow conserves, and the product
    moves as under one rate ``sqrt(eta_A eta_B)`` (Saxe et al. 2014; Vashisht and Ramaswamy
    eq. (8)). ``ratio`` may be traced; a concrete one must be finite and positive (``ValueError``
    naming it: ``ratio^(1/4)`` of a negative ratio is NaN)."""
    V.positive("ratio (eta_A / eta_B)", ratio)
    A, B = jnp.asarray(A), jnp.asarray(B)
    w = jnp.asarray(ratio, A.dtype) ** 0.25
    return A * w, B / w
