"""GPFL ("GPFL: Simultaneously Learning Global and Personalized Feature Information for Personalized Federated
Learning", Zhang et al., ICCV 2023, section 3): a Conditional Valve (CoV) after the feature extractor splits the
features f into a global route f_G = CoV(f, g) and a personalized route f_P = CoV(f, p_i), where
CoV(f, c) = ReLU(f * (1 + gamma(c)) + beta(c)), gamma and beta each Linear -> ReLU -> LayerNorm on the conditional
input c. The personal head classifies f_P; the Global Category Embedding layer (GCE, one embedding e_c per class)
guides f_G. A client's local loss per batch:
  cross-entropy(head(f_P), y)                                  the personalized task
  + cross-entropy(cos(f_G, e_c) over classes c, y)             angle-level guidance (`angle_level_loss`)
  + lam * || f_G - e'_y ||_2                                   magnitude-level guidance (`magnitude_level_loss`)
  + mu / 2 * (||GCE||^2 + ||CoV||^2)                           the weight decay of PFLlib's GCE and CoV optimizers
                                                               (its gradient only: `weight_decay`)
where e' are the embeddings the client received (frozen) and the norm runs over the whole batch, as the authors'
code computes it. The conditional inputs come from the client's embeddings: g = the mean of the e_c, p_i = the sum of
the e_c weighted by the client's class shares (`conditional_inputs`). The feature extractor, the GCE and the CoV
are averaged; the head and the conditional inputs are each client's own. A client predicts with head(f_P).

How it sits on the engine: the GCE (an nn.Embedding), the CoV and the conditional inputs (buffers) are modules the
method adds to the model (`extend_model`), so every client's flat model holds them and the round's clients train
vectorized with one objective; a forward pre-hook on the head puts f_P in place of f, so evaluation, fine-tuning
and every prediction are the personalized model's. The head and the conditional inputs are personal by mask.
After training, each client's new conditional inputs are computed from the embeddings it trained and written
into its personal part: what PFLlib's server hands every client after the round (`set_GCE` computes them from the
client's GCE before it loads the averaged one), so they are the client's own from its next round on.

Defaults (the authors' code, TsingZ0/GPFL run_me.sh): lam = 0.01 and mu = 0.1, the values for the 4-layer CNN and
the MLP (0.0001 and 0 for ResNet-18); PFLlib's command-line defaults are lam 1.0 and mu 0.0 instead (its
clientgpfl.py / servergpfl.py take them from main.py), which configs/papers/pfllib/ use; the conditional inputs start
at zero; GCE, CoV and the network train at the module's learning rate; averaging weighted by training-set size.

Measured (configs/digits/skew/, 2 classes per client, 60 rounds, seed 0): 0.991 mean test accuracy (worst client
0.818), FedRoD's number there; a slow start (0.52 at round 10, about the majority class; 0.70 at 20, 0.95 at 30):
the valve's shift beta(c), a LayerNorm output of norm about sqrt(width), swamps this CNN's small features at first,
so the personalized route barely varies between inputs until the extractor scales them up.

Deviations:
- One optimizer: PFLlib steps the GCE and the CoV with two more SGD optimizers at the model's learning rate with
  weight decay mu. The engine's one optimizer (the module's) steps them here, and their weight decay is folded into
  the objective as mu / 2 * ||theta||^2, whose gradient mu * theta is what SGD's weight decay adds before its
  momentum. With PFLlib's plain SGD this is exactly the authors' step; a module with momentum or weight decay gives
  them to GCE and CoV as well.
- A client not selected in a round keeps the conditional inputs of its last training (zero until its first, as
  every client's are in PFLlib's first round); PFLlib recomputes every client's in every round from the embeddings
  it was last sent, work on all clients. With every client every round (PFLlib's default) the two are the same.
- A client's class shares are those of its whole training split (PFLlib counts its drop_last loader's batches).
- A client that arrives after training gets the averaged extractor, GCE and CoV with a fresh personal part (the
  initial head, zero conditional inputs): PFLlib's client that never trained; `federation.finetune_epochs` then
  personalizes it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import Algorithm, ClientSplit, ModelParts, Trained, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

GCE = "gpfl_gce"
COV = "gpfl_cov"
INPUTS = "gpfl_conditional_inputs"
GENERIC, PERSONALIZED = 0, 1  # the rows of the conditional inputs


class ConditionalValve(nn.Module):
    """CoV: features f and a conditional input c (one vector) -> ReLU(f * (1 + gamma(c)) + beta(c))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width))
        self.beta = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width))

    def forward(self, features: Tensor, condition: Tensor) -> Tensor:
        return F.relu(features * (1 + self.gamma(condition)) + self.beta(condition))


class ConditionalInputs(nn.Module):
    """A client's two conditional inputs of the valve as one (2, width) buffer: row GENERIC is g, row PERSONALIZED
    is p_i. Buffers take no gradient, so they stay fixed while the client trains, as PFLlib's do."""

    values: Tensor  # the buffer

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("values", torch.zeros(2, width))


