"""`AbstractSetup`: the base of every theory package's ``Setup``.

A ``Setup`` is an Equinox module holding one theory's data model, architecture and
per-circuit learning rates. It is validated on construction and traceable: every numeric
field is an array, so a field can be a `attnflow.sweep` axis and a new value never
compiles again. Choices that set shapes or code paths (sizes, parametrisations,
activations) are static fields.

Every theory package (`attnflow.deeplinear`, `attnflow.qkov`, `attnflow.focus`,
`attnflow.heads`) exposes the same four names at its top level:

- ``Setup``: a subclass of `AbstractSetup`; ``Setup()`` is the package's documented
  reference configuration;
- ``solve(setup, t1, *, save=None, solver=None, ...) -> Trajectory``: the theory;
- ``train(setup, t1, *, key=0, save=None, ...) -> Trajectory``: the finite-size network of
  the same setup, trained on the same clock (sizes, batch and seeds as options);
- ``OBSERVABLES``: ``{name: meaning}`` of what both record, so that
  ``attnflow.compare(P.solve(s, T), P.train(s, T, key=0))`` needs no glue.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import equinox as eqx

__all__ = ["AbstractSetup", "array_field"]

_S = TypeVar("_S", bound="AbstractSetup")


def array_field(name: str, default: Any, dtype: Any = None) -> Any:
    """A ``Setup`` field holding an array of reals (a number, a vector, ...): values are converted
    to JAX arrays of ``dtype`` (default: JAX's float) on construction, so they are data, never
    static; a value that is not an array of reals raises ``ValueError`` naming the field."""
    from . import _validate as V

    def convert(x: Any) -> Any:
        return V.floats(name, x, dtype)

    return eqx.field(converter=convert, default=default)


class AbstractSetup(eqx.Module):
    """Base of the theory packages' ``Setup`` classes (see the module documentation).

    Subclasses check their values in `validate` (called on construction and by `replace`;
    traced values are let through, they were checked where they were made).
    """

    def __check_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the offending value when a concrete field is invalid."""

    def replace(self: _S, **changes: Any) -> _S:
        """A copy with the named fields replaced, validated.

        Values may be traced (inside ``jit``, ``vmap`` or a `attnflow.sweep`), which is how
        a field becomes a sweep axis: ``sweep(lambda eta: P.solve(s.replace(eta=eta), T).final(),
        {"eta": etas})``. Python floats become arrays, so a new value reuses the compiled
        solve. Unknown names raise ``ValueError`` listing the fields.
        """
        from .ode import as_data

        fields = type(self).__dataclass_fields__
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {unknown}; fields: {sorted(fields)}")
        new = copy.copy(self)
        for name, value in changes.items():
            static = fields[name].metadata.get("static", False)
            object.__setattr__(new, name, value if static else as_data(value))
        new.validate()
        return new
