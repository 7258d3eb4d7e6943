"""UCI tables for p-FClus ("Fair Federated Data Clustering through Personalization: Bridging the Gap between
Diverse Data Distributions", section 5): Adult, Bank marketing (bank-additional-full), Diabetes 130-US
hospitals, read from their CSV files with the numeric columns the paper lists.

Preprocessing (not stated in the paper; our choice): the listed columns only, Diabetes' age bracket "[70-80)" as
its ordinal index 0..9, every column z-scored (population std) over the whole file. The labels are, by default,
the "distributions" D_k (left undefined for these tables by the paper; our choice): k-means cluster ids (k = 10,
seed 0, n_init = 10) computed once on the standardized pooled rows; `labels: target` gives the table's own target
instead (income, subscription, readmission). Rows are (N, F) float32; there is no natural owner and no official
split, so any partition scheme cuts them.
"""

from __future__ import annotations

import csv
import io
from abc import ABCMeta, abstractmethod
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedDataModule
from fedlight.datamodules.support import corrupt, fetch_member, require

LABELS = ("kmeans", "target")


class UCITableFederated(FederatedDataModule, metaclass=ABCMeta):
    """Base of the UCI tables (abstract: `fedlight list` shows its subclasses).

    A subclass names its file, its source and archive member, its columns, and parses one row.

    Args:
        root: the folder holding the table's CSV file.
        labels: "kmeans" (cluster ids on the standardized rows, the p-FClus "distributions") or "target".
        num_clusters: k of the k-means labels.
        kmeans_seed: random_state of the k-means labels.
        standardize: z-score every column over the whole file.
        download: fetch the file from the UCI repository when it is missing (needs network).
        num_clients, partition, val_fraction, test_fraction, public_size, split_seed: as in FederatedDataModule
            (p-FClus scores on the data it fits: set val_fraction and test_fraction to 0 for that).
    """

    FILE: str = ""
    URL: str = ""
    MEMBERS: tuple[str, ...] = ()  # path of the file inside the downloaded archive (nested archives: several)
    COLUMNS: tuple[str, ...] = ()
    TARGETS: tuple[str, ...] = ()

    def __init__(
        self,
        root: str,
        labels: str = "kmeans",
        num_clusters: int = 10,
        kmeans_seed: int = 0,
        standardize: bool = True,
        download: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be at least 1, got {num_clusters}")
        self.root, self.labels, self.num_clusters, self.kmeans_seed = Path(root), labels, num_clusters, kmeans_seed
        self.standardize, self.download = standardize, download
        self.feature_names: list[str] = list(self.COLUMNS)

    @property
    def path(self) -> Path:
        """The table's CSV file: `<root>/<FILE>`."""
        return self.root / self.FILE

    @property
    def num_classes(self) -> int:
        """`num_clusters` with the k-means labels, else the number of the table's target values."""
        return self.num_clusters if self.labels == "kmeans" else len(self.TARGETS)

    def _place(self) -> str:
        inside = f" (in the archive: {' / '.join(self.MEMBERS)})" if self.MEMBERS else ""
        return f"download it{inside} and save it as {self.path}, or set download: true on a machine with network"

    # -- what a subclass provides ------------------------------------------------------------------
    @abstractmethod
    def rows(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(features (N, F) float64 in COLUMNS order, target index (N,)) from the file's text; raise ValueError
        naming the line on a malformed row."""

    # -- loading -----------------------------------------------------------------------------------
    def load_pool(self) -> tuple[Tensor, Tensor]:
        if self.download and not self.path.is_file():
            fetch_member(self.URL, self.MEMBERS, self.path)
        require(self.path, self.URL, self._place())
        try:
            features, target = self.rows(self.path.read_text(encoding="utf-8", errors="strict"))
        except (ValueError, KeyError, IndexError, UnicodeDecodeError, csv.Error) as e:
            raise corrupt(self.path, f"{type(e).__name__}: {e}", self.URL, self._place()) from e
        if len(features) == 0:
            raise corrupt(self.path, "no data rows", self.URL, self._place())
        if self.standardize:
            std = features.std(0)
            features = (features - features.mean(0)) / np.where(std > 0, std, 1.0)
        if self.labels == "kmeans":
            if len(features) < self.num_clusters:
                raise ValueError(f"{self.path} has {len(features)} rows, fewer than num_clusters={self.num_clusters}")
            from sklearn.cluster import KMeans

            y = KMeans(self.num_clusters, random_state=self.kmeans_seed, n_init=10).fit_predict(features)
        else:
            y = target
        return torch.from_numpy(features.astype(np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))


def _number(value: str, line: int, column: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"line {line}: column {column!r} is {value!r}, not a number") from None


def _header_rows(
    text: str, delimiter: str, columns: tuple[str, ...], target: str
) -> tuple[list[int], int, list[tuple[int, list[str]]]]:
    """Column positions (of `columns` and `target`) from the header, and the data rows with line numbers."""
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in columns + (target,) if c not in header]
    if missing:
        more = "..." if len(header) > 12 else ""
        raise ValueError(f"the header lacks the columns {missing}; it has {header[:12]}{more}")
    rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    for line, row in rows:
        if len(row) != len(header):
            raise ValueError(f"line {line} has {len(row)} fields, the header {len(header)}")
    return [header.index(c) for c in columns], header.index(target), rows


def _target_index(value: str, targets: tuple[str, ...], line: int) -> int:
    value = value.strip().rstrip(".")
    if value not in targets:
        raise ValueError(f"line {line}: target {value!r} is not one of {targets}")
    return targets.index(value)


class AdultFederated(UCITableFederated):
    """UCI Adult (census 1994, `adult.data`, 32,561 rows): age, fnlwgt, education-num, capital-gain,
    hours-per-week; target income <=50K / >50K. The file has no header; fields are separated by ", "."""

    FILE = "adult.data"
    URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data"
    MEMBERS = ()
    ALL_COLUMNS = (
        "age",
        "workclass",
        "fnlwgt",
        "education",
        "education-num",
        "marital-status",
        "occupation",
        "relationship",
        "race",
        "sex",
        "capital-gain",
        "capital-loss",
        "hours-per-week",
        "native-country",
        "income",
    )
    COLUMNS = ("age", "fnlwgt", "education-num", "capital-gain", "hours-per-week")
    TARGETS = ("<=50K", ">50K")

    def rows(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        positions = [self.ALL_COLUMNS.index(c) for c in self.COLUMNS]
        features, target = [], []
        for line, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True), 1):
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(self.ALL_COLUMNS):
                raise ValueError(f"line {line} has {len(row)} fields, expected {len(self.ALL_COLUMNS)}")
            features.append([_number(row[p], line, self.ALL_COLUMNS[p]) for p in positions])
            target.append(_target_index(row[-1], self.TARGETS, line))
        return np.asarray(features, dtype=np.float64).reshape(-1, len(self.COLUMNS)), np.asarray(target)


class BankMarketingFederated(UCITableFederated):
    """UCI Bank marketing, `bank-additional-full.csv` (41,188 rows, ';'-separated, quoted header): age,
    duration, campaign, cons.price.idx, euribor3m, nr.employed; target y (term deposit) no / yes."""

    FILE = "bank-additional-full.csv"
    URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00222/bank-additional.zip"
    MEMBERS = ("bank-additional/bank-additional-full.csv",)
    COLUMNS = ("age", "duration", "campaign", "cons.price.idx", "euribor3m", "nr.employed")
    TARGETS = ("no", "yes")

    def rows(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        positions, target_at, rows = _header_rows(text, ";", self.COLUMNS, "y")
        features = [[_number(row[p], line, c) for p, c in zip(positions, self.COLUMNS)] for line, row in rows]
        target = [_target_index(row[target_at], self.TARGETS, line) for line, row in rows]
        return np.asarray(features, dtype=np.float64).reshape(-1, len(self.COLUMNS)), np.asarray(target)


class DiabetesFederated(UCITableFederated):
    """UCI Diabetes 130-US hospitals 1999-2008, `diabetic_data.csv` (101,766 rows): age (bracket "[70-80)"
    as its index 0..9) and time_in_hospital; target readmitted NO / <30 / >30."""

    FILE = "diabetic_data.csv"
    URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00296/dataset_diabetes.zip"
    MEMBERS = ("dataset_diabetes/diabetic_data.csv",)
    COLUMNS = ("age", "time_in_hospital")
    TARGETS = ("NO", "<30", ">30")
    AGES = tuple(f"[{10 * i}-{10 * (i + 1)})" for i in range(10))

    def rows(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        positions, target_at, rows = _header_rows(text, ",", self.COLUMNS, "readmitted")
        features, target = [], []
        for line, row in rows:
            age = row[positions[0]].strip()
            if age not in self.AGES:
                raise ValueError(f"line {line}: age {age!r} is not a bracket like '[70-80)'")
            features.append([float(self.AGES.index(age)), _number(row[positions[1]], line, "time_in_hospital")])
            target.append(_target_index(row[target_at], self.TARGETS, line))
        return np.asarray(features, dtype=np.float64).reshape(-1, len(self.COLUMNS)), np.asarray(target)
