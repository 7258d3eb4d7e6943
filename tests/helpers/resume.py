"""Crashed and resumed runs through the command line, and the metrics.csv rows to compare them by."""

from __future__ import annotations

import csv


def rows(path, drop=("time/round_s",)):
    with path.open() as f:
        return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]


def crash_and_resume(
    args: list[str], run_dir, monkeypatch, crash_round: int = 3, after_the_work: bool = False, before_resuming=None
) -> None:
    """Run `args` as run folder `run_dir` (its --output_dir) with a crash (Ctrl-C) in `crash_round`, then resume it
    to the end; the rounds before the crash must be saved. The crash comes as the round starts, or with
    `after_the_work` once the round's work is done (its client state written) but before anything records it;
    `before_resuming(run_dir)` may then change the folder (remove a checkpoint)."""
    from fedlight.engine.federation import Federation
    from fedlight.run.cli import main

    real_run_round = Federation.run_round

    def crash(self, round):
        if round == crash_round and not after_the_work:
            raise KeyboardInterrupt("killed")
        result = real_run_round(self, round)
        if round == crash_round:
            raise KeyboardInterrupt("killed")
        return result

    monkeypatch.setattr(Federation, "run_round", crash)
    assert main(args + ["--run_name", run_dir.name]) == 130
    monkeypatch.setattr(Federation, "run_round", real_run_round)
    assert (run_dir / "metrics.csv").read_text().count("\n") == crash_round  # the header and the saved rounds
    if before_resuming is not None:
        before_resuming(run_dir)
    assert main(args + ["--run_name", run_dir.name, "--resume", str(run_dir)]) == 0


def resumed_and_whole(args: list[str], run_root, monkeypatch, crash_round: int = 3) -> tuple[list, list]:
    """The metrics.csv rows of `args` run whole (run folder "whole") and crashed in `crash_round`, then resumed
    ("crashed"), both under `run_root` (the --output_dir in `args`): equal when resuming loses nothing."""
    from fedlight.run.cli import main

    assert main(args + ["--run_name", "whole"]) == 0
    crash_and_resume(args, run_root / "crashed", monkeypatch, crash_round=crash_round)
    return rows(run_root / "crashed" / "metrics.csv"), rows(run_root / "whole" / "metrics.csv")
