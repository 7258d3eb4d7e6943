"""An ordinary LightningModule (BatchNorm, self.log, SGD with momentum and StepLR) trains as a client unchanged and
vectorized: its logged values and learning rate reach metrics.csv, its schedule is followed round by round or step
by step, BatchNorm statistics are per client, FedBN keeps them personal, and all four precisions run."""

from __future__ import annotations

import copy
import csv
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedlight import Federation, FederationConfig, RoundUpdates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedbn import FedBN
from fedlight.run.cli import main
from fedlight.datamodules import DigitsFederated, QuantitySkew

from helpers.ordinary_module import OrdinaryModule


def federation(
    algorithm=None,
    vectorize: int = 4,
    num_clients: int = 4,
    rounds: int = 3,
    partition=None,
    precision: str | None = None,
    **module,
) -> Federation:
    torch.manual_seed(0)
    config = FederationConfig(
        rounds=rounds, local_epochs=2, batch_size=32, accelerator="cpu", vectorize=vectorize, precision=precision
    )
    data = DigitsFederated(num_clients=num_clients, partition=partition)
    return Federation(data, OrdinaryModule(**module), algorithm or FedAvg(), config)


def train_alone(fed: Federation, client: int, round: int, start: torch.Tensor, rates: list[float]) -> torch.Tensor:
    """A plain PyTorch loop on a copy of the network: the client's batches in the client's order, SGD with momentum
    0.9 at the given learning rate of each step; returns the trained parameters, flattened in module order."""
    net = copy.deepcopy(fed.module.net)
    flat_params = start[fed.flat.parameter_mask()]
    offset = 0
    for p in net.parameters():
        p.data.copy_(flat_params[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    buffers = start[~fed.flat.parameter_mask()]
    offset = 0
    for b in (b for b in net.buffers() if b.is_floating_point()):
        b.copy_(buffers[offset : offset + b.numel()].view_as(b))
        offset += b.numel()
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=rates[0], momentum=0.9)
    x, y = fed.data.train.client(client)
    seed = fed.server.random.client_seed(round, client)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    step = 0
    for _ in range(fed.config.local_epochs):
        order = torch.randperm(len(y), generator=generator)
        for begin in range(0, len(y), 32):
            rows = order[begin : begin + 32]
            batch_x, batch_y = fed.transform((x[rows], y[rows]), 0)
            loss = nn.functional.cross_entropy(net(batch_x), batch_y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.param_groups[0]["lr"] = rates[step]
            optimizer.step()
            step += 1
    return torch.cat([p.detach().flatten() for p in net.parameters()])


# -- the learning-rate schedule --------------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_an_epoch_scheduler_steps_once_per_round_as_steplr_does(vectorize):
    fed = federation(vectorize=vectorize, rounds=4, batch_norm=False)
    logged = [fed.run_round(r).scalars["train/lr"] for r in range(1, 5)]
    assert logged == pytest.approx([0.1 * 0.5 ** (r - 1) for r in range(1, 5)])  # StepLR(step_size=1, gamma=0.5)
    start = fed.algorithm.models[0]
    steps = fed.config.local_epochs * math.ceil(fed.data.train.size(2) / 32)
    trained = fed.execution.train(5, [2]).params[0][fed.flat.parameter_mask()]
    torch.testing.assert_close(trained, train_alone(fed, 2, 5, start, [0.1 * 0.5**4] * steps), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_a_step_scheduler_steps_after_every_local_step_and_starts_afresh_each_round(vectorize):
    fed = federation(
        vectorize=vectorize,
        rounds=2,
        batch_norm=False,
        gamma=0.9,
        interval="step",
        partition=QuantitySkew(alpha=0.5, min_size=40),
    )
    fed.run_round(1)
    start = fed.algorithm.models[0]
    trained = fed.execution.train(2, [0, 1, 2, 3]).params[:, fed.flat.parameter_mask()]
    for client in range(4):  # clients of different sizes: each steps through the schedule at its own pace
        steps = fed.config.local_epochs * math.ceil(fed.data.train.size(client) / 32)
        expected = train_alone(fed, client, 2, start, [0.1 * 0.9**k for k in range(steps)])
        torch.testing.assert_close(trained[client], expected, atol=1e-5, rtol=1e-4)


# -- what training_step logs -------------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_logged_values_are_per_client_means_then_a_size_weighted_mean_of_clients(vectorize):
    fed = federation(vectorize=vectorize, partition=QuantitySkew(alpha=0.5, min_size=40))
    metrics = fed.run_round(1)
    sizes = fed.data.train.sizes()
    # every sample is in exactly one batch of the last epoch, so a client's batch-size weighted mean of its
    # batches' mean label is the mean label of its training split
    by_hand = np.array([fed.data.train.client(c)[1].double().mean().item() for c in range(4)])
    assert metrics.per_client["train/label_mean"] == pytest.approx(by_hand, rel=1e-6)
    assert metrics.scalars["train/label_mean"] == pytest.approx(float((by_hand * sizes).sum() / sizes.sum()), rel=1e-6)
    accuracy = metrics.per_client["train/train_acc"]
    assert ((0 <= accuracy) & (accuracy <= 1)).all()
    assert metrics.scalars["train/train_acc"] == pytest.approx(float((accuracy * sizes).sum() / sizes.sum()), rel=1e-6)


def test_vectorized_and_sequential_training_log_the_same_values_per_client():
    a, b = federation(vectorize=0), federation(vectorize=4)
    logs_a, logs_b = (f.execution.train(1, [0, 1, 2, 3]).logs for f in (a, b))
    assert set(logs_a) == set(logs_b) == {"train_acc", "label_mean"}
    for name in logs_a:
        torch.testing.assert_close(logs_a[name], logs_b[name], atol=1e-5, rtol=0)


# -- BatchNorm ---------------------------------------------------------------------------------------------
def test_batchnorm_trains_vectorized_with_each_clients_own_running_statistics():
    vectorized = federation(vectorize=2, partition=QuantitySkew(alpha=0.5, min_size=40))  # groups, short batches
    assert vectorized.execution.vectorized is not None and vectorized.execution.plan.reason is None
    sequential = federation(vectorize=0, partition=QuantitySkew(alpha=0.5, min_size=40))
    a, b = (f.execution.train(1, [0, 1, 2, 3]).params for f in (vectorized, sequential))
    stats = ~vectorized.flat.parameter_mask()
    assert stats.any() and not torch.equal(a[0, stats], a[1, stats])  # per client, and they moved
    torch.testing.assert_close(a[:, stats], b[:, stats], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[:, ~stats], b[:, ~stats], atol=1e-5, rtol=1e-5)


def test_fedavg_with_batchnorm_averages_the_running_statistics_by_training_set_size():
    fed = federation(FedAvg(), vectorize=0)
    updates = fed.execution.train(1, [0, 1, 2, 3])
    fed.algorithm.aggregate(1, RoundUpdates.of(updates))
    stats = fed.server.model.module_mask((nn.BatchNorm2d,)) & ~fed.flat.parameter_mask()
    assert int(stats.sum()) == 2 * 8  # running mean and variance
    sizes = torch.as_tensor(fed.data.train.sizes(), dtype=torch.float64)
    by_hand = (sizes[:, None] * updates.params[:, stats].double()).sum(0) / sizes.sum()
    torch.testing.assert_close(fed.algorithm.models[0][stats].double(), by_hand, atol=1e-6, rtol=0)


@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_fedbn_clients_keep_their_trained_batchnorm_and_share_the_rest(vectorize):
    fed = federation(FedBN(), vectorize=vectorize)
    alg = fed.algorithm
    assert torch.equal(alg.personal_mask, fed.server.model.module_mask((nn.BatchNorm2d,)))
    assert int(alg.personal_mask.sum()) == 4 * 8  # weight, bias, running mean and variance of 8 channels
    updates = fed.execution.train(1, [0, 1, 2, 3])
    alg.aggregate(1, RoundUpdates.of(updates))
    bn = alg.personal_mask
    sizes = updates.num_samples.double()
    shared_mean = (sizes[:, None] * updates.params.double()).sum(0) / sizes.sum()
    for c in range(4):
        model = alg.client_model(c)
        assert torch.equal(model[bn], updates.params[c][bn])
        torch.testing.assert_close(model[~bn].double(), shared_mean[~bn], atol=1e-6, rtol=0)


# -- precisions and the run's records ------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "bf16-true"])
def test_every_precision_runs_the_ordinary_module_vectorized(tmp_path, precision, capsys):
    args = [
        "fit",
        "--data",
        "fedlight.datamodules.DigitsFederated",
        "--data.num_clients",
        "4",
        "--model",
        "helpers.ordinary_module.OrdinaryModule",
        "--algorithm",
        "fedavg",
        "--federation.rounds",
        "2",
        "--federation.batch_size",
        "32",
        "--federation.accelerator",
        "cpu",
        "--federation.precision",
        precision,
        "--federation.vectorize",
        "4",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(tmp_path),
        "--run_name",
        "run",
    ]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["vectorized"] is True and summary["vectorized_reason"] is None
    assert math.isfinite(summary["test/acc_mean"]) and summary["test/acc_mean"] > 0.1
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["train/lr"]) for r in rows] == pytest.approx([0.1, 0.05])
    assert all(0 <= float(r["train/train_acc"]) <= 1 for r in rows)
    with (tmp_path / "run" / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    assert len(clients) == 8 and all(0 <= float(r["train/train_acc"]) <= 1 for r in clients)


def test_summary_records_why_clients_were_not_vectorized(tmp_path):
    args = [
        "fit",
        "--data",
        "fedlight.datamodules.DigitsFederated",
        "--data.num_clients",
        "3",
        "--model",
        "helpers.ordinary_module.OrdinaryModule",
        "--algorithm",
        "fedavg",
        "--federation.rounds",
        "1",
        "--federation.accelerator",
        "cpu",
        "--federation.vectorize",
        "0",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(tmp_path),
        "--run_name",
        "run",
    ]
    assert main(args) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["vectorized"] is False and summary["vectorized_reason"] == "federation.vectorize is 0"


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_half_precision_vectorized_training_stays_close_to_sequential_training(precision):
    """bf16 rounds every product, and the batched kernels round in another order: after the 20 local steps here
    the two trainers differ by about 1 % of the mean weight, where a wrong BatchNorm or optimizer would differ by
    the size of an update."""
    vectorized, sequential = federation(vectorize=4, precision=precision), federation(vectorize=0, precision=precision)
    assert vectorized.execution.vectorized is not None
    a, b = (f.execution.train(1, [0, 1, 2, 3]).params.float() for f in (vectorized, sequential))
    start = vectorized.algorithm.models[0].float()
    assert (a - b).abs().mean() < 0.05 * (b - start).abs().mean()  # far below one round's movement
