"""FedRC: the E-step divides each likelihood by the component's label marginal (a label shift alone moves no sample,
worked by hand), the label mass and its floor by hand, the server's running total equal to the sum of every client's
rows under partial participation, exact resume."""

import math

import numpy as np
import pytest
import torch

from fedlight.algorithms.fedrc import FedRC, label_log_prior, label_mass

from helpers.federations import every_row, small_federation
from helpers.resume import resumed_and_whole


def test_label_mass_sums_each_components_responsibilities_by_class():
    q = torch.tensor([[0.2, 0.8], [0.6, 0.4], [1.0, 0.0]], dtype=torch.float64)  # 3 samples, 2 components
    mass = label_mass(q, torch.tensor([0, 2, 0]), num_classes=3)
    assert mass.tolist() == [pytest.approx([1.2, 0.0, 0.6]), pytest.approx([0.8, 0.0, 0.4])]


def test_the_label_prior_floors_an_unseen_class_at_1e_minus_8_and_normalizes():
    prior = label_log_prior(torch.tensor([[2.0, 0.0, 6.0]], dtype=torch.float64)).exp()
    total = 8.0 + 1e-8
    assert prior[0].tolist() == pytest.approx([2 / total, 1e-8 / total, 6 / total], rel=1e-9)


def test_a_label_shift_alone_moves_no_sample_but_a_better_conditional_does():
    """Two components whose models predict their own label marginals P_k (component 0: mostly class 0, component 1:
    mostly class 1), so l_k(x, y) = -log P_k(y). FedEM's posterior prefers the component whose marginal favours the
    sample's label; FedRC's ratio p_k(y | x) / P_k(y) is 1 for both, so q is the mixture weight omega. A sample whose
    loss under component 1 is lower by log 3 beyond its marginal gets q proportional to omega x (1, 3)."""
    fed = small_federation(FedRC(num_components=2), num_clients=4, rounds=1)
    alg = fed.algorithm
    labels = fed.server.clients.split("train").client(0)[1]
    c = fed.server.data.num_classes
    marginal = torch.full((2, c), 0.5 / (c - 1), dtype=torch.float64)
    marginal[0, 0] = marginal[1, 1] = 0.5
    alg.label_totals = marginal * 100.0  # M: P_k(y) once normalized
    omega = torch.tensor([0.25, 0.75])
    alg.mixture.write([0], omega[None])
    losses = -marginal.log()[:, labels].float()  # (components, samples)
    alg.sample_losses = lambda client: losses
    q = alg.responsibilities(0)
    assert torch.allclose(q, omega.expand(len(labels), 2), atol=1e-6)
    fedem_q = (omega[:, None] * marginal[:, labels] / (omega[:, None] * marginal[:, labels]).sum(0)).T
    assert not torch.allclose(fedem_q.float(), q, atol=0.1)  # FedEM's would follow the label marginal
    shifted = losses.clone()
    shifted[1] -= math.log(3.0)
    alg.sample_losses = lambda client: shifted
    expected = torch.tensor([0.25 * 1, 0.75 * 3]) / (0.25 + 0.75 * 3)
    assert torch.allclose(alg.responsibilities(0), expected.expand(len(labels), 2), atol=1e-6)


def test_the_servers_label_total_is_every_clients_latest_row_summed_under_partial_participation():
    """Clients not trained yet count with their starting row, 1/C everywhere; a trained client's row holds one unit of
    responsibility per training sample, spread over the components and its own labels only."""
    fed = small_federation(FedRC(num_components=2, participation=0.5), num_clients=6, rounds=3)
    for round in range(1, 4):
        fed.run_round(round)
    alg = fed.algorithm
    stored = every_row(alg.label_mass)
    assert torch.allclose(alg.label_totals, stored.sum(dim=0), rtol=1e-12, atol=1e-9)
    split = fed.server.clients.split("train")
    touched = set(alg.label_mass.touched().tolist())
    assert touched  # some client trained
    for client in range(6):
        if client not in touched:
            assert torch.allclose(stored[client], torch.full_like(stored[client], 1 / fed.server.data.num_classes))
            continue
        labels = split.client(client)[1]
        assert float(stored[client].sum()) == pytest.approx(len(labels))
        absent = np.setdiff1d(np.arange(fed.server.data.num_classes), labels.numpy())
        assert float(stored[client][:, absent].abs().sum()) == 0.0


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    args = tiny_run_args + [
        "--algorithm",
        "fedrc",
        "--algorithm.init_args.num_components",
        "2",
        "--algorithm.init_args.participation",
        "0.5",
        "--federation.rounds",
        "3",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch, crash_round=2)
    assert crashed == whole
