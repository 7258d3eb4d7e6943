"""Partition schemes: how a pool of labelled samples is cut into clients.

Every scheme gives each sample of the pool to exactly one client (or, for schemes that say so, leaves it
out on purpose and documents it). Cluster schemes also define a true cluster per client and a transform
applied to that client's samples (rotation, label permutation), so clustering algorithms can be scored.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


class PartitionScheme:
    """Base class. `assign` returns one index array per client, disjoint, into the pool."""

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        """Split the pool. `owners` (one id per sample, e.g. the writer or user) is given by data sets with a
        natural partition; schemes that do not use it ignore it."""
        raise NotImplementedError

    def cluster_labels(self, num_clients: int) -> np.ndarray | None:
        """The true cluster of each client, or None when the scheme defines none."""
        return None

    def transform(self, x: Tensor, y: Tensor, cluster: int) -> tuple[Tensor, Tensor]:
        """Transform one client's samples given its true cluster (identity by default)."""
        return x, y

    def transform_client(self, x: Tensor, y: Tensor, client: int, cluster: int | None) -> tuple[Tensor, Tensor]:
        """Transform client `client`'s samples, `cluster` its true cluster (None when the scheme defines none): the
        cluster's `transform` by default. A scheme whose transform also differs between the clients of a cluster
        (a feature shift inside a concept: `ConceptShift`) overrides this."""
        return (x, y) if cluster is None else self.transform(x, y, cluster)


class IID(PartitionScheme):
    """Uniformly random, equal-size (up to one sample) split."""

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


# -- helpers -----------------------------------------------------------------------------------------
_MAX_TRIES = 1000


def _sorted(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _split_by_proportions(idx: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """Cut `idx` into len(proportions) consecutive chunks of (about) the given shares."""
    cuts = (np.cumsum(proportions) / proportions.sum() * len(idx)).astype(int)[:-1]
    return np.split(idx, cuts)


def largest_remainders(total: int, weights: np.ndarray) -> np.ndarray:
    """`total` whole units shared in proportion to `weights`: each gets the floor of its exact share and the largest
    remainders one more each (the first on a tie), so the counts add up to `total`."""
    exact = total * np.asarray(weights, dtype=float) / np.sum(weights)
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]] += 1
    return counts


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _check_min_size(min_size: int) -> None:
    if min_size < 0:
        raise ValueError(f"min_size must be non-negative, got {min_size}")


def _check_room(n: int, num_clients: int, min_size: int, scheme: str) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients * min_size > n:
        raise ValueError(
            f"{scheme}: {num_clients} clients x min_size={min_size} needs more than the {n} samples in the pool"
        )


# -- label and quantity skew -------------------------------------------------------------------------
class _RedrawnScheme(PartitionScheme):
    """A scheme drawing Dirichlet(alpha) proportions, redrawn until every client has `min_size` samples."""

    def __init__(self, alpha: float = 0.5, min_size: int = 2, max_tries: int = _MAX_TRIES) -> None:
        _check_positive("alpha", alpha)
        _check_min_size(min_size)
        self.alpha, self.min_size, self.max_tries = alpha, min_size, max_tries

    def _give_up(self, num_clients: int) -> ValueError:
        return ValueError(
            f"{type(self).__name__}(alpha={self.alpha}) could not give every one of {num_clients} "
            f"clients min_size={self.min_size} samples in {self.max_tries} draws: raise alpha, "
            "lower min_size, or use fewer clients"
        )


