"""`python -m fedlight ...`: Ctrl-C while the heavy modules load ends with one line, not a traceback."""

import os
import signal
import sys


def stop_before_running(signum: int, frame: object) -> None:
    """Exit at once from the signal handler: raising KeyboardInterrupt into the import machinery is not safe.

    It can be swallowed by a library's import guard (a bare `except:`, so the run went on as if never interrupted),
    surface as another error (numpy's lazy attributes half-initialized: a RecursionError), or abort inside a C++
    extension's initializer. Nothing has run yet, so there is nothing to clean up; `os._exit` also skips the
    half-imported modules' exit handlers, which could take a second interrupt and die by it.
    """
    print("fedlight: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
    os._exit(130)


def run() -> int:
    """Ctrl-C exits at once until the command line has read its arguments (the config's classes load then: torch,
    Lightning); from there on a run handles it (one line, and how to continue)."""
    previous = signal.signal(signal.SIGINT, stop_before_running)
    from fedlight.run.cli import main

    return main(on_parsed=lambda: signal.signal(signal.SIGINT, previous))


if __name__ == "__main__":
    sys.exit(run())
