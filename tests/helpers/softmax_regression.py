"""Softmax regression on the digits' 64 pixels, whose cross-entropy gradient is written out here: the linear model
that the tests of SCAFFOLD, APFL, FedALA and the drift baselines check hand computations on."""

from __future__ import annotations

import torch
from torch import nn

from fedlight import Federation, FederationConfig
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.models import Classifier

from helpers.federations import every_row


LR = 0.1


def linear_federation(
    algorithm,
    num_clients: int = 3,
    batch_size: int = 32,
    vectorize: int = 0,
    partition=None,
    local_epochs: int = 1,
    network: nn.Module | None = None,
    **data,
) -> Federation:
    """Softmax regression on the 64 pixels of the digits (or `network`), plain SGD (momentum 0), one local epoch;
    `data`: more settings of the data module (its public_size)."""
    torch.manual_seed(0)
    model = Classifier(network or nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), lr=LR, momentum=0.0)
    data = DigitsFederated(num_clients=num_clients, partition=partition or Rotations(2), **data)
    config = FederationConfig(
        rounds=3, local_epochs=local_epochs, batch_size=batch_size, accelerator="cpu", vectorize=vectorize
    )
    return Federation(data, model, algorithm, config, seed=0)


def linear_gradient(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy gradient of softmax regression, by hand, in float64: with G = (softmax(XW' + b) -
    onehot(y)) / m, dW = G'X and db = sum of G's rows; flat as [W (10 x 64), b (10)]."""
    W, b = params[:640].double().view(10, 64), params[640:].double()
    X = x.reshape(len(x), -1).double()
    G = torch.softmax(X @ W.T + b, dim=1)
    G[torch.arange(len(y)), y] -= 1
    G /= len(y)
    return torch.cat([(G.T @ X).reshape(-1), G.sum(0)])


def client_data(fed: Federation, client: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = fed.server.clients.split("train").client(client)
    return fed.server.data.inputs(x), y


def resumed_equals_uninterrupted(make, names: tuple[str, ...]) -> None:
    """Round 3 after restoring round 2's state equals round 3 of an uninterrupted run, state included."""
    a = make()
    for r in (1, 2):
        a.run_round(r)
    state = a.state_dict()
    state["algorithm"] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state["algorithm"].items()}
    b = make()
    b.load_state_dict(state)
    a.run_round(3), b.run_round(3)
    for name in ("models", *names):
        assert torch.equal(every_row(getattr(a.algorithm, name)), every_row(getattr(b.algorithm, name))), name
