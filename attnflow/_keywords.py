"""Unknown keyword arguments of the theory packages' verbs, answered with where the package has
the thing asked for.

The packages share their verbs (`solve`, `train`) but not every keyword: a model trained by
online SGD at dimension ``D`` has no ``dt``, and a minibatch that enters the theory's
``eta^2`` term is a field of its ``Setup``. A keyword taken from another package then gets,
instead of Python's bare "unexpected keyword argument", the way this package does it, a
close spelling, and the keywords it takes.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["keyword_hints"]

F = TypeVar("F", bound=Callable[..., Any])


def keyword_hints(where: str, **hints: str) -> Callable[[F], F]:
    """Decorate the verb ``where`` (``"heads.train"``): a call with a keyword it does not take
    raises ``TypeError`` naming it, with ``hints[keyword]`` (where this package has it) when
    given, else the closest keywords it takes, and the list of them. Checked before the call,
    so nothing is computed; the signature is the function's own (``functools.wraps``)."""

    def decorate(fn: F) -> F:
        names = tuple(inspect.signature(fn).parameters)
        taken = frozenset(names)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for key in kwargs:
                if key not in taken:
                    raise TypeError(unknown_keyword(where, key, names, hints.get(key)))
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return decorate


def unknown_keyword(where: str, key: str, names: tuple[str, ...], hint: str | None = None) -> str:
    """The message for keyword ``key`` that ``where`` does not take (keywords ``names``)."""
    if hint is None:
        close = difflib.get_close_matches(key, names, n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    hint = f" {hint}" if hint else ""
    return f"{where}() got an unexpected keyword argument {key!r}:{hint} ({where} takes: {', '.join(names)})"
