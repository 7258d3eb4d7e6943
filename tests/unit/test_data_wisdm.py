"""WISDM data module on a small raw file in the real format, malformed lines included."""

from __future__ import annotations

import io
import logging
import tarfile

import numpy as np
import pytest
import torch

import fedlight.datamodules.wisdm as wisdm
from fedlight.datamodules import Natural, WISDMFederated
from fedlight.datamodules.support import CorruptFileError
from fedlight.datamodules.wisdm import ACTIVITIES, parse_wisdm, window_starts

from helpers.data_checks import check_federated, file_url, leftovers
from helpers.data_files import MALFORMED, RUNS, write_wisdm

WINDOW, STEP = 10, 5


def expected_windows() -> int:
    return sum((n - WINDOW) // STEP + 1 for _, _, n in RUNS if n >= WINDOW)


def test_parser_counts_what_it_skips(tmp_path) -> None:
    text = write_wisdm(tmp_path)
    records = parse_wisdm(text)
    assert records.report.records == sum(n for _, _, n in RUNS)
    assert records.report.skipped == len(MALFORMED)
    assert records.report.examples[0][1].startswith("1,Walking,49106062271000")
    np.testing.assert_array_equal(records.xyz[:, 1], np.arange(records.report.records))  # order kept
    assert set(records.users.tolist()) == {1, 2, 3, 5}
    assert parse_wisdm("1,Walking,1,1,2,3;1,Walking,2,1,2,3,;;\n\n").report.skipped == 0


def test_windows_one_client_per_user(tmp_path, caplog) -> None:
    write_wisdm(tmp_path)
    dm = WISDMFederated(str(tmp_path), window=WINDOW, step=STEP, standardize=False, val_fraction=0.2, test_fraction=0.2)
    with caplog.at_level(logging.WARNING, logger="fedlight.datamodules.wisdm"):
        data = dm.build()
    assert f"{len(MALFORMED)} malformed skipped" in caplog.text
    assert data.info["wisdm_skipped"] == len(MALFORMED) and dm.parse_report.skipped == len(MALFORMED)
    check_federated(
        data, num_clients=4, num_classes=6, sample_shape=(3, WINDOW), dtype=torch.float32, total=expected_windows()
    )
    np.testing.assert_array_equal(dm.users, [1, 2, 3, 5])
    for split in (data.train, data.val, data.test):
        for k, user in enumerate(dm.users):
            x, y = split.client(k)
            runs = x[:, 0, 0].long()
            # a window never crosses a run: one run number, consecutive records
            assert torch.equal(x[:, 0, :], runs[:, None].float().expand(-1, WINDOW))
            assert torch.equal(x[:, 1, 1:] - x[:, 1, :-1], torch.ones(len(x), WINDOW - 1))
            for run, label in zip(runs.tolist(), y.tolist()):
                assert RUNS[run][0] == user and ACTIVITIES[label] == RUNS[run][1]


def test_features_and_raw_rows(tmp_path) -> None:
    write_wisdm(tmp_path)
    total = sum(n for _, _, n in RUNS)
    features = WISDMFederated(
        str(tmp_path), mode="features", window=WINDOW, step=STEP, val_fraction=0, test_fraction=0
    ).build()
    check_federated(
        features, num_clients=4, num_classes=6, sample_shape=(14,), dtype=torch.float32, total=expected_windows()
    )
    assert torch.allclose(features.train.x.mean(0), torch.zeros(14), atol=1e-4)  # standardized columns
    raw = WISDMFederated(str(tmp_path), mode="raw", include_timestamp=True, standardize=False, public_size=20).build()
    check_federated(raw, num_clients=4, num_classes=6, sample_shape=(4,), dtype=torch.float32, total=total)
    assert raw.public_x.shape == (20, 4)  # unlabelled: rows only
    assert float(raw.train.x[:, 0].min()) > 4.9e13  # raw nanosecond timestamps, un-normalized
    three = WISDMFederated(str(tmp_path), mode="raw", num_clients=2, partition=Natural(shuffle=True)).build()
    assert three.num_clients == 2 and three.train.x.shape[1:] == (3,)


def test_window_starts_stay_inside_runs() -> None:
    users = np.array([1, 1, 1, 1, 1, 2, 2, 2])
    acts = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(window_starts(users, acts, 2, 1), [0, 1, 3, 5, 6])
    np.testing.assert_array_equal(window_starts(users, acts, 3, 2), [0, 5])


def test_missing_file_names_path_and_source(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        WISDMFederated(str(tmp_path / "wisdm")).build()
    assert str(tmp_path / "wisdm" / "WISDM_ar_v1.1_raw.txt") in str(err.value)
    assert "WISDM_ar_latest.tar.gz" in str(err.value)


def test_corrupt_file_names_path(tmp_path) -> None:
    (tmp_path / wisdm.FILE).write_text("this is not\nthe WISDM file;\n1,Walking,1,1,2,3;\n")
    with pytest.raises(CorruptFileError, match=str(tmp_path / wisdm.FILE)):
        WISDMFederated(str(tmp_path)).build()
    (tmp_path / wisdm.FILE).write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(CorruptFileError, match="not a text file"):
        WISDMFederated(str(tmp_path)).build()


def test_download_from_archive(tmp_path, monkeypatch) -> None:
    text = write_wisdm(tmp_path / "src")
    archive = tmp_path / "WISDM_ar_latest.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = text.encode()
        info = tarfile.TarInfo(f"WISDM_ar_v1.1/{wisdm.FILE}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(wisdm, "URL", file_url(archive))
    root = tmp_path / "data"
    dm = WISDMFederated(str(root), window=WINDOW, step=STEP, download=True)
    assert dm.build().num_clients == 4
    assert (root / wisdm.FILE).read_text() == text and leftovers(root) == []


def test_bad_arguments(tmp_path) -> None:
    for kwargs in ({"mode": "images"}, {"window": 0}, {"step": 0}, {"include_timestamp": True}):
        with pytest.raises(ValueError):
            WISDMFederated("x", **kwargs)
    write_wisdm(tmp_path)
    with pytest.raises(ValueError, match="smaller window"):
        WISDMFederated(str(tmp_path), window=100).build()


def test_listed() -> None:
    from fedlight.run.catalog import components

    assert components()["data modules"]["WISDMFederated"] == "fedlight.datamodules.wisdm.WISDMFederated"
