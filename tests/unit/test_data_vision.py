"""torchvision data modules on small files in the on-disk formats torchvision's own classes read: MNIST-style
idx files, CIFAR's pickled batches, SVHN's .mat files. (CIFAR and SVHN check the MD5 of the real files; the
small stand-ins cannot match it, so those tests let torchvision's integrity check test existence only.)"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlight.datamodules import (
    IID,
    CIFAR10Federated,
    CIFAR100Federated,
    ClassesPerClient,
    Dirichlet,
    EMNISTFederated,
    FashionMNISTFederated,
    LabelPermutations,
    MNISTFederated,
    SVHNFederated,
)
from fedlight.datamodules.base import SPLITS
from fedlight.datamodules.support import CorruptFileError

from helpers.data_checks import check_federated, leftovers
from helpers.data_files import N_TEST, N_TRAIN, write_cifar, write_mnist_like, write_svhn


def ids_of(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0, 0, 0].long() + 256 * x[:, 0, 0, 1].long()


@pytest.fixture
def skip_md5(monkeypatch):
    """Let CIFAR/SVHN's integrity check accept the small stand-in files (existence only)."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.svhn as svhn

    exists = lambda path, md5=None: os.path.isfile(path)  # noqa: E731
    monkeypatch.setattr(cifar, "check_integrity", exists)
    monkeypatch.setattr(svhn, "check_integrity", exists)


def check_official(data, channels: int, side: int, num_classes: int, public: int = 0) -> None:
    check_federated(
        data,
        num_clients=data.num_clients,
        num_classes=num_classes,
        sample_shape=(channels, side, side),
        dtype=torch.uint8,
        total=N_TRAIN + N_TEST,
    )
    assert bool((ids_of(data.test.x) >= N_TRAIN).all()) and len(data.test.y) == N_TEST  # official test only
    assert bool((ids_of(data.train.x) < N_TRAIN).all()) and bool((ids_of(data.val.x) < N_TRAIN).all())
    if public:
        assert len(data.public_x) == public and bool((ids_of(data.public_x) < N_TRAIN).all())


def test_mnist_and_fashion(tmp_path) -> None:
    written = write_mnist_like(tmp_path, "MNIST")
    dm = MNISTFederated(str(tmp_path), num_clients=4, partition=ClassesPerClient(3), public_size=8)
    data = dm.build()
    check_official(data, 1, 28, 10, public=8)
    for s in SPLITS:  # images and labels as written
        split = getattr(data, s)
        ids = ids_of(split.x)
        pool = np.concatenate([written["train"][0], written["t10k"][0]])
        assert torch.equal(split.x[:, 0], torch.from_numpy(pool[ids.numpy()]))
        assert torch.equal(split.y, ids % 10)
    x, _ = dm.on_after_batch_transfer((data.train.x[:4], None))
    assert torch.allclose(x, (data.train.x[:4].float() / 255 - 0.1307) / 0.3081)
    write_mnist_like(tmp_path, "FashionMNIST")
    fashion = FashionMNISTFederated(str(tmp_path), num_clients=4, partition=LabelPermutations(2)).build()
    check_official(fashion, 1, 28, 10)


def test_emnist_is_turned_upright(tmp_path) -> None:
    written = write_mnist_like(
        tmp_path,
        "EMNIST",
        num_classes=47,
        transpose=True,
        prefix=lambda s: f"emnist-balanced-{'train' if s == 'train' else 'test'}",
    )
    dm = EMNISTFederated(str(tmp_path), split="balanced", num_clients=3, partition=IID())
    data = dm.build()
    check_official(data, 1, 28, 47)
    ids = ids_of(data.train.x)
    assert torch.equal(data.train.x[:, 0], torch.from_numpy(written["train"][0][ids.numpy()]))
    with pytest.raises(ValueError, match="split must be one of"):
        EMNISTFederated(str(tmp_path), split="bytes")


