"""FedDBE ("Eliminating Domain Bias for Federated Learning in Representation Space", Zhang et al., NeurIPS 2023,
section 4): FedAvg with a Domain Bias Eliminator, two parts.
- Personalized Representation Bias Memory (PRBM): each client's own learnable vector, added to the features (the
  head's input) before the head, in training and in prediction; it stays on the client, so the averaged body
  learns features without the client's bias.
- Mean Regularization (MR): kappa x mean over the features of 1/2 (running mean - global mean)^2, where the running
  mean is the client's momentum average of its batches' mean features (without the PRBM), restarted at zero at the
  start of every local training and updated at every step, the steps before detached (only the current batch's
  mean carries a gradient), and the global mean is the training-set-size weighted mean of the clients' running
  means after one local training of the initial model without DBE, computed once before round 1 and fixed.

How it sits on the engine: the PRBM is a module the method adds to the model (`extend_model`), one vector of the
features' width, applied by a forward pre-hook on the network's head and kept personal by mask; the running mean is
a buffer of a second added module, updated in place inside the local objective (`LocalWork.objective`: each
client's row of it under the vectorized trainer), reset to zero before every call and never sent (the trained
rows' entries are zeroed, so updates carry none of it). The global mean is captured by the objective.

Defaults and where they come from:
- kappa = 50 and momentum = 1.0: the authors' released command (their DBE repository's run script, FMNIST); PFLlib's
  command-line defaults are momentum 0.1 and kappa 0 (MR off), which configs/papers/pfllib/ keep;
- the initialization pass as PFLlib's serverdbe.py: every client trains the initial model for the run's local
  epochs with cross-entropy alone (the PRBM, zero, frozen), and its final running mean enters the global mean; the
  trained models are discarded. That pass needs every client, so the work is declared and a cohort below the
  clients is refused (`every_client_mean: false` takes the first round's clients instead). With kappa 0 the global
  mean has no use and is not computed (the same training as PFLlib's, which computes it anyway);
- the PRBM starts at zero; cross-entropy of head(features + PRBM), as clientdbe.py.
Measured (configs/digits/skew/, 2 classes per client, 60 rounds, seed 0, class defaults): 0.985 mean test accuracy
in the last round, 0.991 in the best round (34).

Deviations:
- the PRBM trains with the module's optimizer (its momentum and weight decay); PFLlib steps it with a plain SGD of
  its own at the same learning rate: the same when the module's SGD has neither (PFLlib's setting);
- the loss is cross-entropy of the module's outputs, not the module's `training_step`;
- `every_client_mean: false` (cross-device runs): the global mean is computed by the same pass over the first
  round's clients only, the clients that train first (PFLlib's pass covers all of them);
- a client that arrives after training gets the averaged model with a zero PRBM (the engine's fresh personal part);
  `federation.finetune_epochs` then trains its PRBM with the rest;
- a client's short last batch trains (fedlight's batches cover every sample); PFLlib's loader drops it
  (`drop_last=True`). With momentum 1 the running mean after an epoch is its last batch's mean alone, so a client
  whose last batch holds 4 samples enters the global mean (and the MR term of its last step) with those 4 samples'
  mean; PFLlib's would be a full batch's. Set a batch size that divides the clients' training sets, or a momentum
  below 1, where that matters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import Algorithm, ModelParts, Trained, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

PRBM = "feddbe_prbm"
RUNNING_MEAN = "feddbe_running_mean"


class RepresentationBias(nn.Module):
    """The PRBM: a learnable vector of the features' width, added to the head's input by `shift` (a forward
    pre-hook on the head)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(size))

    def shift(self, head: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The head's arguments with the bias added to the first, the features (the forward pre-hook)."""
        return (args[0] + self.bias, *args[1:])


class RunningMean(nn.Module):
    """A client's momentum average of its batches' mean features, a buffer so each client keeps its own row."""

    mean: Tensor  # the buffer

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))


def updated_mean(previous: Tensor, features: Tensor, momentum: float) -> Tensor:
    """(1 - momentum) x previous + momentum x the batch's mean features (clientdbe.py's running mean)."""
    return (1 - momentum) * previous + momentum * features.mean(dim=0)


def mean_regularization(running_mean: Tensor, global_mean: Tensor) -> Tensor:
    """MR's distance: the mean over the features of 1/2 (running mean - global mean)^2."""
    return (0.5 * (running_mean - global_mean) ** 2).mean()


