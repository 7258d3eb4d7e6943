"""What a run that fails after its first checkpoint says after its error: one line (a note on the exception, PEP
678, which Python prints after the traceback) naming what is kept and how to go on: `--resume` once the cause is
fixed, or a new run; a diverged round (`fedlight.engine.divergence.RoundDiverged`) only a new run, since a resume
would repeat it. A run that fails before its first checkpoint leaves no folder, as after Ctrl-C, and needs no line:
the same command starts it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedlight.engine.run_errors import RoundDiverged

NOTE = "fedlight: "  # the start of the line a failed run's error carries
FOLLOWER = "_fedlight_follower"  # set on an error raised in a process other than the first, which reports it


def failure_note(error: Exception, run_dir: Path, saved_round: int) -> str:
    """The line that follows the error of a run whose folder is kept: what is saved and how to go on."""
    saved = f"rounds 1-{saved_round} are saved" if saved_round else "no round is saved"
    if isinstance(error, RoundDiverged):
        kept = f" with the checkpoint of round {saved_round}, the last good one" if saved_round else ""
        return (
            f"{NOTE}the run stopped; {saved} in {run_dir}{kept}, and a resume would repeat round "
            f"{error.round}: start a new run with the fix"
        )
    return (
        f"{NOTE}{saved} in {run_dir}: once the cause is fixed, continue with: python -m fedlight fit --resume "
        f"{run_dir}; or start over with another --run_name"
    )


def add_note(error: BaseException, note: str) -> None:
    """`error.add_note(note)`, on Python 3.10 as well, which has no `add_note` (nor prints notes after a
    traceback): there the note is kept in `__notes__` for `notes` and the command line's report."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])


def notes(error: BaseException) -> list[str]:
    """The notes a failed run added to `error`, without their leading 'fedlight: ' (to join them to one line)."""
    return [note.removeprefix(NOTE) for note in getattr(error, "__notes__", [])]


def mark_follower(error: BaseException) -> None:
    """Mark `error` as raised in a process other than the first of a run: the first one reports the failure (each
    process of a diverged run raises the same error in the same round)."""
    setattr(error, FOLLOWER, True)


def from_follower(error: BaseException) -> bool:
    """Whether `error` was raised in a process other than the first (`mark_follower`)."""
    return getattr(error, FOLLOWER, False) is True
