"""FedEM's synthetic mixture: client sizes, each sample labelled by its own component (not the authors' script's
unadvanced offset, which leaves most labels 0), the Bayes rule worked by hand, the true clusters, the seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlight.datamodules import SyntheticMixture
from fedlight.datamodules.synthetic_mixture import draw_samples, oracle_accuracy, training_sizes


def build(**kwargs) -> SyntheticMixture:
    module = SyntheticMixture(**{"num_clients": 20, "dim": 10, "test_samples": 50, **kwargs})
    module.setup()
    return module


def test_sizes_follow_fedem_bounds_and_every_client_gets_its_test_samples():
    data = build(num_clients=30, val_fraction=0.1).federated
    drawn = np.array(data.train.sizes()) + np.array(data.val.sizes())
    assert drawn.min() >= 50 and drawn.max() <= 1000
    assert data.test.sizes().tolist() == [50] * 30
    assert data.val.sizes().tolist() == [int(round(0.1 * n)) for n in drawn]


def test_training_sizes_median_is_lognormal_median_plus_minimum():
    # LogNormal(4, 2) has median e^4 = 54.6; floored and shifted by 50: about 104 (capped at 1,000 far above it)
    sizes = training_sizes(np.random.default_rng(0), 20_000)
    assert sizes.min() == 50 and sizes.max() == 1000
    assert abs(np.median(sizes) - 104) <= 4


def test_each_sample_is_labelled_by_its_own_component():
    # two components in 2-d: theta_0 = (1, 0) labels by x_0's sign, theta_1 = (0, 1) by x_1's; no noise
    theta = np.array([[1.0, 0.0], [0.0, 1.0]])
    x, y, z = draw_samples(np.random.default_rng(1), theta, np.array([0.5, 0.5]), 4000, noise_level=0.0)
    assert np.array_equal(y[z == 0], (x[z == 0, 0] > 0).astype(int))
    assert np.array_equal(y[z == 1], (x[z == 1, 1] > 0).astype(int))
    assert 0.45 < (z == 0).mean() < 0.55
    # a client of one component only: every label is that component's
    x, y, z = draw_samples(np.random.default_rng(2), theta, np.array([0.0, 1.0]), 500, noise_level=0.0)
    assert (z == 1).all() and np.array_equal(y, (x[:, 1] > 0).astype(int))


def test_labels_are_balanced_for_every_client():
    # x is symmetric about 0, so each client's labels are Bernoulli(1/2) whatever its mixture; the authors' script
    # (its row offset never advances) leaves every row past the largest component's count at label 0
    data = build(num_clients=40, test_samples=400).federated
    per_client = [float(y.float().mean()) for y in data.test.y.split(data.test.sizes().tolist())]
    assert all(0.38 < share < 0.62 for share in per_client)


def test_oracle_accuracy_worked_by_hand():
    # weights (0.7, 0.3): the Bayes rule follows component 0 wherever the two disagree
    theta = np.array([[1.0, 0.0], [0.0, 1.0]])
    x = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    y = np.array([1, 0, 1, 0])  # labels drawn from component 1 on the two points where they disagree
    # rule predicts 1, 1, 0, 0: right on rows 0 and 3, wrong on rows 1 and 2
    assert oracle_accuracy(x, y, theta, np.array([0.7, 0.3])) == pytest.approx(0.5)
    assert oracle_accuracy(x, y, theta, np.array([0.2, 0.8])) == pytest.approx(1.0)


def test_true_clusters_are_dominant_components_and_oracle_beats_chance():
    data = build(num_clients=30, num_components=3, alpha=0.05, test_samples=200).federated
    assert data.cluster_labels is not None and set(data.cluster_labels) <= {0, 1, 2}
    assert len(set(data.cluster_labels)) >= 2
    # alpha 0.05: nearly every client has one component, whose labels the Bayes rule gets all but the noise of
    assert data.info["oracle_test_acc"] > 0.9


def test_same_seed_same_clients_other_seed_others():
    a, b, c = build(split_seed=3).federated, build(split_seed=3).federated, build(split_seed=4).federated
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert a.train.x.shape != c.train.x.shape or not torch.equal(a.train.x, c.train.x)


def test_public_data_and_held_out_clients():
    module = build(num_clients=20, public_size=30, holdout_clients=0.2)
    data = module.federated
    assert data.public_x is not None and data.public_x.shape == (30, 10)
    assert data.num_clients == 16 and data.newcomers is not None and data.newcomers.num_clients == 4


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"num_components": 0}, {"test_samples": 0}, {"min_samples": 100, "max_samples": 50}],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        SyntheticMixture(**kwargs)


def test_the_shipped_config_runs_and_reports_the_resolution_of_its_test_samples(tmp_path):
    import json
    from pathlib import Path

    from fedlight.run.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "synthetic_mixture" / "fedavg.yaml"
    args = ["fit", "--config", str(config), "--output_dir", str(tmp_path), "--run_name", "run"]
    args += ["--data.init_args.num_clients", "6", "--data.init_args.test_samples", "40", "--federation.rounds", "2"]
    assert main(args + ["--federation.local_epochs", "1", "--logger.wandb", "false"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test/acc_resolution"] == pytest.approx(1 / 40)  # every client has 40 test samples
    assert 0.0 <= summary["val_selected/test/acc_mean"] <= 1.0
