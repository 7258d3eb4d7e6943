"""FedRoD ("On Bridging Generic and Personalized Federated Learning for Image Classification", Chen and Chao, ICLR
2022, section 4 and Algorithm 1): one shared body with two heads. The generic head is trained with the balanced
softmax (the logits shifted by the log of the client's class counts, section 4.2, the "balanced risk" that makes the
averaged model a good generic one under label skew) and averaged with the body; the personal head, each client's
own, is trained with cross-entropy on the sum of the generic logits and its own, with the features and the generic
logits detached (section 4.3: the personal head learns what the generic one misses). A client predicts with the sum.

How it sits on the engine: the personal head is a module the method adds to the model (`extend_model`), a linear
layer on the network's features, kept personal by mask, so every client's flat model holds it and the round's
clients train vectorized with one objective (`LocalWork.objective`): balanced softmax + personal cross-entropy. Its
gradients reach the body and generic head from the first term only and the personal head from the second only, so
one SGD step on the sum is the two separate steps of the authors' code (two optimizers at one learning rate). A
forward hook on the head adds the personal logits, so evaluation, fine-tuning and the predictions of every client
are the personalized model's; `generic/acc_mean` logs the averaged model without personal heads (the paper's G-FL
number) in every evaluated round.

Defaults and choices (as PFLlib's `clientrod.py` runs it):
- the personal head starts as a copy of the generic head's initial weights, and trains at the module's learning
  rate and optimizer;
- a class a client has no sample of gets log(0) = -inf in the balanced softmax: its generic logit takes no part in
  that client's loss;
- body and generic head are averaged weighted by training-set size, as everywhere in fedlight.
Measured (configs/digits/skew/, 2 classes per client, 60 rounds, seed 0): personalized 0.991 mean test accuracy
(FedAvg's global model 0.925), generic model 0.724. A generic head trained with the balanced softmax never compares
two classes that no client holds together (a class a client lacks is out of its softmax), so under pathological
splits the generic model is weaker than FedAvg's; the paper's generic claim is for Dirichlet splits.

Deviation: a client that arrives after training gets the averaged body and generic head with a zero personal head,
i.e. the generic model's predictions (the paper's G-FL model for clients without personalization);
`federation.finetune_epochs` then personalizes it (the whole model, with the module's `training_step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import Algorithm, ModelParts, Newcomers, RoundUpdates, Trained, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

PERSONAL_HEAD = "fedrod_personal_head"


def balanced_softmax_loss(logits: Tensor, y: Tensor, log_counts: Tensor) -> Tensor:
    """Cross-entropy of the logits shifted by the log class counts of the client (Ren et al.'s balanced softmax, the
    loss FedRoD's generic head minimizes)."""
    return F.cross_entropy(logits + log_counts, y)


class FedRoD(Algorithm):
    """A shared body and generic head trained with the balanced softmax and averaged; a personal head per client on
    the detached features; prediction by the sum of both heads' logits.

    Args:
        participation: share of clients selected each round.
    """

    def __init__(self, participation: float = 1.0) -> None:
        super().__init__(participation)
        self._generic_only = False  # evaluation of the generic model: the head's hook adds nothing

    def extend_model(self, parts: ModelParts) -> None:
        personal = nn.Linear(parts.feature_size("FedRoD"), parts.num_classes)
        parts.add(PERSONAL_HEAD, personal)
        parts.head.register_forward_hook(self._add_personal_logits)  # (refuses a network without a head)
        assert parts.head_name is not None
        self.head_layer = parts.head_name

    def _add_personal_logits(self, head: nn.Module, args: tuple[Tensor, ...], generic: Tensor) -> Tensor:
        if self._generic_only:
            return generic
        return generic + self.server.model.module.get_submodule(PERSONAL_HEAD)(args[0].detach())

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        head = server.model.layer_mask([self.head_layer])
        self.personal_head = server.model.layer_mask([PERSONAL_HEAD])
        if int(head.sum()) != int(self.personal_head.sum()):
            raise ValueError(
                "FedRoD's personal head copies the network's last layer, which must be the linear head "
                "alone; end the network with one nn.Linear"
            )
        self.models[:, self.personal_head] = self.models[:, head]  # PFLlib: the personal head starts as a copy
        self.set_personal_mask(self.personal_head)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The round's clients on balanced softmax + personal cross-entropy, each with its own log class counts."""
        split = self.server.clients.split("train")
        classes = cast(nn.Linear, self.server.model.module.get_submodule(PERSONAL_HEAD)).out_features
        log_counts = torch.stack([torch.bincount(split.client(c)[1], minlength=classes).float().log() for c in clients])
        return self.server.clients.train_many(
            round,
            clients,
            starts,
            lr_scale=self.learning_rate_scale(round),
            objective=self._objective,
            client_inputs=log_counts,
        )

    def _objective(self, module: nn.Module, batch: tuple[Tensor, Tensor], log_counts: Tensor) -> Tensor:
        x, y = batch
        features, _ = head_inputs(module, self.server.model.head, x)
        head = cast(nn.Linear, self.server.model.head)  # `setup` checked that the head is one linear layer
        generic = F.linear(features, head.weight, head.bias)
        personal = module.get_submodule(PERSONAL_HEAD)(features.detach())
        return balanced_softmax_loss(generic, y, log_counts) + F.cross_entropy(generic.detach() + personal, y)

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """In an evaluated round, the generic model's accuracy (the averaged body and generic head, no personal
        head) on every client's evaluation split, as the mean over clients (`generic/acc_mean`)."""
        if not self.server.run.evaluates(round):
            return
        split = self.server.clients.split(self.server.run.eval_split)
        self._generic_only = True
        try:
            correct = (self.server.model.predict(self.models[0], split.x).argmax(1) == split.y).float()
        finally:
            self._generic_only = False
        rows = self.server.clients.client_of_row(self.server.run.eval_split)
        sizes = torch.bincount(rows, minlength=self.server.num_clients).float()
        per_client = torch.bincount(rows, weights=correct, minlength=self.server.num_clients) / sizes
        self.log("generic/acc_mean", float(per_client[sizes > 0].mean()))

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """The averaged model with a zero personal head: the generic model's predictions."""
        model = self.models[:1].clone()
        model[:, self.personal_head] = 0
        return model, torch.zeros(newcomers.count, dtype=torch.long, device=model.device), None
