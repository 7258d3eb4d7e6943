"""Figures: fixed colour scales for matrices (by kind, or the first matrix of a name), cluster colours matched to
the true clusters, and the W&B recorder's per-round heatmap range."""

import math

import numpy as np
import pytest

from fedlight.reports import plots
from fedlight.run.recorder import client_rows, matrix_file
from fedlight.run.wandb_logger import LoggerConfig, WandbLogger


@pytest.mark.parametrize(
    "name, expected",
    [
        ("update_cosine_distance", (0.0, 2.0)),
        ("cosine_similarity", (-1.0, 1.0)),
        ("js_divergence", (0.0, math.log(2))),
        ("inference_similarity", (0.0, 1.0)),
    ],
)
def test_a_known_kind_of_matrix_has_its_kinds_range(name, expected):
    assert plots.matrix_range(name, np.full((3, 3), 0.4)) == pytest.approx(expected)


def test_a_matrix_of_unknown_kind_keeps_the_range_of_the_first_one_of_its_name(tmp_path):
    first, later = np.array([[0.0, 3.0], [3.0, 0.0]]), np.array([[0.0, 9.0], [9.0, 0.0]])
    logger = WandbLogger(LoggerConfig())
    logger.run_dir = tmp_path
    assert logger.matrix_range("l2_gap", first) == (0.0, 3.0)
    assert logger.matrix_range("l2_gap", later) == (0.0, 3.0)
    matrix_file(tmp_path, "l2_gap", 1).parent.mkdir()
    np.save(matrix_file(tmp_path, "l2_gap", 1), first)  # what the CSV recorder saved in round 1
    resumed = WandbLogger(LoggerConfig())
    resumed.run_dir = tmp_path
    assert resumed.matrix_range("l2_gap", later) == (0.0, 3.0)  # found on disk: the same scale after a resume


def test_a_heatmap_uses_the_given_scale_and_has_a_colour_bar():
    figure = plots.heatmap_figure([("a", np.array([[0.0, 0.2], [0.2, 0.0]]))], 0.0, 2.0, "distance")
    image = figure.axes[0].images[0]
    assert image.get_clim() == (0.0, 2.0)
    colour_bar = figure.axes[1]
    assert colour_bar.get_ylabel() == "distance" and colour_bar.get_ylim() == (0.0, 2.0)
    assert figure.axes[0].get_xlabel() == "client" and figure.axes[0].get_ylabel() == "client"


def test_clusters_are_numbered_after_the_true_clusters_they_overlap_most():
    true = np.array([0, 0, 1, 1, 2, 2])
    assigned = np.array([[7, 7], [7, 7], [3, 3], [3, 5], [-1, 9], [9, 9]])  # (clients, rounds)
    codes, true_codes = plots.cluster_codes(assigned, true)
    assert true_codes.tolist() == [0, 0, 1, 1, 2, 2]
    assert codes.tolist() == [[0, 0], [0, 0], [1, 1], [1, 3], [-1, 2], [2, 2]]  # 5 matches nothing: a new colour


def test_clusters_without_truth_are_numbered_in_order_of_the_last_round():
    codes, true_codes = plots.cluster_codes(np.array([[4, 2], [4, 8], [4, 8]]), None)
    assert true_codes is None and codes.tolist() == [[2, 0], [2, 1], [2, 1]]


def test_client_rows_lead_with_the_clusters_and_end_with_the_training_size():
    per_client = {
        "acc": np.array([0.5, 0.25], dtype=np.float32),
        "samples": np.array([10, 12]),
        "cluster": np.array([1, 0]),
        "true_cluster": np.array([0, 0]),
    }
    rows = client_rows(4, per_client)
    assert rows == [
        {"round": 4, "client": 0, "true_cluster": 0, "cluster": 1, "acc": 0.5, "samples": 10},
        {"round": 4, "client": 1, "true_cluster": 0, "cluster": 0, "acc": 0.25, "samples": 12},
    ]
    assert all(type(r["samples"]) is int for r in rows)


def test_the_seed_band_stays_within_the_seeds_extremes():
    seeds = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 0.2]])  # ARI of three seeds at two rounds
    series = plots.Series("x", "#000000", np.array([1, 2]), seeds.mean(0), seeds.std(0), seeds.min(0), seeds.max(0))
    figure = plots.line_figure([("ARI", "ARI", [series])])
    band = figure.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() <= 1.0 and band.min() >= 0.0
    mean, std = seeds[:, 1].mean(), seeds[:, 1].std()  # 0.4, 0.432...: mean - std is below 0, mean + std not clipped
    assert band.min() == pytest.approx(0.0) and band.max() == pytest.approx(1.0)
    assert series.band()[1][1] == pytest.approx(mean + std) and series.band()[0][1] == pytest.approx(0.0)
