"""A data module of many tiny clients built at once (tests at cross-device scale): no per-client Python loop, so
10,000 clients take milliseconds where the partitioned data modules take seconds."""

from __future__ import annotations

import torch

from fedlight.datamodules.base import FederatedDataModule
from fedlight.models import MLP
from fedlight.plugin.data import ClientSplit, FederatedData


class ManyClients(FederatedDataModule):
    """`num_clients` clients, each with `train_samples` training and one test point of `dim` features: client k's
    points are Gaussian around a mean of its own class k mod `classes`, labelled by that class (a learnable task:
    a model of the class means), drawn from the run's seed."""

    def __init__(self, num_clients: int = 2000, train_samples: int = 3, dim: int = 2, classes: int = 4) -> None:
        super().__init__(num_clients=num_clients, val_fraction=0.0, test_fraction=0.0)
        self.train_samples, self.dim, self.classes = train_samples, dim, classes

    @property
    def num_classes(self) -> int:
        return self.classes

    def build(self) -> FederatedData:
        generator = torch.Generator().manual_seed(self.seed)
        n, per = self.num_clients, self.train_samples + 1
        label = torch.arange(n) % self.classes
        means = torch.randn(self.classes, self.dim, generator=generator) * 3
        x = means[label].repeat_interleave(per, 0) + torch.randn(n * per, self.dim, generator=generator)
        y = label.repeat_interleave(per)
        test = torch.zeros(n * per, dtype=torch.bool)
        test[per - 1 :: per] = True  # each client's last point

        def split(rows: torch.Tensor, size: int) -> ClientSplit:
            return ClientSplit(x[rows], y[rows], list(range(0, n * size + 1, size)))

        empty = ClientSplit(x[:0], y[:0], [0] * (n + 1))
        return FederatedData(
            split(~test, self.train_samples),
            empty,
            split(test, 1),
            num_classes=self.classes,
            info={"pool_size": n * per, "public_size": 0},
        )


def row_bytes_of(module: torch.nn.Module) -> int:
    """Bytes of one float32 copy of a module's parameters and buffers (a client's row of a model-sized state)."""
    return 4 * sum(t.numel() for t in module.state_dict().values())


NETWORK = {"input_dim": 2, "hidden": [4], "num_classes": 4}  # the MLP the runs below train on ManyClients


def ditto_run_args(output_dir, clients: int, per_round: int, rounds: int, memory_rows: float) -> list[str]:
    """`fit` arguments of Ditto on `clients` ManyClients clients, `per_round` a round, with a client-state budget of
    `memory_rows` of its personal models (the rest spill), W&B off, writing into `output_dir`."""
    row = row_bytes_of(MLP(**NETWORK))
    network = [
        arg
        for key, value in NETWORK.items()
        for arg in (f"--model.network.init_args.{key}", str(value).replace(" ", ""))
    ]
    return [
        "fit",
        "--data",
        "helpers.many_clients.ManyClients",
        "--data.num_clients",
        str(clients),
        "--model",
        "fedlight.models.Classifier",
        "--model.network",
        "fedlight.models.MLP",
        *network,
        "--model.lr",
        "0.1",
        "--algorithm",
        "ditto",
        "--federation.rounds",
        str(rounds),
        "--federation.clients_per_round",
        str(per_round),
        "--federation.batch_size",
        "8",
        "--federation.accelerator",
        "cpu",
        "--federation.vectorize",
        str(per_round),
        "--federation.client_state_memory",
        str(memory_rows * row / 1e9),
        "--logger.wandb",
        "false",
        "--output_dir",
        str(output_dir),
    ]
