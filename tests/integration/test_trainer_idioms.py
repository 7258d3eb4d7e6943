"""Modules that read their Trainer, as Lightning's documentation writes them, run unchanged as clients, one after
another and vectorized: `OneCycleLR(total_steps=self.trainer.estimated_stepping_batches)`, `self.trainer.max_epochs`,
`self.current_epoch` and `self.global_step` in `training_step`, `self.trainer.num_devices`; each value is checked
against the number worked out by hand from the clients' sizes, and an attribute with no meaning in a federated run
stops it with one line naming it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated, QuantitySkew
from fedlight.plugin.data import ClientSplit, FederatedData
from fedlight.run.cli import main
from fedlight.training.trainer_stand_in import TrainerAttributeError, TrainerStandIn

from helpers.ordinary_module import OrdinaryModule
from helpers.schedules import one_cycle_rates

BATCH = 32


class OneCycleModule(OrdinaryModule):
    """Lightning's OneCycleLR idiom, stepping after every optimizer step."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        self.total_steps = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class OneCycleEveryEpoch(OrdinaryModule):
    """The example of Lightning's `estimated_stepping_batches` docstring: the scheduler at its default interval."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        total_steps = self.trainer.estimated_stepping_batches
        return [optimizer], [torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=total_steps)]


class SmoothingRamp(OrdinaryModule):
    """Uses `self.current_epoch / self.trainer.max_epochs` in its loss: label smoothing rising over the epochs."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        smoothing = 0.1 * self.current_epoch / self.trainer.max_epochs
        self.log("smoothing", smoothing)
        return F.cross_entropy(self(x), y, label_smoothing=smoothing)


class StepCounter(OrdinaryModule):
    """Logs `self.current_epoch` and `self.global_step` in every step and keeps what it saw."""

    def configure_optimizers(self):
        self.at_setup = (self.current_epoch, self.global_step)
        self.seen: list[tuple[int, int, int]] = []
        return super().configure_optimizers()

    def training_step(self, batch, batch_idx):
        self.log("epoch", float(self.current_epoch))
        self.log("global_step", float(self.global_step))
        self.seen.append((self.current_epoch, self.global_step, batch_idx))
        return super().training_step(batch, batch_idx)


class ScalesByDevices(OrdinaryModule):
    """The linear scaling rule: the learning rate times the devices, read with the ranks and the logger."""

    def configure_optimizers(self):
        self.read = (
            self.trainer.num_devices,
            self.global_rank,
            self.local_rank,
            self.trainer.is_global_zero,
            self.logger,
        )
        return torch.optim.SGD(self.parameters(), lr=self.lr * self.trainer.num_devices)


class ReadsDatamodule(OrdinaryModule):
    def configure_optimizers(self):
        self.trainer.datamodule.train_dataloader()
        return super().configure_optimizers()


class ReadsMaxSteps(OrdinaryModule):
    def training_step(self, batch, batch_idx):
        if self.global_step >= self.trainer.max_steps:
            raise RuntimeError("unreachable: max_steps has no value here")
        return super().training_step(batch, batch_idx)


def federation(module_type: type[OrdinaryModule], vectorize: int, rounds: int = 2, local_epochs: int = 2) -> Federation:
    """4 digits clients of different sizes training a module of `module_type` (no BatchNorm) with FedAvg."""
    torch.manual_seed(0)
    module = module_type(batch_norm=False)
    config = FederationConfig(
        rounds=rounds, local_epochs=local_epochs, batch_size=BATCH, accelerator="cpu", vectorize=vectorize
    )
    data = DigitsFederated(num_clients=4, partition=QuantitySkew(alpha=0.5, min_size=40))
    return Federation(data, module, FedAvg(), config)


def batches(n: int) -> int:
    return math.ceil(n / BATCH)


# -- estimated_stepping_batches ---------------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_one_cycle_over_estimated_stepping_batches_runs_one_whole_cycle_each_round(vectorize):
    fed = federation(OneCycleModule, vectorize, rounds=3)
    sizes = fed.data.train.sizes()
    assert len(set(sizes)) == 4  # clients of different sizes
    steps = batches(max(sizes)) * 2  # the largest client's batches times the local epochs
    assert fed.module.total_steps == steps
    logged = [fed.run_round(r).scalars["train/lr"] for r in range(1, 4)]
    # train/lr is the mean rate of the round's longest client, here one whole cycle of a fresh OneCycleLR
    by_hand = one_cycle_rates(steps)
    assert max(by_hand) > 0.49 and by_hand[-1] < 1e-4  # up to max_lr and down again
    assert logged == pytest.approx([sum(by_hand) / steps] * 3)
    assert torch.isfinite(fed.algorithm.models).all()


def test_lightnings_one_cycle_example_stepping_once_per_round_is_refused_at_set_up_when_rounds_outlast_it():
    probe = federation(OrdinaryModule, 0, rounds=1, local_epochs=1)
    steps = batches(max(probe.data.train.sizes()))
    federation(OneCycleEveryEpoch, 0, rounds=steps + 1, local_epochs=1)  # steps once per round
    with pytest.raises(
        ValueError,
        match=rf"OneCycleLR \(interval 'epoch'\) cannot step again in round {steps + 1}.*"
        rf"build it for {steps + 1} rounds.*'interval': 'step'",
    ):
        federation(OneCycleEveryEpoch, 0, rounds=steps + 2, local_epochs=1)


# -- max_epochs, current_epoch, global_step ---------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_max_epochs_is_the_local_epochs_and_current_epoch_the_local_epoch(vectorize):
    fed = federation(SmoothingRamp, vectorize, local_epochs=3)
    result = fed.run_round(1)
    # a client's logged value is its mean over the last local epoch: 0.1 * 2 / 3 at every step of it
    assert result.per_client["train/smoothing"] == pytest.approx([0.1 * 2 / 3] * 4)


