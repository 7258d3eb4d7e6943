"""Round extensions: the documented example runs as printed, every hook is called at its point of the set-up and
of the round with what it answers landing in the round's record and the checkpoint, and two extensions of one
checkpoint name are refused."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlight import Federation, FederationConfig, RoundExtension
from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.engine.extensions import RoundExtensions
from fedlight.models import Classifier, SmallCNN

DOC = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()


def federation(extensions: list[RoundExtension], num_clients: int = 4, rounds: int = 2) -> Federation:
    """Digits in 2 rotation clusters, a narrow CNN, clients trained one at a time, FedAvg of every client."""
    torch.manual_seed(0)
    model = Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1)
    data = DigitsFederated(num_clients=num_clients, partition=Rotations(2))
    config = FederationConfig(rounds=rounds, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0)
    return Federation(data, model, FedAvg(), config, seed=0, extensions=extensions)


def documented_extension() -> type[RoundExtension]:
    section = DOC.split("\n## Round extensions\n", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    exec(compile(re.search(r"```python\n(.*?)```", section, re.S).group(1), "docs/architecture.md", "exec"), namespace)
    return namespace["LargestUpdate"]


def test_the_documented_extension_logs_the_largest_update_norm_the_clients_send():
    fed = federation([documented_extension()()], rounds=1)
    honest = federation([], rounds=1).execution.train(1, [0, 1, 2, 3])  # the same clients, trained alike
    result = fed.run_round(1)
    assert result.scalars["updates/largest_norm"] == pytest.approx(float(honest.deltas.norm(dim=1).max()), rel=1e-6)


class Recorder(RoundExtension):
    """Records every hook call; clients send back their start (no update), the run stops after round 2."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.rounds_ended = 0

    def prepare_data(self, data):
        self.calls.append("prepare_data")
        return data

    def aggregation(self, aggregation):
        self.calls.append("aggregation")
        return aggregation

    def setup(self, context):
        self.calls.append("setup")
        self.evaluator_ready = context.evaluator is not None

    def describe(self):
        return "recording"

    def begin_round(self, round):
        self.calls.append(f"begin_round {round}")

    def tamper(self, round, clients, starts, params):
        self.calls.append(f"tamper {round} {clients}")
        return starts.clone()

    def end_round(self, round, selected):
        self.calls.append(f"end_round {round}")
        self.rounds_ended += 1
        return {"recorder/selected": float(selected)}, ("enough rounds" if round == 2 else None)

    def cluster_scores(self, clusters):
        self.calls.append("cluster_scores")
        return {"cluster/recorded": float(clusters is None)}

    def client_columns(self):
        self.calls.append("client_columns")
        return {"recorded": np.arange(4.0)}

    def evaluate(self, round, models, clusters):
        self.calls.append("evaluate")
        return {"recorder/groups": float(len(torch.unique(models[1])))}, {"recorded_held_out": np.array([7.0])}

    def state_dict(self):
        return {"rounds_ended": self.rounds_ended}

    def load_state_dict(self, state):
        self.rounds_ended = state["rounds_ended"]


def test_every_hook_is_called_at_its_point_and_its_answers_land_in_the_round_result():
    recorder = Recorder()
    fed = federation([recorder])
    assert recorder.calls == ["prepare_data", "aggregation", "setup"] and recorder.evaluator_ready
    assert fed.describe_threats() == "; recording" and fed.extension(Recorder) is recorder
    initial = fed.algorithm.models.clone()
    first = fed.run_round(1)
    # FedAvg streams its 4 clients as one group: one tamper call, between begin_round and end_round
    assert recorder.calls[3:] == [
        "begin_round 1",
        "tamper 1 [0, 1, 2, 3]",
        "end_round 1",
        "cluster_scores",
        "client_columns",
        "evaluate",
    ]
    assert torch.equal(fed.algorithm.models, initial)  # every client sent its start: the mean of equal rows is it
    assert first.logged["recorder/selected"] == 4.0 and first.clustering == {"cluster/recorded": 1.0}
    assert first.evaluation["recorder/groups"] == 1.0  # FedAvg evaluates every client with its one model
    assert first.per_client["recorded"].tolist() == [0, 1, 2, 3]
    assert first.newcomers["recorded_held_out"].tolist() == [7.0] and first.stop_reason is None
    assert fed.run_round(2).stop_reason == "enough rounds"
    state = fed.state_dict()
    assert state["recorder"] == {"rounds_ended": 2}
    again = Recorder()
    federation([again]).load_state_dict(state)
    assert again.rounds_ended == 2


def test_two_extensions_of_one_checkpoint_name_are_refused_in_one_line():
    with pytest.raises(ValueError, match="share the checkpoint name 'recorder': give each its own `name`"):
        RoundExtensions([Recorder(), Recorder()])
