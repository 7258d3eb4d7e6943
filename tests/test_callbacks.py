"""Run callbacks: a user's own by class path sees every round as metrics.csv records it, EarlyStopping stops where a
hand computation over an uninterrupted run says it must, and its state survives a resume."""
from __future__ import annotations

import csv
import json

from fedlight.run.cli import main

CALLBACK = '''
from fedlight import Callback

CALLS = []


class Recording(Callback):
    def __init__(self, tag: str = "x") -> None:
        self.tag = tag

    def on_fit_start(self, run):
        CALLS.append(("start", run.name, run.federation.round))

    def on_round_end(self, run, result):
        CALLS.append(("round", result.round, dict(result.scalars)))

    def on_fit_end(self, run, summary):
        CALLS.append(("end", summary["rounds"]))
'''


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def early_stopping(monitor: str, mode: str, patience: int) -> list[str]:
    return ["--callbacks+=fedlight.EarlyStopping", f"--callbacks.monitor={monitor}", f"--callbacks.mode={mode}",
            f"--callbacks.patience={patience}"]


def test_a_callback_by_class_path_sees_every_round_as_metrics_csv_records_it(tmp_path, tiny_run_args, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(tiny_run_args + ["--run_name", "run", "--callbacks+=my_callbacks.Recording",
                                 "--callbacks.tag=y"]) == 0
    import my_callbacks

    calls = my_callbacks.CALLS
    assert calls[0] == ("start", "run", 0) and calls[-1] == ("end", 3)
    recorded = rows(tmp_path / "run" / "metrics.csv")
    seen = [c[2] for c in calls if c[0] == "round"]
    assert [s["round"] for s in seen] == [1, 2, 3]
    for scalars, row in zip(seen, recorded):
        assert {k: float(v) for k, v in scalars.items() if k != "time/round_s"} == \
            {k: float(v) for k, v in row.items() if k != "time/round_s"}


def first_stop(values: list[float], mode: str, patience: int) -> int | None:
    """The round EarlyStopping must stop after, worked out from an uninterrupted run's values (None: never)."""
    best, waited = None, 0
    for round, value in enumerate(values, start=1):
        if best is None or (value > best if mode == "max" else value < best):
            best, waited = value, 0
        else:
            waited += 1
            if waited >= patience:
                return round
    return None


def test_early_stopping_stops_where_the_uninterrupted_run_says(tmp_path, tiny_run_args):
    assert main(tiny_run_args + ["--run_name", "whole", "--federation.rounds", "5"]) == 0
    losses = [float(r["train/loss"]) for r in rows(tmp_path / "whole" / "metrics.csv")]
    expected = first_stop(losses, "max", 1)  # training loss falls, so "max" stops early
    assert expected is not None and expected < 5
    assert main(tiny_run_args + ["--run_name", "early", "--federation.rounds", "5",
                                 *early_stopping("train/loss", "max", 1)]) == 0
    early = rows(tmp_path / "early" / "metrics.csv")
    assert len(early) == expected
    assert [r["train/loss"] for r in early] == [r["train/loss"] for r in rows(tmp_path / "whole" / "metrics.csv")][:expected]
    summary = json.loads((tmp_path / "early" / "summary.json").read_text())
    assert summary["rounds"] == expected and "train/loss has not improved" in summary["stopped"]


def test_early_stopping_state_survives_a_resume(tmp_path, tiny_run_args):
    settings = early_stopping("train/loss", "max", 2)
    assert main(tiny_run_args + ["--run_name", "whole", "--federation.rounds", "5", *settings]) == 0
    assert main(tiny_run_args + ["--run_name", "split", "--federation.rounds", "2", *settings]) == 0
    assert main(["fit", "--resume", str(tmp_path / "split"), "--federation.rounds", "5"]) == 0
    whole = [(r["round"], r["train/loss"]) for r in rows(tmp_path / "whole" / "metrics.csv")]
    split = [(r["round"], r["train/loss"]) for r in rows(tmp_path / "split" / "metrics.csv")]
    assert split == whole  # the same stop: the waited rounds of the first part were restored


def test_early_stopping_on_a_metric_the_run_does_not_log_is_one_line(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--run_name", "typo", *early_stopping("test/acc_meen", "max", 2)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedlight: error: EarlyStopping monitors 'test/acc_meen'") and "test/acc_mean" in err
    assert len(err.splitlines()) == 1