def test_a_loss_that_uses_the_epoch_trains_the_same_models_one_after_another_and_vectorized():
    sequential, vectorized = (federation(SmoothingRamp, v, local_epochs=2) for v in (0, 4))
    a, b = (f.execution.train(1, [0, 1, 2, 3]).params for f in (sequential, vectorized))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_global_step_counts_the_runs_steps_and_current_epoch_the_local_epoch(vectorize):
    fed = federation(StepCounter, vectorize, rounds=2, local_epochs=2)
    module = fed.module
    assert module.at_setup == (0, 0)
    sizes = [int(n) for n in fed.data.train.sizes()]
    per_epoch = batches(max(sizes))
    per_round = 2 * per_epoch
    fed.run_round(1)
    module.seen.clear()
    result = fed.run_round(2)
    for client, n in enumerate(sizes):
        # the last local epoch (1) of round 2: global step (2 - 1) * per_round + 1 * per_epoch + k at batch k,
        # averaged with the batch sizes as weights
        weights = [min(BATCH, n - BATCH * k) for k in range(batches(n))]
        by_hand = per_round + per_epoch + sum(k * w for k, w in enumerate(weights)) / n
        assert result.per_client["train/global_step"][client] == pytest.approx(by_hand)
        assert result.per_client["train/epoch"][client] == 1
    # every step of round 2 saw its own place, and nothing but plain ints
    expected = {(e, per_round + e * per_epoch + k, k) for e in range(2) for k in range(batches(max(sizes)))}
    assert set(module.seen) == expected
    assert all(type(value) is int for seen in module.seen for value in seen)


def test_a_custom_group_loop_sees_the_place_of_each_step_it_draws():
    fed = federation(StepCounter, 0, rounds=3, local_epochs=2)
    per_epoch = batches(max(fed.data.train.sizes()))
    for step in fed.server.clients.group_batches(3, [0, 1], epochs=2):
        assert (fed.module.current_epoch, fed.module.global_step) == (
            step.epoch,
            2 * (2 * per_epoch) + step.epoch * per_epoch + step.step,
        )
    for epoch, step, _ in fed.server.clients.batches(2, 3):
        assert fed.module.global_step == 2 * per_epoch + epoch * per_epoch + step


def test_the_largest_client_counts_the_held_out_clients_too():
    def split(sizes: list[int]) -> ClientSplit:
        n = sum(sizes)
        return ClientSplit(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), [0, *np.cumsum(sizes).tolist()])

    def data(sizes: list[int], newcomers: FederatedData | None = None) -> FederatedData:
        return FederatedData(split(sizes), split(sizes), split(sizes), num_classes=2, newcomers=newcomers)

    assert data([30, 70, 50]).largest_training_split() == 70
    assert data([30, 70, 50], newcomers=data([90, 10])).largest_training_split() == 90


# -- processes ------------------------------------------------------------------------------------------------
def test_one_process_is_one_device_rank_zero_with_no_logger():
    fed = federation(ScalesByDevices, 0)
    assert fed.module.read == (1, 0, 0, True, None)
    assert fed.execution.trainer.raw_optimizer.param_groups[0]["lr"] == 0.1


def test_num_devices_are_the_processes_of_one_node_and_global_step_the_runs_clock():
    fabric = SimpleNamespace(world_size=4, global_rank=3, local_rank=1, node_rank=1)
    trainer = TrainerStandIn.of_run(fabric, num_nodes=2, local_epochs=2, batch_size=32, largest_client=70)
    assert (trainer.num_devices, trainer.num_training_batches, trainer.estimated_stepping_batches) == (2, 3, 6)
    assert not trainer.is_global_zero and (trainer.global_rank, trainer.local_rank) == (3, 1)
    trainer.at(round=3, epoch=1, batch_idx=2)
    assert (trainer.current_epoch, trainer.global_step) == (1, 2 * 6 + 1 * 3 + 2)


# -- what has no meaning here ---------------------------------------------------------------------------------
def test_an_attribute_with_no_meaning_is_one_error_naming_it_and_getattr_keeps_its_default():
    with pytest.raises(
        TrainerAttributeError,
        match=r"^self\.trainer\.datamodule has no meaning in a federated run: "
        r"the clients' data are tensors",
    ) as error:
        federation(ReadsDatamodule, 0)
    assert "\n" not in str(error.value) and "estimated_stepping_batches" in str(error.value)
    assert getattr(TrainerStandIn(1, 1), "datamodule", None) is None


def test_an_attribute_with_no_meaning_read_under_vmap_stops_the_run_instead_of_falling_back(recwarn):
    fed = federation(ReadsMaxSteps, 4)
    with pytest.raises(TrainerAttributeError, match=r"self\.trainer\.max_steps has no meaning"):
        fed.run_round(1)
    assert not [w for w in recwarn if "vectorized training is off" in str(w.message)]


def test_the_command_line_prints_an_attribute_with_no_meaning_in_one_line(tmp_path, capsys):
    args = [
        "fit",
        "--data",
        "fedlight.datamodules.DigitsFederated",
        "--data.num_clients",
        "3",
        "--model",
        "test_trainer_idioms.ReadsDatamodule",
        "--algorithm",
        "fedavg",
        "--federation.rounds",
        "1",
        "--federation.accelerator",
        "cpu",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(tmp_path),
        "--run_name",
        "run",
    ]
    assert main(args) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("fedlight: error: self.trainer.datamodule has no meaning")
    assert not (tmp_path / "run").exists()
