"""MedMNIST v2 (2-D flags) from the official `.npz` files, with the official train/val/test splits.

The file `<root>/<flag>.npz` (size 28) or `<root>/<flag>_<size>.npz` (64, 128, 224) holds `train_images`,
`train_labels`, `val_*` and `test_*`: images (N, H, W) or (N, H, W, 3) uint8, labels (N, 1). Label names,
channels and download addresses come from `medmnist.INFO` (imported lazily: importing medmnist creates
`~/.medmnist`). Images stay uint8 (N, C, H, W) in the pool and are scaled on the device per batch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import OFFICIAL_TEST, OFFICIAL_TRAIN, OFFICIAL_VAL, FederatedDataModule
from fedlight.datamodules.support import (
    CorruptFileError,
    ImageBatches,
    check_channels,
    corrupt,
    download,
    md5sum,
    require,
)

SIZES = (28, 64, 128, 224)
SPLIT_CODES = {"train": OFFICIAL_TRAIN, "val": OFFICIAL_VAL, "test": OFFICIAL_TEST}


def medmnist_info() -> dict:
    """`medmnist.INFO` (flag -> description, labels, channels, URLs, MD5s), imported on first use."""
    from medmnist.info import INFO

    return INFO


def flags_2d() -> list[str]:
    """The 2-D MedMNIST flags (the 3-D ones end in '3d')."""
    return [flag for flag in medmnist_info() if not flag.endswith("3d")]


def _stored_shape(arrays: np.lib.npyio.NpzFile, key: str) -> tuple[int, ...]:
    """The shape of one array of an `.npz`, read from its header without loading the array."""
    assert arrays.zip is not None  # an open file
    with arrays.zip.open(f"{key}.npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        return read(f)[0]


class MedMNISTFederated(FederatedDataModule):
    """One 2-D MedMNIST data set (OCFL uses `pathmnist` and `bloodmnist`), cut into clients by any partition.

    With `official_splits` (default) the partition cuts train+val+test together, and each client's official
    val and test samples become its val and test splits (`val_fraction`/`test_fraction` unused); public data
    comes from the official training split. Without it, all samples are pooled and re-split by fractions.

    Args:
        root: the folder holding `<flag>.npz` / `<flag>_<size>.npz`.
        flag: a 2-D MedMNIST flag, e.g. "pathmnist", "bloodmnist". Multi-label "chestmnist" is refused.
        size: image side, 28 (default) or 64/128/224 where MedMNIST publishes that size.
        download: fetch the file from Zenodo when it is missing (needs network).
        official_splits: keep the official train/val/test splits (see above).
        normalize: per-channel (x - mean) / std after scaling to [0, 1]; MedMNIST's own examples use 0.5/0.5.
        mean, std: the normalization statistics (one per channel, or one for all); default 0.5 / 0.5.
        as_rgb: repeat grayscale images to 3 channels per batch (for networks built for RGB).
        verify_md5: check the file against MedMNIST's MD5 before loading (slow for the large sizes).
        num_clients, partition, val_fraction, test_fraction, public_size, split_seed: as in FederatedDataModule.
    """

    def __init__(
        self,
        root: str,
        flag: str = "pathmnist",
        size: int = 28,
        download: bool = False,
        official_splits: bool = True,
        normalize: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        as_rgb: bool = False,
        verify_md5: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        info = medmnist_info()
        flag = flag.lower()
        if flag not in info:
            raise ValueError(f"unknown MedMNIST flag {flag!r}; the 2-D flags are {flags_2d()}")
        if flag.endswith("3d"):
            raise ValueError(f"{flag!r} is a 3-D MedMNIST set; only the 2-D flags are supported: {flags_2d()}")
        if info[flag]["task"].startswith("multi-label"):
            raise ValueError(
                f"{flag!r} is multi-label ({info[flag]['task']}, {len(info[flag]['label'])} labels per "
                "image); fedlight's data modules give one class per sample, so it is not supported"
            )
        if size not in SIZES or (size != 28 and f"url_{size}" not in info[flag]):
            available = [28] + [s for s in SIZES[1:] if f"url_{s}" in info[flag]]
            raise ValueError(f"size must be one of {available} for {flag!r}, got {size}")
        self.root, self.flag, self.size = Path(root), flag, size
        self.download, self.official_splits, self.verify_md5 = download, official_splits, verify_md5
        self.info = info[flag]
        self.channels = int(self.info["n_channels"])
        self.class_names: list[str] = [self.info["label"][str(k)] for k in range(len(self.info["label"]))]
        if normalize:
            mean, std = (mean or [0.5]), (std or [0.5])
            check_channels(mean, 3 if as_rgb else self.channels, "mean")
            check_channels(std, 3 if as_rgb else self.channels, "std")
        self.batches = ImageBatches(mean if normalize else None, std if normalize else None, as_rgb)

    # -- the file ----------------------------------------------------------------------------------
    @property
    def suffix(self) -> str:
        """The file name's size suffix: none for 28x28, else "_<size>" ("_64", ...)."""
        return "" if self.size == 28 else f"_{self.size}"

    @property
    def path(self) -> Path:
        """Where the set's file is, or goes: `<root>/<flag><suffix>.npz`."""
        return self.root / f"{self.flag}{self.suffix}.npz"

    @property
    def url(self) -> str:
        """Where MedMNIST serves the file of this flag and size."""
        return self.info[f"url{self.suffix}"]

    @property
    def md5(self) -> str:
        """The MD5 MedMNIST lists for the file of this flag and size."""
        return self.info[f"MD5{self.suffix}"]

    def _place(self) -> str:
        """How to place the file; follows the 'source: <url>' line, so the URL is not repeated."""
        return (
            f"download it from the source above (MD5 {self.md5}) and save it as {self.path}, "
            "or set download: true on a machine with network"
        )

    @property
    def num_classes(self) -> int:
        """How many classes the flag's task has (its label names)."""
        return len(self.class_names)

    # -- loading -----------------------------------------------------------------------------------
    def load_pool(self) -> tuple[Tensor, Tensor]:
        if self.download and not self.path.is_file():
            download(self.url, self.path, self.md5)
        require(self.path, self.url, self._place())
        if self.verify_md5 and md5sum(self.path) != self.md5:
            raise corrupt(self.path, f"its MD5 is not MedMNIST's {self.md5}", self.url, self._place())
        try:
            x, y, codes = self._read()
        except CorruptFileError:
            raise
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as e:
            raise corrupt(self.path, f"{type(e).__name__}: {e}", self.url, self._place()) from e
        self.pool_splits = codes if self.official_splits else None
        return x, y

    def _read(self) -> tuple[Tensor, Tensor, np.ndarray]:
        """All three splits into one uint8 (N, C, H, W) tensor, filled split by split (no second copy)."""
        fail = lambda reason: corrupt(self.path, reason, self.url, self._place())  # noqa: E731
        with np.load(self.path) as arrays:
            missing = [f"{s}_{k}" for s in SPLIT_CODES for k in ("images", "labels") if f"{s}_{k}" not in arrays.files]
            if missing:
                raise fail(f"it lacks the arrays {missing}; it holds {arrays.files}")
            total = sum(_stored_shape(arrays, f"{s}_images")[0] for s in SPLIT_CODES)
            x = torch.empty((total, self.channels, self.size, self.size), dtype=torch.uint8)
            ys, codes, start = [], [], 0
            for split, code in SPLIT_CODES.items():
                images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
                expected = (
                    (len(images), self.size, self.size)
                    if self.channels == 1
                    else (len(images), self.size, self.size, self.channels)
                )
                if images.shape != expected or images.dtype != np.uint8:
                    raise fail(f"{split}_images is {images.dtype} {images.shape}, expected uint8 {expected}")
                labels = labels.reshape(len(labels), -1)
                if labels.shape != (len(images), 1):
                    raise fail(
                        f"{split}_labels has shape {arrays[f'{split}_labels'].shape}, expected ({len(images)}, 1)"
                    )
                labels = labels[:, 0].astype(np.int64)
                if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                    raise fail(f"{split}_labels hold values outside 0..{self.num_classes - 1}")
                block = torch.from_numpy(images)
                x[start : start + len(images)] = block.unsqueeze(1) if self.channels == 1 else block.permute(0, 3, 1, 2)
                ys.append(labels)
                codes.append(np.full(len(labels), code, dtype=np.int8))
                start += len(images)
        return x, torch.from_numpy(np.concatenate(ys)), np.concatenate(codes)

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return self.batches(x), y
