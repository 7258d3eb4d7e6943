"""FedProto ("FedProto: Federated Prototype Learning across Heterogeneous Clients", Tan, Long, Liu, Zhou, Lu, Jiang and
Zhang, AAAI 2022, section 4 and Algorithm 1): clients exchange class prototypes, never models. Each client keeps its
own model (nothing is averaged, as `local`) and trains it on cross-entropy plus lambda times the distance of its
features (the head's input) to the global prototype of each sample's class (section 4, "Local Model Update"); after
training it sends its local prototypes, the mean features of each class on its training split (section 3,
"Prototype"). The server's global prototype of a class is the mean of the round's clients' prototypes of that class
(section 4, "Global Prototype Aggregation"), and a client predicts the class of the nearest global prototype
(section 3, "Prototype-based model inference": argmin_j ||f(x) - C_j||_2).

How it sits on the engine: every client's model is a client state (`local_models`, from `Local`); the round's
clients train vectorized with one objective (`LocalWork.objective`) that reads the global prototypes as constants;
their local prototypes come back in `Trained.state` and are averaged in `aggregate`, so the cost grows with the
round's clients. The global prototypes, (classes, features) with a flag per class, are server state (checkpointed).
A forward hook on the head turns its outputs into the logits -||f(x) - C_j||_2 whenever the module runs in
evaluation mode (every evaluation, fine-tuned or not, and newcomers), and leaves training alone.

Defaults and choices (PFLlib's clientproto.py and serverproto.py; the paper's appendix A):
- lambda = 1, PFLlib's default (-lam) and the paper's best for MNIST and FEMNIST (0.1 for CIFAR-10);
- the distance is PFLlib's: the mean squared error over the batch's samples and feature entries (nn.MSELoss of the
  features against their classes' global prototypes); a sample whose class has no global prototype adds nothing but
  still counts in the mean (its target is its own feature, as in PFLlib's FedPAC client; its FedProto client assumes
  every class has one); before the first aggregation there is none, and the loss is cross-entropy alone;
- the global prototype is the unweighted mean over the round's clients that hold the class, as PFLlib's
  `proto_aggregation` (taken from the authors' code, which it cites) computes it. The paper's formula as printed
  also weights each prototype by |D_ij| / N_j and then divides by |N_j|, which would shrink every prototype by that
  count: not followed;
- local prototypes are computed after local training, in evaluation mode, over the client's whole training split
  (the paper's definition at the trained model, PFLlib's `collect_protos`; the PFLlib version read leaves that
  unused and averages the training-mode features seen during the local epochs instead);
- the local solver is the module's optimizer (the paper's: SGD, lr 0.01, momentum 0.5, batch 8, 1 epoch).
Measured (configs/digits/skew/, 2 classes per client, 60 rounds, seed 0): 1.000 mean test accuracy by the nearest
global prototype over all 10 classes (FedRoD: 0.991 there), test loss 0.69.
Deviations:
- a class that none of the round's clients holds keeps its last global prototype; PFLlib replaces the whole set each
  round, the same under its full participation when every class is held, but with a cohort (10 of 3,400 writers)
  rarely held classes would otherwise vanish from inference between rounds;
- a class no trained client has held yet is never predicted (logit -inf): a test sample of such a class counts as
  wrong and its loss is infinite (PFLlib's FedProto test metrics give no loss);
- no label oracle: a client predicts the nearest of every class's global prototype; the authors' evaluation takes
  the argmin over the prototypes of the classes the client itself holds, which a deployed client cannot know of a
  new sample, and which makes a 2-class client's task a 2-way choice;
- the paper's heterogeneous architectures are out of scope: every client runs the configured network;
- `federation.finetune_epochs` fine-tunes with the module's `training_step` (cross-entropy alone), then predicts by
  the nearest global prototype.
A client that arrives after training gets, as in `Local`, the training client's model with the lowest loss on its
training split (the loss of the nearest-prototype logits), and predicts by the nearest global prototype. The paper's
newcomer (section 5, "Model Inference") fine-tunes a pre-trained model on the local objective, which needs a training
stream the newcomers' interface does not offer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.algorithms.local import Local
from fedlight.plugin import SUMMED, ModelParts, RoundUpdates, Trained, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def local_prototypes(features: Tensor, y: Tensor, classes: int) -> tuple[Tensor, Tensor]:
    """((classes, width) the mean features of each class, zero for a class without a sample; (classes,) the samples
    of each class): a client's prototypes."""
    counts = torch.bincount(y, minlength=classes)
    sums = features.new_zeros(classes, features.shape[1]).index_add_(0, y, features)
    return sums / counts.clamp(min=1).to(sums.dtype)[:, None], counts


