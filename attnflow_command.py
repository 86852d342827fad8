"""The ``attnflow`` command's entry point (a module outside the package, so that it runs before
anything imports Equinox).

It sets Equinox's run-time check mode, ``EQX_ON_ERROR``, to ``nan`` unless it is already set,
then runs `attnflow.cli.main`. In that mode the checks Diffrax compiles into every solve (save
times increasing and inside ``[t0, t1]``; attnflow has already checked them before compiling)
need no host callback, and a program without host callbacks is one JAX's persistent
compilation cache can store: a second ``attnflow reproduce`` loads its solves from disk
instead of compiling them. attnflow's own failure checks raise in either mode, and attnflow
checks every solve's result itself.
"""

import os


def main() -> int:
    os.environ.setdefault("EQX_ON_ERROR", "nan")
    from attnflow.cli import main as run

    return run()
