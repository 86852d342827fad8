"""Counting XLA compilations: `count_compilations`.

A compiled function is reused only while its static arguments and shapes stay the same;
a new Python float, a new lambda or a new shape compiles again. To check that a loop or a
sweep compiles once, count:

```python
with af.count_compilations() as c:
    ...
print(c.n, c.seconds)
```

The count listens to JAX's own monitoring events (``jax.monitoring``): one event per XLA
backend compilation, with its duration. The listener is registered on entering the
block and removed on leaving it; nothing else changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from jax import monitoring

__all__ = ["count_compilations", "CompileCount"]

_EVENT = "/jax/core/compile/backend_compile_duration"
_LOCK = threading.Lock()


@dataclass
class CompileCount:
    """XLA compilations seen inside a `count_compilations` block: ``n`` and their total
    ``seconds`` (backend compilation only, without tracing and lowering), and ``by_name``, how
    many times each program (named after its jitted function, or the primitive of an eager
    operation) was compiled."""

    n: int = 0
    seconds: float = 0.0
    by_name: Counter[str] = field(default_factory=Counter)

    def repeated(self, min_count: int = 2) -> dict[str, int]:
        """Programs compiled at least ``min_count`` times: the same function traced again for a new
        static value or shape (a Python loop that could be a sweep), or distinct programs sharing
        a name."""
        return {name: k for name, k in sorted(self.by_name.items()) if k >= min_count}


@contextlib.contextmanager
def count_compilations() -> Iterator[CompileCount]:
    """Context manager yielding a `CompileCount` that counts the XLA compilations (of any
    function, in any thread) made while the block runs."""
    count = CompileCount()

    def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == _EVENT:
            with _LOCK:
                count.n += 1
                count.seconds += float(duration_secs)
                count.by_name[str(kwargs.get("fun_name", "?"))] += 1

    monitoring.register_event_duration_secs_listener(listen)
    try:
        yield count
    finally:
        monitoring.unregister_event_duration_listener(listen)