def global_prototypes(prototypes: Tensor, counts: Tensor, previous: Tensor, known: Tensor) -> tuple[Tensor, Tensor]:
    """The global prototypes after a round, from the round's clients' prototypes (clients, classes, width) and class
    counts (clients, classes): a class some client holds gets the unweighted mean of their prototypes of it, any
    other keeps its `previous` row ((classes, width)); and (classes,) whether a class has one (`known` before)."""
    holds = counts > 0
    holders = holds.sum(dim=0)
    sums = (prototypes * holds[..., None].to(prototypes.dtype)).sum(dim=0)
    means = sums / holders.clamp(min=1).to(sums.dtype)[:, None]
    held = holders > 0
    return torch.where(held[:, None], means.to(previous.dtype), previous), known | held


def prototype_distance(features: Tensor, y: Tensor, prototypes: Tensor, known: Tensor) -> Tensor:
    """The mean over samples and feature entries of (feature - global prototype of its class)^2, a sample of a class
    without a prototype adding zero (PFLlib's MSE regularizer). No data-dependent branch: it runs under vmap."""
    held = known[y].to(features.dtype)[:, None]
    return ((features - prototypes[y].to(features.dtype)) ** 2 * held).mean()


def nearest_prototype_logits(features: Tensor, prototypes: Tensor, known: Tensor) -> Tensor:
    """(samples, classes) -||feature - prototype_j||_2, -inf for a class without a prototype: argmax is the class of
    the nearest prototype (the paper's inference)."""
    distances = torch.cdist(features.float(), prototypes.float())
    return (-distances).masked_fill(~known, float("-inf"))


class FedProto(Local):
    """Each client's own model, trained on cross-entropy + lambda x the distance of its features to the global
    prototypes; the server averages the clients' class prototypes; prediction by the nearest global prototype.

    Args:
        lam: lambda, the weight of the prototype distance (>= 0; 0: cross-entropy alone, as `local` trains).
        participation: share of clients selected each round.
    """

    def __init__(self, lam: float = 1.0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if lam < 0:
            raise ValueError(f"algorithm.init_args.lam must be >= 0 (the weight of the prototype distance), got {lam}")
        self.lam = lam

    def extend_model(self, parts: ModelParts) -> None:
        """No module of its own: the prototypes' shape (classes, the head's input width), and the hook that turns the
        head's outputs into nearest-prototype logits in evaluation mode."""
        width = parts.feature_size("FedProto")
        self.prototypes = torch.zeros(parts.num_classes, width)
        self.known = torch.zeros(parts.num_classes, dtype=torch.bool)
        parts.head.register_forward_hook(self._nearest_prototype_outputs)

    def _nearest_prototype_outputs(self, head: nn.Module, args: tuple[Tensor, ...], outputs: Tensor) -> Tensor:
        if head.training or not bool(self.known.any()):  # training, or nothing to compare with yet
            return outputs
        return nearest_prototype_logits(args[0], self.prototypes, self.known).to(outputs.dtype)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        for entry in ("prototypes", "class_counts"):  # summed into the global prototypes
            server.message.sends(entry, SUMMED)
        self.prototypes = torch.zeros_like(self.prototypes, device=server.device)
        self.known = torch.zeros_like(self.known, device=server.device)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The group on cross-entropy + lambda x prototype distance; each client sends its local prototypes and class
        counts beside its model."""
        trained = self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), objective=self._objective
        )
        split, classes = self.server.clients.split("train"), len(self.known)
        sent = [
            local_prototypes(self.server.model.features(params, split.client(c)[0])[0], split.client(c)[1], classes)
            for c, params in zip(clients, trained.params)
        ]
        trained.state = {
            **trained.state,
            "prototypes": torch.stack([p for p, _ in sent]),
            "class_counts": torch.stack([n for _, n in sent]),
        }
        return trained

    def _objective(self, module: nn.Module, batch: tuple[Tensor, Tensor], inputs: Tensor) -> Tensor:
        x, y = batch
        features, logits = head_inputs(module, self.server.model.head, x)
        return F.cross_entropy(logits, y) + self.lam * prototype_distance(features, y, self.prototypes, self.known)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The trained models are stored (`Local`); each class the round's clients hold gets the mean of their
        prototypes, the others keep theirs."""
        super().aggregate(round, updates)
        state = updates.all().state
        self.prototypes, self.known = global_prototypes(
            state["prototypes"], state["class_counts"], self.prototypes, self.known
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "prototypes": self.prototypes, "known": self.known}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prototypes, self.known = state["prototypes"], state["known"]
