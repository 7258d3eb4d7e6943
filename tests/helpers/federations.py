"""Small federations the tests build in-process: a narrow SmallCNN on digits (`small_federation`), an MLP on digits
of unequal clients (`mlp_federation`), and what tests do with them (every client's row of a state, noisy starts, a
one-ulp nudge, a network whose head is not linear)."""

from __future__ import annotations

import torch
from torch import nn

from fedlight import Federation, FederationConfig
from fedlight.datamodules import DigitsFederated, QuantitySkew, Rotations
from fedlight.models import MLP, Classifier, SmallCNN
from fedlight.plugin.algorithm import Algorithm


def small_federation(
    algorithm=None,
    num_clients: int = 6,
    rounds: int = 2,
    seed: int = 0,
    partition=None,
    lr: float = 0.1,
    momentum: float = 0.0,
    public_size: int = 0,
    privacy=None,
    system=None,
    attack=None,
    server_optimizer=None,
    **config,
) -> Federation:
    """A fast federation on digits: a narrow SmallCNN, few clients, one local epoch; clients train one after
    another unless `vectorize` is given (tests of the sequential trainer compare exact values). `privacy`: a
    `PrivacyConfig` (the run's `privacy:` section); `system`: a `SystemConfig` (its `system:` section); `attack`: an
    `AttackConfig` (its `attack:` section)."""
    torch.manual_seed(seed)
    model = Classifier(SmallCNN(1, 10, 8, width=8), lr=lr, momentum=momentum)
    data = DigitsFederated(num_clients=num_clients, partition=partition or Rotations(2), public_size=public_size)
    aggregator = aggregator_section(config)
    settings = {"rounds": rounds, "local_epochs": 1, "batch_size": 32, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(
        data,
        model,
        algorithm,
        FederationConfig(**settings),
        seed=seed,
        privacy=privacy,
        system=system,
        attack=attack,
        aggregator=aggregator,
        server_optimizer=server_optimizer,
    )


def aggregator_section(config: dict):
    """The `aggregator:` section from a test's `aggregator="median", aggregator_f=2, ...` keywords, taken out of
    `config` (None when it gives none: the mean)."""
    from fedlight.aggregators.config import AggregatorConfig

    names = {
        "aggregator": "rule",
        "aggregator_f": "f",
        "aggregator_beta": "beta",
        "aggregator_clip": "clip",
        "aggregator_keep": "keep",
    }
    given = {field: config.pop(key) for key, field in names.items() if key in config}
    return AggregatorConfig(**given) if given else None


def every_row(value):
    """A client state (`fedlight.plugin.client_state.ClientState`) as one tensor of every client's row; any other
    value as it is: to compare an algorithm's attributes across runs."""
    from fedlight.plugin.client_state import ClientState

    return value.read(range(value.num_clients)) if isinstance(value, ClientState) else value


def mlp_federation(
    algorithm=None,
    vectorize=8,
    num_clients=5,
    batch_size=16,
    weight_decay=0.0,
    network: torch.nn.Module | None = None,
    accelerator: str = "cpu",
) -> Federation:
    """An MLP (or `network`) on digits of unequal clients (short last batches, other step counts), in float32: no
    max-pool ties, so the two trainers (and the CPU and a GPU) agree to float rounding."""
    torch.manual_seed(0)
    model = Classifier(network or MLP(64, [32], 10), lr=0.05, momentum=0.9, weight_decay=weight_decay)
    config = FederationConfig(
        rounds=2,
        local_epochs=2,
        batch_size=batch_size,
        accelerator=accelerator,
        vectorize=vectorize,
        precision="32-true",
    )
    data = DigitsFederated(num_clients=num_clients, partition=QuantitySkew(alpha=0.5, min_size=20))
    return Federation(data, model, algorithm or Algorithm(), config)


def noisy_starts(fed: Federation, count: int) -> torch.Tensor:
    noise = torch.Generator().manual_seed(3)
    initial = fed.server.model.initial_params
    return initial + 0.05 * torch.randn(count, fed.server.model.num_params, generator=noise).to(initial.device)


def nudge_by_one_ulp(models: torch.Tensor) -> None:
    """Every parameter moved one unit in the last place, up or down: the smallest change rounding can make."""
    signs = torch.randn(models.shape, generator=torch.Generator().manual_seed(1)).sign().to(models.device)
    models.mul_(1 + 2**-23 * signs)


class ConvHead(nn.Module):
    """A network on the digits whose last layer is a convolution, not a linear head (methods that read the features
    at the head refuse it)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(64, 8), nn.Conv1d(1, 10, 8)

    def forward(self, x):
        return self.head(self.body(torch.flatten(x, 1))[:, None]).flatten(1)
