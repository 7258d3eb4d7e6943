"""The clustering toolkit algorithms build on (docs/architecture.md, "Clustering toolkit").

- `clusterers`: interchangeable components that cluster clients from an n x n distance or similarity matrix
  (`HDBSCAN`, `DBSCAN`, `Agglomerative`, `KMeans`, `MeanShift`, `AffinityPropagation`; scikit-learn's
  `fit_predict` convention, noise policies, a registry by name).
- `similarity`: the matrices themselves, on the device: cosine and L2 of flat updates, Jensen-Shannon of
  outputs, agreement of predictions; column-blocked for large models.
- `differences`: clients' updates (trained minus start, on a mask's entries) as a matrix built a block at a time,
  never whole, for the similarity matrices and cluster means of large models.
- `kcenters`: (k, l)-clustering of data points in torch: k-means, k-medoids, Lloyd for any l, k-means++,
  Awasthi-Sheffet (for algorithms that cluster data rather than clients).
- `hopkins`: the Hopkins statistic (is there cluster structure at all?).
- `scores`: how well a clustering recovers a known partition (ARI, AMI, homogeneity, completeness, NMI).
"""

from fedlight.cluster.clusterers import (
    AffinityPropagation,
    Agglomerative,
    Clusterer,
    DBSCAN,
    HDBSCAN,
    KMeans,
    MeanShift,
    make_clusterer,
    register_clusterer,
)

__all__ = [
    "AffinityPropagation",
    "Agglomerative",
    "Clusterer",
    "DBSCAN",
    "HDBSCAN",
    "KMeans",
    "MeanShift",
    "make_clusterer",
    "register_clusterer",
]
