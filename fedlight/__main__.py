"""`python -m fedlight ...`: Ctrl-C while the heavy modules load ends with one line, not a traceback."""
import os
import signal
import sys


def run() -> int:
    interrupted: list[int] = []

    def on_interrupt(signum: int, frame: object) -> None:  # Python's own handler, remembering that it ran
        interrupted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        from fedlight.run.cli import main
    except BaseException:
        # the interrupt can land inside a module's import machinery and surface as another error (numpy's lazy
        # attributes half-initialized: a RecursionError): whatever it became, Ctrl-C was the cause
        if not interrupted:
            raise
        print("fedlight: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
        os._exit(130)  # at once: the half-imported modules' exit handlers could take a second interrupt and die by it
    signal.signal(signal.SIGINT, previous)
    return main()


if __name__ == "__main__":
    sys.exit(run())
