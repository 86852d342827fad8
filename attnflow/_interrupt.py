"""Interrupts that Python would lose: a Ctrl-C (or SIGTERM) raised inside a callback whose
exceptions Python ignores is sent again, for the command line and for long library calls."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "redelivering_hook", "redeliver_swallowed_interrupts"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: staging folders removed, finished sweep chunks kept."""


def redelivering_hook(previous: Any, stopping: threading.Event) -> Any:
    """A ``sys.unraisablehook`` that sends a swallowed Ctrl-C or SIGTERM again.

    Python runs a signal's handler in whatever Python code the main thread is in. When that is a
    callback whose exceptions Python ignores (JAX's garbage-collection callback, a ``__del__``),
    the ``KeyboardInterrupt`` is printed as "Exception ignored" and the run goes on as if no
    signal had come. The hook sends the signal again from a short-lived thread, so the handler
    runs anew once the callback has returned (the hook itself must return cleanly: an exception
    raised inside it is swallowed too). Nothing is sent once ``stopping`` is set (the interrupt
    was caught and its clean-up must run to its end, or the call that installed the hook is over).
    """

    def hook(unraisable: Any) -> None:
        stop = unraisable.exc_value
        if not isinstance(stop, KeyboardInterrupt):
            previous(unraisable)
            return
        if stopping.is_set():
            return
        signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT

        def send_again() -> None:
            if not stopping.is_set():
                os.kill(os.getpid(), signum)

        threading.Timer(0.05, send_again).start()

    hook.attnflow_redelivers = True  # type: ignore[attr-defined]
    return hook


@contextlib.contextmanager
def redeliver_swallowed_interrupts() -> Iterator[None]:
    """While inside (in the main thread), a swallowed Ctrl-C is sent again (`redelivering_hook`),
    unless a hook of ours is already installed (the command line's)."""
    if threading.current_thread() is not threading.main_thread() or getattr(
        sys.unraisablehook, "attnflow_redelivers", False
    ):
        yield
        return
    stopping = threading.Event()
    previous = sys.unraisablehook
    sys.unraisablehook = redelivering_hook(previous, stopping)
    try:
        yield
    finally:
        stopping.set()
        sys.unraisablehook = previous
