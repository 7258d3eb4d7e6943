"""FEMNIST at LEAF's size made in memory: the writers and splits `femnist_load.leaf_writers` draws (3,550 writers,
805,263 images), random pixels and labels, no files. For timing a whole run where LEAF's 4.8 GB of JSON cannot
travel (a leased GPU machine takes 64 MiB): a run's speed does not depend on what the pixels show.

    PYTHONPATH=benchmarks python -m fedlight fit --config configs/cross_device/femnist/fedavg.yaml \
        --data made_femnist.MadeFemnist --federation.accelerator cuda
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from femnist_load import LEAF_IMAGES, LEAF_WRITERS, leaf_writers

from fedlight.datamodules import FEMNISTFederated
from fedlight.datamodules.base import OFFICIAL_TEST, OFFICIAL_TRAIN
from fedlight.datamodules.femnist_cache import LeafWriters


class MadeFemnist(FEMNISTFederated):
    """`FEMNISTFederated` on made writers: every option of it (num_writers, writer_order, official_splits,
    public_size, ...) acts as on LEAF's files; `root` names nothing read."""

    def __init__(
        self, root: str = "(made in memory)", writers: int = LEAF_WRITERS, images: int = LEAF_IMAGES, **options
    ) -> None:
        super().__init__(root=root, **options)
        self.made_writers, self.made_images = writers, images

    def _folders(self) -> list[tuple[Path, int]]:
        return [(Path("train"), OFFICIAL_TRAIN), (Path("test"), OFFICIAL_TEST)]

    def read_writers(self) -> LeafWriters:
        """Each writer's train chunk, then its test chunk, as LEAF's train/ and test/ files would give them."""
        sizes = leaf_writers(self.made_writers, self.made_images)
        rng = np.random.default_rng(0)
        counts = [n for pair in sizes.values() for n in pair]
        total = sum(counts)
        return LeafWriters(
            names=np.array(list(sizes), dtype=str),
            x=rng.integers(0, 256, (total, 784), dtype=np.uint8),
            y=rng.integers(0, 62, total, dtype=np.int64),
            chunk_writer=np.repeat(np.arange(len(sizes)), 2),
            chunk_split=np.tile(np.array([OFFICIAL_TRAIN, OFFICIAL_TEST], dtype=np.int8), len(sizes)),
            offsets=np.cumsum([0] + counts, dtype=np.int64),
        )