class Dirichlet(_RedrawnScheme):
    """Label skew by class-wise Dirichlet proportions (NIID-Bench "distribution-based label imbalance",
    as used by FLIS with Dir(0.1)).

    For each class, its shuffled samples are split among the clients by p ~ Dir(alpha * 1_n); a client
    that already holds its fair share (pool size / n) gets no more (p_j = 0, renormalised), which keeps
    sizes from running away. The whole draw is repeated until every client has `min_size` samples.
    Small alpha = few classes per client (strong skew); large alpha tends to IID.

    Args:
        alpha: Dirichlet concentration (> 0).
        min_size: the fewest samples any client may end with.
        max_tries: draws attempted before giving up with an error.
    """

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        labels = np.asarray(labels)
        _check_room(len(labels), num_clients, self.min_size, "Dirichlet")
        fair = len(labels) / num_clients
        for _ in range(self.max_tries):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            sizes = np.zeros(num_clients, dtype=np.int64)
            for k in np.unique(labels):
                idx = rng.permutation(np.flatnonzero(labels == k))
                p = rng.dirichlet(np.full(num_clients, self.alpha)) * (sizes < fair)
                if p.sum() <= 0:  # every open client drew an underflowed 0: share evenly among them
                    p = (sizes < fair).astype(float)
                for j, chunk in enumerate(_split_by_proportions(idx, p)):
                    parts[j].append(chunk)
                    sizes[j] += len(chunk)
            if sizes.min() >= self.min_size:
                return _sorted([np.concatenate(p) for p in parts])
        raise self._give_up(num_clients)


