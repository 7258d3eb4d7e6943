"""FEMNIST data module on small LEAF JSON files (train/ and test/ folders, or all_data/)."""
from __future__ import annotations

import pytest
import torch
from _data_files import WRITERS, write_leaf
from _data_helpers import check_federated

from fedlight.datamodules import IID, FEMNISTFederated, Natural
from fedlight.datamodules.support import CorruptFileError


def ids_of(x: torch.Tensor) -> list[int]:
    return (x[:, 0, 0, 0].long() + 256 * x[:, 0, 0, 1].long()).tolist()


def test_one_client_per_writer_with_leaf_splits(tmp_path) -> None:
    numbers = write_leaf(tmp_path)
    dm = FEMNISTFederated(str(tmp_path), val_fraction=0.25)
    data = dm.build()
    total = sum(a + b for a, b in WRITERS.values())
    check_federated(data, num_clients=5, num_classes=62, sample_shape=(1, 28, 28), dtype=torch.uint8, total=total)
    assert dm.writers == sorted(WRITERS)
    for k, writer in enumerate(dm.writers):  # client k = k-th writer by id, LEAF's test samples as its test
        assert sorted(ids_of(data.test.client(k)[0])) == numbers[f"test:{writer}"]
        own_train = ids_of(data.train.client(k)[0]) + ids_of(data.val.client(k)[0])
        assert sorted(own_train) == numbers[f"train:{writer}"]
        assert data.val.size(k) == round(0.25 * WRITERS[writer][0])
    # pixels are k/255: stored exactly as uint8, scaled back per batch
    x, _ = dm.on_after_batch_transfer((data.train.x, None))
    assert x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    assert torch.equal((x * 255).round().to(torch.uint8), data.train.x)


def test_writer_selection_is_reproducible(tmp_path) -> None:
    write_leaf(tmp_path)
    first = FEMNISTFederated(str(tmp_path), num_writers=3, min_samples=5, writer_seed=1)
    first.load_pool()
    again = FEMNISTFederated(str(tmp_path), num_writers=3, min_samples=5, writer_seed=1)
    again.load_pool()
    assert first.writers == again.writers and len(first.writers) == 3
    assert "f0000_01" not in first.writers  # 4 samples < min_samples
    assert first.num_clients == 3
    ordered = FEMNISTFederated(str(tmp_path), num_writers=2, writer_order="sorted")
    ordered.load_pool()
    assert ordered.writers == ["f0000_01", "f0001_40"]
    with pytest.raises(ValueError, match="num_writers=9"):
        FEMNISTFederated(str(tmp_path), num_writers=9).load_pool()


def test_any_partition_and_public_data(tmp_path) -> None:
    write_leaf(tmp_path)
    dm = FEMNISTFederated(str(tmp_path), num_clients=3, partition=IID(), public_size=6)
    data = dm.build()
    check_federated(data, num_clients=3, num_classes=62, sample_shape=(1, 28, 28), dtype=torch.uint8,
                    total=sum(a + b for a, b in WRITERS.values()))
    picked = FEMNISTFederated(str(tmp_path), num_clients=2, partition=Natural(shuffle=True)).build()
    assert picked.num_clients == 2


def test_all_data_layout(tmp_path) -> None:
    write_leaf(tmp_path, folders=("all_data",))
    dm = FEMNISTFederated(str(tmp_path), test_fraction=0.2, val_fraction=0.0)
    data = dm.build()
    check_federated(data, num_clients=5, num_classes=62, sample_shape=(1, 28, 28), dtype=torch.uint8,
                    total=sum(a + b for a, b in WRITERS.values()))
    assert not data.info["official_splits"]  # all_data/ has no official split: re-split by fractions
    assert [data.test.size(k) for k in range(5)] == [round(0.2 * sum(WRITERS[w])) for w in sorted(WRITERS)]


def test_missing_files_name_the_path(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        FEMNISTFederated(str(tmp_path / "leaf")).build()
    assert str(tmp_path / "leaf" / "train" / "*.json") in str(err.value) and "preprocess.sh" in str(err.value)
    with pytest.raises(FileNotFoundError, match="cannot be downloaded"):
        FEMNISTFederated(str(tmp_path / "leaf"), download=True).build()


def test_corrupt_json_names_the_file(tmp_path) -> None:
    write_leaf(tmp_path)
    bad = sorted((tmp_path / "test").glob("*.json"))[0]
    bad.write_text(bad.read_text()[:100])
    with pytest.raises(CorruptFileError, match=str(bad)):
        FEMNISTFederated(str(tmp_path)).build()


def test_bad_arguments() -> None:
    for kwargs in ({"num_writers": 0}, {"min_samples": -1}, {"writer_order": "first"}):
        with pytest.raises(ValueError):
            FEMNISTFederated("x", **kwargs)


def test_listed() -> None:
    from fedlight.run.catalog import components

    assert components()["data modules"]["FEMNISTFederated"] == "fedlight.datamodules.femnist.FEMNISTFederated"
