"""What a run prints for counts (whole numbers, singular and plural) and the MedMNIST missing-file message."""

from __future__ import annotations

import pytest

from fedlight.run.console import cluster_text, round_text, summary_table

from helpers.reports import SUMMARY, rendered


def test_summary_table_prints_counts_as_integers_and_other_values_with_decimals():
    text = rendered(summary_table(SUMMARY, "test", plain=True))
    rows = {line.split()[1]: line.split()[3] for line in text.splitlines() if line.startswith("| cluster/")}
    assert rows == {
        "cluster/count": "4",
        "cluster/ari": "1.0000",
        "cluster/clustered_round": "1",
        "cluster/temperature": "3.0000",
    }
    assert "0.5000" in text and "0.1250" in text


@pytest.mark.parametrize(
    "rounds, clients, title",
    [
        (1, 1, "r: OCFL, 1 round, 1 client, 2.0 s"),
        (3, 6, "r: OCFL, 3 rounds, 6 clients, 2.0 s"),
    ],
)
def test_summary_table_title_is_singular_for_one(rounds, clients, title):
    text = rendered(summary_table({**SUMMARY, "rounds": rounds, "num_clients": clients}, "test", plain=True))
    assert title in text


def test_cluster_events_and_round_lines_print_whole_counts():
    assert cluster_text({"cluster/count": 4.0, "cluster/ari": 1.0}) == "4 clusters, ARI 1.00"
    assert cluster_text({"cluster/count": 1.0}) == "1 cluster"
    line = round_text(
        {"test/acc_mean": 0.5, "test/acc_std": 0.25, "test/acc_worst": 0.125, "cluster/count": 2.0}, "test"
    )
    assert line == "acc 0.5000 ± 0.2500 (worst 0.1250)  2 clusters"
    assert "4.0" not in rendered(summary_table(SUMMARY, "test"))


def test_fine_tuned_accuracy_and_epsilon_are_printed_where_the_accuracy_is():
    fine_tuned = {
        "test_ft/acc_mean": 0.75,
        "test_ft/acc_std": 0.0625,
        "test_ft/acc_worst": 0.5,
        "privacy/epsilon": 7.0774,
    }
    line = round_text({"test/acc_mean": 0.5, "test/acc_std": 0.25, "test/acc_worst": 0.125, **fine_tuned}, "test")
    assert line == "acc 0.5000 ± 0.2500 (worst 0.1250)  fine-tuned acc 0.7500 (worst 0.5000)  epsilon 7.08"
    rows = [
        line.split("|")[1:-1]
        for line in rendered(summary_table({**SUMMARY, **fine_tuned}, "test", plain=True)).splitlines()
        if line.startswith("|")
    ]
    cells = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows}
    assert cells["test fine-tuned acc"] == ["0.7500", "0.0625", "0.5000"]
    assert cells["privacy/epsilon"] == ["7.0774", "", ""]


def test_medmnist_missing_file_names_the_download_address_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # importing medmnist creates ~/.medmnist
    from fedlight.datamodules import MedMNISTFederated

    with pytest.raises(FileNotFoundError) as error:
        MedMNISTFederated(str(tmp_path / "med"), flag="bloodmnist").build()
    message = str(error.value)
    assert message.count("https://zenodo.org/") == 1, message
    assert str(tmp_path / "med" / "bloodmnist.npz") in message and "download: true" in message
