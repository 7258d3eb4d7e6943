"""`federation.vectorize: -1` times both trainers on the same work in the first round and keeps the faster one, never
a trainer that gives other models; the choice is recorded and survives a resume."""
from __future__ import annotations

import time

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedprox import FedProx
from fedlight.datamodules import DigitsFederated, QuantitySkew
from fedlight.models import MLP, Classifier
from fedlight.training.probe import AGREEMENT, probe
from fedlight.training.vectorized import VectorizedTrainer
from fedlight.training.sequential import ClientTrainer


def federation(algorithm=None, batch_size: int = 10, vectorize: int = -1) -> Federation:
    torch.manual_seed(0)
    model = Classifier(MLP(64, [32], 10), lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=3, local_epochs=1, batch_size=batch_size, accelerator="cpu", vectorize=vectorize)
    data = DigitsFederated(num_clients=5, partition=QuantitySkew(alpha=0.5, min_size=30))
    return Federation(data, model, algorithm or FedAvg(), config)


def slowed(cls, method: str, monkeypatch, seconds: float = 0.05) -> None:
    """Make one trainer `seconds` slower per call."""
    real = getattr(cls, method)

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, slow)


def test_auto_keeps_the_vectorized_trainer_when_it_is_faster(monkeypatch):
    slowed(ClientTrainer, "fit", monkeypatch)
    fed = federation()
    fed.execution.train(1, list(range(5)))
    probe = fed.execution.probe_result
    assert probe.choice == "vectorized" and fed.execution.vectorized is not None and fed.execution.plan.reason is None
    assert probe.vectorized_s < probe.sequential_s and probe.clients == 5 and probe.steps >= 1


def test_auto_trains_one_client_at_a_time_when_that_is_faster(monkeypatch):
    slowed(VectorizedTrainer, "fit_many", monkeypatch, seconds=0.5)
    fed = federation()
    updates = fed.execution.train(1, list(range(5)))
    probe = fed.execution.probe_result
    assert probe.choice == "sequential" and fed.execution.vectorized is None
    assert probe.sequential_s < probe.vectorized_s and "faster in the probe" in fed.execution.plan.reason
    alone = torch.stack([fed.algorithm.train_client(1, c, updates.starts[c])[0] for c in range(5)])
    assert torch.equal(updates.params, alone)  # the round itself trained sequentially


def test_auto_never_keeps_a_vectorized_trainer_that_gives_other_models(monkeypatch):
    slowed(ClientTrainer, "fit", monkeypatch)  # vectorized would be faster ...
    real = VectorizedTrainer.fit_many

    def wrong(self, starts, *args, **kwargs):  # ... but it is wrong
        trained = real(self, starts, *args, **kwargs)
        trained.params = starts + 2 * (trained.params - starts)
        return trained

    monkeypatch.setattr(VectorizedTrainer, "fit_many", wrong)
    fed = federation()
    fed.execution.train(1, list(range(5)))
    assert fed.execution.probe_result.choice == "sequential" and fed.execution.probe_result.difference > AGREEMENT
    assert "other models" in fed.execution.plan.reason


@pytest.mark.parametrize("batch_size", [10, 64])
@pytest.mark.parametrize("algorithm", [FedAvg, lambda: FedProx(mu=0.1)], ids=["fedavg", "fedprox"])
def test_whichever_trainer_auto_keeps_gives_the_models_of_sequential_training(batch_size, algorithm):
    auto, sequential = federation(algorithm(), batch_size), federation(algorithm(), batch_size, vectorize=0)
    a, b = (f.execution.train(1, list(range(5))) for f in (auto, sequential))
    assert auto.execution.probe_result.difference <= AGREEMENT
    torch.testing.assert_close(a.params, b.params, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.train_loss, b.train_loss, atol=1e-5, rtol=1e-4)


def test_the_choice_is_part_of_the_checkpoint(monkeypatch):
    slowed(VectorizedTrainer, "fit_many", monkeypatch, seconds=0.5)
    fed = federation()
    fed.run_round(1)
    state = fed.state_dict()
    monkeypatch.undo()
    resumed = federation()
    resumed.load_state_dict(state)  # no new probe: the resumed run trains as the interrupted one did
    assert resumed.execution.probe_result == fed.execution.probe_result and resumed.execution.vectorized is None
    assert resumed.execution.plan.reason == fed.execution.plan.reason


