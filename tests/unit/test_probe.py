"""`federation.vectorize: -1` times both trainers on round 1's own training (part of the first group one client at a
time, the rest vectorized) and keeps the faster one, never a trainer that gives other models; nothing is trained
twice; the choice is recorded, remembered on the machine and survives a resume."""

from __future__ import annotations

import math

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.apfl import APFL
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedprox import FedProx
from fedlight.datamodules import DigitsFederated, QuantitySkew
from fedlight.models import MLP, Classifier
import fedlight.training.probe as probe_module
from fedlight.training.probe import AGREEMENT, decide, sequential_share, step_seconds
from fedlight.training.vectorized import VectorizedTrainer
from fedlight.training.sequential import ClientTrainer


def federation(algorithm=None, batch_size: int = 10, vectorize: int = -1, network=None) -> Federation:
    torch.manual_seed(0)
    model = Classifier(network or MLP(64, [32], 10), lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=3, local_epochs=1, batch_size=batch_size, accelerator="cpu", vectorize=vectorize)
    data = DigitsFederated(num_clients=5, partition=QuantitySkew(alpha=0.5, min_size=30))
    return Federation(data, model, algorithm or FedAvg(), config)


def client_steps(trainer, args) -> int:
    """Client steps of one call: `fit(start, x, y, ...)` or `fit_many(starts, data, ...)`."""
    ys = [args[2]] if isinstance(trainer, ClientTrainer) else [y for _, y in args[1]]
    return sum(-(-len(y) // trainer.batch_size) for y in ys)


class FakeClock:
    """The probe's clock (`fedlight.training.probe.time`), moved only by `slowed` trainers: the decision then depends
    on the costs a test sets, not on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(probe_module, "time", fake)
    return fake


def slowed(cls, method: str, monkeypatch, seconds: float = 0.005) -> None:
    """Make one trainer `seconds` slower per client step on the probe's clock."""
    real = getattr(cls, method)

    def slow(self, *args, **kwargs):
        probe_module.time.now += seconds * client_steps(self, args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, slow)


def one_by_one(fed: Federation, round: int, starts: torch.Tensor) -> torch.Tensor:
    """Every client of the 5 trained alone from its start, as `vectorize: 0` trains them."""
    return torch.stack([fed.algorithm.train_client(round, c, starts[c])[0] for c in range(5)])


def test_the_split_and_the_step_time_worked_by_hand():
    assert [sequential_share(n) for n in (1, 2, 3, 5, 8, 15, 20)] == [1, 1, 2, 2, 2, 4, 5]
    assert step_seconds([0.5, 0.1, 0.3], [2, 2, 4]) == pytest.approx(0.4 / 6)  # the first (warm-up) client left out
    assert step_seconds([0.5], [5]) == pytest.approx(0.1)
    assert decide(2, 3, 0.010, 0.004, 0.0).choice == "vectorized"
    assert decide(2, 3, 0.004, 0.010, 0.0).choice == "sequential"
    wrong = decide(2, 3, 0.010, 0.004, 2 * AGREEMENT)
    assert wrong.choice == "sequential" and "other models" in wrong.reason
    assert "one client per group" in decide(1, 0, 0.01, math.nan, 0.0).reason


def test_auto_keeps_the_vectorized_trainer_when_it_is_faster(monkeypatch):
    slowed(ClientTrainer, "fit", monkeypatch)
    fed = federation()
    fed.execution.train(1, list(range(5)))
    probe = fed.execution.probe_result
    assert probe.choice == "vectorized" and fed.execution.vectorized is not None and fed.execution.plan.reason is None
    assert probe.vectorized_step_s < probe.sequential_step_s
    assert (probe.sequential_clients, probe.vectorized_clients) == (2, 3)


def test_auto_trains_one_client_at_a_time_when_that_is_faster(monkeypatch):
    slowed(VectorizedTrainer, "fit_many", monkeypatch)
    fed = federation()
    updates = fed.execution.train(1, list(range(5)))
    probe = fed.execution.probe_result
    assert probe.choice == "sequential" and fed.execution.vectorized is None
    assert probe.sequential_step_s < probe.vectorized_step_s and "faster in round 1" in fed.execution.plan.reason
    alone = one_by_one(fed, 1, updates.starts)
    assert torch.equal(updates.params[:2], alone[:2])  # the probe's sequential clients, exactly
    torch.testing.assert_close(updates.params[2:], alone[2:], atol=1e-5, rtol=1e-4)  # vectorized, up to rounding
    later = fed.execution.train(2, list(range(5)))
    assert torch.equal(later.params, one_by_one(fed, 2, later.starts))  # the next round trains sequentially


def test_a_compute_bound_cpu_step_trains_one_client_at_a_time_without_trying_vectorized(monkeypatch):
    """A client step of 0.1 s one client at a time (at least COMPUTE_BOUND_S) on the CPU: the rest of round 1 and
    every later round train sequentially, the vectorized trainer never runs (no check, no warm-up), and the start
    line's reason says why; the models are sequential training's."""
    slowed(ClientTrainer, "fit", monkeypatch, seconds=0.1)
    calls: list[int] = []
    real = VectorizedTrainer.fit_many
    monkeypatch.setattr(VectorizedTrainer, "fit_many", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    fed = federation()
    updates = fed.execution.train(1, list(range(5)))
    probe = fed.execution.probe_result
    assert probe.choice == "sequential" and probe.compute_bound and probe.vectorized_clients == 0 and not calls
    assert "compute-bound" in fed.execution.plan.reason and probe.sequential_step_s == pytest.approx(0.1)
    assert torch.equal(updates.params, one_by_one(fed, 1, updates.starts))


def test_auto_never_trains_with_a_vectorized_trainer_that_gives_other_models(monkeypatch):
    slowed(ClientTrainer, "fit", monkeypatch)  # vectorized would be faster ...
    real = VectorizedTrainer.fit_many

    def wrong(self, starts, *args, **kwargs):  # ... but it is wrong
        trained = real(self, starts, *args, **kwargs)
        trained.params = starts + 2 * (trained.params - starts)
        return trained

    monkeypatch.setattr(VectorizedTrainer, "fit_many", wrong)
    fed = federation()
    updates = fed.execution.train(1, list(range(5)))
    assert fed.execution.probe_result.choice == "sequential" and fed.execution.probe_result.difference > AGREEMENT
    assert "other models" in fed.execution.plan.reason
    monkeypatch.undo()
    assert torch.equal(updates.params, one_by_one(fed, 1, updates.starts))  # the check ran before any real training


def test_round_one_trains_every_client_once_plus_the_one_step_check(monkeypatch):
    """The probe's timing is the round's own training: the client steps trained in round 1 are each client's local
    steps (ceil(samples / batch), counted here from the data) plus the check: 1 step of each of the 3 clients about to
    train vectorized, and of 2 of them one after another."""
    steps = {"sequential": 0, "vectorized": 0}
    real_fit, real_many = ClientTrainer.fit, VectorizedTrainer.fit_many

    def fit(self, start, x, y, *args, **kwargs):
        steps["sequential"] += -(-len(y) // 10)
        return real_fit(self, start, x, y, *args, **kwargs)

    def fit_many(self, starts, data, *args, **kwargs):
        steps["vectorized"] += sum(-(-len(y) // 10) for _, y in data)
        return real_many(self, starts, data, *args, **kwargs)

    monkeypatch.setattr(ClientTrainer, "fit", fit)
    monkeypatch.setattr(VectorizedTrainer, "fit_many", fit_many)
    fed = federation()
    fed.execution.train(1, list(range(5)))
    sizes = fed.server.clients.train_sizes.tolist()
    local = [-(-int(n) // 10) for n in sizes]
    assert steps == {"sequential": sum(local[:2]) + 2, "vectorized": sum(local[2:]) + 3}


@pytest.mark.parametrize("batch_size", [10, 64])
@pytest.mark.parametrize("algorithm", [FedAvg, lambda: FedProx(mu=0.1)], ids=["fedavg", "fedprox"])
def test_whichever_trainer_auto_keeps_gives_the_models_of_sequential_training(batch_size, algorithm):
    auto, sequential = federation(algorithm(), batch_size), federation(algorithm(), batch_size, vectorize=0)
    a, b = (f.execution.train(1, list(range(5))) for f in (auto, sequential))
    assert auto.execution.probe_result.difference <= AGREEMENT
    torch.testing.assert_close(a.params, b.params, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.train_loss, b.train_loss, atol=1e-5, rtol=1e-4)


def test_the_choice_is_part_of_the_checkpoint(monkeypatch):
    slowed(VectorizedTrainer, "fit_many", monkeypatch)
    fed = federation()
    fed.run_round(1)
    state = fed.state_dict()
    monkeypatch.undo()
    resumed = federation()
    resumed.load_state_dict(state)  # no new probe: the resumed run trains as the interrupted one did
    assert resumed.execution.probe_result == fed.execution.probe_result and resumed.execution.vectorized is None
    assert resumed.execution.plan.reason == fed.execution.plan.reason


def test_the_same_config_on_the_same_machine_takes_the_remembered_choice_and_gives_the_same_numbers(monkeypatch):
    with monkeypatch.context() as patch:
        slowed(ClientTrainer, "fit", patch)  # sequential slow: the first run chooses vectorized
        first = federation()
        measured = first.execution.train(1, list(range(5)))
    assert first.execution.probe_result.choice == "vectorized" and not first.execution.probe_result.remembered
    with monkeypatch.context() as patch:
        slowed(VectorizedTrainer, "fit_many", patch)  # a fresh probe would now choose sequential ...
        again = federation()
        recalled = again.execution.train(1, list(range(5)))
        other_batch = federation(batch_size=64)
        other_batch.execution.train(1, list(range(5)))
    remembered = again.execution.probe_result
    assert remembered.remembered and remembered.choice == "vectorized"  # ... but the machine remembers
    assert {k: v for k, v in remembered.as_dict().items() if k != "remembered"} == {
        k: v for k, v in first.execution.probe_result.as_dict().items() if k != "remembered"
    }
    assert torch.equal(measured.params, recalled.params)  # the same clients trained each way: the same numbers
    assert not other_batch.execution.probe_result.remembered  # another batch size is measured anew
    assert other_batch.execution.probe_result.choice == "sequential"


def test_a_model_with_dropout_is_compared_like_with_like_and_vectorizes_when_faster(monkeypatch):
    """The two trainers draw other dropout masks; the check switches dropout off, so their models agree and the
    faster trainer is kept (before, every model with dropout trained sequentially, blamed on 'other models')."""
    slowed(ClientTrainer, "fit", monkeypatch)
    network = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 10)
    )
    fed = federation(network=network)
    fed.execution.train(1, list(range(5)))
    result = fed.execution.probe_result
    assert result.difference <= AGREEMENT and result.choice == "vectorized"
    assert [m.p for m in network.modules() if isinstance(m, torch.nn.Dropout)] == [0.5]  # restored after the check


def test_the_probe_s_two_parts_join_in_order_and_a_log_one_part_lacks_is_nan():
    from fedlight.training.sequential import Trained

    one = Trained(torch.ones(1, 2), torch.tensor([0.5]), {"acc": torch.tensor([0.9])})
    two = Trained(torch.zeros(2, 2), torch.tensor([0.1, 0.2]))
    joined = Trained.cat([one, two])
    assert joined.params.tolist() == [[1, 1], [0, 0], [0, 0]] and joined.loss.tolist() == pytest.approx([0.5, 0.1, 0.2])
    assert joined.logs["acc"][0].item() == pytest.approx(0.9) and joined.logs["acc"][1:].isnan().all()


def slowed_group_step(cls, method: str, monkeypatch, seconds: float = 0.005) -> None:
    """One trainer's group-loop step (`loss_and_grad` of one model, `loss_and_grads` of k) `seconds` slower per
    model on the probe's clock."""
    real = getattr(cls, method)

    def slow(self, params, *args, **kwargs):
        probe_module.time.now += seconds * (len(params) if params.dim() == 2 else 1)
        return real(self, params, *args, **kwargs)

    monkeypatch.setattr(cls, method, slow)


def group_loop_round(vectorize: int) -> Federation:
    """APFL (a group loop: `group_batches` and `group_loss_and_grad`, no `train_many`) after one round."""
    fed = federation(APFL(alpha=0.3), vectorize=vectorize)
    fed.run_round(1)
    return fed


def test_a_group_loop_under_auto_is_probed_and_keeps_the_vectorized_step_when_it_is_faster(monkeypatch):
    slowed_group_step(ClientTrainer, "loss_and_grad", monkeypatch)
    fed = group_loop_round(-1)
    probe = fed.execution.probe_result
    assert probe.choice == "vectorized" and probe.difference <= AGREEMENT and not probe.remembered
    assert fed.execution.plan.trainer == "vectorized" and fed.execution.plan.reason is None
    assert probe.sequential_step_s == pytest.approx(0.005)  # 5 models, one step each, 5 ms apiece on the clock


def test_a_group_loop_under_auto_steps_one_model_at_a_time_when_that_is_faster_with_sequential_numbers(monkeypatch):
    """The probe leaves no trace in the numbers: dropout and the random state are put back, so a model without
    dropout ends where a run told `vectorize: 0` ends."""
    slowed_group_step(VectorizedTrainer, "loss_and_grads", monkeypatch)
    fed = group_loop_round(-1)
    assert fed.execution.probe_result.choice == "sequential" and fed.execution.vectorized is None
    assert "faster in round 1" in fed.execution.plan.reason
    assert torch.equal(fed.algorithm.models, group_loop_round(0).algorithm.models)


def test_a_group_loop_takes_the_remembered_choice_on_the_same_machine(monkeypatch):
    with monkeypatch.context() as patch:
        slowed_group_step(ClientTrainer, "loss_and_grad", patch)
        first = group_loop_round(-1)
    with monkeypatch.context() as patch:
        slowed_group_step(VectorizedTrainer, "loss_and_grads", patch)  # a fresh probe would choose sequential
        again = group_loop_round(-1)
    assert again.execution.probe_result.remembered and again.execution.probe_result.choice == "vectorized"
    assert torch.equal(first.algorithm.models, again.algorithm.models)


def test_a_compute_bound_choice_is_written_to_the_summary(tmp_path, tiny_run_args, monkeypatch):
    """The probe result of a run whose steps count as compute-bound has no vectorized time and no check (NaN):
    summary.json writes them as null and says why the clients trained one after another."""
    import json

    from fedlight.run.cli import main

    monkeypatch.setattr(probe_module, "COMPUTE_BOUND_S", 0.0)
    monkeypatch.setattr("fedlight.engine.group_training.COMPUTE_BOUND_S", 0.0)
    monkeypatch.setenv("FEDLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    args = list(tiny_run_args)
    position = args.index("--federation.vectorize")
    args[position + 1] = "-1"
    assert main(args + ["--run_name", "bound"]) == 0
    summary = json.loads((tmp_path / "bound" / "summary.json").read_text())
    assert summary["plan"]["trainer"] == "sequential" and "compute-bound" in summary["plan"]["reason"]
    probe = summary["vectorize_probe"]
    assert probe["vectorized_step_s"] is None and probe["difference"] is None and probe["compute_bound"] is True


def small_cnn() -> torch.nn.Module:
    """A convolution on the digits' 1x8x8 images (the layout question arises on a CPU)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 10))


def recorded_layouts(monkeypatch, slow: bool | None = None) -> list[bool]:
    """The input layout (`channels_last_inputs`) of every vectorized call, in order; a call in the `slow` layout moves
    the probe's clock by a second."""
    real = VectorizedTrainer.fit_many
    layouts: list[bool] = []

    def fit_many(self, *args, **kwargs):
        layouts.append(self.channels_last_inputs)
        if self.channels_last_inputs == slow:
            probe_module.time.now += 1.0
        return real(self, *args, **kwargs)

    monkeypatch.setattr(VectorizedTrainer, "fit_many", fit_many)
    return layouts


@pytest.mark.parametrize("slow_channels_last", [True, False])
def test_a_convolutional_network_is_timed_in_both_input_layouts_and_keeps_the_faster(monkeypatch, slow_channels_last):
    """The check step runs in both layouts of the image batches, taking turns; the faster is recorded, trains every
    later vectorized step, is remembered on the machine and restored by a resume."""
    layouts = recorded_layouts(monkeypatch, slow=slow_channels_last)
    slowed(ClientTrainer, "fit", monkeypatch)  # vectorized is chosen
    fed = federation(network=small_cnn())
    fed.execution.train(1, list(range(5)))
    kept = not slow_channels_last
    probe = fed.execution.probe_result
    assert probe.choice == "vectorized" and probe.channels_last_inputs is kept
    checks = 2 * probe_module.LAYOUT_TRIES
    assert layouts[:checks] == [False, True] * probe_module.LAYOUT_TRIES and set(layouts[checks:]) == {kept}
    layouts.clear()
    fed.execution.train(2, list(range(5)))
    assert layouts and set(layouts) == {kept}
    again = federation(network=small_cnn())
    again.execution.train(1, list(range(5)))
    assert again.execution.probe_result.remembered and again.execution.probe_result.channels_last_inputs is kept
    resumed = federation(network=small_cnn(), vectorize=-1)
    resumed.load_state_dict(fed.state_dict())
    assert resumed.execution.training.vectorized.channels_last_inputs is kept


def test_a_network_without_convolutions_is_not_timed_in_two_layouts(monkeypatch):
    layouts = recorded_layouts(monkeypatch)
    fed = federation()
    fed.execution.train(1, list(range(5)))
    assert not fed.execution.training.vectorized.layouts_differ and layouts and not any(layouts)
    assert fed.execution.probe_result.channels_last_inputs is False
