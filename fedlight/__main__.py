"""`python -m fedlight ...`: Ctrl-C while the heavy modules load ends with one line, not a traceback."""
import sys


def run() -> int:
    try:
        from fedlight.run.cli import main
    except KeyboardInterrupt:
        print("fedlight: interrupted while starting; nothing was run", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
