"""torchvision's image sets (MNIST, FashionMNIST, EMNIST, CIFAR-10, CIFAR-100, SVHN) through torchvision's
own classes, read from the files already under `root` (`download=False` unless asked).

The official train and test splits are kept by default: the partition cuts both, each client's official test
images form its test split, and public data comes from the training images only (see base.py). Images stay
uint8 (N, C, H, W) in the pool and are scaled and normalized per batch on the device.
"""

from __future__ import annotations

import pickle
import tempfile
from abc import ABCMeta, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import OFFICIAL_TEST, OFFICIAL_TRAIN, FederatedDataModule
from fedlight.datamodules.support import ImageBatches, check_channels, corrupt, move_tree, require


class TorchvisionFederated(FederatedDataModule, metaclass=ABCMeta):
    """Base of the torchvision sets (abstract: `fedlight list` shows its subclasses).

    A subclass names the torchvision class (`make`), the files it reads (`files`), where they come from
    (`source`), its channels, classes and default normalization statistics.

    Args:
        root: the folder given to torchvision as its `root` (it holds e.g. `cifar-10-batches-py/`).
        download: let torchvision download missing files (needs network); the download goes to a temporary
            folder under `root` and is moved into place only when complete.
        official_splits: keep the official train/test split (see the module doc); False pools train and test
            and re-splits each client's samples by `val_fraction` / `test_fraction`.
        normalize: per-channel (x - mean) / std after scaling to [0, 1].
        mean, std: normalization statistics; default the data set's usual ones (`MEAN`, `STD`).
        num_clients, partition, val_fraction, test_fraction, public_size, split_seed: as in FederatedDataModule.
    """

    MEAN: tuple[float, ...] = (0.5,)
    STD: tuple[float, ...] = (0.5,)
    CHANNELS: int = 1

    def __init__(
        self,
        root: str,
        download: bool = False,
        official_splits: bool = True,
        normalize: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.root, self.download, self.official_splits = Path(root), download, official_splits
        if normalize:
            mean, std = (mean or list(self.MEAN)), (std or list(self.STD))
            check_channels(mean, self.CHANNELS, "mean")
            check_channels(std, self.CHANNELS, "std")
        self.batches = ImageBatches(mean if normalize else None, std if normalize else None)
        self.class_names: list[str] = []

    # -- what a subclass provides ------------------------------------------------------------------
    @abstractmethod
    def make(self, root: str, train: bool, download: bool) -> Any:
        """The torchvision data set object of one official split."""

    @abstractmethod
    def files(self, train: bool) -> list[str]:
        """The files (relative to `root`) the torchvision class reads for one split."""

    @property
    @abstractmethod
    def source(self) -> str:
        """Where the files come from (an address)."""

    def arrays(self, dataset: Any) -> tuple[Tensor, Tensor]:
        """(uint8 images (N, C, H, W), int64 labels) of a torchvision data set object."""
        data = torch.as_tensor(np.asarray(dataset.data))
        x = data.unsqueeze(1) if data.dim() == 3 else data.permute(0, 3, 1, 2)
        return x.contiguous(), torch.as_tensor(np.asarray(dataset.targets), dtype=torch.long)

    def splits(self) -> tuple[tuple[bool, int], ...]:
        """The official splits read: (train flag, OFFICIAL_* code)."""
        return (True, OFFICIAL_TRAIN), (False, OFFICIAL_TEST)

    # -- loading -----------------------------------------------------------------------------------
    def _place(self) -> str:
        expected = [str(self.root / f) for train, _ in self.splits() for f in self.files(train)]
        return (
            f"get the files from there and place them so that these exist: {', '.join(expected)}; or set "
            f"download: true on a machine with network (torchvision then fetches them)"
        )

    def _missing(self) -> list[Path]:
        return [self.root / f for train, _ in self.splits() for f in self.files(train) if not (self.root / f).is_file()]

    def _download(self) -> None:
        """Let torchvision download into a temporary folder under root, then move the files into place."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".fedlight-download-") as tmp:
            for train, _ in self.splits():
                self.make(tmp, train, True)
            move_tree(Path(tmp), self.root)

    def load_pool(self) -> tuple[Tensor, Tensor]:
        if self.download and self._missing():
            self._download()
        missing = self._missing()
        if missing:
            require(missing[0], self.source, self._place())
        xs, ys, codes = [], [], []
        for train, code in self.splits():
            first = self.root / self.files(train)[0]
            try:
                dataset = self.make(str(self.root), train, False)
                x, y = self.arrays(dataset)
            except (
                RuntimeError,
                OSError,
                ValueError,
                TypeError,
                EOFError,
                KeyError,
                AssertionError,
                pickle.UnpicklingError,
            ) as e:
                raise corrupt(
                    first, f"torchvision could not read it: {type(e).__name__}: {e}", self.source, self._place()
                ) from e
            if not self.class_names and getattr(dataset, "classes", None):
                self.class_names = list(dataset.classes)
            if x.shape[1] != self.CHANNELS or len(x) != len(y):
                raise corrupt(first, f"read {tuple(x.shape)} images and {len(y)} labels", self.source, self._place())
            xs.append(x)
            ys.append(y)
            codes.append(np.full(len(y), code, dtype=np.int8))
        y = torch.cat(ys)
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            raise corrupt(
                self.root / self.files(True)[0], f"labels outside 0..{self.num_classes - 1}", self.source, self._place()
            )
        self.pool_splits = np.concatenate(codes) if self.official_splits else None
        return torch.cat(xs), y

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return self.batches(x), y


# -- MNIST family ------------------------------------------------------------------------------------
class _IdxFiles:
    """Files of the MNIST-style sets: `<root>/<Class>/raw/<prefix>-{images-idx3,labels-idx1}-ubyte`."""

    folder = "MNIST"

    def files(self, train: bool) -> list[str]:
        prefix = "train" if train else "t10k"
        return [f"{self.folder}/raw/{prefix}-images-idx3-ubyte", f"{self.folder}/raw/{prefix}-labels-idx1-ubyte"]


class MNISTFederated(_IdxFiles, TorchvisionFederated):
    """MNIST (60k + 10k 1x28x28 digits, 10 classes) via `torchvision.datasets.MNIST`."""

    folder = "MNIST"
    MEAN, STD = (0.1307,), (0.3081,)

    @property
    def num_classes(self) -> int:
        """10: the digits 0-9."""
        return 10

    @property
    def source(self) -> str:
        from torchvision.datasets import MNIST

        return f"{MNIST.mirrors[0]} (the four .gz files, decompressed)"

    def make(self, root: str, train: bool, download: bool) -> Any:
        from torchvision.datasets import MNIST

        return MNIST(root, train=train, download=download)


class FashionMNISTFederated(_IdxFiles, TorchvisionFederated):
    """Fashion-MNIST (60k + 10k 1x28x28 clothing images, 10 classes) via `torchvision.datasets.FashionMNIST`.
    Default statistics are Fashion-MNIST's own (0.2860 / 0.3530); FLIS's code uses MNIST's 0.1307 / 0.3081."""

    folder = "FashionMNIST"
    MEAN, STD = (0.2860,), (0.3530,)

    @property
    def num_classes(self) -> int:
        """10 kinds of clothing."""
        return 10

    @property
    def source(self) -> str:
        from torchvision.datasets import FashionMNIST

        return f"{FashionMNIST.mirrors[0]} (the four .gz files, decompressed)"

    def make(self, root: str, train: bool, download: bool) -> Any:
        from torchvision.datasets import FashionMNIST

        return FashionMNIST(root, train=train, download=download)


class EMNISTFederated(TorchvisionFederated):
    """EMNIST (1x28x28 handwritten characters) via `torchvision.datasets.EMNIST`, one of its splits.

    EMNIST's files store every image transposed; `transpose` (default) turns them upright, as FEMNIST's.
    Labels are torchvision's: for "letters" they run 1..26 (class 0, "N/A", is empty), so num_classes = 27.

    Args:
        split: "byclass" (62 classes), "bymerge" (47), "balanced" (47), "letters" (27), "digits" (10), "mnist" (10).
        transpose: undo the transposition of the stored images.
        root, download, ...: as in TorchvisionFederated.
    """

    MEAN, STD = (0.1751,), (0.3332,)

    def __init__(self, root: str, split: str = "balanced", transpose: bool = True, **kwargs) -> None:
        from torchvision.datasets import EMNIST

        if split not in EMNIST.splits:
            raise ValueError(f"EMNIST split must be one of {list(EMNIST.splits)}, got {split!r}")
        self.split, self.transpose = split, transpose
        super().__init__(root, **kwargs)

    @property
    def num_classes(self) -> int:
        """The classes of the chosen `split` (27 for "letters", whose class 0 is empty)."""
        from torchvision.datasets import EMNIST

        return len(EMNIST.classes_split_dict[self.split])

    @property
    def source(self) -> str:
        from torchvision.datasets import EMNIST

        return f"{EMNIST.url} (extract gzip/emnist-{self.split}-*.gz into EMNIST/raw and decompress them)"

    def files(self, train: bool) -> list[str]:
        prefix = f"EMNIST/raw/emnist-{self.split}-{'train' if train else 'test'}"
        return [f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"]

    def make(self, root: str, train: bool, download: bool) -> Any:
        from torchvision.datasets import EMNIST

        return EMNIST(root, split=self.split, train=train, download=download)

    def arrays(self, dataset: Any) -> tuple[Tensor, Tensor]:
        x, y = super().arrays(dataset)
        return (x.transpose(-2, -1).contiguous() if self.transpose else x), y


# -- CIFAR and SVHN ----------------------------------------------------------------------------------
class CIFAR10Federated(TorchvisionFederated):
    """CIFAR-10 (50k + 10k 3x32x32 images, 10 classes) via `torchvision.datasets.CIFAR10`; default
    statistics are those of FLIS's code."""

    MEAN, STD, CHANNELS = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), 3
    folder = "cifar-10-batches-py"

    @property
    def num_classes(self) -> int:
        """10 object classes."""
        return 10

    @property
    def source(self) -> str:
        from torchvision.datasets import CIFAR10

        return f"{CIFAR10.url} (extract it in root)"

    def files(self, train: bool) -> list[str]:
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        return [f"{self.folder}/{n}" for n in names + ["batches.meta"]]

    def make(self, root: str, train: bool, download: bool) -> Any:
        from torchvision.datasets import CIFAR10

        return CIFAR10(root, train=train, download=download)


class CIFAR100Federated(TorchvisionFederated):
    """CIFAR-100 (50k + 10k 3x32x32 images, 100 fine classes) via `torchvision.datasets.CIFAR100`."""

    MEAN, STD, CHANNELS = (0.507, 0.487, 0.441), (0.267, 0.256, 0.276), 3
    folder = "cifar-100-python"

    @property
    def num_classes(self) -> int:
        """100 fine-grained classes."""
        return 100

    @property
    def source(self) -> str:
        from torchvision.datasets import CIFAR100

        return f"{CIFAR100.url} (extract it in root)"

    def files(self, train: bool) -> list[str]:
        return [f"{self.folder}/{'train' if train else 'test'}", f"{self.folder}/meta"]

    def make(self, root: str, train: bool, download: bool) -> Any:
        from torchvision.datasets import CIFAR100

        return CIFAR100(root, train=train, download=download)


class SVHNFederated(TorchvisionFederated):
    """SVHN cropped digits (73,257 train + 26,032 test 3x32x32, 10 classes; digit 0 is label 0) via
    `torchvision.datasets.SVHN`. The `extra` split (531k) is only read with `use_extra`, as training data.

    Args:
        use_extra: add `extra_32x32.mat` to the training data.
        root, download, ...: as in TorchvisionFederated.
    """

    MEAN, STD, CHANNELS = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), 3

    def __init__(self, root: str, use_extra: bool = False, **kwargs) -> None:
        self.use_extra = use_extra
        super().__init__(root, **kwargs)

    @property
    def num_classes(self) -> int:
        """10: the digits 0-9."""
        return 10

    @property
    def source(self) -> str:
        return "http://ufldl.stanford.edu/housenumbers/ (train_32x32.mat, test_32x32.mat, extra_32x32.mat)"

    def splits(self) -> tuple[tuple[Any, int], ...]:
        extra = (("extra", OFFICIAL_TRAIN),) if self.use_extra else ()
        return (("train", OFFICIAL_TRAIN),) + extra + (("test", OFFICIAL_TEST),)

    def files(self, train: Any) -> list[str]:
        name = {True: "train", False: "test"}.get(train, train)
        return [f"{name}_32x32.mat"]

    def make(self, root: str, train: Any, download: bool) -> Any:
        from torchvision.datasets import SVHN

        return SVHN(root, split={True: "train", False: "test"}.get(train, train), download=download)

    def arrays(self, dataset: Any) -> tuple[Tensor, Tensor]:
        return (
            torch.as_tensor(np.ascontiguousarray(dataset.data)),
            torch.as_tensor(np.asarray(dataset.labels), dtype=torch.long),
        )
