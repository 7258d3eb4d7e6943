"""The three numbers of a run: the last evaluated round's, the round chosen on validation data and the best round on
the test split, each with its worst client; chosen here by hand over rows whose answers are known in advance, kept
across a resume, measured in one pass per split, absent without a validation split, and shown in the console's
summary and the report's Table 1 with the ranking under it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedlight.datamodules import DigitsFederated
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import Classifier, SmallCNN
from fedlight.plugin.aggregation import ClientModels
from fedlight.reports import selection
from fedlight.reports.runs import find_runs, group_runs, load_run
from fedlight.reports.tables import comparison_table, ranking_text, table_columns
from fedlight.run import checkpoint
from fedlight.run.console import summary_table
from fedlight.run.runner import Totals

from helpers.reports import SUMMARY, fake_run, rendered, table

# (round, val mean, test mean, test worst): val is best at round 2, test at rounds 3 and 4 (a tie, no loss to break it:
# the later counts), the last round is 5, and round 1's NaN validation mean is never chosen
ROWS = [
    (1, float("nan"), 0.30, 0.10),
    (2, 0.80, 0.50, 0.20),
    (3, 0.60, 0.90, 0.40),
    (4, 0.70, 0.90, 0.30),
    (5, 0.75, 0.60, 0.25),
]


def rows(table_rows=ROWS, validated=True) -> list[dict]:
    """Evaluated rows as metrics.csv holds them (with a training row between, which is not evaluated)."""
    out = []
    for round, val, test, worst in table_rows:
        out.append(
            {
                "round": round,
                "test/acc_mean": test,
                "test/acc_worst": worst,
                "test/acc_std": 0.1,
                **({"val/acc_mean": val, "val/acc_worst": val / 2} if validated else {}),
            }
        )
        out.append({"round": round + 0.5, "train/loss": 1.0})  # a row without an evaluation
    return out


def test_the_val_selected_and_test_selected_rounds_by_hand():
    chosen = selection.selections(rows(), "test", "acc")
    assert chosen == {
        "val_selected/round": 2,
        "val_selected/val/acc_mean": 0.80,
        "val_selected/test/acc_mean": 0.50,
        "val_selected/test/acc_worst": 0.20,
        "test_selected/round": 4,
        "test_selected/test/acc_mean": 0.90,
        "test_selected/test/acc_worst": 0.30,
    }
    # a loss is chosen at its lowest: round 1's 0.30 test "loss", round 2's 0.80 validation one is the highest
    lowest = selection.selections([{k.replace("acc", "loss"): v for k, v in r.items()} for r in rows()], "test", "loss")
    assert (lowest["test_selected/round"], lowest["val_selected/round"]) == (1, 3)


def test_a_tie_goes_to_the_lower_loss_on_the_chosen_split_then_to_the_later_round():
    tied = [
        {"round": 1, "val/acc_mean": 0.9, "val/loss_mean": 0.40, "test/acc_mean": 0.70, "test/acc_worst": 0.5},
        {"round": 2, "val/acc_mean": 0.9, "val/loss_mean": 0.30, "test/acc_mean": 0.80, "test/acc_worst": 0.6},
        {"round": 3, "val/acc_mean": 0.9, "val/loss_mean": 0.35, "test/acc_mean": 0.75, "test/acc_worst": 0.4},
        {"round": 4, "val/acc_mean": 0.8, "val/loss_mean": 0.10, "test/acc_mean": 0.60, "test/acc_worst": 0.3},
    ]
    chosen = selection.selections(tied, "test", "acc")
    assert chosen["val_selected/round"] == 2  # three rounds tie at 0.9; round 2 has the lowest validation loss
    no_loss = [{k: v for k, v in row.items() if "loss" not in k} for row in tied]
    assert selection.selections(no_loss, "test", "acc")["val_selected/round"] == 3  # then the latest of the tie


def test_without_validation_numbers_the_val_selected_round_is_absent_and_says_why():
    chosen = selection.selections(rows(validated=False), "test", "acc")
    assert chosen == {
        "no_val_selection": "no validation split",
        "test_selected/round": 4,
        "test_selected/test/acc_mean": 0.90,
        "test_selected/test/acc_worst": 0.30,
    }
    partly = selection.selections(rows(ROWS[:2], validated=False) + rows(ROWS[2:]), "test", "acc")
    assert partly["no_val_selection"] == "validation not measured in every evaluated round"
    assert not any(k.startswith("val_selected/") for k in partly)
    # evaluated on val itself: one selection, the best validation round
    on_val = selection.selections([{"round": 1, "val/acc_mean": 0.4}, {"round": 2, "val/acc_mean": 0.6}], "val", "acc")
    assert on_val == {"val_selected/round": 2, "val_selected/val/acc_mean": 0.6, "val_selected/val/acc_worst": None}


def rounds_into(totals: Totals, table_rows) -> None:
    run = SimpleNamespace(federation=SimpleNamespace(config=SimpleNamespace(eval_split="test")))
    for row in rows(table_rows):
        evaluated = "test/acc_mean" in row
        totals.on_round_end(
            run,
            SimpleNamespace(
                seconds=1.0,
                evaluated=evaluated,
                per_client={},
                scalars={**row, "cluster/count": 2.0, "time/round_s": 1.0},
            ),
        )


def test_a_resumed_run_chooses_among_the_rounds_before_its_checkpoint_too(tmp_path):
    whole, before = Totals(), Totals()
    rounds_into(whole, ROWS)
    rounds_into(before, ROWS[:3])  # the checkpoint after round 3, read back as a resume reads it
    checkpoint.save({"callbacks": {"totals": before.state_dict()}}, tmp_path)
    resumed = Totals()
    resumed.load_state_dict(checkpoint.load(tmp_path)["callbacks"]["totals"])
    rounds_into(resumed, ROWS[3:])
    assert resumed.selections("test") == whole.selections("test") == selection.selections(rows(), "test", "acc")
    # what the checkpoint keeps of a round: the means and worst clients of the two splits, nothing else
    assert [set(row) for row in resumed.evaluated] == [
        {"round", "test/acc_mean", "test/acc_worst", "val/acc_mean", "val/acc_worst"}
    ] * len(ROWS)


def test_a_format_5_checkpoint_keeps_its_last_and_best_rounds_and_chooses_no_val_round():
    key = "fedlight.run.runner.Totals()"
    v5 = {
        "elapsed": 3.0,
        "last_eval": {"round": 3, "test/acc_mean": 0.5, "test/acc_worst": 0.25},
        "best": {"test/acc_mean": 0.8, "round": 2},
    }
    state = checkpoint.upgrade({"federation": {"round": 3}, "callbacks": {key: v5}, "format_version": 5}, [])
    totals = Totals()
    totals.load_state_dict(state["callbacks"][key])
    rounds_into(totals, [(4, 0.9, 0.7, 0.35)])
    assert totals.selections("test") == {
        "no_val_selection": "validation not measured in every evaluated round",
        "test_selected/round": 2,
        "test_selected/test/acc_mean": 0.8,
        "test_selected/test/acc_worst": None,
    }


def federation(val_fraction: float) -> Federation:
    data = DigitsFederated(num_clients=4, val_fraction=val_fraction, test_fraction=0.2)
    return Federation(
        data, Classifier(SmallCNN(1, 10, 8, width=8)), None, FederationConfig(rounds=1, accelerator="cpu", vectorize=0)
    )


def test_an_evaluated_round_measures_val_beside_test_building_each_model_once():
    fed = federation(0.2)
    assert fed.also_evaluated == ("val",)
    models, groups = fed.algorithm.evaluation_models()
    built = []

    def lazy() -> tuple[ClientModels, torch.Tensor]:  # every client's model built on demand, counted
        return (
            ClientModels(lambda c: built.append(c) or models[int(groups[c])], fed.num_clients),
            torch.arange(fed.num_clients),
        )

    summary, values = fed.evaluator.evaluate(lazy(), also=("val",))
    assert built == [0, 1, 2, 3]  # one model a client, for both splits
    test, test_values = fed.evaluator.evaluate(lazy(), "test")  # each split in a pass of its own, as before
    val, _ = fed.evaluator.evaluate(lazy(), "val")
    assert summary == {**test, **val} and list(summary)[:3] == list(test)[:3]  # the evaluated split first
    assert values.keys() == test_values.keys() and all(np.array_equal(values[k], test_values[k]) for k in values)
    recorded, _ = fed.evaluate_clients(1, (models, groups), None)  # what an evaluated round records
    assert {k.split("/")[0] for k in recorded} == {"test", "val"}


def test_without_a_val_split_nothing_more_is_measured():
    fed = federation(0.0)
    assert fed.also_evaluated == ()
    recorded, _ = fed.evaluate_clients(1, fed.algorithm.evaluation_models(), None)
    assert {k.split("/")[0] for k in recorded} == {"test"}


def test_the_console_summary_shows_the_three_with_their_rounds_and_worst_clients():
    chosen = {
        "val_selected/round": 2,
        "val_selected/val/acc_mean": 0.8,
        "val_selected/test/acc_mean": 0.375,
        "val_selected/test/acc_worst": 0.0625,
        "test_selected/round": 3,
        "test_selected/test/acc_mean": 0.625,
        "test_selected/test/acc_worst": 0.25,
    }
    cells = {
        row[0].strip(): [c.strip() for c in row[1:]]
        for line in rendered(summary_table({**SUMMARY, **chosen}, "test", plain=True)).splitlines()
        if line.startswith("|") and (row := line.split("|")[1:-1])
    }
    assert cells["test acc, last round"] == ["0.5000", "0.2500", "0.1250"]
    assert cells["test acc, val-selected (round 2)"] == ["0.3750", "", "0.0625"]
    assert cells["test acc, test-selected (round 3)"] == ["0.6250", "", "0.2500"]
    absent = {"no_val_selection": "no validation split", **{k: v for k, v in chosen.items() if "test_selected" in k}}
    text = rendered(summary_table({**SUMMARY, **absent}, "test", plain=True))
    row = next(line for line in text.splitlines() if "val-selected" in line).split("|")
    assert [c.strip() for c in row[1:3]] == ["test acc, val-selected", "no validation split"]


def with_rows(run, table_rows, validated=True):
    """A fake run's metrics.csv replaced by `table_rows`, its summary without chosen rounds (chosen from the rows)."""
    evaluated = [r for r in rows(table_rows, validated) if "test/acc_mean" in r]
    columns = list(evaluated[0])
    (run / "metrics.csv").write_text(
        ",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in evaluated)
    )
    return run


