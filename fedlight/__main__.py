"""`python -m fedlight ...`: Ctrl-C while the heavy modules load ends with one line, not a traceback."""
import os
import sys


def run() -> int:
    try:
        from fedlight.run.cli import main
    except KeyboardInterrupt:
        print("fedlight: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
        os._exit(130)  # at once: the half-imported modules' exit handlers could take a second interrupt and die by it
    return main()


if __name__ == "__main__":
    sys.exit(run())
