"""FEMNIST data module on small LEAF JSON files (train/ and test/ folders, or all_data/), and the cache of its
parsed writers (fedlight.datamodules.femnist_cache)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch

from fedlight.datamodules import IID, FEMNISTFederated, Natural
from fedlight.datamodules import support
from fedlight.datamodules.femnist_cache import BESIDE, read_cache, source_key
from fedlight.datamodules.support import CorruptFileError

from helpers.data_checks import check_federated
from helpers.data_files import WRITERS, write_leaf

CACHE_LOG = "fedlight.datamodules.femnist_cache"


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
    check_federated(
        data,
        num_clients=3,
        num_classes=62,
        sample_shape=(1, 28, 28),
        dtype=torch.uint8,
        total=sum(a + b for a, b in WRITERS.values()),
    )
    picked = FEMNISTFederated(str(tmp_path), num_clients=2, partition=Natural(shuffle=True)).build()
    assert picked.num_clients == 2


def test_all_data_layout(tmp_path) -> None:
    write_leaf(tmp_path, folders=("all_data",))
    dm = FEMNISTFederated(str(tmp_path), test_fraction=0.2, val_fraction=0.0)
    data = dm.build()
    check_federated(
        data,
        num_clients=5,
        num_classes=62,
        sample_shape=(1, 28, 28),
        dtype=torch.uint8,
        total=sum(a + b for a, b in WRITERS.values()),
    )
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


# -- the cache of the parsed writers -------------------------------------------------------------------------------
def pool_of(root, **kwargs) -> tuple:
    """(writers, x, y, owners, splits) of one load of the pool."""
    dm = FEMNISTFederated(str(root), **kwargs)
    x, y = dm.load_pool()
    return dm.writers, x, y, dm.pool_owners, dm.pool_splits


def assert_same_pool(a: tuple, b: tuple) -> None:
    writers, x, y, owners, splits = a
    assert b[0] == writers and torch.equal(b[1], x) and torch.equal(b[2], y)
    assert np.array_equal(b[3], owners) and b[3].dtype == owners.dtype
    assert (b[4] is None) == (splits is None) and (splits is None or np.array_equal(b[4], splits))


def pool_from_json(root, folders, writers) -> tuple:
    """The pool worked out from the JSON text alone: each writer's rows in folder and file order, pixel v as
    round(255 v), owner k for the k-th writer, split 0 for train/ and all_data/, 2 for test/."""
    rows: dict[str, list] = {}
    for folder in folders:
        for path in sorted((root / folder).glob("*.json")):
            doc = json.loads(path.read_text())
            for user in doc["users"]:
                data = doc["user_data"][user]
                for pixels, label in zip(data["x"], data["y"]):
                    rows.setdefault(user, []).append(([round(255 * v) for v in pixels], label, 2 * (folder == "test")))
    picked = [(k, row) for k, w in enumerate(writers) for row in rows[w]]
    x = torch.tensor([row[0] for _, row in picked], dtype=torch.uint8).view(-1, 1, 28, 28)
    splits = np.array([row[2] for _, row in picked], dtype=np.int8) if "test" in folders else None
    return writers, x, torch.tensor([row[1] for _, row in picked]), np.array([k for k, _ in picked]), splits


def json_load_fails(monkeypatch) -> None:
    def no_parsing(*args, **kwargs):
        raise AssertionError("the JSON was parsed")

    monkeypatch.setattr(json, "load", no_parsing)


@pytest.mark.parametrize("seed", range(6))
def test_the_cached_pool_is_exactly_the_parsed_one(tmp_path, monkeypatch, seed) -> None:
    rng = np.random.default_rng(seed)
    names = sorted({f"f{rng.integers(10_000):04d}_{rng.integers(100):02d}" for _ in range(rng.integers(2, 9))})
    writers = {w: (int(rng.integers(1, 12)), int(rng.integers(1, 4))) for w in names}
    folders = ("all_data",) if seed % 3 == 0 else ("train", "test")
    write_leaf(tmp_path, folders=folders, writers=writers, files=int(rng.integers(1, 4)))
    chosen = {"num_writers": int(rng.integers(1, len(writers) + 1)), "writer_seed": seed}
    parsed = pool_of(tmp_path, cache=False, **chosen)
    assert not (tmp_path / BESIDE).parent.exists()  # cache=False writes nothing
    assert_same_pool(pool_from_json(tmp_path, folders, parsed[0]), parsed)
    assert_same_pool(parsed, pool_of(tmp_path, **chosen))  # parsed, then cached
    json_load_fails(monkeypatch)
    assert_same_pool(parsed, pool_of(tmp_path, **chosen))  # read from the cache


def test_a_second_load_reads_the_cache_memory_mapped(tmp_path, monkeypatch, caplog) -> None:
    write_leaf(tmp_path)
    dm = FEMNISTFederated(str(tmp_path), val_fraction=0.25)
    first = dm.build()
    cache, files = tmp_path / BESIDE, [path for path, _ in dm.json_files()]
    assert isinstance(read_cache(cache, source_key(tmp_path, files)).x, np.memmap)
    json_load_fails(monkeypatch)
    with caplog.at_level(logging.INFO, logger=CACHE_LOG):
        again = FEMNISTFederated(str(tmp_path), val_fraction=0.25).build()
    assert not caplog.records  # nothing to say: the cache matched
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(first, split).x, getattr(again, split).x)
        assert torch.equal(getattr(first, split).y, getattr(again, split).y)


def test_a_changed_json_file_rebuilds_the_cache_and_says_so(tmp_path, monkeypatch, caplog) -> None:
    write_leaf(tmp_path)
    before = pool_of(tmp_path)
    cache, changed = tmp_path / BESIDE, sorted((tmp_path / "train").glob("*.json"))[0]
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same content, newer
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        assert_same_pool(before, pool_of(tmp_path))
    [line] = caplog.messages
    assert line.startswith(f"FEMNIST cache {cache} is stale (changed: train/{changed.name})") and "rebuilding" in line
    caplog.clear()
    doc = json.loads(changed.read_text())  # rewritten: every label of its first writer becomes 61
    writer = doc["users"][0]
    doc["user_data"][writer]["y"] = [61] * len(doc["user_data"][writer]["y"])
    changed.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        writers, _, y, owners, splits = pool_of(tmp_path)
    assert len(caplog.messages) == 1 and "is stale" in caplog.messages[0]
    mine = (owners == writers.index(writer)) & (splits == 0)
    assert (y[mine] == 61).all() and not (before[2][mine] == 61).all()
    caplog.clear()
    json_load_fails(monkeypatch)  # rebuilt: the next load reads it and says nothing
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        assert torch.equal(pool_of(tmp_path)[2], y)
    assert not caplog.records


@pytest.mark.parametrize("keep", [0, 5, 200, 0.5, -1])
def test_a_truncated_cache_is_rebuilt_and_says_so(tmp_path, caplog, keep) -> None:
    write_leaf(tmp_path)
    before = pool_of(tmp_path)
    cache = tmp_path / BESIDE
    whole = cache.read_bytes()
    cut = int(len(whole) * keep) if isinstance(keep, float) else keep % len(whole)
    cache.write_bytes(whole[:cut])
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        assert_same_pool(before, pool_of(tmp_path))
    [line] = caplog.messages
    assert line.startswith(f"FEMNIST cache {cache} is unreadable (") and "rebuilding" in line
    assert cache.read_bytes() == whole


def test_an_unwritable_data_folder_puts_the_cache_in_the_machine_cache(tmp_path, monkeypatch, caplog) -> None:
    data, machine = tmp_path / "leaf", tmp_path / "machine-cache"
    write_leaf(data)
    monkeypatch.setenv("FEDLIGHT_CACHE_DIR", str(machine))
    temporary = support._temporary_beside

    def read_only(path, under=(data,)):  # a read-only folder (chmod does not stop root, who may run the tests)
        if any(folder in path.parents for folder in under):
            raise PermissionError(13, "Permission denied", str(path))
        return temporary(path)

    monkeypatch.setattr(support, "_temporary_beside", read_only)
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        first = pool_of(data)
    assert not caplog.records and not (data / BESIDE).parent.exists()
    [cache] = (machine / "femnist").glob("*.cache")
    with monkeypatch.context() as patch:
        json_load_fails(patch)
        assert_same_pool(first, pool_of(data))
    cache.unlink()  # neither place writable: one line, and the load still works
    monkeypatch.setattr(support, "_temporary_beside", lambda path: read_only(path, (data, machine)))
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        assert_same_pool(first, pool_of(data))
    [line] = caplog.messages
    assert line.startswith("FEMNIST cache not written (") and "Permission denied" in line


def test_an_interrupted_cache_write_leaves_no_cache(tmp_path, monkeypatch, caplog) -> None:
    write_leaf(tmp_path)
    write_array, records = np.lib.format.write_array, []

    def interrupted(out, array, **kwargs):  # Ctrl-C while the pixels are being written
        records.append(array.shape)
        if len(records) == 3:
            raise KeyboardInterrupt
        write_array(out, array, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(np.lib.format, "write_array", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool_of(tmp_path)
    assert list((tmp_path / BESIDE).parent.iterdir()) == []  # no cache, no temporary file
    with caplog.at_level(logging.WARNING, logger=CACHE_LOG):
        pool_of(tmp_path)
    assert not caplog.records and (tmp_path / BESIDE).is_file()