class FedDBE(Algorithm):
    """FedAvg with a personal feature shift (PRBM) before the head and the running mean of the features pulled to
    a global mean (MR).

    Args:
        kappa: MR's weight (>= 0; 0 turns MR off).
        momentum: the running mean's momentum in [0, 1] (1: the current batch's mean alone).
        every_client_mean: the global mean from every client before round 1 (PFLlib); False: from the first
            round's clients (a run with a cohort below the clients).
        participation: share of clients selected each round.
    """

    def __init__(
        self, kappa: float = 50.0, momentum: float = 1.0, every_client_mean: bool = True, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if kappa < 0:
            raise ValueError(
                f"FedDBE's kappa (the mean regularization's weight) must be >= 0, got {kappa}: set "
                "algorithm.init_args.kappa to 0 (no MR) or more"
            )
        if not 0 <= momentum <= 1:
            raise ValueError(
                f"FedDBE's momentum (of the features' running mean) must be in [0, 1], got {momentum}: "
                "set algorithm.init_args.momentum within it"
            )
        self.kappa, self.momentum, self.every_client_mean = float(kappa), float(momentum), bool(every_client_mean)
        self.global_mean: Tensor | None = None  # fixed once computed, before round 1

    def extend_model(self, parts: ModelParts) -> None:
        size = parts.feature_size("FedDBE")
        bias = RepresentationBias(size)
        parts.add(PRBM, bias)
        parts.add(RUNNING_MEAN, RunningMean(size))
        parts.head.register_forward_pre_hook(bias.shift)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.prbm = server.model.layer_mask([PRBM])
        self.running_mean = server.model.layer_mask([RUNNING_MEAN])
        self.set_personal_mask(self.prbm)
        if self.every_client_mean and self.kappa > 0:
            server.cohort.needs_every_client(
                "FedDBE",
                "once before round 1 (the global mean of the features, PFLlib's initialization)",
                instead="algorithm.init_args.every_client_mean: false",
                in_a_round=False,
            )

    def begin_round(self, round: int) -> None:
        """Every running mean starts at zero; before the first round, the global mean (none without MR)."""
        self.models[:, self.running_mean] = 0  # DP's noise may have reached the averaged entries
        if self.global_mean is None and self.kappa > 0:
            self.global_mean = self.first_global_mean(round)

    def first_global_mean(self, round: int) -> Tensor:
        """The training-set-size weighted mean of the running means the clients (all, or this round's) reach in one
        local training of the initial model without DBE (cross-entropy alone, the zero PRBM frozen), trained a
        round's worth of clients at a time (round index 0: a stream of its own)."""
        clients = list(range(self.server.num_clients)) if self.every_client_mean else self.select_clients(round)
        chunk = len(self.select_clients(round))
        weights = self.server.clients.train_sizes.to(self.models.dtype)
        total = self.models.new_zeros(int(self.running_mean.sum()))
        for begin in range(0, len(clients), chunk):
            group = clients[begin : begin + chunk]
            starts = self.server.model.initial_params.expand(len(group), -1)
            trained = self.server.clients.train_many(0, group, starts, trainable=~self.prbm, objective=self._objective)
            total += weights[group].to(total.device) @ trained.params[:, self.running_mean]
            del trained
        return total / weights[clients].sum().to(total.device)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD on cross-entropy of head(features + PRBM) + kappa x MR; the running means stay home."""
        trained = self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), objective=self._objective
        )
        trained.params[:, self.running_mean] = 0
        return trained

    def _objective(self, module: nn.Module, batch: tuple[Tensor, Tensor], inputs: Tensor) -> Tensor:
        x, y = batch
        features, outputs = head_inputs(module, self.server.model.head, x)  # features before the PRBM's shift
        tracked = cast(RunningMean, module.get_submodule(RUNNING_MEAN)).mean
        running = updated_mean(tracked, features, self.momentum)
        tracked.copy_(running.detach())  # the next step's start; this step's gradient flows through its batch only
        loss = F.cross_entropy(outputs, y)
        if self.global_mean is None:  # the initialization pass, which computes the global mean, or no MR (kappa 0)
            return loss
        return loss + self.kappa * mean_regularization(running, self.global_mean)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "global_mean": self.global_mean}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.global_mean = state["global_mean"]
