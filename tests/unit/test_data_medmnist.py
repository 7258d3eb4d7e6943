"""MedMNIST data module on small `.npz` files in the official layout (train/val/test images and (N, 1) labels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlight.datamodules import IID, Dirichlet, MedMNISTFederated, MissingClasses
from fedlight.datamodules.base import OFFICIAL_TEST, OFFICIAL_TRAIN, OFFICIAL_VAL
from fedlight.datamodules.support import CorruptFileError, md5sum

from helpers.data_checks import check_federated, file_url, leftovers
from helpers.data_files import MEDMNIST_SIZES as SIZES, write_medmnist


@pytest.fixture(autouse=True)
def _medmnist_home(tmp_path, monkeypatch):
    """Importing medmnist creates ~/.medmnist: keep that inside the test's folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def ids_of(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0, 0, 0].long() + 256 * x[:, 0, 0, 1].long()


def split_of(ids: torch.Tensor) -> set[int]:
    codes = torch.full_like(ids, OFFICIAL_TRAIN)
    codes[ids >= SIZES["train"]] = OFFICIAL_VAL
    codes[ids >= SIZES["train"] + SIZES["val"]] = OFFICIAL_TEST
    return set(codes.tolist())


def test_pathmnist_official_splits_public_and_batches(tmp_path) -> None:
    write_medmnist(tmp_path, "pathmnist", num_classes=9, channels=3)
    dm = MedMNISTFederated(
        str(tmp_path),
        flag="pathmnist",
        num_clients=4,
        partition=Dirichlet(1.0, min_size=5),
        public_size=10,
        split_seed=0,
    )
    data = dm.build()
    total = sum(SIZES.values())
    check_federated(data, num_clients=4, num_classes=9, sample_shape=(3, 28, 28), dtype=torch.uint8, total=total)
    assert dm.class_names[0] == "adipose" and len(dm.class_names) == 9
    # official splits: each client's test holds only official test samples, val only official val
    assert split_of(ids_of(data.test.x)) == {OFFICIAL_TEST}
    assert split_of(ids_of(data.val.x)) == {OFFICIAL_VAL}
    assert split_of(ids_of(data.train.x)) == {OFFICIAL_TRAIN}
    assert len(data.test.y) == SIZES["test"] and len(data.val.y) == SIZES["val"]
    # public data: from the official training split only, labels not given
    assert split_of(ids_of(data.public_x)) == {OFFICIAL_TRAIN} and len(data.public_x) == 10
    # labels follow the file: label = id mod 9
    for split in (data.train, data.val, data.test):
        assert torch.equal(split.y, ids_of(split.x) % 9)
    # per-batch conversion on the device: uint8 -> [0, 1] -> (x - 0.5) / 0.5
    x, y = dm.on_after_batch_transfer((data.train.x[:5], data.train.y[:5]))
    assert x.dtype == torch.float32 and torch.allclose(x, data.train.x[:5].float() / 255 * 2 - 1)
    assert torch.equal(y, data.train.y[:5])
    public, none = dm.on_after_batch_transfer((data.public_x, None))
    assert none is None and public.shape == (10, 3, 28, 28)


def test_bloodmnist_ocfl_clusters(tmp_path) -> None:
    write_medmnist(tmp_path, "bloodmnist", num_classes=8, channels=3)
    dm = MedMNISTFederated(
        str(tmp_path), flag="bloodmnist", num_clients=6, partition=MissingClasses(3), normalize=False
    )
    data = dm.build()
    check_federated(
        data, num_clients=6, num_classes=8, sample_shape=(3, 28, 28), dtype=torch.uint8, total=sum(SIZES.values())
    )
    kept = MissingClasses(3).kept_classes(8)
    for k in range(6):
        classes = {int(c) for split in (data.train, data.test) for c in split.client(k)[1]}
        assert classes <= set(kept[int(data.cluster_labels[k])])
    x, _ = dm.on_after_batch_transfer((data.train.x[:3], None))
    assert torch.allclose(x, data.train.x[:3].float() / 255)


def test_grayscale_size64_as_rgb_and_pooled_splits(tmp_path) -> None:
    sizes = {"train": 20, "val": 5, "test": 5}
    write_medmnist(tmp_path, "octmnist", num_classes=4, channels=1, size=64, sizes=sizes)
    dm = MedMNISTFederated(
        str(tmp_path),
        flag="octmnist",
        size=64,
        as_rgb=True,
        official_splits=False,
        num_clients=3,
        partition=IID(),
        val_fraction=0.2,
        test_fraction=0.2,
    )
    data = dm.build()
    check_federated(data, num_clients=3, num_classes=4, sample_shape=(1, 64, 64), dtype=torch.uint8, total=30)
    assert not data.info["official_splits"]
    assert len(data.test.y) == 6  # re-split by fractions: 2 of 10 per client
    x, _ = dm.on_after_batch_transfer((data.train.x[:2], None))
    assert x.shape == (2, 3, 64, 64)


