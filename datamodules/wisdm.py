"""WISDM v1.1 raw accelerometer data (Kwapisz et al., 2010): 36 users, 6 activities, 20 Hz, one client per user.

The file `WISDM_ar_v1.1_raw.txt` has one record `user,activity,timestamp,x,y,z;` per line, but the real
file is not clean: some records lack values, some lines hold several records, some end in a trailing comma.
`parse_wisdm` keeps every well-formed record, counts the others and reports them (log warning,
`parse_report`, and `FederatedData.info["wisdm_skipped"]`).

Three views of the records, all with the activity as label and the user as natural owner:
- "windows": sliding windows (n, 3, window) of (x, y, z) within runs of one user and one activity
  (for the 1-D CNN); windows never cross a change of user or activity;
- "features": one row of 14 statistics per window (mean, std, min, max of x, y, z; mean and std of the
  magnitude) (for p-FClus);
- "raw": one row per record, (x, y, z) or (timestamp, x, y, z) (p-FClus's table magnitudes come from
  un-normalized raw columns including the timestamp).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedData, FederatedDataModule
from fedlight.datamodules.partition import Natural, PartitionScheme
from fedlight.datamodules.support import corrupt, fetch_member, require

log = logging.getLogger(__name__)

ACTIVITIES = ("Downstairs", "Jogging", "Sitting", "Standing", "Upstairs", "Walking")
FILE = "WISDM_ar_v1.1_raw.txt"
URL = "https://www.cis.fordham.edu/wisdm/includes/datasets/latest/WISDM_ar_latest.tar.gz"
MODES = ("windows", "features", "raw")


@dataclass
class ParseReport:
    """What `parse_wisdm` kept and skipped; `examples` holds (line number, text) of the first skipped records."""

    records: int = 0
    skipped: int = 0
    examples: list[tuple[int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        shown = "; ".join(f"line {n}: {text!r}" for n, text in self.examples)
        return f"{self.records} records kept, {self.skipped} malformed skipped" + (f" (e.g. {shown})" if shown else "")


@dataclass
class WISDMRecords:
    """The well-formed records in file order."""

    users: np.ndarray  # (n,) int64
    activities: np.ndarray  # (n,) int64, index into ACTIVITIES
    timestamps: np.ndarray  # (n,) int64
    xyz: np.ndarray  # (n, 3) float32
    report: ParseReport


def parse_wisdm(text: str, max_examples: int = 5) -> WISDMRecords:
    """Parse the raw file's text. A record is `user,activity,timestamp,x,y,z`, records end at ';' or a line
    end; trailing commas are ignored; a record with a missing or non-numeric value, an unknown activity or
    a non-finite reading is skipped and counted."""
    index = {name: k for k, name in enumerate(ACTIVITIES)}
    users, acts, times, xs, ys, zs = [], [], [], [], [], []
    report = ParseReport()
    isfinite = math.isfinite
    for lineno, line in enumerate(text.split("\n"), 1):
        for chunk in line.split(";"):
            chunk = chunk.strip()
            if not chunk:
                continue
            parts = chunk.rstrip(", \t").split(",")
            try:
                if len(parts) != 6:
                    raise ValueError
                u, a, t = int(parts[0]), index[parts[1].strip()], int(parts[2])
                x, y, z = float(parts[3]), float(parts[4]), float(parts[5])
                if not (isfinite(x) and isfinite(y) and isfinite(z)):
                    raise ValueError
            except (ValueError, KeyError):
                report.skipped += 1
                if len(report.examples) < max_examples:
                    report.examples.append((lineno, chunk[:80]))
                continue
            users.append(u)
            acts.append(a)
            times.append(t)
            xs.append(x)
            ys.append(y)
            zs.append(z)
    report.records = len(users)
    return WISDMRecords(
        np.asarray(users, dtype=np.int64),
        np.asarray(acts, dtype=np.int64),
        np.asarray(times, dtype=np.int64),
        np.stack([xs, ys, zs], axis=1).astype(np.float32) if users else np.zeros((0, 3), np.float32),
        report,
    )


def window_starts(users: np.ndarray, activities: np.ndarray, window: int, step: int) -> np.ndarray:
    """First record of every window: windows of `window` records every `step` records, inside each run of
    consecutive records with the same user and activity."""
    n = len(users)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.flatnonzero((users[1:] != users[:-1]) | (activities[1:] != activities[:-1])) + 1
    bounds = np.concatenate([[0], change, [n]])
    starts = [np.arange(lo, hi - window + 1, step) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi - lo >= window]
    return np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, dtype=np.int64)


def window_features(windows: np.ndarray) -> np.ndarray:
    """(n, 3, window) -> (n, 14): mean, std, min, max of each axis, then mean and std of the magnitude."""
    magnitude = np.linalg.norm(windows, axis=1)
    return np.concatenate(
        [
            windows.mean(2),
            windows.std(2),
            windows.min(2),
            windows.max(2),
            magnitude.mean(1, keepdims=True),
            magnitude.std(1, keepdims=True),
        ],
        axis=1,
    )


def _zscore(a: np.ndarray, axis: int | tuple[int, ...] = 0) -> np.ndarray:
    a = a.astype(np.float64)
    mean, std = a.mean(axis=axis, keepdims=True), a.std(axis=axis, keepdims=True)
    return (a - mean) / np.where(std > 0, std, 1.0)


class WISDMFederated(FederatedDataModule):
    """WISDM v1.1 activity recognition, one client per user by default (36 users, 6 activities).

    Args:
        root: the folder holding `WISDM_ar_v1.1_raw.txt`.
        mode: "windows" (n, 3, window) for classification, "features" (n, 14) rows per window, or "raw"
            (n, 3) / (n, 4) rows per record (see the module doc).
        window: records per window (200 = 10 s at 20 Hz).
        step: records between window starts (100 = 50% overlap).
        standardize: z-score with statistics of the whole file: the (x, y, z) readings (windows), the
            feature columns (features) or the columns (raw).
        include_timestamp: raw mode only, add the timestamp as the first column.
        num_clients: number of clients; None = one per user present.
        partition: default `Natural(shuffle=False)`: client k is the user with the k-th smallest id.
        download: fetch the archive from WISDM's site when the file is missing (needs network).
        val_fraction, test_fraction, public_size, split_seed: as in FederatedDataModule (WISDM has no
            official split: each client's samples are split by fractions).
    """

    def __init__(
        self,
        root: str,
        mode: str = "windows",
        window: int = 200,
        step: int = 100,
        standardize: bool = True,
        include_timestamp: bool = False,
        num_clients: int | None = None,
        partition: PartitionScheme | None = None,
        download: bool = False,
        **kwargs,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if window < 1 or step < 1:
            raise ValueError(f"window and step must be positive, got window={window}, step={step}")
        if include_timestamp and mode != "raw":
            raise ValueError("include_timestamp only applies to mode='raw'")
        super().__init__(
            num_clients=num_clients if num_clients is not None else 1,
            partition=partition if partition is not None else Natural(shuffle=False),
            **kwargs,
        )
        self.clients_per_user = num_clients is None
        self.root, self.mode, self.window, self.step = Path(root), mode, window, step
        self.standardize, self.include_timestamp, self.download = standardize, include_timestamp, download
        self.parse_report: ParseReport | None = None
        self.users: np.ndarray | None = None  # user ids present, sorted

    @property
    def path(self) -> Path:
        """The raw WISDM file: `<root>/WISDM_ar_v1.1_raw.txt`."""
        return self.root / FILE

    @property
    def num_classes(self) -> int:
        """6: the activities (`ACTIVITIES`)."""
        return len(ACTIVITIES)

    def _place(self) -> str:
        return (
            f"download {URL}, extract it and copy WISDM_ar_v1.1/{FILE} to {self.path}, "
            "or set download: true on a machine with network"
        )

    def read(self) -> WISDMRecords:
        """Parse the file (downloading it first when asked and missing); log what was skipped."""
        if self.download and not self.path.is_file():
            fetch_member(URL, [FILE], self.path)
        require(self.path, URL, self._place())
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise corrupt(self.path, f"not a text file ({e})", URL, self._place()) from e
        records = parse_wisdm(text)
        report = records.report
        if report.records == 0 or report.skipped > report.records:
            raise corrupt(self.path, f"mostly not WISDM records: {report}", URL, self._place())
        if report.skipped:
            log.warning("WISDM %s: %s", self.path, report)
        self.parse_report = report
        return records

    def load_pool(self) -> tuple[Tensor, Tensor]:
        rec = self.read()
        if self.mode == "raw":
            x = rec.xyz.astype(np.float64)
            if self.include_timestamp:
                x = np.concatenate([rec.timestamps[:, None].astype(np.float64), x], axis=1)
            x = _zscore(x) if self.standardize else x
            labels, owners = rec.activities, rec.users
        else:
            starts = window_starts(rec.users, rec.activities, self.window, self.step)
            if len(starts) == 0:
                raise ValueError(
                    f"{self.path}: no run of one user and activity is {self.window} records long; use a smaller window"
                )
            readings = _zscore(rec.xyz) if (self.standardize and self.mode == "windows") else rec.xyz
            x = readings[starts[:, None] + np.arange(self.window)].transpose(0, 2, 1)  # (n, 3, window)
            if self.mode == "features":
                x = window_features(x.astype(np.float64))
                x = _zscore(x) if self.standardize else x
            labels, owners = rec.activities[starts], rec.users[starts]
        self.pool_owners = owners
        self.users = np.unique(owners)
        if self.clients_per_user:
            self.num_clients = len(self.users)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(labels)

    def build(self) -> FederatedData:
        """The clients as `FederatedDataModule.build` makes them, with the parse's record and skipped counts in `info`
        (`wisdm_records`, `wisdm_skipped`)."""
        data = super().build()
        if self.parse_report is not None:
            data.info.update(wisdm_records=self.parse_report.records, wisdm_skipped=self.parse_report.skipped)
        return data
