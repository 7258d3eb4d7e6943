"""SIGTERM, which SLURM and most schedulers send before they kill a job, stops a run as Ctrl-C does: the last
checkpoint is kept, one line names the command that continues the run, and the exit code is SIGTERM's usual 143
(Ctrl-C's is 130).

One process abandons the round in progress at once, as Ctrl-C does (`Terminated` is a `KeyboardInterrupt`, so
every place that handles Ctrl-C handles it). Several processes cannot each stop where the signal finds them (one
would wait forever in a collective for another that left), so while their rounds run (`deferred`) SIGTERM is only
noted, and after each round the processes ask each other (`requested_anywhere`): if any was signalled, all of them
stop after that round and its checkpoint, whether the scheduler signalled every process or one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

INTERRUPTED_EXIT, TERMINATED_EXIT = 130, 143  # 128 + SIGINT, 128 + SIGTERM: what a shell reports for either


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled wherever Ctrl-C is, told apart where the message and the exit code differ."""


class _State:
    """This process's SIGTERM: whether it arrived (`requested`), and whether it is only noted (`defer`)."""

    requested = False
    defer = False


def _on_sigterm(signum: int, frame: Any) -> None:
    _State.requested = True
    if not _State.defer:
        raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises `Terminated` (or is noted, within `deferred`); the handler before is restored after.
    Only the main thread may handle signals: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _State.requested = False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, SIGTERM is only noted (`requested_anywhere` tells the processes); one that came before is kept."""
    before, _State.defer = _State.defer, True
    try:
        yield
    finally:
        _State.defer = before


def requested_anywhere(collective: Any) -> bool:
    """Whether any of the processes of `collective` (`fedlight.engine.processes.Collective`) received SIGTERM: the
    same answer on every process, so all of them stop after the same round."""
    return any(collective.gather_objects(_State.requested))


def terminated(stop: BaseException) -> bool:
    """Whether `stop` (an interrupt, or `RunInterrupted`, which says so) came from SIGTERM rather than Ctrl-C."""
    return isinstance(stop, Terminated) or getattr(stop, "terminated", False) is True


def same_interrupt(stop: BaseException) -> KeyboardInterrupt:
    """A fresh interrupt of the kind of `stop` (to raise on after handling it: a tuning trial queued again)."""
    return Terminated() if terminated(stop) else KeyboardInterrupt()


def exit_code(stop: BaseException) -> int:
    """143 for SIGTERM, 130 for Ctrl-C."""
    return TERMINATED_EXIT if terminated(stop) else INTERRUPTED_EXIT