def test_the_same_config_on_the_same_machine_takes_the_remembered_choice(monkeypatch):
    with monkeypatch.context() as patch:
        slowed(ClientTrainer, "fit", patch)  # sequential slow: the first run chooses vectorized
        first = federation()
        first.execution.train(1, list(range(5)))
    assert first.execution.probe_result.choice == "vectorized" and not first.execution.probe_result.remembered
    with monkeypatch.context() as patch:
        slowed(VectorizedTrainer, "fit_many", patch, seconds=0.5)  # a fresh probe would now choose sequential ...
        again = federation()
        again.execution.train(1, list(range(5)))
        other_batch = federation(batch_size=64)
        other_batch.execution.train(1, list(range(5)))
    remembered = again.execution.probe_result
    assert remembered.remembered and remembered.choice == "vectorized"  # ... but the machine remembers
    assert {k: v for k, v in remembered.as_dict().items() if k != "remembered"} == \
        {k: v for k, v in first.execution.probe_result.as_dict().items() if k != "remembered"}
    assert not other_batch.execution.probe_result.remembered  # another batch size is measured anew
    assert other_batch.execution.probe_result.choice == "sequential"


def test_a_model_with_dropout_is_compared_like_with_like_and_vectorizes_when_faster(monkeypatch):
    """The two trainers draw other dropout masks; the probe switches dropout off, so their models agree and the
    faster trainer is kept (before, every model with dropout trained sequentially, blamed on 'other models')."""
    slowed(ClientTrainer, "fit", monkeypatch)
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                  torch.nn.Linear(32, 10))
    config = FederationConfig(rounds=1, local_epochs=1, batch_size=10, accelerator="cpu", vectorize=-1)
    data = DigitsFederated(num_clients=5, partition=QuantitySkew(alpha=0.5, min_size=30))
    fed = Federation(data, Classifier(network, lr=0.05), FedAvg(), config)
    fed.execution.train(1, list(range(5)))
    result = fed.execution.probe_result
    assert result.difference <= AGREEMENT and result.choice == "vectorized"
    assert [m.p for m in network.modules() if isinstance(m, torch.nn.Dropout)] == [0.5]  # restored after the probe


def test_the_probe_spends_a_small_share_of_a_short_round(monkeypatch):
    """20 clients of one step each: the old probe trained 981 client steps (7 rounds' worth of 140) before the
    round; now the warm-ups and the timed repeats stay within PROBE_SHARE of the round, fewer clients when needed."""
    import fedlight.training.probe as probe_module

    monkeypatch.setattr(probe_module, "PROBE_FLOOR_S", 0.0)
    work = {"sequential": 0, "vectorized": 0}
    step_s = 0.004

    def trainer(name):
        def train(starts, data):
            client_steps = sum(-(-len(y) // 10) for _, y in data)
            work[name] += client_steps
            time.sleep(step_s * client_steps)
            return starts + 1
        return train

    starts = torch.zeros(20, 3)
    data = [(torch.zeros(70, 1), torch.zeros(70)) for _ in range(20)]  # 7 batches of 10 each
    round_steps = 140
    result = probe_module.probe(starts, data, 10, trainer("sequential"), trainer("vectorized"), torch.device("cpu"),
                                round_steps)
    spent = work["sequential"] + work["vectorized"]
    assert spent <= 1.5 * probe_module.PROBE_SHARE * round_steps, work  # sleeps overshoot a little, so 1.5x
    assert result.clients >= 2 and result.steps >= 1
    work.update(sequential=0, vectorized=0)
    probe_module.probe(starts, data, 10, trainer("sequential"), trainer("vectorized"), torch.device("cpu"))
    assert work["sequential"] + work["vectorized"] > 5 * round_steps  # unbounded, as before: the full probe


def test_the_probe_stops_timing_once_one_trainer_is_clearly_slower():
    calls = {"sequential": 0, "vectorized": 0}

    def trainer(name, seconds):
        def train(starts, data):
            calls[name] += 1
            time.sleep(seconds)
            return starts + 1
        return train

    starts = torch.zeros(4, 3)
    data = [(torch.zeros(20, 1), torch.zeros(20)) for _ in range(4)]
    result = probe(starts, data, 10, trainer("sequential", 0.02), trainer("vectorized", 0.0), torch.device("cpu"))
    assert result.choice == "vectorized"
    assert calls == {"sequential": 2, "vectorized": 2}  # a warm-up and one timed repeat each, not 1 + 3
