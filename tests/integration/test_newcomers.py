"""Clients held out of training (`data.init_args.holdout_clients`): how they are cut, that they never train, how each
algorithm gives them a model, and `unseen/*`, per-cluster means and their rows in clients.csv, against hand
computations and known cases."""

from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import adjusted_rand_score

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.fesem import FeSEM
from fedlight.algorithms.flis import FlisHC
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.ocfl import OCFL
from fedlight.algorithms.pacfl import PACFL
from fedlight.algorithms.pfclus import PFClus
from fedlight.cluster import HDBSCAN
from fedlight.datamodules import DigitsFederated, Rotations, SyntheticGaussians
from fedlight.datamodules.base import choose_holdout, holdout_count
from fedlight.plugin.evaluation import per_cluster_means
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.engine.held_out import HeldOutClients
from fedlight.plugin.newcomers import Newcomers, nearest_update_direction
from fedlight.plugin.population import ClientPopulation
from fedlight.models import CentroidModel, Classifier, SmallCNN
from fedlight.run.cli import main
from fedlight.run.recorder import client_rows
from fedlight.run.compatibility_table import SETTING

from helpers.shipped import shipped


def held_out(fed: Federation) -> HeldOutClients | None:
    """The federation's held-out clients as its algorithm sees them (None: the data holds none out)."""
    evaluation = fed.extension(NewcomerEvaluation)
    return None if evaluation is None else evaluation.clients