class ClassesPerClient(PartitionScheme):
    """Label skew where every client holds exactly `classes_per_client` distinct classes (NIID-Bench
    "#C=k", FLIS's "p% label skew": p% of the K classes, i.e. 2 or 3 of 10 for 20% / 30%).

    Client i's first class is the (i mod K)-th class; its other classes are drawn at random without
    repetition. Each class's shuffled samples are then split into equal chunks, one per client holding
    it. With fewer clients than classes, the classes no client drew first are dealt into the clients'
    random slots first, so every class is held and no sample is lost.

    Args:
        classes_per_client: classes per client (ignored when `fraction` is given).
        fraction: classes per client as a share of the classes present, e.g. 0.2 for FLIS's 20%
            (rounded, at least 1); takes precedence over `classes_per_client`.
    """

    def __init__(self, classes_per_client: int = 2, fraction: float | None = None) -> None:
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if fraction is None and classes_per_client < 1:
            raise ValueError(f"classes_per_client must be at least 1, got {classes_per_client}")
        self.classes_per_client, self.fraction = classes_per_client, fraction

    def num_held(self, num_classes: int) -> int:
        """Classes per client for a pool of `num_classes` classes."""
        if self.fraction is None:
            return self.classes_per_client
        return max(1, int(round(self.fraction * num_classes)))

    def choose_classes(self, num_classes: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The class positions (0..K-1) each client holds."""
        s = self.num_held(num_classes)
        if s > num_classes:
            raise ValueError(f"classes_per_client={s} exceeds the {num_classes} classes in the pool")
        if num_clients * s < num_classes:
            raise ValueError(
                f"{num_clients} clients x {s} classes cannot cover all {num_classes} classes: "
                "use more clients or more classes per client"
            )
        held = [[i % num_classes] for i in range(num_clients)]
        orphans = rng.permutation(np.arange(num_clients, num_classes))  # classes nobody got first
        for i in range(num_clients):
            held[i] += orphans[i::num_clients].tolist()
            rest = np.setdiff1d(np.arange(num_classes), held[i])
            held[i] += rng.choice(rest, s - len(held[i]), replace=False).tolist()
        return [np.asarray(h) for h in held]

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        labels = np.asarray(labels)
        classes = np.unique(labels)
        held = self.choose_classes(len(classes), num_clients, rng)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, k in enumerate(classes):
            holders = [i for i in range(num_clients) if c in held[i]]
            idx = rng.permutation(np.flatnonzero(labels == k))
            if len(idx) < len(holders):
                raise ValueError(
                    f"class {k} has {len(idx)} samples but {len(holders)} clients hold it: "
                    "use fewer clients or fewer classes per client"
                )
            for i, chunk in zip(holders, np.array_split(idx, len(holders))):
                parts[i].append(chunk)
        return _sorted([np.concatenate(p) for p in parts])


class Shards(PartitionScheme):
    """Pathological label skew of FedAvg (McMahan et al.): sort the pool by label, cut it into
    num_clients * shards_per_client equal shards and deal `shards_per_client` random shards to each
    client, so each client sees only a few classes.

    Args:
        shards_per_client: shards dealt to each client.
    """

    def __init__(self, shards_per_client: int = 2) -> None:
        if shards_per_client < 1:
            raise ValueError(f"shards_per_client must be at least 1, got {shards_per_client}")
        self.shards_per_client = shards_per_client

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        labels = np.asarray(labels)
        num_shards = num_clients * self.shards_per_client
        if num_shards > len(labels):
            raise ValueError(f"{num_shards} shards need at least as many samples; the pool has {len(labels)}")
        shuffled = rng.permutation(len(labels))  # random order within each label
        by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
        shards = np.array_split(by_label, num_shards)
        deal = rng.permutation(num_shards).reshape(num_clients, self.shards_per_client)
        return _sorted([np.concatenate([shards[s] for s in row]) for row in deal])


class QuantitySkew(_RedrawnScheme):
    """Quantity skew (NIID-Bench): client sizes follow Dir(alpha) proportions, samples are uniform, so
    label distributions stay IID while sizes differ. Redrawn until every client has `min_size` samples.

    Args:
        alpha: Dirichlet concentration (> 0); small = very unequal sizes.
        min_size: the fewest samples any client may end with.
        max_tries: draws attempted before giving up with an error.
    """

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        n = len(labels)
        _check_room(n, num_clients, self.min_size, "QuantitySkew")
        for _ in range(self.max_tries):
            p = rng.dirichlet(np.full(num_clients, self.alpha))
            parts = _split_by_proportions(rng.permutation(n), p)
            if min(len(part) for part in parts) >= self.min_size:
                return _sorted(parts)
        raise self._give_up(num_clients)


class Natural(PartitionScheme):
    """The data set's own partition: one client per owner (FEMNIST writer, WISDM user).

    With more owners than clients, `num_clients` owners are picked (at random with `shuffle`, else the
    first ids in sorted order) and the samples of the owners not picked are LEFT OUT: this is the only
    scheme that drops samples. Fewer owners than clients is an error. The ids picked, in client order,
    are kept in `owner_ids` after `assign`.

    Args:
        shuffle: pick the owners at random (reproducibly from the split's rng) and in random order;
            False takes the smallest owner ids in sorted order.
    """

    def __init__(self, shuffle: bool = True) -> None:
        self.shuffle = shuffle
        self.owner_ids: np.ndarray | None = None

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        if owners is None:
            raise ValueError("this data set has no natural owners; use another partition")
        owners = np.asarray(owners)
        if len(owners) != len(labels):
            raise ValueError(f"owners has {len(owners)} entries for {len(labels)} samples")
        ids, inverse = np.unique(owners, return_inverse=True)
        if len(ids) < num_clients:
            raise ValueError(f"the data set has {len(ids)} natural owners, fewer than num_clients={num_clients}")
        picked = rng.permutation(len(ids))[:num_clients] if self.shuffle else np.arange(num_clients)
        self.owner_ids = ids[picked]
        order = np.argsort(inverse, kind="stable")  # sample indices grouped by owner, ascending
        groups = np.split(order, np.cumsum(np.bincount(inverse, minlength=len(ids)))[:-1])
        return _sorted([groups[g] for g in picked])


# -- cluster schemes with a ground truth -------------------------------------------------------------
class Groups(PartitionScheme):
    """Clients cut within the data set's natural groups (a column of the rows: a task, a category, an author), each
    group a true cluster: group g gets a share of the clients proportional to its samples (largest remainders, at
    least one each; groups in sorted order, so its clients are a contiguous block) and `base` splits its samples among
    them (IID when None). Every sample goes to exactly one client.

    Args:
        base: the split of a group's samples among its clients.
    """

    def __init__(self, base: PartitionScheme | None = None) -> None:
        self.base = base if base is not None else IID()
        self.groups: np.ndarray | None = None  # each client's group, after `assign`
        self.group_ids: np.ndarray | None = None

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        if owners is None:
            raise ValueError(
                "this data set has no groups; give the data module a group column (`group_column`) or "
                "use another partition"
            )
        ids, inverse = np.unique(np.asarray(owners), return_inverse=True)
        if num_clients < len(ids):
            raise ValueError(
                f"{num_clients} clients cannot fill the data's {len(ids)} groups; use at least {len(ids)} clients"
            )
        sizes = np.bincount(inverse, minlength=len(ids))
        counts = clients_by_size(sizes, num_clients)
        parts: list[np.ndarray] = []
        for group, count in enumerate(counts):
            members = np.flatnonzero(inverse == group)
            parts += [members[part] for part in self.base.assign(np.asarray(labels)[members], int(count), rng)]
        self.group_ids, self.groups = ids, np.repeat(np.arange(len(ids)), counts)
        return _sorted(parts)

    def cluster_labels(self, num_clients: int) -> np.ndarray | None:
        return self.groups


def clients_by_size(sizes: np.ndarray, num_clients: int) -> np.ndarray:
    """Clients per group proportional to `sizes`, at least one each, summing to `num_clients` (largest remainders)."""
    extra = num_clients - len(sizes)
    share = sizes / sizes.sum() * extra
    counts = np.floor(share).astype(np.int64)
    counts[np.argsort(-(share - counts), kind="stable")[: extra - counts.sum()]] += 1
    return counts + 1


class ClusterScheme(PartitionScheme):
    """Base of the schemes with true clusters: `base` splits the samples (IID when None) and client k
    belongs to cluster k * num_clusters // num_clients (contiguous, balanced blocks)."""

    def __init__(self, num_clusters: int, base: PartitionScheme | None = None) -> None:
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be at least 1, got {num_clusters}")
        self.num_clusters = num_clusters
        self.base = base if base is not None else IID()

    def _check_clients(self, num_clients: int) -> None:
        if num_clients < self.num_clusters:
            raise ValueError(f"{num_clients} clients cannot fill {self.num_clusters} clusters")

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        self._check_clients(num_clients)
        return self.base.assign(labels, num_clients, rng, owners)

    def cluster_labels(self, num_clients: int) -> np.ndarray:
        return np.arange(num_clients, dtype=np.int64) * self.num_clusters // num_clients


class Rotations(ClusterScheme):
    """Covariate-shift clusters (the IFCA / CFL rotated-images benchmark): every image of a cluster-c
    client is rotated counter-clockwise by angles[c] degrees (default 360 * c / num_clusters).

    Multiples of 90 use `torch.rot90` (exact, any dtype); other angles use torchvision's bilinear
    `rotate` (corners filled with 0). Images are (n, C, H, W) or (n, H, W).

    Args:
        num_clusters: number of clusters.
        angles: one angle in degrees per cluster; None spreads them evenly over the circle.
        base: the sample split (IID when None).
    """

    def __init__(
        self, num_clusters: int = 4, angles: list[float] | None = None, base: PartitionScheme | None = None
    ) -> None:
        super().__init__(num_clusters, base)
        if angles is None:
            angles = [360.0 * c / num_clusters for c in range(num_clusters)]
        if len(angles) != num_clusters:
            raise ValueError(f"angles has {len(angles)} entries for {num_clusters} clusters")
        self.angles = [float(a) for a in angles]

    def transform(self, x: Tensor, y: Tensor, cluster: int) -> tuple[Tensor, Tensor]:
        angle = self.angles[cluster] % 360.0
        if angle % 90.0 == 0:
            return torch.rot90(x, int(angle // 90), dims=(-2, -1)), y
        from torchvision.transforms.functional import InterpolationMode, rotate

        return rotate(x, angle, interpolation=InterpolationMode.BILINEAR), y


class LabelPermutations(ClusterScheme):
    """Concept-shift clusters (label swaps): cluster 0 keeps its labels, every other cluster relabels
    y -> perm_c[y] with its own random permutation of the classes (distinct across clusters, never the
    identity), so the same image means different things in different clusters.

    Args:
        num_clusters: number of clusters.
        base: the sample split (IID when None).
        seed: seed of the permutations (independent of the split's rng).
        num_classes: number of classes; None takes max label + 1 seen in `assign`.
    """

    def __init__(
        self, num_clusters: int = 4, base: PartitionScheme | None = None, seed: int = 0, num_classes: int | None = None
    ) -> None:
        super().__init__(num_clusters, base)
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"num_classes must be at least 2 to permute labels, got {num_classes}")
        self.seed, self.num_classes = seed, num_classes
        self.permutations: np.ndarray | None = None  # (num_clusters, num_classes), row 0 the identity
        if num_classes is not None:
            self.permutations = self.make_permutations(num_classes)

    def make_permutations(self, num_classes: int) -> np.ndarray:
        """(num_clusters, num_classes) distinct permutations of the classes from `seed`, row 0 the identity; refused
        when there are too few classes for `num_clusters` of them."""
        if num_classes < 2 and self.num_clusters > 1:
            raise ValueError("label permutations need at least 2 classes")
        if self.num_clusters > math.factorial(min(num_classes, 20)):
            raise ValueError(f"{num_classes} classes have fewer than {self.num_clusters} distinct permutations")
        rng = np.random.default_rng(self.seed)
        perms = [np.arange(num_classes)]
        while len(perms) < self.num_clusters:  # rejection is quick: collisions are rare unless K is tiny
            p = rng.permutation(num_classes)
            if not any(np.array_equal(p, q) for q in perms):
                perms.append(p)
        return np.stack(perms).astype(np.int64)

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        labels = np.asarray(labels)
        num_classes = self.num_classes if self.num_classes is not None else int(labels.max()) + 1
        if labels.max() >= num_classes:
            raise ValueError(f"label {labels.max()} is out of range for num_classes={num_classes}")
        if self.permutations is None or self.permutations.shape[1] != num_classes:
            self.permutations = self.make_permutations(num_classes)
        return super().assign(labels, num_clients, rng, owners)

    def transform(self, x: Tensor, y: Tensor, cluster: int) -> tuple[Tensor, Tensor]:
        if self.permutations is None:
            raise RuntimeError("LabelPermutations.transform needs num_classes or a prior call to assign")
        perm = torch.as_tensor(self.permutations[cluster], device=y.device)
        return x, perm[y.long()].to(y.dtype)


class MissingClasses(ClusterScheme):
    """Missing-class clusters (OCFL's "NO" / "O" construction): the clients of cluster c only ever see
    the classes in class_sets[c].

    Default class sets (K classes cut into num_clusters contiguous groups G_0..G_{C-1} by
    np.array_split): non-overlapping, cluster c keeps G_c (for 3 clusters and 10 / 9 / 8 classes
    exactly OCFL's NO sets {0-3}/{4-6}/{7-9}, {0-2}/{3-5}/{6-8}, {0-2}/{3-5}/{6,7}); with `overlap`,
    cluster c keeps G_c and G_{c+1 mod C}, so the overlap is pairwise only and, for 3 or more
    clusters, no class is in every cluster (OCFL's resolution A7). OCFL's exact 10-class code sets are
    in `OCFL_CLASS_SETS` for `class_sets`.

    Unlike OCFL's code, which draws each client's rows with replacement from one shared pool (the same
    image can land in several clients), every sample here goes to exactly one client: each class's
    samples are shared among the clusters keeping it in proportion to their client counts (so every
    client holding a class gets about the same amount of it), then `base` splits each cluster's samples
    among its clients. A class kept by no cluster is an error (no sample is dropped silently).

    Args:
        num_clusters: number of clusters (OCFL uses 3).
        overlap: the overlapping ("O") default sets instead of the disjoint ("NO") ones.
        class_sets: explicit classes kept by each cluster; overrides the defaults.
        cluster_sizes: clients per cluster in contiguous blocks (OCFL's imbalanced 3/7/5 for 15
            clients); None = balanced blocks.
        num_classes: number of classes; None takes max label + 1 seen in `assign`.
        base: the split of each cluster's samples among its clients (IID when None).
    """

    def __init__(
        self,
        num_clusters: int = 3,
        overlap: bool = False,
        class_sets: list[list[int]] | None = None,
        cluster_sizes: list[int] | None = None,
        num_classes: int | None = None,
        base: PartitionScheme | None = None,
    ) -> None:
        super().__init__(num_clusters, base)
        if class_sets is not None:
            if len(class_sets) != num_clusters:
                raise ValueError(f"class_sets has {len(class_sets)} sets for {num_clusters} clusters")
            if any(len(s) == 0 for s in class_sets):
                raise ValueError("every cluster must keep at least one class")
            class_sets = [sorted({int(k) for k in s}) for s in class_sets]
        if cluster_sizes is not None:
            if len(cluster_sizes) != num_clusters or min(cluster_sizes) < 1:
                raise ValueError(f"cluster_sizes must give {num_clusters} positive client counts, got {cluster_sizes}")
        self.overlap, self.class_sets, self.cluster_sizes = overlap, class_sets, cluster_sizes
        self.num_classes = num_classes

    def kept_classes(self, num_classes: int) -> list[list[int]]:
        """The classes each cluster keeps, for a pool of `num_classes` classes."""
        if self.class_sets is not None:
            return self.class_sets
        if num_classes < self.num_clusters:
            raise ValueError(f"{num_classes} classes cannot be cut into {self.num_clusters} groups")
        groups = [g.tolist() for g in np.array_split(np.arange(num_classes), self.num_clusters)]
        if not self.overlap or self.num_clusters == 1:
            return groups
        return [sorted(groups[c] + groups[(c + 1) % self.num_clusters]) for c in range(self.num_clusters)]

    def cluster_labels(self, num_clients: int) -> np.ndarray:
        if self.cluster_sizes is None:
            return super().cluster_labels(num_clients)
        if sum(self.cluster_sizes) != num_clients:
            raise ValueError(
                f"cluster_sizes {self.cluster_sizes} add up to {sum(self.cluster_sizes)}, not num_clients={num_clients}"
            )
        return np.repeat(np.arange(self.num_clusters, dtype=np.int64), self.cluster_sizes)

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        self._check_clients(num_clients)
        labels = np.asarray(labels)
        num_classes = self.num_classes if self.num_classes is not None else int(labels.max()) + 1
        kept = self.kept_classes(num_classes)
        clusters = self.cluster_labels(num_clients)
        counts = np.bincount(clusters, minlength=self.num_clusters)
        members: list[list[np.ndarray]] = [[] for _ in range(self.num_clusters)]
        for k in np.unique(labels):
            holders = [c for c in range(self.num_clusters) if k in kept[c]]
            if not holders:
                raise ValueError(
                    f"class {k} is kept by no cluster, so its samples would be lost: "
                    "every class must appear in some class set"
                )
            idx = rng.permutation(np.flatnonzero(labels == k))
            for c, chunk in zip(holders, _split_by_proportions(idx, counts[holders].astype(float))):
                members[c].append(chunk)
        parts: list[np.ndarray] = []
        for c in range(self.num_clusters):
            if not members[c]:
                raise ValueError(f"cluster {c} keeps classes {kept[c]}, none of which is in the pool")
            pool = np.sort(np.concatenate(members[c]))
            sub = self.base.assign(labels[pool], int(counts[c]), rng, None if owners is None else owners[pool])
            parts += [pool[p] for p in sub]
        return _sorted(parts)


# OCFL's label sets for 10-class data sets ("One-Shot Clustering for Federated Learning Under Clustering-Agnostic
# Assumption", section 3.1.2 leaves them open), straight from the authors' code.
OCFL_CLASS_SETS: dict[str, list[list[int]]] = {
    "NO": [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]],
    "O": [[0, 1, 2, 3, 8, 9], [4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5]],
}
