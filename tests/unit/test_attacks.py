"""Attackers: the same seeded clients every round, what each kind does to data or updates (checked against the
clean run), the reports (backdoor success, ARI with the attackers as a cluster, clients.csv), and a tiny problem on
which 20 % sign-flip attackers break the mean and not the median."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import IID, DigitsFederated
from fedlight.aggregators.attacks import Attack, AttackConfig, apply_trigger
from fedlight.plugin.server import stream_seed
from fedlight.models import Classifier, SmallCNN
from fedlight.run.cli import main

from helpers.federations import aggregator_section


def federation(
    attack: AttackConfig | None = None, num_clients: int = 10, rounds: int = 4, partition=None, algorithm=None, **config
) -> Federation:
    """Digits, a narrow CNN that learns in a few rounds (about 0.9 test accuracy after 4 with 10 IID clients)."""
    torch.manual_seed(0)
    model = Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1, momentum=0.9)
    data = DigitsFederated(num_clients=num_clients, partition=partition or IID())
    aggregator = aggregator_section(config)
    settings = {"rounds": rounds, "local_epochs": 2, "batch_size": 16, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(
        data, model, algorithm or FedAvg(), FederationConfig(**settings), seed=0, attack=attack, aggregator=aggregator
    )


def test_the_attackers_are_a_seeded_share_of_the_clients():
    first = Attack(AttackConfig("sign_flip", 0.25), 20, 10, stream_seed(3, "attack"))
    again = Attack(AttackConfig("sign_flip", 0.25), 20, 10, stream_seed(3, "attack"))
    other = Attack(AttackConfig("sign_flip", 0.25), 20, 10, stream_seed(4, "attack"))
    assert len(first.malicious) == 5 and np.array_equal(first.malicious, again.malicious)
    assert not np.array_equal(first.malicious, other.malicious)
    assert first.is_malicious.sum() == 5 and first.is_malicious[first.malicious].all()


def test_label_flip_changes_only_the_attackers_training_labels():
    clean = federation(None, num_clients=5, rounds=1)
    flipped = federation(AttackConfig("label_flip", 0.4), num_clients=5, rounds=1)
    bounds = clean.data.train.bounds
    for client in range(5):
        rows = slice(bounds[client], bounds[client + 1])
        y, attacked = clean.data.train.y[rows], flipped.data.train.y[rows]
        assert torch.equal(attacked, 9 - y if client in flipped.extension(Attack).malicious else y)
    assert torch.equal(clean.data.test.y, flipped.data.test.y) and torch.equal(clean.data.train.x, flipped.data.train.x)


def test_backdoor_triggers_a_share_of_the_attackers_rows_with_the_target_label():
    clean = federation(None, num_clients=5, rounds=1)
    poisoned = federation(AttackConfig("backdoor", 0.4, target=7, poison_fraction=0.5), num_clients=5, rounds=1)
    bounds = clean.data.train.bounds
    for client in range(5):
        rows = slice(bounds[client], bounds[client + 1])
        x, px, py = clean.data.train.x[rows], poisoned.data.train.x[rows], poisoned.data.train.y[rows]
        changed = (x != px).flatten(1).any(dim=1)
        if client not in poisoned.extension(Attack).malicious:
            assert not changed.any()
            continue
        triggered = (px[:, 0, -3:, -3:] == 1.0).flatten(1).all(dim=1)  # digits are in [0, 1]: the trigger is 1
        assert int(triggered.sum()) == math.ceil(0.5 * len(x))
        assert bool((py[triggered] == 7).all()) and torch.equal(py[~triggered], clean.data.train.y[rows][~triggered])


def test_backdoor_success_counts_honest_samples_turned_to_the_target():
    fed = federation(AttackConfig("backdoor", 0.4, target=7), num_clients=5, rounds=1)
    attack = fed.extension(Attack)

    def trigger_reader(x: torch.Tensor) -> torch.Tensor:  # predicts 7 exactly when the trigger square is on
        on = (x[:, 0, -3:, -3:] == 1.0).flatten(1).all(dim=1)
        return torch.nn.functional.one_hot(torch.where(on, 7, 0), 10).float()

    def always_nine(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.full((len(x),), 9), 10).float()

    groups = torch.zeros(5, dtype=torch.long)
    assert attack.backdoor_success(fed.evaluator, ([trigger_reader], groups), "test") == (1.0, 0.0)
    assert attack.backdoor_success(fed.evaluator, ([always_nine], groups), "test") == (0.0, 0.0)
    result = fed.run_round(1)
    assert 0 <= result.scalars["test/backdoor_success"] <= 1 and 0 <= result.scalars["test/backdoor_baseline"] <= 1
    assert result.per_client["malicious"].tolist() == attack.is_malicious.astype(float).tolist()


def test_trigger_on_a_table_sets_the_last_features():
    x = torch.zeros(2, 6)
    assert apply_trigger(x, 5.0, 2).tolist() == [[0, 0, 0, 0, 5, 5]] * 2 and x.sum() == 0


@pytest.mark.parametrize("kind, scale", [("sign_flip", 3.0), ("scale", 4.0)])
def test_update_attacks_transform_the_attackers_updates(kind, scale):
    clean = federation(None, num_clients=5, rounds=1)
    attacked = federation(AttackConfig(kind, 0.4, scale=scale), num_clients=5, rounds=1)
    clients = [0, 1, 2, 3, 4]
    honest, sent = clean.execution.train(1, clients), attacked.execution.train(1, clients)
    factor = -scale if kind == "sign_flip" else scale
    for row, client in enumerate(clients):
        expected = honest.deltas[row] * (factor if client in attacked.extension(Attack).malicious else 1)
        assert torch.allclose(sent.deltas[row], expected, atol=1e-5)


def test_a_gaussian_attacker_sends_a_random_update_of_the_given_scale():
    attacked = federation(AttackConfig("gaussian", 0.2, scale=0.5), num_clients=5, rounds=1)
    sent = attacked.execution.train(1, [0, 1, 2, 3, 4])
    row = int(attacked.extension(Attack).malicious[0])
    deltas = sent.deltas[row]
    assert abs(float(deltas.std()) - 0.5) < 0.05 and abs(float(deltas.mean())) < 0.05


def test_ari_with_the_attackers_as_a_cluster_of_their_own():
    attack = Attack(AttackConfig("sign_flip", 0.25), 8, 10, stream_seed(0, "attack"))
    truth = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    isolated = truth.copy()
    isolated[attack.is_malicious] = 2
    assert attack.ari_with_attackers(truth, isolated) == 1.0
    assert attack.ari_with_attackers(truth, truth) < 1.0
    assert attack.ari_with_attackers(None, attack.is_malicious.astype(int)) == 1.0


def test_twenty_percent_sign_flippers_break_the_mean_and_not_the_median():
    results = {}
    for aggregator in ("mean", "median"):  # the clients of a round train as one vectorized group: faster here
        fed = federation(AttackConfig("sign_flip", 0.2), aggregator=aggregator, vectorize=10)
        for round in range(1, 5):
            results[aggregator] = fed.run_round(round).scalars["test/acc_mean"]
    clean = federation(None, vectorize=10)
    for round in range(1, 5):
        results["clean"] = clean.run_round(round).scalars["test/acc_mean"]
    assert results["clean"] > 0.8 and results["median"] > 0.8
    assert results["mean"] < 0.3  # -10 times two updates outweighs eight honest ones: the model goes uphill


def test_a_clustered_run_logs_the_ari_with_attackers_and_clients_csv_marks_them(tmp_path, tiny_run_args):
    assert (
        main(
            tiny_run_args
            + [
                "--run_name",
                "attacked",
                "--algorithm",
                "ocfl",
                "--federation.rounds",
                "2",
                "--attack.kind",
                "sign_flip",
                "--attack.fraction",
                "0.34",
            ]
        )
        == 0
    )
    folder = tmp_path / "attacked"
    rows = list(csv.DictReader((folder / "clients.csv").open()))
    assert sorted({row["malicious"] for row in rows}) == ["0.0", "1.0"]
    assert "cluster/ari_attackers" in (folder / "metrics.csv").read_text().splitlines()[0]


def test_an_attack_that_leaves_no_honest_client_is_refused_in_one_line(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--run_name", "bad", "--attack.kind", "sign_flip", "--attack.fraction", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "attack.fraction must be in (0, 1)" in error
    assert not (tmp_path / "bad").exists()


def test_a_mistyped_attack_kind_is_refused_in_one_line_with_the_nearest_kind(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--run_name", "typo", "--attack.kind", "signflip", "--attack.fraction", "0.3"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "got 'signflip' (did you mean 'sign_flip'?)" in error
