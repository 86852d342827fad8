"""The ``attnflow`` command's entry point (a module outside the package, so that it runs before
anything imports Equinox).

It sets Equinox's run-time check mode, ``EQX_ON_ERROR``, to ``nan`` unless it is already set,
then runs `attnflow.cli.main`. In that mode the checks Diffrax compiles into every solve (save
times increasing and inside ``[t0, t1]``; attnflow has already checked them before compiling)
need no host callback, and a program without host callbacks is one JAX's persistent
compilation cache can store: a second ``attnflow reproduce`` loads its solves from disk
instead of compiling them. attnflow's own failure checks raise in either mode, and attnflow
checks every solve's result itself.

Ctrl-C and SIGTERM are handled from the first line: importing the package (JAX, XLA) takes a
second or two, and a ``KeyboardInterrupt`` raised in there is either swallowed by a callback
whose exceptions Python ignores (JAX's garbage-collection callback: the run goes on) or ends
the process with a traceback. Until `attnflow.cli.main` takes the signals over, nothing has
been written, so the signal ends the process at once with the command's one line and its
exit status (130, 143).
"""

import contextlib
import os
import signal
import sys


def _exit_at_once(signum: int, frame: object) -> None:
    """Before `attnflow.cli.main` handles them: the command's line for Ctrl-C or SIGTERM, then exit."""
    what, code = ("terminated (SIGTERM)", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    # os.write, not print: the signal may have come while the main thread was writing to stderr
    os.write(2, f"attnflow: {what}; --out is unchanged\n".encode())
    os._exit(code)


_exit_at_once.attnflow_early_exit = True  # type: ignore[attr-defined]  # cli.main replaces this handler


def main() -> int:
    """The ``attnflow`` console script: Ctrl-C and SIGTERM handled from here on, ``EQX_ON_ERROR``
    set, then `attnflow.cli.main` on ``sys.argv``; returns its exit status."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # a background job (`&`) keeps ignoring SIGINT
            signal.signal(signum, _exit_at_once)
    os.environ.setdefault("EQX_ON_ERROR", "nan")
    from attnflow.cli import main as run

    code = run()

    def finished(signum: int, frame: object) -> None:
        # the command's work is done (and said): a signal now only cuts interpreter shut-down short
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, finished)
    return code
