"""Cluster-stratified selection: each cluster of the algorithm's current assignment gets its share of the cohort,
proportional to its available clients and rounded by largest remainder (Hamilton's method), drawn uniformly within
the cluster, so a small cluster is not starved by chance. An algorithm that does not cluster (one cluster) gets the
uniform draw's distribution."""

from __future__ import annotations

import numpy as np

from fedlight.system.selection import SelectionContext


def largest_remainder(seats: int, sizes: np.ndarray) -> np.ndarray:
    """(len(sizes),) `seats` shared in proportion to `sizes` by largest remainder: every part its quota's floor,
    then one more for the largest fractional parts, ties to the earlier part. Exact: integer arithmetic."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    quotas, remainders = np.divmod(seats * sizes, total)
    left = seats - int(quotas.sum())
    quotas[np.argsort(-remainders, kind="stable")[:left]] += 1
    return quotas


class ClusterStratified:
    """Each cluster's share of the cohort (`largest_remainder` of its available clients), uniformly within it."""

    def __init__(self, context: SelectionContext) -> None:
        self.context = context

    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """`count` clients of `available`, sorted: each cluster's `largest_remainder` share of them, drawn uniformly
        within the cluster."""
        labels = self.context.clusters()[available]
        clusters, sizes = np.unique(labels, return_counts=True)
        rng = self.context.rng(round, "select")
        chosen = [
            rng.choice(available[labels == k], size=q, replace=False)
            for k, q in zip(clusters, largest_remainder(count, sizes))
            if q
        ]
        return sorted(int(c) for c in np.concatenate(chosen))
