"""Learning-rate schedules on the federation's clock: a round's cost does not grow with its number, a scheduler with a
fixed length built for one round's local steps runs a whole federation, `train/lr` is what clients trained at, and a
scheduler that is too short is named with its fix."""

from __future__ import annotations

import math

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated
from fedlight.training.schedules import LearningRates, Scheduler

from helpers.ordinary_module import OrdinaryModule
from helpers.schedules import one_cycle_rates


class OneCycle(OrdinaryModule):
    """The ordinary module with OneCycleLR stepping after every local step, for `total_steps` steps."""

    def __init__(self, total_steps: int = 10) -> None:
        super().__init__(batch_norm=False)
        self.total_steps = total_steps

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def federation(module, rounds: int, vectorize: int = 0) -> Federation:
    torch.manual_seed(0)
    config = FederationConfig(rounds=rounds, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=vectorize)
    return Federation(DigitsFederated(num_clients=4), module, FedAvg(), config)


def counted_rates(interval: str) -> tuple[LearningRates, list[int]]:
    """LearningRates over a StepLR whose `step` calls are counted."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    calls = [0]
    step = scheduler.step

    def counting(*args, **kwargs):
        calls[0] += 1
        return step(*args, **kwargs)

    scheduler.step = counting
    return LearningRates(optimizer, [Scheduler(scheduler, interval)]), calls


def test_a_step_schedules_round_costs_the_same_in_round_30_as_in_round_2():
    rates, calls = counted_rates("step")
    per_round = []
    for round in range(1, 31):
        before = calls[0]
        rates.round_rate(round, 20)  # what the engine asks first ...
        rates.rates(round, 20)  # ... and what the trainers ask
        rates.rates(round, 7)  # a smaller client
        per_round.append(calls[0] - before)
    assert per_round[1] == per_round[-1] == 19  # 20 recorded rates need 19 steps, every round


def test_an_epoch_schedule_steps_once_per_finished_round_and_no_more():
    rates, calls = counted_rates("epoch")
    rates.rates(30, 50)
    assert calls[0] == 29
    assert rates.rates(30, 3) == [[pytest.approx(0.99**29)]] * 3


@pytest.mark.parametrize("vectorize", [0, 4], ids=["sequential", "vectorized"])
def test_one_cycle_built_for_one_rounds_local_steps_runs_every_round(vectorize):
    probe = federation(OneCycle(), rounds=1)
    steps = max(math.ceil(probe.data.train.size(c) / 32) for c in range(4))
    fed = federation(OneCycle(total_steps=steps), rounds=8, vectorize=vectorize)
    logged = [fed.run_round(r).scalars["train/lr"] for r in range(1, 9)]
    # the mean of OneCycleLR's rates over one round's steps, worked out from a fresh scheduler of the same shape
    by_hand = one_cycle_rates(steps)
    assert logged == pytest.approx([sum(by_hand) / steps] * 8)
    assert logged[0] != pytest.approx(by_hand[0])  # not the initial rate: what clients trained at
    assert torch.isfinite(fed.algorithm.models).all()


def test_a_scheduler_too_short_for_a_round_is_named_with_the_steps_it_needs():
    probe = federation(OneCycle(), rounds=1)
    steps = max(math.ceil(probe.data.train.size(c) / 32) for c in range(4))
    with pytest.raises(
        ValueError,
        match=rf"OneCycleLR \(interval 'step'\) cannot step again in round 1.*"
        rf"total_steps={steps}",
    ):
        federation(OneCycle(total_steps=steps - 2), rounds=1)  # refused at set-up, before any training
