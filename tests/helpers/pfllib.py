"""PFLlib's benchmark splits (configs/papers/pfllib/) and its leaderboard's published numbers, which the configs'
comments quote."""

from __future__ import annotations


SPLITS = ("cifar100_dir0.1", "cifar100_pat", "fmnist_dir0.1", "fmnist_pat")


#: the leaderboard's Cifar100 numbers (pathological, practical); FedPer's and FedRep's are also GPFL's Table 1's
PUBLISHED = {
    "fedavg": ("25.98 +- 0.13", "31.89 +- 0.47"),
    "fedprox": ("25.94 +- 0.16", "31.99 +- 0.41"),
    "perfedavg": ("56.80 +- 0.26", "44.28 +- 0.33"),
    "pfedme": ("58.20 +- 0.14", "47.34 +- 0.46"),
    "ditto": ("67.23 +- 0.07", "52.87 +- 0.64"),
    "apfl": ("64.26 +- 0.13", "46.74 +- 0.60"),
    "fedamp": ("64.34 +- 0.37", "47.69 +- 0.49"),
    "fedper": ("63.53 +- 0.21", "49.63 +- 0.54"),
    "fedrep": ("67.56 +- 0.31", "52.39 +- 0.35"),
    "fedrod": ("62.30 +- 0.02", "50.94 +- 0.11"),
    "fedbabu": ("66.85 +- 0.07", "55.02 +- 0.33"),
    "fedcp": ("71.80 +- 0.16", "59.56 +- 0.08"),
    "gpfl": ("71.78 +- 0.26", "61.86 +- 0.31"),
    "feddbe": ("73.38 +- 0.18", "64.39 +- 0.27"),
    "fedproto": ("69.18 +- 0.03", "52.70 +- 0.33"),
}


#: the leaderboard's FMNIST numbers (pathological, practical): the methods of the FMNIST splits
FMNIST_PUBLISHED = {
    "fedavg": ("80.41 +- 0.08", "85.85 +- 0.19"),
    "ditto": ("99.44 +- 0.06", "97.47 +- 0.04"),
    "fedala": ("99.57 +- 0.01", "97.66 +- 0.02"),
    "gpfl": ("99.85 +- 0.08", "97.81 +- 0.09"),
    "feddbe": ("99.74 +- 0.04", "97.69 +- 0.05"),
}