def test_table_1_adds_the_val_selected_and_test_selected_columns_and_ranks_by_val_selected(tmp_path):
    with_rows(fake_run(tmp_path / "a" / "s0", 0, 0.6, lr=0.1), ROWS)
    with_rows(fake_run(tmp_path / "a" / "s1", 1, 0.6, lr=0.1), [(1, 0.5, 0.7, 0.3), (2, 0.4, 0.8, 0.2)])
    with_rows(fake_run(tmp_path / "b" / "s0", 0, 0.6, lr=0.2), [(1, 0.9, 0.3, 0.1)])
    groups = group_runs([load_run(p) for p in find_runs([tmp_path])])
    columns = table_columns("test", "acc")
    got = table(comparison_table(groups, columns))
    a, b = got["FedAvg (lr=0.1)"], got["FedAvg (lr=0.2)"]
    assert [c.header for c in columns][:7] == [
        "mean acc",
        "std acc (clients)",
        "worst-client acc",
        "val-selected acc",
        "val-selected worst-client acc",
        "test-selected acc",
        "test-selected worst-client acc",
    ]
    # by hand: s0 rounds 2 and 4 (above), s1 round 1 on val and round 2 on test
    assert a["val-selected acc"] == (pytest.approx(0.6), pytest.approx(0.1), 2)
    assert a["val-selected worst-client acc"] == (pytest.approx(0.25), pytest.approx(0.05), 2)
    assert a["test-selected acc"] == (pytest.approx(0.85), pytest.approx(0.05), 2)
    assert a["test-selected worst-client acc"] == (pytest.approx(0.25), pytest.approx(0.05), 2)
    assert b["val-selected acc"] == (0.3, 0.0, 1) and b["test-selected acc"] == (0.3, 0.0, 1)
    assert ranking_text(groups, "test", "acc") == (
        "Ranked by val-selected acc (every run chose its round on "
        "validation data): 1. FedAvg (lr=0.1) 0.600; 2. FedAvg "
        "(lr=0.2) 0.300."
    )


def test_table_1_says_no_validation_split_and_ranks_by_the_last_round_then(tmp_path):
    with_rows(fake_run(tmp_path / "a" / "s0", 0, 0.6, lr=0.1), ROWS)
    with_rows(fake_run(tmp_path / "b" / "s0", 0, 0.7, lr=0.2), [(1, 0.9, 0.3, 0.1), (2, 0.9, 0.2, 0.1)], False)
    groups = group_runs([load_run(p) for p in find_runs([tmp_path])])
    page = comparison_table(groups, table_columns("test", "acc"))
    cells = dict(re.findall(r"<th scope='row'><span[^>]*></span>(.*?)</th>(.*?)</tr>", page))
    assert cells["FedAvg (lr=0.2)"].count("<td class='num'>no validation split</td>") == 2
    assert table(page)["FedAvg (lr=0.2)"]["test-selected acc"] == (0.3, 0.0, 1)
    assert ranking_text(groups, "test", "acc") == (
        "Ranked by mean acc (the last round: 1 run (s0) has no validation-selected round): "
        "1. FedAvg (lr=0.2) 0.700; 2. FedAvg (lr=0.1) 0.600."
    )
