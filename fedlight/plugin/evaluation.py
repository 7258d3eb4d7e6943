"""Per-client test metrics for every client at once, and their summary across clients.

Accuracy, macro-F1 and loss of n clients come from three `bincount`s over (client, class) pairs instead of
n calls into torchmetrics: same definitions (macro-F1 averages over the classes a client has in its labels
or predictions, as torchmetrics does), tested against torchmetrics client by client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

HIGHER_IS_BETTER = {"acc": True, "f1": True, "loss": False, "cost": False}
UNSEEN = "unseen"  # the name of the held-out clients' summaries: unseen/acc_mean, unseen/ari, ...


def per_client_classification(
    logits: Tensor, target: Tensor, client: Tensor, num_clients: int, num_classes: int
) -> dict[str, Tensor]:
    """Accuracy, macro-F1 and mean cross-entropy of each client; rows of `logits` belong to `client`."""
    import torch  # here: the metric names below are read by the command line, which does not load torch
    import torch.nn.functional as F

    preds = logits.argmax(dim=1)
    flat_target = client * num_classes + target
    cells = num_clients * num_classes
    correct = preds == target
    tp = torch.bincount(flat_target[correct], minlength=cells).view(num_clients, num_classes)
    predicted = torch.bincount(client * num_classes + preds, minlength=cells).view(num_clients, num_classes)
    actual = torch.bincount(flat_target, minlength=cells).view(num_clients, num_classes)
    denominator = predicted + actual  # = 2tp + fp + fn
    present = denominator > 0
    f1 = torch.where(present, 2 * tp / denominator.clamp(min=1), torch.zeros_like(denominator, dtype=torch.float))
    size = actual.sum(dim=1).clamp(min=1)
    losses = F.cross_entropy(logits.float(), target, reduction="none")
    return {
        "acc": tp.sum(dim=1) / size,
        "f1": f1.sum(dim=1) / present.sum(dim=1).clamp(min=1),
        "loss": torch.bincount(client, weights=losses, minlength=num_clients) / size,
    }


def higher_is_better(name: str) -> bool:
    """Whether a larger value of metric `name` is better: `HIGHER_IS_BETTER`'s answer, else False for a name with "loss"
    or "cost" in it and True otherwise."""
    return HIGHER_IS_BETTER.get(name, not ("loss" in name or "cost" in name))


def summarize(per_client: dict[str, np.ndarray], prefix: str) -> dict[str, float]:
    """Mean, population standard deviation and worst client of each metric (worst = min for accuracy and
    F1, max for losses and costs; a metric named `*loss*` or `*cost*` counts as lower-is-better). Clients without a
    value (NaN: nothing to evaluate) are left out; a metric no client has is NaN."""
    out: dict[str, float] = {}
    for name, values in per_client.items():
        known = values[~np.isnan(values)]
        if not len(known):
            known = np.array([np.nan])
        worst = known.min() if higher_is_better(name) else known.max()
        out[f"{prefix}/{name}_mean"] = float(known.mean())
        out[f"{prefix}/{name}_std"] = float(known.std())
        out[f"{prefix}/{name}_worst"] = float(worst)
    return out


def per_cluster_means(values: np.ndarray, labels: np.ndarray, prefix: str) -> dict[str, float]:
    """`<prefix>_<c>`: the mean of the clients' `values` within each cluster c of `labels` (clients without a value
    left out; NaN for a cluster none of whose clients has one), so a reader sees which cluster a method fails."""
    labels = np.asarray(labels)
    out = {}
    for c in np.unique(labels):
        known = values[(labels == c) & ~np.isnan(values)]
        out[f"{prefix}_{c}"] = float(known.mean()) if len(known) else float("nan")
    return out
