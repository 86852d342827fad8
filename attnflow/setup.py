"""`AbstractSetup`: the base of every theory package's ``Setup``.

A ``Setup`` is an Equinox module holding one theory's data model, architecture and
per-circuit learning rates. It is validated on construction and traceable: every numeric
field is an array, so a field can be a `attnflow.sweep` axis and a new value never
compiles again. Choices that set shapes or code paths (sizes, parametrisations,
activations) are static fields.

Every theory package (`attnflow.deeplinear`, `attnflow.qkov`, `attnflow.focus`,
`attnflow.heads`, `attnflow.derive`) exposes the same four names at its top level:

- ``Setup``: a subclass of `AbstractSetup`; ``Setup()`` is the package's documented
  reference configuration (``derive.Setup`` takes the user's model, so it has none), and
  ``Setup.initial_state()`` is where ``solve`` starts;
- ``solve(setup, t1, *, save=None, solver=None, ...) -> Trajectory``: the theory;
- ``train(setup, t1, *, key=0, save=None, ...) -> Trajectory``: the finite-size network of
  the same setup, trained on the same clock (sizes, batch and seeds as options);
- ``OBSERVABLES``: ``{name: meaning}`` of what both record, so that
  ``attnflow.compare(P.solve(s, T), P.train(s, T, key=0))`` needs no glue.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from typing import Any, TypeVar

import equinox as eqx
import jax
import numpy as np

__all__ = ["RECORD_MAX_SIZE", "AbstractSetup", "array_field"]

RECORD_MAX_SIZE = 64
"""The largest array `AbstractSetup.record` writes out entry by entry."""


def _pformat(x: Any, indent: int = 0, width: int = 100) -> str:
    """A record (`AbstractSetup.record`) as ``Type(field=value, ...)``, one line when it fits."""
    if not (isinstance(x, dict) and "type" in x):
        return x if x == "traced" else repr(x)
    items = [(k, v) for k, v in x.items() if k != "type"]
    one = f"{x['type']}({', '.join(f'{k}={_pformat(v)}' for k, v in items)})"
    if len(one) + indent <= width or not items:
        return one
    pad = " " * (indent + 2)
    body = ",\n".join(f"{pad}{k}={_pformat(v, indent + 2, width)}" for k, v in items)
    return f"{x['type']}(\n{body}\n{' ' * indent})"


def _record(x: Any) -> Any:
    """`AbstractSetup.record` of one value."""
    if isinstance(x, jax.core.Tracer):
        return "traced"
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.size <= RECORD_MAX_SIZE:
            return arr.tolist()
        return f"{arr.dtype.kind}{8 * arr.dtype.itemsize}{list(arr.shape)}"
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)):
        return [_record(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _record(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = {f.name: _record(getattr(x, f.name)) for f in dataclasses.fields(x) if not f.name.startswith("_")}
        return {"type": type(x).__name__, **fields}
    if callable(x):
        return getattr(x, "__qualname__", None) or type(x).__qualname__
    return re.sub(r" at 0x[0-9a-f]+", "", repr(x))  # no memory addresses: a record is data


_S = TypeVar("_S", bound="AbstractSetup")

_BY_SHAPE = re.compile(r"^[a-z]\d+\[[\d, ]*\]$")


def _namespace(cls: type) -> list[Any]:
    """Where the names of a record are looked up: the package of ``cls``, then `attnflow`."""
    import importlib

    package = cls.__module__.rsplit(".", 1)[0]
    return [importlib.import_module(package), importlib.import_module("attnflow")]


def _lookup(name: str, spaces: list[Any]) -> Any:
    for space in spaces:
        if hasattr(space, name):
            return getattr(space, name)
    return None


def _rebuild(x: Any, spaces: list[Any], where: str, cls: type | None = None) -> Any:
    """The value a `_record` entry stands for (`AbstractSetup.from_record`)."""
    import types

    if isinstance(x, dict) and "type" in x:
        klass = cls if cls is not None else _lookup(str(x["type"]), spaces)
        if not isinstance(klass, type):
            raise ValueError(f"{where}: the record's type {x['type']!r} is not a class of {spaces[0].__name__}")
        names = [k for k in x if k != "type"]
        known = {f.name for f in dataclasses.fields(klass)} if dataclasses.is_dataclass(klass) else set(names)
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(f"{where}: {klass.__name__} has no field {unknown} (a record of another class?)")
        fields = {k: _rebuild(x[k], spaces, f"{where}.{k}") for k in names}
        params = inspect.signature(klass).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            # fields an __init__ computes (a prior's `symmetric`) are recorded but not passed back
            fields = {k: v for k, v in fields.items() if k in params}
        try:
            return klass(**fields)
        except TypeError as err:
            raise ValueError(f"{where}: {klass.__name__} cannot be rebuilt from its record ({err})") from None
    if isinstance(x, dict):
        return {k: _rebuild(v, spaces, f"{where}.{k}") for k, v in x.items()}
    if isinstance(x, list):
        out = [_rebuild(v, spaces, f"{where}[{i}]") for i, v in enumerate(x)]
        return np.asarray(out) if all(isinstance(v, (int, float, list, np.ndarray)) for v in out) else out
    if isinstance(x, str) and x == "traced":
        raise ValueError(f"{where} was traced (inside a sweep) when it was recorded: its value is not in the record")
    if isinstance(x, str) and _BY_SHAPE.match(x):
        raise ValueError(
            f"{where} was recorded by its shape only ({x}: more than RECORD_MAX_SIZE = {RECORD_MAX_SIZE} "
            "entries); give it in the record"
        )
    if isinstance(x, str) and isinstance(_lookup(x, spaces), types.FunctionType):
        return _lookup(x, spaces)  # a function recorded by its name
    return x


def array_field(name: str, default: Any, dtype: Any = None) -> Any:
    """A ``Setup`` field holding an array of reals (a number, a vector, ...): values are converted
    to JAX arrays of ``dtype`` (default: JAX's float) on construction and by
    `AbstractSetup.replace`, so they are data, never static; a value that is not an array of reals
    (a string, ``None``, a ragged list, a boolean, a complex number) raises ``ValueError`` naming
    the field."""
    from . import _validate as V

    def convert(x: Any) -> Any:
        return V.floats(name, x, dtype)

    return eqx.field(converter=convert, default=default)


def size_field(name: str, default: Any, minimum: int = 1) -> Any:
    """A static ``Setup`` field holding a size or a seed: values are converted to a Python int
    on construction and by `AbstractSetup.replace` (`attnflow._validate.positive_int`: a NumPy
    integer such as ``np.int64(3)`` or a whole float becomes ``3``; a boolean, an array, a traced
    value or an int below ``minimum`` raises ``ValueError`` naming the field). Converted before
    Equinox stores it, since a static field is part of the compiled program's key, where a NumPy
    scalar makes Equinox warn that an array is set as static."""
    from . import _validate as V

    def convert(x: Any) -> int:
        return V.positive_int(name, x, minimum=minimum)

    return eqx.field(static=True, converter=convert, default=default)


class AbstractSetup(eqx.Module):
    """Base of the theory packages' ``Setup`` classes (see the module documentation).

    Subclasses check their values in `validate` (called on construction and by `replace`;
    traced values are let through, they were checked where they were made).
    """

    def __check_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the offending value when a concrete field is invalid."""

    def __repr__(self) -> str:
        # numbers as numbers (eta=0.7, not eta=f64[]), static fields too: a setup printed or
        # logged says what it is
        return _pformat(self.record())

    def record(self) -> dict[str, Any]:
        """The setup as JSON-ready data: every field by name, numbers as numbers (arrays of up to
        `RECORD_MAX_SIZE` entries as nested lists, larger ones as ``"f64[27, 27]"``), nested
        modules (priors, chains, activations) as dicts with their ``"type"``, functions by name,
        traced values (inside a sweep) as ``"traced"``. ``traj.with_meta(setup=s.record())``
        before ``traj.save(...)`` keeps in a saved trajectory what it was run on (the verbs do
        not add it themselves: metadata is static pytree data, and results of different setups
        must stack, branch and resume as one structure)."""
        out = _record(self)
        assert isinstance(out, dict)
        return out

    @classmethod
    def from_record(cls: type[_S], record: dict[str, Any]) -> _S:
        """The setup a `record` describes: ``P.Setup.from_record(traj.meta["setup"])`` after
        ``traj.with_meta(setup=s.record()).save(...)`` and `attnflow.Trajectory.load`, or from a
        ``summary.json``. Nested modules are rebuilt from their ``"type"`` (a name of the
        package, e.g. ``MarkovChain``, ``FlippedSpike``, or of `attnflow`), functions from their
        name in the package (``soft_committee``; a function of your own: see below), lists as
        arrays.

        ``ValueError`` names what a record cannot give back: an array written by shape only
        (more than `RECORD_MAX_SIZE` entries), a value traced inside a sweep, a type or a
        function the package does not define (``P.Setup.from_record({**rec, "student": f})``
        takes your own objects in place of their names; do so too for a function of your own that
        shares a package function's name, which the name alone would resolve to the package's)."""
        if not isinstance(record, dict):
            raise ValueError(f"from_record needs the dict of Setup.record(), got {record!r:.80}")
        if record.get("type", cls.__name__) != cls.__name__:
            raise ValueError(f"the record is of a {record.get('type')!r}, not of {cls.__module__}.{cls.__name__}")
        return _rebuild(dict(record, type=cls.__name__), _namespace(cls), "setup", cls)

    def replace(self: _S, **changes: Any) -> _S:
        """A copy with the named fields replaced, converted and validated as ``Setup(...)``
        converts and validates them: a new value goes through its field's converter (an
        `array_field` makes numbers and lists arrays of its dtype, so ``replace(eta=2)`` equals
        ``Setup(eta=2)`` in type and dtype, and a new value reuses the compiled solve; booleans,
        complex numbers and strings raise ``ValueError`` naming the field; a data field without
        a converter gets its floats as arrays), then `validate` runs.

        Values may be traced (inside ``jit``, ``vmap`` or a `attnflow.sweep`), which is how
        a field becomes a sweep axis: ``sweep(lambda eta: P.solve(s.replace(eta=eta), T).final(),
        {"eta": etas})``. Unknown names raise ``ValueError`` listing the fields.
        """
        fields = type(self).__dataclass_fields__
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {unknown}; fields: {sorted(fields)}")
        from .ode import as_data

        new = copy.copy(self)
        for name, value in changes.items():
            # the converter equinox applies after __init__; a data field without one (a plain
            # ``lr: float`` of a user's subclass) still gets its floats as arrays, or a new value
            # would be a static leaf of the compiled solve and compile again
            meta = fields[name].metadata
            converter = meta.get("converter")
            if converter is not None:
                value = converter(value)
            elif not meta.get("static", False):
                value = as_data(value)
            object.__setattr__(new, name, value)
        for klass in type(new).__mro__:  # every __check_init__, as equinox runs them on construction
            check = klass.__dict__.get("__check_init__")
            if check is not None:
                check(new)
        return new