def test_cifar10_cifar100(tmp_path, skip_md5) -> None:
    written = write_cifar(tmp_path)
    dm = CIFAR10Federated(str(tmp_path), num_clients=4, partition=Dirichlet(1.0, min_size=3), public_size=5)
    data = dm.build()
    check_official(data, 3, 32, 10, public=5)
    assert dm.class_names[1] == "automobile"
    pool = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)] + [written["test"][0]])
    ids = ids_of(data.train.x)
    assert torch.equal(data.train.x, torch.from_numpy(pool[ids.numpy()]))  # channels-first, as written
    x, _ = dm.on_after_batch_transfer((data.train.x[:2], None))
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2023, 0.1994, 0.2010]).view(1, 3, 1, 1)
    assert torch.allclose(x, (data.train.x[:2].float() / 255 - mean) / std)
    write_cifar(tmp_path, hundred=True)
    hundred = CIFAR100Federated(str(tmp_path), num_clients=2, official_splits=False, test_fraction=0.25).build()
    check_federated(
        hundred, num_clients=2, num_classes=100, sample_shape=(3, 32, 32), dtype=torch.uint8, total=N_TRAIN + N_TEST
    )
    assert len(hundred.test.y) == 2 * round(0.25 * 26)  # re-split by fractions per client


def test_svhn(tmp_path, skip_md5) -> None:
    written = write_svhn(tmp_path)
    dm = SVHNFederated(str(tmp_path), num_clients=3, normalize=False)
    data = dm.build()
    check_official(data, 3, 32, 10)
    ids = ids_of(data.test.x)
    assert torch.equal(data.test.x, torch.from_numpy(written["test"][0][(ids - N_TRAIN).numpy()]))
    assert torch.equal(data.test.y, ids % 10)  # the file's label 10 is digit 0
    with pytest.raises(FileNotFoundError, match="extra_32x32.mat"):
        SVHNFederated(str(tmp_path), use_extra=True).build()


@pytest.mark.parametrize(
    "cls, expected",
    [
        (MNISTFederated, "MNIST/raw/train-images-idx3-ubyte"),
        (FashionMNISTFederated, "FashionMNIST/raw/train-images-idx3-ubyte"),
        (EMNISTFederated, "EMNIST/raw/emnist-balanced-train-images-idx3-ubyte"),
        (CIFAR10Federated, "cifar-10-batches-py/data_batch_1"),
        (CIFAR100Federated, "cifar-100-python/train"),
        (SVHNFederated, "train_32x32.mat"),
    ],
)
def test_missing_files_name_the_path(tmp_path, cls, expected) -> None:
    with pytest.raises(FileNotFoundError) as err:
        cls(str(tmp_path / "vision")).build()
    message = str(err.value)
    assert str(tmp_path / "vision" / expected) in message
    assert "source: http" in message and "download: true" in message
    assert not (tmp_path / "vision").exists()


def test_corrupt_files(tmp_path) -> None:
    write_cifar(tmp_path)  # real layout, but not the real bytes: torchvision's MD5 check refuses it
    with pytest.raises(CorruptFileError, match="cifar-10-batches-py"):
        CIFAR10Federated(str(tmp_path)).build()
    write_mnist_like(tmp_path, "MNIST")
    labels = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:10] + b"\x00\x01")  # fewer labels than images
    with pytest.raises(CorruptFileError, match="t10k"):
        MNISTFederated(str(tmp_path)).build()


def test_download_lands_complete(tmp_path) -> None:
    """torchvision downloads into a temporary folder under root; the files are moved in only afterwards."""
    seen = []

    class FakeDownload(MNISTFederated):
        """Stands in for torchvision's download: writes the four files where torchvision would."""

        def make(self, root, train, download):
            if download:
                seen.append(root)
                if len(seen) == 1:  # torchvision's MNIST fetches both splits at once
                    write_mnist_like(Path(root), "MNIST")
            return super().make(root, train, False)

    root = tmp_path / "data"
    dm = FakeDownload(str(root), download=True, num_clients=2)
    assert dm.build().num_clients == 2
    assert all(os.path.basename(r).startswith(".fedlight-download-") for r in seen)
    assert (root / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file() and leftovers(root) == []


def test_listed() -> None:
    from fedlight.run.catalog import components

    listed = components()["data modules"]
    for name in (
        "MNISTFederated",
        "FashionMNISTFederated",
        "EMNISTFederated",
        "CIFAR10Federated",
        "CIFAR100Federated",
        "SVHNFederated",
    ):
        assert listed[name] == f"fedlight.datamodules.vision.{name}"
    assert "TorchvisionFederated" not in listed  # the abstract base