def angle_level_loss(features: Tensor, embeddings: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of the cosine similarities between each feature row and every class embedding (no scale)."""
    return F.cross_entropy(F.normalize(features) @ F.normalize(embeddings).T, y)


def magnitude_level_loss(features: Tensor, embeddings: Tensor, y: Tensor) -> Tensor:
    """The Euclidean norm of the whole batch's differences between each feature row and its class's embedding
    (not squared, not divided by the batch size, as the authors' code has it)."""
    return torch.linalg.vector_norm(features - embeddings[y])


def conditional_inputs(embeddings: Tensor, shares: Tensor) -> Tensor:
    """(..., 2, width): the generic input (the mean of the class embeddings (..., classes, width)) and the
    personalized one (their sum weighted by the class shares (..., classes))."""
    generic = embeddings.mean(dim=-2)
    personalized = (shares.unsqueeze(-1) * embeddings).sum(dim=-2)
    return torch.stack([generic, personalized], dim=-2)


def weight_decay(mu: float, tensors: list[Tensor]) -> Tensor:
    """mu / 2 * the tensors' squared norm, as a term whose gradient is SGD's weight decay (mu * theta) and whose
    value is 0 (the value is subtracted, detached): the loss a client reports is the authors', without the decay
    their optimizers add."""
    squares = [t.square().sum() for t in tensors]
    decay = mu / 2 * sum(squares[1:], squares[0])
    return decay - decay.detach()


def class_shares(split: ClientSplit, clients: list[int], classes: int) -> Tensor:
    """(len(clients), classes): each client's share of every class in `split` (zeros for a client without rows)."""
    counts = torch.stack([torch.bincount(split.client(c)[1], minlength=classes) for c in clients]).float()
    return counts / counts.sum(dim=1, keepdim=True).clamp(min=1)


class GPFL(Algorithm):
    """An averaged feature extractor, GCE and CoV; each client's own head on the valve's personalized route and
    its own conditional inputs.

    Args:
        lam: weight (>= 0) of the magnitude-level guidance || f_G - e'_y ||_2 (the paper's lambda).
        mu: weight decay (>= 0) of the GCE and CoV parameters (the paper's mu).
        participation: share of clients selected each round.
    """

    def __init__(self, lam: float = 0.01, mu: float = 0.1, participation: float = 1.0) -> None:
        super().__init__(participation)
        for name, value in (("lam", lam), ("mu", mu)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(
                    f"GPFL's {name} must be a finite number >= 0, got {value}: set algorithm.init_args."
                    f"{name} to 0 or more"
                )
        self.lam, self.mu = lam, mu

    def extend_model(self, parts: ModelParts) -> None:
        width, classes = parts.feature_size("GPFL"), parts.num_classes
        if width < 1 or classes < 1:
            raise ValueError(
                f"GPFL's category embeddings are {classes} x {width} (classes x the head's input width), "
                "an empty layer: end the network with an nn.Linear that takes at least one feature"
            )
        parts.add(GCE, nn.Embedding(classes, width))
        parts.add(COV, ConditionalValve(width))
        parts.add(INPUTS, ConditionalInputs(width))
        assert parts.head_name is not None  # `feature_size` read the head
        self.head_layer, self.classes, self.width = parts.head_name, classes, width
        parts.head.register_forward_pre_hook(self._personalized_route)

    def _personalized_route(self, head: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor]:
        """The head's input f replaced by CoV(f, p_i): every prediction is the personalized model's."""
        model = self.server.model.module
        condition = cast(ConditionalInputs, model.get_submodule(INPUTS)).values[PERSONALIZED]
        return (model.get_submodule(COV)(args[0], condition),)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.embeddings = server.model.layer_mask([GCE])
        self.inputs = server.model.layer_mask([INPUTS])
        self.set_personal_mask(server.model.layer_mask([self.head_layer]) | self.inputs)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The round's clients on the objective, each with the embeddings it received; then each one's conditional
        inputs for its next round from the embeddings it trained."""
        trained = self.server.clients.train_many(
            round,
            clients,
            starts,
            lr_scale=self.learning_rate_scale(round),
            objective=self._objective,
            client_inputs=starts[:, self.embeddings],
        )
        embeddings = trained.params[:, self.embeddings].view(len(clients), self.classes, self.width)
        shares = class_shares(self.server.clients.split("train"), clients, self.classes).to(embeddings)
        trained.params[:, self.inputs] = conditional_inputs(embeddings, shares).flatten(1)
        return trained

    def _objective(self, module: nn.Module, batch: tuple[Tensor, Tensor], received: Tensor) -> Tensor:
        x, y = batch
        features, personalized = head_inputs(module, self.server.model.head, x)  # the head ran on CoV(f, p_i)
        gce, cov = cast(nn.Embedding, module.get_submodule(GCE)), module.get_submodule(COV)
        global_route = cov(features, cast(ConditionalInputs, module.get_submodule(INPUTS)).values[GENERIC])
        return (
            F.cross_entropy(personalized, y)
            + angle_level_loss(global_route, gce.weight, y)
            + self.lam * magnitude_level_loss(global_route, received.view_as(gce.weight), y)
            + weight_decay(self.mu, [*gce.parameters(), *cov.parameters()])
        )