def federation(
    algorithm,
    num_clients: int = 8,
    holdout: int | float = 2,
    clusters: int = 2,
    rounds: int = 2,
    seed: int = 0,
    data_class=DigitsFederated,
    width: int = 8,
    lr: float = 0.1,
    momentum: float = 0.0,
    public_size: int = 0,
    **config,
) -> Federation:
    """A small digits federation with held-out clients; clients train one at a time."""
    torch.manual_seed(seed)
    data = data_class(
        num_clients=num_clients, partition=Rotations(clusters), holdout_clients=holdout, public_size=public_size
    )
    settings = {"rounds": rounds, "local_epochs": 1, "batch_size": 32, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(
        data,
        Classifier(SmallCNN(1, 10, 8, width=width), lr=lr, momentum=momentum),
        algorithm,
        FederationConfig(**settings),
        seed=seed,
    )


def built(holdout: int | float, num_clients: int = 12, clusters: int = 3, seed: int = 0):
    data = DigitsFederated(num_clients=num_clients, partition=Rotations(clusters), holdout_clients=holdout)
    data.seed = seed
    data.setup("fit")
    return data.federated


# -- the cut ---------------------------------------------------------------------------------------------------
def test_training_and_held_out_clients_are_the_partitions_clients_each_once_with_their_own_data():
    whole, cut = built(0), built(0.25)
    training, held = cut.info["partition_clients"], cut.newcomers.info["partition_clients"]
    assert sorted(training + held) == list(range(12)) and len(held) == 3
    for part, indices in ((cut, training), (cut.newcomers, held)):
        for j, k in enumerate(indices):  # client j of the part is client k of the run without holdout
            for split in ("train", "val", "test"):
                x, y = part.split(split).client(j)
                x0, y0 = whole.split(split).client(k)
                assert torch.equal(x, x0) and torch.equal(y, y0)
        assert part.cluster_labels.tolist() == [whole.cluster_labels[k] for k in indices]
    assert sorted(cut.newcomers.cluster_labels.tolist()) == [0, 1, 2]  # one from every true cluster
    assert built(0.25).newcomers.info["partition_clients"] == held  # deterministic in the seed


def test_each_true_cluster_gives_its_share_of_the_held_out_clients_by_largest_remainder():
    # sizes 5, 3, 2 of 10, 3 held out: exact shares 1.5, 0.9, 0.6 -> 1, 0, 0 and the two largest remainders -> 1, 1, 1
    clusters = np.array([0] * 5 + [1] * 3 + [2] * 2)
    for seed in range(5):
        held = choose_holdout(3, 10, clusters, seed)
        assert sorted(clusters[held].tolist()) == [0, 1, 2] and len(set(held.tolist())) == 3
    # sizes 6, 4 of 10, 5 held out: exactly 3 and 2
    clusters = np.array([0] * 6 + [1] * 4)
    assert np.bincount(clusters[choose_holdout(5, 10, clusters, 1)]).tolist() == [3, 2]
    # no true clusters: any 4 of 10
    held = choose_holdout(4, 10, None, 0)
    assert len(set(held.tolist())) == 4 and held.max() < 10


@pytest.mark.parametrize("holdout, clients, count", [(0.2, 20, 4), (0.01, 20, 1), (3, 20, 3), (0, 20, 0), (0.5, 3, 2)])
def test_a_share_is_rounded_and_at_least_one_and_a_count_is_taken_as_is(holdout, clients, count):
    assert holdout_count(holdout, clients) == count


@pytest.mark.parametrize("holdout", [0.99, 1.0, 20, 25, -1, True, 1.5])
def test_a_holdout_that_leaves_no_client_to_train_is_refused_naming_the_option(holdout):
    with pytest.raises(ValueError, match=r"^data\.init_args\.holdout_clients="):
        holdout_count(holdout, 20)


@pytest.mark.parametrize("holdout", ["6", "0.95"])
def test_the_command_line_refuses_it_in_one_line_without_a_run_folder(tmp_path, tiny_run_args, capsys, holdout):
    assert main(tiny_run_args + ["--data.holdout_clients", holdout]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedlight: error: data.init_args.holdout_clients=") and "none to train" in err
    assert len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no run folder


# -- held-out clients never train ------------------------------------------------------------------------------
class ScrambledNewcomers(DigitsFederated):
    """The same clients, with every held-out client's samples replaced by noise and its labels by 0."""

    def setup(self, stage=None):
        super().setup(stage)
        for split in ("train", "val", "test"):
            data = self.federated.newcomers.split(split)
            data.x = torch.rand_like(data.x)
            data.y = torch.zeros_like(data.y)


def test_the_held_out_clients_data_changes_nothing_for_the_training_clients():
    """Their samples replaced by noise, the training clients get the same models and the same numbers, bit for bit
    (round 2 trains after the newcomers were evaluated and fine-tuned in round 1); only `unseen/*` change."""
    runs = [
        federation(IFCA(num_clusters=2), data_class=cls, finetune_epochs=1)
        for cls in (DigitsFederated, ScrambledNewcomers)
    ]
    results = [[fed.run_round(r) for r in (1, 2)] for fed in runs]
    assert torch.equal(runs[0].algorithm.models, runs[1].algorithm.models)
    for a, b in zip(*results):
        training = {k: v for k, v in a.scalars.items() if not k.startswith(("unseen", "time/"))}
        assert training == {k: b.scalars[k] for k in training}
        assert all(np.array_equal(a.per_client[k], b.per_client[k]) for k in a.per_client)
    assert results[0][1].scalars["unseen/loss_mean"] != results[1][1].scalars["unseen/loss_mean"]
    assert runs[0].num_clients == 6 and held_out(runs[0]).count == 2


# -- unseen metrics by hand ------------------------------------------------------------------------------------
def test_unseen_metrics_are_the_lowest_loss_cluster_models_scores_on_each_newcomers_test_split():
    fed = federation(IFCA(num_clusters=2), num_clients=9, holdout=3, rounds=1)
    result = fed.run_round(1)
    alg, held = fed.algorithm, fed.data.newcomers
    accuracies, placed = [], []
    for j in range(3):  # by hand: the cluster model with the lowest mean cross-entropy on the newcomer's train rows
        x, y = held.train.client(j)
        losses = [float(F.cross_entropy(fed.server.model.predict(m, x), y)) for m in alg.models]
        placed.append(int(np.argmin(losses)))
        x, y = held.test.client(j)
        accuracies.append(
            float((fed.server.model.predict(alg.models[placed[-1]], x).argmax(dim=1) == y).float().mean())
        )
    assert result.newcomers["cluster"].tolist() == placed
    assert result.newcomers["acc"].tolist() == pytest.approx(accuracies)
    assert result.scalars["unseen/acc_mean"] == pytest.approx(np.mean(accuracies))
    assert result.scalars["unseen/acc_worst"] == pytest.approx(min(accuracies))
    assert result.newcomers["true_cluster"].tolist() == held.cluster_labels.tolist()
    truth = np.concatenate([fed.data.cluster_labels, held.cluster_labels])
    found = np.concatenate([alg.cluster_labels(), placed])
    assert result.scalars["unseen/ari"] == pytest.approx(adjusted_rand_score(truth, found))
    assert result.newcomers["samples"].tolist() == held.train.sizes().tolist()


def test_fedavg_gives_newcomers_the_global_model_and_fine_tunes_it_on_their_own_data():
    fed = federation(FedAvg(), finetune_epochs=2, rounds=1)
    result = fed.run_round(1)
    held, w = fed.data.newcomers, fed.algorithm.models[0]
    plain, tuned = [], []
    for j in range(2):
        x, y = held.test.client(j)
        plain.append(float((fed.server.model.predict(w, x).argmax(dim=1) == y).float().mean()))
        seed = fed.server.random.client_seed(1, j, "finetune")  # (seed, round, newcomer, purpose)
        tx, ty = held.train.client(j)
        model = held_out(fed).trainer.fit(w, tx, ty, seed, epochs=2).params
        tuned.append(float((fed.server.model.predict(model, x).argmax(dim=1) == y).float().mean()))
    assert result.newcomers["acc"].tolist() == pytest.approx(plain)
    assert result.newcomers["ft_acc"].tolist() == pytest.approx(tuned)
    assert result.scalars["unseen_ft/acc_mean"] == pytest.approx(np.mean(tuned))
    assert "unseen/ari" not in result.scalars and "cluster" not in result.newcomers  # FedAvg does not cluster


def test_per_cluster_means_by_hand():
    values = np.array([0.5, 1.0, np.nan, 0.25, np.nan])
    means = per_cluster_means(values, np.array([0, 0, 1, 1, 2]), "cluster_acc/true")
    assert means["cluster_acc/true_0"] == 0.75 and means["cluster_acc/true_1"] == 0.25
    assert np.isnan(means["cluster_acc/true_2"]) and len(means) == 3


def test_a_round_reports_the_mean_accuracy_of_each_true_and_found_cluster():
    fed = federation(IFCA(num_clusters=3), num_clients=8, holdout=0)
    result = fed.run_round(1)
    acc, truth, found = (result.per_client[k] for k in ("acc", "true_cluster", "cluster"))
    for kind, labels in (("true", truth), ("found", found)):
        for c in set(labels.tolist()):
            assert result.scalars[f"cluster_acc/{kind}_{c}"] == pytest.approx(acc[labels == c].mean())
    assert not any(k.startswith("unseen") for k in result.scalars) and held_out(fed) is None


# -- each algorithm's model for a newcomer ---------------------------------------------------------------------
class Stub:
    """Newcomers whose local training moves the start by a fixed vector each (and records the start)."""

    def __init__(self, moves: torch.Tensor) -> None:
        self.moves, self.count, self.starts = moves, len(moves), []

    def train(self, newcomer, start, epochs=None, purpose="newcomer"):
        self.starts.append(start.clone())
        return start + self.moves[newcomer]

    def train_many(self, newcomers, starts, epochs=None, purpose="newcomer"):
        return torch.stack([self.train(j, s, epochs, purpose) for j, s in zip(newcomers, starts)])


def test_a_newcomer_joins_the_cluster_its_update_points_to_from_the_mean_model():
    e1, e2, c = torch.eye(3)[0], torch.eye(3)[1], torch.tensor([5.0, -2.0, 1.0])
    models = torch.stack([c + e1, c + e2, c - e1])
    # centre c + e2/3; directions e1 - e2/3, 2e2/3, -e1 - e2/3: by hand, e1 -> 0, e2 -> 1, -e1 + 0.1 e2 -> 2
    stub = Stub(torch.stack([e1, e2, -e1 + 0.1 * e2, 2 * e1]))
    assert nearest_update_direction(stub, models, torch.tensor([1, 1, 1])).tolist() == [0, 1, 2, 0]
    assert torch.allclose(stub.starts[0], c + e2 / 3)
    # members weigh the centre: 3 members in cluster 0 -> centre c + (3 e1 + e2 - e1) / 5
    weighted = Stub(torch.stack([e2]))
    nearest_update_direction(weighted, models, torch.tensor([3, 1, 1]))
    assert torch.allclose(weighted.starts[0], c + (2 * e1 + e2) / 5)
    # a mask compares only some entries: with the first entry masked out, e1 + e2 points to cluster 1 alone
    mask = torch.tensor([False, True, True])
    assert nearest_update_direction(Stub(torch.stack([e1 + e2])), models, torch.tensor([1, 1, 1]), mask).tolist() == [1]


def test_a_personal_part_starts_fresh_for_a_newcomer():
    fed = federation(FedPer(personal_layers=1), rounds=1)
    fed.run_round(1)
    alg = fed.algorithm
    models, groups, placed = alg.newcomer_models(held_out(fed))
    mask = alg.personal_mask
    assert groups.tolist() == [0, 0] and placed is None
    assert torch.equal(models[0][mask], fed.server.model.initial_params[mask])
    assert torch.equal(models[0][~mask], alg.models[0][~mask])
    assert not torch.equal(alg.models[0][~mask], fed.server.model.initial_params[~mask])  # the shared part trained


def test_pfclus_gives_newcomers_the_global_centers_and_each_point_its_nearest():
    alg = PFClus()
    fed = Federation(
        SyntheticGaussians("NO", 2, 8, 30, holdout_clients=2),
        CentroidModel(10, 2),
        alg,
        FederationConfig(rounds=1, eval_split="train", accelerator="cpu"),
    )
    result = fed.run_round(1)
    centers = alg.global_centers.view(10, 2)
    for j in range(2):
        x, _ = fed.data.newcomers.train.client(j)
        cost = torch.cdist(x.double(), centers.double()).min(dim=1).values.pow(2).mean()
        assert result.newcomers["cost"][j] == pytest.approx(float(cost), rel=1e-5)


SETTINGS = {
    "ifca": {"num_clusters": 2, "participation": 0.5},
    "flis_dc": {"participation": 0.5},
    "flis_hc": {"phase_zero_epochs": 1},
    "cfl": {"warmup_rounds": 0, "eps1": 10.0, "eps2": 0.0},
    "ocfl": {"clusterer": HDBSCAN(min_cluster_size=2)},
    "fedtsdp": {"hopkins_threshold": 0.0},
    "fedsoft": {"num_clusters": 2, "selection_size": 2},
    "icfl": {"epsilon_1": 20.0},
    "stocfl": {"observe_epochs": 2},
    "fedgmm": {"num_components": 2, "num_gaussians": 2, "embedding_dim": 8},
}


@pytest.mark.parametrize("name", sorted(shipped()))
def test_every_algorithm_gives_each_newcomer_a_model_without_changing_its_state(name):
    algorithm = shipped()[name](**copy.deepcopy(SETTINGS.get(name, {})))
    if SETTING[name] == "points":  # the compatibility table's derived setting: a data-clustering method
        fed = Federation(
            SyntheticGaussians("NO", 2, 8, 30, holdout_clients=2),
            CentroidModel(10, 2),
            algorithm,
            FederationConfig(rounds=1, eval_split="train", accelerator="cpu"),
        )
    elif SETTING[name] == "adapters":  # a method on LoRA adapters: a tiny random ViT's
        from fedlight.models import PretrainedClassifier
        from fedlight.run.compatibility import tiny_vit_folder

        torch.manual_seed(0)
        data = DigitsFederated(num_clients=8, partition=Rotations(2), holdout_clients=2)
        fed = Federation(
            data,
            PretrainedClassifier(tiny_vit_folder(), num_classes=10),
            algorithm,
            FederationConfig(rounds=2, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0),
        )
    else:
        fed = federation(algorithm, public_size=60, rounds=2)
    for round in range(1, fed.config.rounds + 1):
        result = fed.run_round(round)
    held_out(fed).round = fed.config.rounds
    before = copy.deepcopy(algorithm.state_dict())
    answers = [algorithm.newcomer_models(held_out(fed)) for _ in range(2)]
    for models, groups, placed in answers:
        assert len(groups) == 2 and all(0 <= int(g) < len(models) for g in groups)
        assert placed is None or (len(placed) == 2 and algorithm.cluster_labels() is not None)
    (m1, g1, p1), (m2, g2, p2) = answers
    x = held_out(fed).split("train").x[:8]

    def same(a, b) -> bool:  # a flat model, or a predictor of the algorithm's own (FedEM's mixture)
        return torch.equal(a(x), b(x)) if callable(a) else torch.equal(a, b)

    assert torch.equal(g1, g2) and all(same(m1[int(g)], m2[int(g)]) for g in g1)  # a query repeats
    after = algorithm.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        if isinstance(before[key], torch.Tensor):
            assert torch.equal(before[key], after[key]), (name, key)
    assert np.isfinite(result.scalars.get("unseen/acc_mean", result.scalars.get("unseen/cost_mean")))


# -- digits rotations: newcomers join their true cluster -------------------------------------------------------
def placed_with_their_peers(result) -> bool:
    """Whether every newcomer was placed in the found cluster whose training clients are mostly of its true cluster
    (computed from the training clients' rows, independently of `unseen/ari`)."""
    truth, found = result.per_client["true_cluster"], result.per_client["cluster"]
    for cluster, true in zip(result.newcomers["cluster"], result.newcomers["true_cluster"]):
        members = truth[found == cluster]
        if not len(members) or np.bincount(members).argmax() != true:
            return False
    return True


@pytest.mark.parametrize(
    "algorithm, rounds",
    [
        (lambda: IFCA(num_clusters=4), 6),
        (lambda: OCFL(clusterer=HDBSCAN(min_cluster_size=3)), 8),  # 16 training clients: HDBSCAN's default 20% is 4
        (lambda: FlisHC(beta=0.3, phase_zero_epochs=10), 2),
        (lambda: FeSEM(num_clusters=4, seed_round=3), 5),  # configs/digits/fesem.yaml
        (lambda: PACFL(basis_size=3, threshold=7.5, linkage="average"), 2),  # configs/digits/pacfl.yaml
    ],
    ids=["ifca", "ocfl", "flis_hc", "fesem", "pacfl"],
)
def test_newcomers_to_digits_rotations_join_their_true_cluster(algorithm, rounds):
    """configs/digits' settings (20 clients in 4 rotation clusters, 200 public samples), 20% held out."""
    fed = federation(
        algorithm(),
        num_clients=20,
        holdout=0.2,
        clusters=4,
        rounds=rounds,
        width=32,
        lr=0.05,
        momentum=0.9,
        public_size=200,
        local_epochs=2,
        batch_size=16,
        eval_every=rounds,
        vectorize=16,
    )  # the training clients as one vectorized group: faster here
    for round in range(1, rounds + 1):
        result = fed.run_round(round)
    assert held_out(fed).count == 4 and sorted(result.newcomers["true_cluster"].tolist()) == [0, 1, 2, 3]
    assert result.scalars["cluster/ari"] == 1.0
    assert result.scalars["unseen/ari"] >= 0.9
    assert placed_with_their_peers(result)


# -- the run's files -------------------------------------------------------------------------------------------
def test_clients_csv_marks_the_held_out_clients_and_metrics_csv_has_unseen_and_per_cluster_columns(
    tmp_path, tiny_run_args
):
    args = tiny_run_args + [
        "--data.holdout_clients",
        "2",
        "--data.partition",
        "fedlight.datamodules.Rotations",
        "--data.partition.init_args.num_clusters",
        "2",
        "--algorithm",
        "ifca",
        "--algorithm.init_args.num_clusters",
        "2",
        "--federation.rounds",
        "2",
        "--federation.vectorize",
        "4",
        "--run_name",
        "held",
    ]
    assert main(args) == 0
    run = tmp_path / "held"
    with (run / "clients.csv").open() as f:
        rows = list(csv.DictReader(f))
    with (run / "metrics.csv").open() as f:
        metrics = list(csv.DictReader(f))
    assert len(rows) == 2 * 6
    for row in rows:
        held = int(row["client"]) >= 4
        assert row["held_out"] == str(held)
        assert (row["train/loss"] == "") == held  # a held-out client never trains
        assert row["acc"] != "" and row["true_cluster"] != "" and row["cluster"] != ""
    last = metrics[-1]
    newcomers = [r for r in rows if r["round"] == "2" and r["held_out"] == "True"]
    accuracies = [float(r["acc"]) for r in newcomers]
    assert float(last["unseen/acc_mean"]) == pytest.approx(np.mean(accuracies))
    assert float(last["unseen/acc_worst"]) == pytest.approx(min(accuracies))
    assert "unseen/ari" in last and "cluster_acc/true_0" in last and "cluster_acc/found_0" in last
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_clients"] == 4 and summary["held_out_clients"] == 2 and "unseen/acc_mean" in summary


def test_the_wandb_table_holds_training_and_held_out_rows_under_one_header():
    from fedlight.run.wandb_logger import LoggerConfig, WandbLogger

    per_client = {"acc": np.array([0.5, 0.75]), "samples": np.array([3, 4]), "train/loss": np.array([1.0, 2.0])}
    newcomers = {"acc": np.array([0.25]), "samples": np.array([5])}
    rows = client_rows(1, per_client, newcomers)
    assert [r["client"] for r in rows] == [0, 1, 2] and [r["held_out"] for r in rows] == [False, False, True]
    table = WandbLogger(LoggerConfig())._payload(1, {"round": 1}, per_client, rows, {})["clients/table"]
    assert table.columns == ["round", "client", "acc", "samples", "train/loss", "held_out"]
    assert table.data[2] == [1, 2, 0.25, 5, None, True]


def test_the_report_shows_unseen_accuracy_when_a_run_has_held_out_clients(tmp_path):
    from fedlight.reports.report import build

    for name, acc, unseen in (("a", 0.8, 0.6), ("b", 0.7, None)):
        folder = tmp_path / name
        folder.mkdir()
        extra = {} if unseen is None else {"unseen/acc_mean": unseen, "unseen/acc_worst": unseen / 2, "unseen/ari": 1.0}
        (folder / "metrics.csv").write_text(f"round,test/acc_mean,test/acc_std,test/acc_worst\n1,{acc},0.1,{acc}\n")
        summary = {
            "run": name,
            "algorithm": name.upper(),
            "seed": 0,
            "rounds": 1,
            "test/acc_mean": acc,
            "wall_time_s": 1.0,
            **extra,
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    page, _ = build([tmp_path])
    assert "<th>unseen acc</th>" in page and "<th>unseen ARI</th>" in page and "data-mean='0.6'" in page
    page, _ = build([tmp_path / "b"])
    assert "<th>unseen" not in page and "Unseen:" not in page


def test_a_newcomers_local_work_is_seeded_by_the_round_and_its_purpose():
    fed = federation(FedAvg(), rounds=1)
    fed.run_round(1)
    newcomers, start = held_out(fed), fed.algorithm.models[0]
    assert isinstance(newcomers, HeldOutClients) and isinstance(newcomers, Newcomers)
    newcomers.round = 1
    first = newcomers.train(0, start)
    assert torch.equal(first, newcomers.train(0, start))  # repeats exactly
    assert not torch.equal(first, newcomers.train(0, start, purpose="other"))  # another stream
    newcomers.round = 2
    assert not torch.equal(first, newcomers.train(0, start))  # another round, other batches
    losses, rows = newcomers.sample_losses(fed.algorithm.models)
    x, y = fed.data.newcomers.train.x, fed.data.newcomers.train.y
    assert torch.allclose(losses[0], F.cross_entropy(fed.server.model.predict(start, x), y, reduction="none"))
    assert torch.allclose(
        newcomers.losses(fed.algorithm.models)[0], torch.stack([losses[0][rows == j].mean() for j in range(2)])
    )


def test_training_clients_and_newcomers_are_one_population_class():
    fed = federation(FedAvg(), rounds=1)
    server, models = fed.server, fed.server.model.initial_params[None]
    assert type(server.clients) is type(held_out(fed).population) is ClientPopulation
    assert server.clients.count == server.num_clients and torch.equal(
        server.clients.train_sizes, server.clients.train_sizes
    )
    losses, owner = server.clients.sample_losses(models, [2, 0])  # two clients' rows, client 2's first
    x2, y2 = server.clients.split("train").client(2)
    x0, y0 = server.clients.split("train").client(0)
    assert owner.tolist() == [2] * len(y2) + [0] * len(y0)
    by_hand = [
        F.cross_entropy(server.model.predict(models[0], x), y, reduction="none") for x, y in ((x2, y2), (x0, y0))
    ]
    assert torch.allclose(losses[0], torch.cat(by_hand))
    assert torch.allclose(server.clients.losses(models)[0, 2], by_hand[0].mean())
    params = server.clients.train(1, 2, models[0]).params
    assert torch.equal(params, server.clients.train(1, 2, models[0]).params)


def test_the_console_prints_the_held_out_clients_apart():
    from helpers.reports import SUMMARY, rendered
    from fedlight.run.console import round_text, summary_table

    unseen = {"unseen/acc_mean": 0.75, "unseen/acc_std": 0.125, "unseen/acc_worst": 0.625, "unseen/ari": 0.5}
    text = rendered(summary_table({**SUMMARY, **unseen, "held_out_clients": 2}, "test", plain=True))
    assert "6 clients + 2 held out" in text
    row = next(line for line in text.splitlines() if "unseen (test) acc" in line).split("|")
    assert [cell.strip() for cell in row[2:5]] == ["0.7500", "0.1250", "0.6250"]
    row = next(line for line in text.splitlines() if "unseen/ari" in line).split("|")
    assert [cell.strip() for cell in row[1:3]] == ["unseen/ari", "0.5000"]
    line = round_text({"test/acc_mean": 0.5, "test/acc_std": 0.25, "test/acc_worst": 0.125, **unseen}, "test")
    assert line.endswith("unseen acc 0.7500 (worst 0.6250)")


@pytest.mark.parametrize("name", ["local", "fedfomo", "fedamp"])
def test_a_method_of_client_models_gives_a_newcomer_the_one_that_fits_it_best(name):
    """Local, FedFomo and FedAMP hold no global model worth giving (FedFomo's and FedAMP's was the untrained network):
    each newcomer gets the stored client model with the lowest mean cross-entropy on its own training rows, computed
    here model by model."""
    fed = federation(shipped()[name](), rounds=2)
    for round in (1, 2):
        fed.run_round(round)
    newcomers = held_out(fed)
    newcomers.round = 2
    models, placed, _ = fed.algorithm.newcomer_models(newcomers)
    stored = [models[c] for c in range(fed.num_clients)]
    for j in range(newcomers.count):
        x, y = newcomers.split("train").client(j)
        losses = [float(F.cross_entropy(fed.server.model.predict(params, x), y)) for params in stored]
        assert int(placed[j]) == int(np.argmin(losses)), (name, j)
    assert len({tuple(m.tolist()) for m in stored}) > 1  # the clients' models differ: the choice is one
