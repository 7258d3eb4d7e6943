"""How well a clustering recovers a known partition of the clients (scikit-learn's metrics, not rewritten).

Used each round when a data split defines true cluster labels (rotations, label swaps, missing-class groups).
All five scores equal 1 for a perfect recovery up to renaming the labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn import metrics


def _labels(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of labels, got shape {arr.shape}")
    return arr


def clustering_scores(true_labels: Any, predicted: Any) -> dict[str, float]:
    """ARI, AMI, homogeneity, completeness and NMI of `predicted` against `true_labels`.

    Keys: "ari", "ami", "homogeneity", "completeness", "nmi". Note that the one-shot clustered FL paper's
    "COM" column (Table 1 of "One-Shot Clustering for Federated Learning Under Clustering-Agnostic Assumption") is
    `completeness_score(pred, true)` in the authors' released code, i.e. our "homogeneity" (not stated in the paper).
    """
    true, pred = _labels(true_labels, "true_labels"), _labels(predicted, "predicted")
    if true.shape != pred.shape:
        raise ValueError(f"true_labels and predicted differ in length: {len(true)} vs {len(pred)}")
    if len(true) == 0:
        raise ValueError("cannot score an empty clustering")
    return {
        "ari": float(metrics.adjusted_rand_score(true, pred)),
        "ami": float(metrics.adjusted_mutual_info_score(true, pred)),
        "homogeneity": float(metrics.homogeneity_score(true, pred)),
        "completeness": float(metrics.completeness_score(true, pred)),
        "nmi": float(metrics.normalized_mutual_info_score(true, pred)),
    }
