"""Personal heads evaluated at scale: each cluster's body runs once over its clients' rows and each client's head on
their features. Every client's metrics must be those of its own whole model, computed here by a plain forward pass."""

import copy

import pytest
import torch
from torch import nn

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedper import FedPer
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.models import Classifier, SmallCNN
from fedlight.plugin.aggregation import ClientModels
from fedlight.plugin.shared_body import SharedBodyModels, client_spans

from helpers.federations import small_federation


def by_hand(fed, split: str = "test") -> tuple[list[float], list[float]]:
    """Each client's accuracy and mean cross-entropy on `split`: its whole model loaded into a copy of the network,
    run on the client's rows alone."""
    data = fed.data.split(split)
    client_of_row = data.client_of_row()
    network = copy.deepcopy(fed.module).eval()
    tensors = dict(network.named_parameters()) | dict(network.named_buffers())
    accuracy, loss = [], []
    for client in range(fed.num_clients):
        rows = client_of_row == client
        with torch.no_grad():
            for name, value in fed.flat.views(fed.algorithm.client_model(client)).items():
                tensors[name].copy_(value)
            logits = network(fed.server.data.inputs(data.x[rows]))
        y = data.y[rows]
        accuracy.append((logits.argmax(1) == y).double().mean().item())
        loss.append(nn.functional.cross_entropy(logits, y).item())
    return accuracy, loss


def two_clusters(fed) -> None:
    """Split FedPer's one model into two cluster models (clients 0-2 and 3-5), the second's body changed."""
    algorithm = fed.algorithm
    second = algorithm.models[0] + 0.05 * torch.randn_like(algorithm.models[0])
    algorithm.models = torch.stack([algorithm.models[0], second])
    algorithm.assignment = torch.tensor([0, 0, 0, 1, 1, 1])


def test_client_spans_cover_every_row_once():
    spans = client_spans(torch.tensor([3, 1, 3, 0, 1, 3]))
    assert {c: at.tolist() for c, at in spans.items()} == {0: [3], 1: [1, 4], 3: [0, 2, 5]}


def test_personal_heads_share_the_body_and_give_each_clients_own_metrics():
    torch.manual_seed(0)
    fed = small_federation(FedPer(personal_layers=1), num_clients=6)
    fed.run_round(1)
    two_clusters(fed)
    models, _ = fed.algorithm.evaluation_models()
    assert isinstance(models, SharedBodyModels)
    calls = []
    features = fed.server.model.features
    fed.server.model.features = lambda params, x: calls.append(len(x)) or features(params, x)
    values = fed.evaluate()[1]
    assert len(calls) == 2  # one body pass a cluster, not one a client
    accuracy, loss = by_hand(fed)
    assert values["acc"].tolist() == pytest.approx(accuracy, rel=1e-6)
    assert torch.allclose(torch.tensor(values["loss"]), torch.tensor(loss), rtol=1e-5)


class Doubled(nn.Module):
    """A network followed by an affine map without parameters: its outputs are not its head's."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 2.0 * self.inner(x) - 1.0


def test_a_network_whose_outputs_are_not_its_heads_runs_each_clients_whole_model():
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=6, partition=Rotations(2))
    model = Classifier(Doubled(SmallCNN(1, 10, 8, width=8)), lr=0.1)
    config = FederationConfig(rounds=2, batch_size=32, accelerator="cpu", vectorize=0)
    fed = Federation(data, model, FedPer(personal_layers=1), config, seed=0)
    fed.run_round(1)
    assert isinstance(fed.algorithm.evaluation_models()[0], SharedBodyModels)  # the evaluator finds out, not this
    whole = []
    outputs = fed.server.model.outputs
    fed.server.model.outputs = lambda params, x: whole.append(len(x)) or outputs(params, x)
    values = fed.evaluate()[1]
    assert len(whole) == 6  # each client's whole model
    accuracy, loss = by_hand(fed)
    assert values["acc"].tolist() == pytest.approx(accuracy, rel=1e-6)
    assert torch.allclose(torch.tensor(values["loss"]), torch.tensor(loss), rtol=1e-5)


def test_personal_entries_outside_the_head_evaluate_whole_models():
    fed = small_federation(FedPer(personal_layers=2), num_clients=4)
    fed.run_round(1)
    models, _ = fed.algorithm.evaluation_models()
    assert isinstance(models, ClientModels) and not isinstance(models, SharedBodyModels)
