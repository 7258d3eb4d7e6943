"""Concept shift with label and feature shift inside each concept, combined as FedRC's splits combine them, so a
method is scored on whether it clusters concepts and not label mixes or corruptions.

FedRC ("FedRC: Tackling Diverse Distribution Shifts Challenge in Federated Learning by Robust Clustering", Guo et
al., ICML 2024) builds its experiments' clients, as the authors' released data scripts for Fashion-MNIST and
CIFAR make them, from three kinds of shift at once:
- label shift: client i draws its class mix q_i ~ Dir(alpha p) (alpha = 1.0, p the class shares of the samples no
  client has taken yet) and takes n // N samples class by class from q_i without replacement (a class that runs
  out is dropped from q_i and the rest renormalized);
- concept shift: of the clients, in random order, 50% keep the labels (concept 0), 25% relabel y -> K - 1 - y
  (concept 1) and 25% y -> (y + 1) mod K (concept 2), the same inputs meaning other classes;
- feature shift: 30% of the clients (20% of all from concept 0, 5% from each other concept) have every image
  corrupted by one corruption drawn from its list at a severity drawn from 1..5.
The concepts are the true clusters; the label mixes and the corruptions are not.

The shares above are those the scripts' comments state, and what this split makes. A review of the scripts found that
their code draws other ones (about 40/30/30 % of the clients per concept and 50/33/33 % of each concept's clients
corrupted); the comments' shares are kept here as the split the authors describe (configs/digits/concept_shift/ sets
them), and `concept_shares` and `feature_shift` (each concept's corrupted share) give the others.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from fedlight.datamodules.partition import LabelPermutations, PartitionScheme, largest_remainders


class ConceptShift(PartitionScheme):
    """Concept shift (label permutations per concept) with a Dirichlet label mix and an optional corruption per
    client inside each concept (FedRC's split, see the module's docstring).

    The same as FedRC: the label-mix sampler (alpha times the unassigned class shares, per client, without
    replacement), FedRC's three label maps under `label_maps="fedrc"`, its concept and corruption shares when
    `concept_shares=[0.5, 0.25, 0.25]` and `feature_shift=[0.4, 0.2, 0.2]` are given (configs/digits/concept_shift/),
    a corruption and a severity drawn per corrupted client, applied once to its images.
    Different: every sample is used (FedRC gives every client n // N and drops the n mod N left over; here the first
    n mod N clients of the draw order take one more); concept c holds a contiguous block of clients (clients are
    drawn in random order, so the block says nothing of the label mix); the corruptions are `CORRUPTIONS`, those of
    FedRC's lists that need only torch and work at any image size (no blur, weather, elastic or drawn lines), with
    no "identity" among them; clients are evaluated on their own test split, where FedRC tests each concept on the
    whole test set relabelled; the pool is used once (FedRC's CIFAR-100 script repeats its training set three
    times).

    Args:
        num_concepts: concepts, the true clusters (FedRC: 3).
        concept_shares: the share of the clients in each concept (positive weights, normalized; clients are dealt
            by largest remainders); None: equal shares. FedRC: [0.5, 0.25, 0.25].
        alpha: concentration of each client's label mix, q ~ Dir(alpha p) with p the class shares still unassigned
            (about alpha / K per class: FedRC's 1.0 gives a client few classes; large alpha tends to IID).
        label_maps: "fedrc": concept 0 keeps y, concept 1 maps y -> K - 1 - y, concept 2 y -> (y + 1) mod K (at
            most 3 concepts, 2 for two classes); "random": concept 0 keeps y and the others get distinct random
            permutations drawn from `seed` (at most K! concepts).
        feature_shift: the share of each concept's clients whose images get a corruption (rounded per concept), one
            share for all concepts or one per concept; 0: no feature shift. FedRC: [0.4, 0.2, 0.2].
        corruptions: the corruptions drawn from, names of `CORRUPTIONS`; None: all of them.
        seed: seed of the "random" label maps (the rest comes from the split's generator).
        num_classes: the classes K; None takes max label + 1 seen in `assign`.
    """

    def __init__(
        self,
        num_concepts: int = 3,
        concept_shares: Sequence[float] | None = None,
        alpha: float = 1.0,
        label_maps: Literal["fedrc", "random"] = "fedrc",
        feature_shift: float | Sequence[float] = 0.0,
        corruptions: Sequence[str] | None = None,
        seed: int = 0,
        num_classes: int | None = None,
    ) -> None:
        if num_concepts < 1:
            raise ValueError(f"ConceptShift(num_concepts={num_concepts}): give at least 1 concept")
        if concept_shares is not None and (len(concept_shares) != num_concepts or min(concept_shares) <= 0):
            raise ValueError(
                f"ConceptShift(concept_shares={list(concept_shares)}): give {num_concepts} positive "
                "shares, one per concept, or None for equal shares"
            )
        if not alpha > 0:
            raise ValueError(f"ConceptShift(alpha={alpha}): the Dirichlet concentration must be positive")
        if label_maps not in ("fedrc", "random"):
            raise ValueError(f"ConceptShift(label_maps={label_maps!r}): choose 'fedrc' or 'random'")
        shares = [feature_shift] * num_concepts if isinstance(feature_shift, (int, float)) else list(feature_shift)
        if len(shares) != num_concepts or not all(0 <= s <= 1 for s in shares):
            raise ValueError(
                f"ConceptShift(feature_shift={feature_shift}): give one share in [0, 1], or "
                f"{num_concepts}, one per concept"
            )
        unknown = sorted(set(corruptions or ()) - set(CORRUPTIONS))
        if unknown or (corruptions is not None and not corruptions):
            raise ValueError(f"ConceptShift(corruptions={corruptions}): choose one or more of {sorted(CORRUPTIONS)}")
        if num_classes is not None and num_classes < 1:
            raise ValueError(f"ConceptShift(num_classes={num_classes}): give at least 1 class, or None")
        self.num_concepts, self.alpha, self.label_maps, self.seed = num_concepts, alpha, label_maps, seed
        self.shares = np.ones(num_concepts) if concept_shares is None else np.asarray(concept_shares, dtype=float)
        self.feature_shift = shares
        self.corruptions = list(corruptions) if corruptions is not None else list(CORRUPTIONS)
        self.num_classes = num_classes
        self.permutations: np.ndarray | None = None  # (num_concepts, K): concept c relabels y -> permutations[c, y]
        self.client_corruptions: list[tuple[str, int, int] | None] = []  # (name, severity, seed) per client

    # -- the ground truth --------------------------------------------------------------------------
    def concept_sizes(self, num_clients: int) -> np.ndarray:
        """Clients per concept, by largest remainders of the shares; refused when a concept gets none."""
        sizes = largest_remainders(num_clients, self.shares)
        if sizes.min() < 1:
            empty = int(np.argmin(sizes))
            shares = np.round(self.shares / self.shares.sum(), 3).tolist()
            raise ValueError(
                f"ConceptShift: concept_shares {shares} leave concept {empty} without "
                f"clients among num_clients={num_clients}: use more clients or a larger share for it"
            )
        return sizes

    def cluster_labels(self, num_clients: int) -> np.ndarray:
        """Each client's concept: contiguous blocks in concept order."""
        return np.repeat(np.arange(self.num_concepts, dtype=np.int64), self.concept_sizes(num_clients))

    def make_permutations(self, num_classes: int) -> np.ndarray:
        """(num_concepts, K) label maps, row 0 the identity; refused when K classes have fewer distinct maps."""
        if self.label_maps == "fedrc":
            y = np.arange(num_classes)
            maps = np.stack([y, num_classes - 1 - y, (y + 1) % num_classes]).astype(np.int64)
            available = len({tuple(m) for m in maps.tolist()})  # fewer than 3 below 3 classes
            if self.num_concepts > available:
                raise ValueError(
                    f"ConceptShift(num_concepts={self.num_concepts}): label_maps='fedrc' has "
                    f"{available} distinct maps for {num_classes} classes: use label_maps='random' "
                    f"or at most {available} concepts"
                )
            return maps[: self.num_concepts]
        possible = math.factorial(min(num_classes, 20))
        if self.num_concepts > possible:
            raise ValueError(
                f"ConceptShift(num_concepts={self.num_concepts}): {num_classes} classes have only "
                f"{possible} label permutations: use at most {possible} concepts"
            )
        return LabelPermutations(self.num_concepts, seed=self.seed).make_permutations(num_classes)

    # -- the split ---------------------------------------------------------------------------------
    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        labels = np.asarray(labels)
        num_classes = self.num_classes if self.num_classes is not None else int(labels.max()) + 1
        if labels.min() < 0 or labels.max() >= num_classes:
            raise ValueError(
                f"ConceptShift(num_classes={num_classes}): labels run from {labels.min()} to "
                f"{labels.max()}; give num_classes above the largest label, or None"
            )
        if len(labels) < num_clients:
            raise ValueError(
                f"ConceptShift: {len(labels)} samples cannot give each of num_clients={num_clients} "
                "one: use fewer clients"
            )
        self.permutations = self.make_permutations(num_classes)
        concepts = self.cluster_labels(num_clients)
        parts = self.draw_label_mixes(labels, num_clients, rng)
        self.client_corruptions = self.draw_corruptions(concepts, rng)
        return parts

    def draw_label_mixes(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """FedRC's sampler: clients in random order, each with q ~ Dir(alpha p) over the classes left and its size
        (n // N, one more for the first n mod N of the order) drawn from q without replacement."""
        classes = np.unique(labels)
        pools = [rng.permutation(np.flatnonzero(labels == k)) for k in classes]
        totals = np.array([len(p) for p in pools])
        left = totals.copy()
        order = rng.permutation(num_clients)
        sizes = np.full(num_clients, len(labels) // num_clients)
        sizes[order[: len(labels) % num_clients]] += 1
        parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_clients
        for client in order:
            counts = self.class_counts(left, int(sizes[client]), rng)
            start = totals - left  # each class's pool is taken from the front
            taken = [pools[k][start[k] : start[k] + counts[k]] for k in range(len(classes))]
            left -= counts
            parts[client] = np.sort(np.concatenate(taken)).astype(np.int64)
        return parts

    def class_counts(self, left: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
        """How many samples of each class a client of `size` takes, `left` of each class unassigned: `size` draws
        from q ~ Dir(alpha p), a draw of a class that has run out drawn again from q over the others."""
        live = left > 0
        q = np.zeros(len(left))
        q[live] = rng.dirichlet(self.alpha * left[live] / left.sum())
        counts = np.zeros(len(left), dtype=np.int64)
        while size > 0:
            weights = q * (counts < left)
            if not weights.sum() > 0:  # q's mass underflowed to classes that ran out: share by what is left
                weights = (left - counts).astype(float)
            drawn = np.minimum(rng.multinomial(size, weights / weights.sum()), left - counts)
            counts += drawn
            size -= int(drawn.sum())
        return counts

    def draw_corruptions(self, concepts: np.ndarray, rng: np.random.Generator) -> list[tuple[str, int, int] | None]:
        """Each concept's `feature_shift` share of its clients, drawn at random, gets a corruption, a severity and
        the seed of its noise."""
        chosen: list[tuple[str, int, int] | None] = [None] * len(concepts)
        for c, share in enumerate(self.feature_shift):
            members = np.flatnonzero(concepts == c)
            for client in rng.choice(members, size=int(round(share * len(members))), replace=False):
                name = self.corruptions[int(rng.integers(len(self.corruptions)))]
                severity = int(rng.integers(SEVERITIES.start, SEVERITIES.stop))
                chosen[client] = (name, severity, int(rng.integers(2**62)))
        return chosen

    # -- the clients' samples -----------------------------------------------------------------------
    def transform(self, x: Tensor, y: Tensor, cluster: int) -> tuple[Tensor, Tensor]:
        """The concept's label map, y -> permutations[cluster, y]."""
        if self.permutations is None:
            raise RuntimeError("ConceptShift.transform needs a prior call to assign")
        perm = torch.as_tensor(self.permutations[cluster], device=y.device)
        return x, perm[y.long()].to(y.dtype)

    def transform_client(self, x: Tensor, y: Tensor, client: int, cluster: int | None) -> tuple[Tensor, Tensor]:
        """The concept's label map and, for a corrupted client, its corruption of the images."""
        assert cluster is not None  # every client has a concept (`cluster_labels`)
        x, y = self.transform(x, y, int(cluster))
        drawn = self.client_corruptions[client] if client < len(self.client_corruptions) else None
        return (x, y) if drawn is None else (corrupt(x, *drawn), y)
