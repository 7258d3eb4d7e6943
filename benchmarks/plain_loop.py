"""The baseline every speed benchmark compares with: a FedAvg round written directly in PyTorch, the way
simulators train clients (state dicts, a fresh optimizer per client, one client after another).

It reads the clients' data, seeds and batch order from a `Federation`, so it does exactly the training
fedlight's sequential trainer does and both end with the same model.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.engine.federation import Federation

OptimizerFactory = Callable[[Iterable[Tensor]], torch.optim.Optimizer]


class PlainLoop:
    """Clients trained one after another on one `nn.Module`, then their state dicts averaged by data size."""

    def __init__(self, fed: Federation, make_net: Callable[[], nn.Module], make_optimizer: OptimizerFactory) -> None:
        torch.manual_seed(0)  # the same initial weights as the benchmark's fedlight module
        self.net = make_net().to(fed.device)
        self.make_optimizer = make_optimizer
        self.global_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.fed = fed

    def train_clients(self, round: int, clients: list[int] | None = None) -> tuple[list[dict[str, Tensor]], list[int]]:
        """The clients' (default: every client's) trained state dicts and training-set sizes, from the current global
        model."""
        fed, net = self.fed, self.net
        states, sizes = [], []
        for client in range(fed.num_clients) if clients is None else clients:
            net.load_state_dict(self.global_state)
            optimizer = self.make_optimizer(net.parameters())
            x, y = fed.data.train.client(client)
            seed = fed.server.random.client_seed(round, client)
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed)  # drawn on the CPU, as fedlight draws sample orders
            net.train()
            for _ in range(fed.config.local_epochs):
                order = torch.randperm(len(y), generator=generator).to(x.device)
                for begin in range(0, len(y), fed.config.batch_size):
                    rows = order[begin : begin + fed.config.batch_size]
                    batch, labels = fed.transform((x[rows], y[rows]), 0)
                    with fed.fabric.autocast():
                        loss = F.cross_entropy(net(batch), labels)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            states.append({k: v.clone() for k, v in net.state_dict().items()})
            sizes.append(len(y))
        return states, sizes

    def round(self, round: int, clients: list[int] | None = None) -> None:
        """One FedAvg round: train the clients (default: every client), average their state dicts weighted by data
        size."""
        states, sizes = self.train_clients(round, clients)
        total = sum(sizes)
        self.global_state = {k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in states[0]}

    def flat_global(self, names: list[str], prefix: str = "network.") -> Tensor:
        """The global model as one vector in the order of fedlight's flat entries `names`."""
        return torch.cat([self.global_state[name.removeprefix(prefix)].flatten() for name in names])
