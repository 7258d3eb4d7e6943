"""FEMNIST from LEAF's JSON output: one client per writer, 62 classes (digits, upper- and lower-case letters).

LEAF (`github.com/TalwalkarLab/leaf`, `data/femnist/preprocess.sh`) writes `train/*.json` and `test/*.json`
(or, before its train/test step, `all_data/*.json`), each file holding
`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [int]}}}`.
Pixels are k/255 (1.0 = white background), so they are stored losslessly as uint8 (N, 1, 28, 28) and
scaled back per batch on the device.

Parsing LEAF's JSON (a text float per pixel; 3,550 writers, 805,263 images at full size) is slow, so the parsed
writers are cached once in an array file beside the data (`fedlight.datamodules.femnist_cache`): later loads read
that, memory-mapped, and give exactly the same pool; changing a JSON file makes the next load rebuild it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import OFFICIAL_TEST, OFFICIAL_TRAIN, FederatedDataModule
from fedlight.datamodules.femnist_cache import LeafWriters, cached_writers
from fedlight.datamodules.partition import Natural, PartitionScheme
from fedlight.datamodules.support import ImageBatches, check_channels, corrupt, require

LEAF = "https://github.com/TalwalkarLab/leaf (data/femnist)"
PLACE = (
    "FEMNIST has no direct download: clone LEAF, run `./preprocess.sh -s niid --sf 1.0 -k 0 -t sample` in "
    "leaf/data/femnist (it downloads NIST SD19 itself), then copy its data/train and data/test folders "
    "(or data/all_data) into {root}"
)


class FEMNISTFederated(FederatedDataModule):
    """LEAF FEMNIST, one client per writer by default (partition `Natural`, writers in id order).

    Writers are chosen once, reproducibly, when the data is loaded: those with at least `min_samples`
    samples (train + test), then `num_writers` of them, at random from `writer_seed` or the first ones in
    id order. Only the chosen writers' samples are kept. With LEAF's train/ and test/ folders and
    `official_splits`, each writer's LEAF test samples become its client's test split.

    Args:
        root: the folder holding `train/` and `test/` (or `all_data/`) with LEAF's `*.json` files.
        num_writers: how many writers to keep (None: all that qualify).
        min_samples: writers with fewer samples are left out.
        writer_order: "random" (drawn from `writer_seed`) or "sorted" (the first writers by id: our choice for
            the 500 writers of p-FClus, "Fair Federated Data Clustering through Personalization: Bridging the
            Gap between Diverse Data Distributions", section 5, which does not say which writers it took).
        writer_seed: seed of the random writer draw.
        num_clients: number of clients; None = one per kept writer.
        partition: default `Natural(shuffle=False)`: client k is the k-th kept writer by id.
        official_splits: use LEAF's per-writer train/test split (see above); False pools both and re-splits
            by `val_fraction` / `test_fraction`.
        download: FEMNIST cannot be downloaded directly; True only explains how to make the files.
        cache: keep the parsed writers in a cache file (`fedlight-cache/` in `root`, or the machine's cache folder
            when `root` cannot be written) and read them from there while the JSON files are unchanged; False
            parses the JSON every time and writes nothing.
        normalize, mean, std: optional per-batch normalization after scaling to [0, 1] (off by default, as LEAF).
        val_fraction, test_fraction, public_size, split_seed: as in FederatedDataModule.
    """

    def __init__(
        self,
        root: str,
        num_writers: int | None = None,
        min_samples: int = 0,
        writer_order: str = "random",
        writer_seed: int = 0,
        num_clients: int | None = None,
        partition: PartitionScheme | None = None,
        official_splits: bool = True,
        download: bool = False,
        cache: bool = True,
        normalize: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        **kwargs,
    ) -> None:
        if num_writers is not None and num_writers < 1:
            raise ValueError(f"num_writers must be at least 1 (or None for all), got {num_writers}")
        if min_samples < 0:
            raise ValueError(f"min_samples must be non-negative, got {min_samples}")
        if writer_order not in ("random", "sorted"):
            raise ValueError(f"writer_order must be 'random' or 'sorted', got {writer_order!r}")
        super().__init__(
            num_clients=num_clients if num_clients is not None else 1,
            partition=partition if partition is not None else Natural(shuffle=False),
            **kwargs,
        )
        self.clients_per_writer = num_clients is None
        self.root, self.num_writers, self.min_samples = Path(root), num_writers, min_samples
        self.writer_order, self.writer_seed = writer_order, writer_seed
        self.official_splits, self.download, self.cache = official_splits, download, cache
        if normalize:
            mean, std = (mean or [0.5]), (std or [0.5])
            check_channels(mean, 1, "mean")
            check_channels(std, 1, "std")
        self.batches = ImageBatches(mean if normalize else None, std if normalize else None)
        self.writers: list[str] = []  # the kept writers' ids; pool_owners index into this list

    @property
    def num_classes(self) -> int:
        """62: digits, upper- and lower-case letters."""
        return 62

    # -- reading LEAF's files ----------------------------------------------------------------------
    def _folders(self) -> list[tuple[Path, int]]:
        """The folders to read with the split code of their samples."""
        train, test, all_data = self.root / "train", self.root / "test", self.root / "all_data"
        if train.is_dir() or test.is_dir() or not all_data.is_dir():
            return [(train, OFFICIAL_TRAIN), (test, OFFICIAL_TEST)]
        return [(all_data, OFFICIAL_TRAIN)]

    def json_files(self) -> list[tuple[Path, int]]:
        """LEAF's JSON files in reading order, each with its folder's split code; a folder without any stops with
        its expected path and how to make the files."""
        files = []
        for folder, code in self._folders():
            found = sorted(folder.glob("*.json")) if folder.is_dir() else []
            if not found:
                require(folder / "*.json", LEAF, PLACE.format(root=self.root))
            files += [(path, code) for path in found]
        return files

    def parse_json(self, files: list[tuple[Path, int]]) -> LeafWriters:
        """Every writer's samples in `files`, checked (784 pixels in [0, 1], labels 0..61), each pixel k/255 kept
        as the uint8 k; a file that is not LEAF's FEMNIST JSON stops with its path."""
        names: dict[str, int] = {}
        xs, ys, chunk_writer, chunk_split = [], [], [], []
        for path, code in files:
            try:
                with open(path) as f:
                    doc = json.load(f)
                users, user_data = doc["users"], doc["user_data"]
                for user in users:
                    x = np.asarray(user_data[user]["x"], dtype=np.float32)
                    y = np.asarray(user_data[user]["y"], dtype=np.int64)
                    if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
                        raise ValueError(f"writer {user}: x has shape {x.shape}, y {y.shape}; expected (n, 784), (n,)")
                    if len(y) and (y.min() < 0 or y.max() >= 62 or x.min() < 0 or x.max() > 1):
                        raise ValueError(f"writer {user}: labels outside 0..61 or pixels outside [0, 1]")
                    xs.append(np.rint(x * 255).astype(np.uint8))
                    ys.append(y)
                    chunk_writer.append(names.setdefault(user, len(names)))
                    chunk_split.append(code)
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
                raise corrupt(
                    path, f"not LEAF's FEMNIST JSON: {type(e).__name__}: {e}", LEAF, PLACE.format(root=self.root)
                ) from e
        return LeafWriters(
            names=np.array(list(names), dtype=str),
            x=np.concatenate([np.zeros((0, 784), np.uint8), *xs]),
            y=np.concatenate([np.zeros(0, np.int64), *ys]),
            chunk_writer=np.array(chunk_writer, dtype=np.int64),
            chunk_split=np.array(chunk_split, dtype=np.int8),
            offsets=np.cumsum([0] + [len(y) for y in ys], dtype=np.int64),
        )

    def read_writers(self) -> LeafWriters:
        """Every writer's samples: from the cache of the parsed JSON when it matches the files (`cache`), else parsed
        (and cached)."""
        files = self.json_files()
        if not self.cache:
            return self.parse_json(files)
        return cached_writers(self.root, [path for path, _ in files], lambda: self.parse_json(files))

    def choose_writers(self, counts: dict[str, int]) -> list[str]:
        """The writers kept, in id order: at least `min_samples` samples, then `num_writers` of them."""
        eligible = sorted(w for w, n in counts.items() if n >= self.min_samples and n > 0)
        if not eligible:
            raise ValueError(f"no writer in {self.root} has min_samples={self.min_samples} samples")
        if self.num_writers is not None and self.num_writers > len(eligible):
            raise ValueError(
                f"num_writers={self.num_writers} but only {len(eligible)} writers in {self.root} have "
                f"min_samples={self.min_samples} samples"
            )
        if self.num_writers is None or self.num_writers == len(eligible):
            return eligible
        if self.writer_order == "sorted":
            return eligible[: self.num_writers]
        picked = np.random.default_rng(self.writer_seed).choice(len(eligible), self.num_writers, replace=False)
        return [eligible[i] for i in np.sort(picked)]

    def load_pool(self) -> tuple[Tensor, Tensor]:
        if self.download and not any(folder.is_dir() for folder, _ in self._folders()):
            raise FileNotFoundError(
                f"FEMNIST cannot be downloaded directly (download: true).\n  {PLACE.format(root=self.root)}"
            )
        parsed = self.read_writers()
        self.writers = self.choose_writers(parsed.sample_counts())
        x, y, owners, splits = parsed.gather(self.writers)
        if self.clients_per_writer:
            self.num_clients = len(self.writers)
        self.pool_owners = owners
        has_test = any(code == OFFICIAL_TEST for _, code in self._folders())  # all_data/ has no official split
        self.pool_splits = splits if self.official_splits and has_test else None
        return torch.from_numpy(x).view(-1, 1, 28, 28), torch.from_numpy(y)

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return self.batches(x), y
