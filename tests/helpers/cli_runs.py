"""The command line of a small digits run that tests start as real processes: 6 clients in 2 rotation clusters, a
narrow SmallCNN, on the CPU; each test appends its rounds, algorithm, trainer and output."""

from __future__ import annotations

DIGITS_RUN = [
    "fit",
    "--data",
    "fedlight.datamodules.DigitsFederated",
    "--data.num_clients",
    "6",
    "--data.partition",
    "fedlight.datamodules.Rotations",
    "--data.partition.init_args.num_clusters",
    "2",
    "--model",
    "fedlight.models.Classifier",
    "--model.network",
    "fedlight.models.SmallCNN",
    "--model.network.init_args.width",
    "8",
    "--model.lr",
    "0.1",
    "--federation.batch_size",
    "32",
    "--federation.accelerator",
    "cpu",
]