def test_missing_file_names_path_and_source(tmp_path) -> None:
    dm = MedMNISTFederated(str(tmp_path / "med"), flag="pathmnist")
    with pytest.raises(FileNotFoundError) as err:
        dm.build()
    message = str(err.value)
    assert str(tmp_path / "med" / "pathmnist.npz") in message
    assert "zenodo.org" in message and "download: true" in message
    assert not (tmp_path / "med").exists()  # nothing written


@pytest.mark.parametrize("damage", ["garbage", "missing_key", "bad_shape", "bad_label"])
def test_corrupt_file_names_path(tmp_path, damage) -> None:
    path = tmp_path / "bloodmnist.npz"
    if damage == "garbage":
        path.write_bytes(b"PK\x03\x04 this is not a zip")
    else:
        arrays = write_medmnist(tmp_path, "bloodmnist", num_classes=8, channels=3)
        if damage == "missing_key":
            del arrays["val_labels"]
        elif damage == "bad_shape":
            arrays["test_images"] = arrays["test_images"][..., 0]
        else:
            arrays["train_labels"][0] = 8
        np.savez(path, **arrays)
    with pytest.raises(CorruptFileError, match=str(path)):
        MedMNISTFederated(str(tmp_path), flag="bloodmnist").build()


def test_refused_flags_and_sizes() -> None:
    with pytest.raises(ValueError, match="multi-label"):
        MedMNISTFederated("x", flag="chestmnist")
    with pytest.raises(ValueError, match="3-D"):
        MedMNISTFederated("x", flag="organmnist3d")
    with pytest.raises(ValueError, match="unknown MedMNIST flag"):
        MedMNISTFederated("x", flag="nomnist")
    with pytest.raises(ValueError, match="size must be one of"):
        MedMNISTFederated("x", flag="pathmnist", size=32)
    with pytest.raises(ValueError, match="mean"):
        MedMNISTFederated("x", flag="pathmnist", mean=[0.5, 0.5], std=[0.5, 0.5])


def test_download_is_atomic_and_checked(tmp_path) -> None:
    source = tmp_path / "zenodo"
    write_medmnist(source, "pathmnist", num_classes=9, channels=3)
    root = tmp_path / "data"
    dm = MedMNISTFederated(str(root), flag="pathmnist", download=True, num_clients=2)
    dm.info = dict(dm.info, url=file_url(source / "pathmnist.npz"), MD5="0" * 32)
    with pytest.raises(CorruptFileError, match="MD5"):
        dm.build()
    assert not (root / "pathmnist.npz").exists() and leftovers(root) == []
    dm.info["MD5"] = md5sum(source / "pathmnist.npz")
    data = dm.build()
    assert (root / "pathmnist.npz").read_bytes() == (source / "pathmnist.npz").read_bytes()
    assert leftovers(root) == [] and data.num_clients == 2
    dm.verify_md5 = True
    dm.federated = None
    dm.setup()  # verified against the (patched) MD5: passes


def test_one_federated_round_on_uint8_images(tmp_path) -> None:
    """The engine trains and evaluates on the uint8 pool through the module's per-batch conversion."""
    from fedlight.algorithms.fedavg import FedAvg
    from fedlight.engine.federation import Federation, FederationConfig
    from fedlight.models import Classifier, SmallCNN

    write_medmnist(tmp_path, "pathmnist", num_classes=9, channels=3)
    torch.manual_seed(0)
    data = MedMNISTFederated(str(tmp_path), flag="pathmnist", num_clients=3, public_size=4)
    model = Classifier(SmallCNN(3, 9, 28, width=4), lr=0.05)
    fed = Federation(data, model, FedAvg(), FederationConfig(rounds=1, batch_size=16, accelerator="cpu", vectorize=0))
    assert fed.data.train.x.dtype == torch.uint8
    metrics = fed.run_round(1)
    assert np.isfinite(metrics.scalars["train/loss"]) and metrics.evaluated
    assert fed.server.model.predict(fed.server.model.initial_params, fed.data.public_x).shape == (4, 9)


def test_listed() -> None:
    from fedlight.run.catalog import components

    listed = components()["data modules"]
    assert listed["MedMNISTFederated"] == "fedlight.datamodules.medmnist.MedMNISTFederated"
