"""Lanes: a batched function run as consecutive groups of points inside one compiled call.

Under ``jax.vmap`` a ``while`` loop (an adaptive ODE solve, a run to a threshold) becomes
one loop that steps until its *last* lane is done; lanes that finished keep computing
(their results are masked out) until then. A sweep of 256 learning rates of the Saxe mode
ODE, whose solves take 62 to 195 steps, runs all 256 lanes for 195 steps.

`vmap_lanes` ``(f, lanes)`` is ``jax.vmap(f)`` with the batch cut into groups of ``lanes``
consecutive points, run one group after another by ``lax.map`` inside the same compiled
program: each group's loop stops when *its own* slowest lane is done, so lanes that finish
early stop costing work as soon as their group does, with no call per group. Neighbouring
points of a grid take similar step counts (the step count is usually a smooth function of
the swept parameter), so consecutive groups waste little. Each lane computes exactly what
it computes under ``jax.vmap`` (tested to 1e-12 against a plain sweep).

Narrow groups also run differently on a CPU: XLA:CPU splits a large elementwise kernel over
its thread pool, and for small loop bodies the hand-off costs more than it saves (more so
on a loaded machine); a group of 16 or 32 lanes stays on one thread. On a GPU, where a
loop step costs a kernel launch whatever the width, keep the full width (``lanes=None``).
`attnflow.sweep` takes it as ``sweep(fn, axes, lanes=k)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["vmap_lanes", "check_lanes"]


def check_lanes(lanes: Any) -> int | None:
    """``lanes`` as a positive ``int`` (or ``None``: one group, plain ``vmap``); a named
    ``ValueError`` otherwise."""
    if lanes is None:
        return None
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1:
        raise ValueError(f"lanes must be a positive integer (points per vmapped group) or None, got {lanes!r:.60}")
    return int(lanes)


def vmap_lanes(f: Callable[[Any], Any], lanes: int | None = None) -> Callable[[Any], Any]:
    """``jax.vmap(f)`` over the leading axis of ``f``'s one (pytree) argument, run as
    consecutive groups of ``lanes`` points.

    The batch of ``n`` points is padded to a multiple of ``lanes`` by repeating its last
    point, cut into ``ceil(n / lanes)`` groups of consecutive points, and the groups run one
    after another through ``lax.map(jax.vmap(f))`` in the same trace (so inside one
    compiled call); the output has the leading axis ``n`` again. A ``while`` loop in ``f``
    (an adaptive solve) then stops in each group when that group's slowest lane is done,
    instead of when the slowest of all ``n`` is. ``lanes=None``, or ``lanes >= n``, is
    plain ``jax.vmap(f)``. The values are those of ``jax.vmap(f)``: every lane runs the same
    computation, only in a narrower batch.
    """
    lanes = check_lanes(lanes)
    batched = jax.vmap(f)
    if lanes is None:
        return batched

    def run(x: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(x)
        if not leaves:
            raise ValueError("vmap_lanes: the argument has no arrays to batch over")
        n = leaves[0].shape[0]
        if lanes >= n:
            return batched(x)
        groups = -(-n // lanes)
        if groups * lanes != n:  # pad by repeating the last point
            idx = np.minimum(np.arange(groups * lanes), n - 1)
            x = jax.tree_util.tree_map(lambda a: a[idx], x)
        xs = jax.tree_util.tree_map(lambda a: a.reshape((groups, lanes) + a.shape[1:]), x)
        out = jax.lax.map(batched, xs)
        return jax.tree_util.tree_map(lambda a: a.reshape((groups * lanes,) + a.shape[2:])[:n], out)

    return run
