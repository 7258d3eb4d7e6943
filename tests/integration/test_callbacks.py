"""Run callbacks: a user's own by class path sees every round as metrics.csv records it, EarlyStopping stops where a
hand computation over an uninterrupted run says it must, and its state survives a resume; a checkpoint keeps each
callback's state under its class and arguments, so reordering the callbacks of a resumed run swaps nothing."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from fedlight import Callback, EarlyStopping
from fedlight.run import checkpoint
from fedlight.run.callbacks import callback_states, load_callback_states
from fedlight.run.cli import main
from fedlight.run.runner import CHECKPOINTS, fit
from fedlight.run.wandb_logger import LoggerConfig

from helpers.federations import small_federation

CALLBACK = """
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
"""


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def early_stopping(monitor: str, mode: str, patience: int) -> list[str]:
    return [
        "--callbacks+=fedlight.EarlyStopping",
        f"--callbacks.monitor={monitor}",
        f"--callbacks.mode={mode}",
        f"--callbacks.patience={patience}",
    ]


def test_a_callback_by_class_path_sees_every_round_as_metrics_csv_records_it(tmp_path, tiny_run_args, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(tiny_run_args + ["--run_name", "run", "--callbacks+=my_callbacks.Recording", "--callbacks.tag=y"]) == 0
    import my_callbacks

    calls = my_callbacks.CALLS
    assert calls[0] == ("start", "run", 0) and calls[-1] == ("end", 3)
    recorded = rows(tmp_path / "run" / "metrics.csv")
    seen = [c[2] for c in calls if c[0] == "round"]
    assert [s["round"] for s in seen] == [1, 2, 3]
    for scalars, row in zip(seen, recorded):
        assert {k: float(v) for k, v in scalars.items() if k != "time/round_s"} == {
            k: float(v) for k, v in row.items() if k != "time/round_s"
        }


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
    assert (
        main(
            tiny_run_args + ["--run_name", "early", "--federation.rounds", "5", *early_stopping("train/loss", "max", 1)]
        )
        == 0
    )
    early = rows(tmp_path / "early" / "metrics.csv")
    assert len(early) == expected
    assert [r["train/loss"] for r in early] == [r["train/loss"] for r in rows(tmp_path / "whole" / "metrics.csv")][
        :expected
    ]
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


class Counter(Callback):
    """Adds `step` every round: after n rounds its count is n * step, however the run was split."""

    def __init__(self, step: int, label: str = "") -> None:
        self.step, self.label, self.count = step, label, 0

    def on_round_end(self, run, result):
        self.count += self.step

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def early(patience: int = 50) -> EarlyStopping:
    return EarlyStopping("train/loss", "min", patience)  # never stops within these runs


def run_rounds(run_dir, rounds: int, callbacks: list, resume: bool = False) -> None:
    fit(
        small_federation(rounds=rounds),
        run_dir,
        "seed: 0\n",
        LoggerConfig(wandb=False),
        resume=resume,
        callbacks=callbacks,
    )


def test_reordered_callbacks_of_one_class_with_different_arguments_each_get_their_own_state_back(tmp_path):
    ones, tens, stopping = Counter(1), Counter(10), early()
    run_rounds(tmp_path / "run", 2, [ones, tens, stopping])
    saved = {"best": stopping.best, "best_round": stopping.best_round, "waited": stopping.waited}
    ones, tens, stopping = Counter(1), Counter(10), early()
    restored = {}
    stopping.on_fit_start = lambda run: restored.update(stopping.state_dict())
    run_rounds(tmp_path / "run", 3, [stopping, tens, ones], resume=True)  # the order reversed
    assert (ones.count, tens.count) == (3, 30)  # by position the two Counters would have swapped: 21 and 12
    assert restored == saved and saved["best_round"] >= 1


def test_a_checkpoint_of_format_1_resumes_with_the_states_by_class_name_and_position(tmp_path):
    run_dir = tmp_path / "run"
    run_rounds(run_dir, 2, [Counter(1), Counter(10)])
    last = run_dir / CHECKPOINTS / checkpoint.LAST
    state = checkpoint.read(last)
    by_class = {key.split("(")[0].rsplit(".", 1)[-1]: value for key, value in state["callbacks"].items()}
    # as fedlight wrote it before checkpoints had a format version: states by class name, "#2" for the second
    torch.save(
        {
            "federation": state["federation"],
            "callbacks": {
                "CsvRecorder": by_class["CsvRecorder"],
                "Totals": by_class["Totals"],
                "ConsoleReporter": {},
                "Counter": {"count": 2},
                "Counter#2": {"count": 20},
            },
        },
        last,
    )
    ones, tens = Counter(1), Counter(10)
    run_rounds(run_dir, 3, [ones, tens], resume=True)
    assert (ones.count, tens.count) == (3, 30)
    assert [row["round"] for row in rows(run_dir / "metrics.csv")] == ["1", "2", "3"]
    resaved = checkpoint.read(last)
    assert resaved["format_version"] == checkpoint.FORMAT_VERSION == 6
    assert resaved["federation"]["round"] == 3 and not any(key.startswith("Counter") for key in resaved["callbacks"])


def test_callbacks_of_one_class_and_the_same_arguments_take_their_states_in_order():
    first, second = Counter(1, "x"), Counter(step=1, label="x")  # positional or by name: the same arguments
    first.count, second.count = 5, 7
    states = callback_states([first, second])
    assert len(states) == 2
    again = [Counter(1, "x"), Counter(1, "x")]
    load_callback_states(again, states)
    assert [c.count for c in again] == [5, 7]


def test_a_callback_whose_arguments_changed_takes_the_state_of_its_class_when_it_is_the_only_one():
    before = early(patience=3)
    before.best, before.best_round, before.waited = 0.5, 4, 2
    after, counter = early(patience=9), Counter(1)
    load_callback_states([counter, after], callback_states([before]))
    assert (after.best, after.best_round, after.waited, counter.count) == (0.5, 4, 2, 0)


def test_two_callbacks_of_a_class_both_with_changed_arguments_are_refused_in_one_line():
    first, second = Counter(1), Counter(2)
    first.count, second.count = 5, 7
    with pytest.raises(ValueError, match="which is which cannot be told") as error:
        load_callback_states([Counter(3), Counter(4)], callback_states([first, second]))
    assert "Counter(step=1, label='')" in str(error.value) and len(str(error.value).splitlines()) == 1
