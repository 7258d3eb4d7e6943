"""Local training: every client trains its own model on its own data; nothing is ever averaged."""

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Newcomers, Plan, RoundUpdates, best_fitting

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class Local(Algorithm):
    """Each client is its own cluster of one, so its model is simply its own trained model (a row of the client
    state "local_models", the initial model until it trains). Every client trains every round, unless the run
    selects fewer (`participation`, `federation.clients_per_round`): a client then trains only in its rounds."""

    plan = Plan(holds_updates=True)  # keeps every client's trained model

    def setup(self, server: "ServerContext") -> None:
        super().setup(server)
        self.local_models = server.state.declare("local_models", initial=server.model.initial_params)

    def client_model(self, client: int) -> Tensor:
        return self.local_models[client]

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        held = updates.all()
        self.local_models.write(held.clients, held.params)

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        n = self.server.num_clients
        return ClientModels(self.client_model, n), torch.arange(n, device=self.server.device)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[ClientModels, Tensor, None]:
        """Each newcomer gets the client model with the lowest loss on its training split."""
        models = ClientModels(self.client_model, self.server.num_clients)
        return models, best_fitting(newcomers, models), None
