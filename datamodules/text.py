"""Text classification from a local file (jsonl or csv) or a `datasets` folder, tokenized once with the model's own
tokenizer.

The rows become token ids, (N, max_length) integers padded with the tokenizer's pad id (the pretrained model builds
its attention mask from it, `fedlight.models.PretrainedClassifier`), and integer labels: a label column of integers
is kept as it is, one of strings is numbered in sorted order (`label_names`). The tokenized rows are cached beside the
data file (`<file>.tokens-<key>.pt`, the key a hash of the file, the tokenizer's files, the columns and the length),
so a second run, a sweep's other runs and a resume read them instead of tokenizing again. `group_column` names the
rows' natural groups (a task, a category, an author) for the `Groups` partition, which makes each one a true cluster.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedDataModule

#: the tokenizer's files a cache key covers (those a folder has)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "tokenizer.model",
)


def read_rows(path: Path, columns: list[str]) -> list[dict]:
    """The rows of a jsonl or csv file, or of a Hugging Face `datasets` folder (`Dataset.save_to_disk`), checked to
    have `columns`."""
    if path.is_dir():
        rows = dataset_folder_rows(path)
    elif not path.is_file():
        raise FileNotFoundError(
            f"text data file {path} not found: give a .jsonl or .csv file, or a folder saved by "
            f"`datasets`' save_to_disk, with the columns {columns} (make a planted one with "
            f"`python -m fedlight.datamodules.planted_text --out {path}`)"
        )
    elif path.suffix not in (".jsonl", ".csv"):
        raise ValueError(
            f"text data file {path}: read .jsonl (one JSON object a line) or .csv files, or a folder "
            f"saved by `datasets`, not {path.suffix!r}"
        )
    else:
        with path.open(newline="") as f:
            rows = (
                [json.loads(line) for line in f if line.strip()] if path.suffix == ".jsonl" else list(csv.DictReader(f))
            )
    if not rows:
        raise ValueError(f"text data file {path} has no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ValueError(f"text data file {path} has no column {missing[0]!r}; its columns are {sorted(rows[0])}")
    return rows


def dataset_folder_rows(path: Path) -> list[dict]:
    """The rows of a folder `datasets` saved one data set into (a `DatasetDict`'s folder holds one per split)."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise ValueError(
            f"{path} holds the splits {splits} of a DatasetDict: give one split's folder, e.g. {path / splits[0]}"
            if splits
            else f"{path} holds an empty DatasetDict"
        )
    if not (path / "state.json").is_file():
        raise FileNotFoundError(
            f"{path} is a folder but not one `datasets` saved (no state.json): give a .jsonl or "
            ".csv file, or the folder `Dataset.save_to_disk` wrote"
        )
    try:
        from datasets import load_from_disk
    except ImportError as error:
        raise ImportError(
            f"reading the `datasets` folder {path} needs the datasets package: pip install 'fedlight[pretrained]'"
        ) from error
    return load_from_disk(str(path)).to_list()


def cache_key(path: Path, tokenizer: Path, settings: str) -> str:
    """A hash of the data (a file, or a `datasets` folder's files), the tokenizer's files and `settings`: what a
    token cache beside the data depends on."""
    key = hashlib.sha256()
    data_files = (
        sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("tokens-"))
        if path.is_dir()
        else [path]
    )
    for file in data_files:
        key.update(file.name.encode() + file.read_bytes())
    for name in TOKENIZER_FILES:
        file = tokenizer / name
        if file.is_file():
            key.update(name.encode() + file.read_bytes())
    key.update(settings.encode())
    return key.hexdigest()[:16]


def cache_file(path: Path, key: str) -> Path:
    """Where tokenized rows are kept: beside a data file, or inside a `datasets` folder."""
    return path / f"tokens-{key}.pt" if path.is_dir() else path.with_name(f"{path.name}.tokens-{key}.pt")


def label_codes(values: list) -> tuple[np.ndarray, list[str]]:
    """Integer labels of a label column: integers kept, strings numbered in sorted order; the class names."""
    if all(isinstance(v, int) or (isinstance(v, str) and v.lstrip("-").isdigit()) for v in values):
        codes = np.asarray([int(v) for v in values], dtype=np.int64)
        if codes.min() < 0:
            raise ValueError(f"integer labels must be >= 0, found {codes.min()}")
        return codes, [str(c) for c in range(int(codes.max()) + 1)]
    names = sorted({str(v) for v in values})
    index = {name: i for i, name in enumerate(names)}
    return np.asarray([index[str(v)] for v in values], dtype=np.int64), names


class TextFederated(FederatedDataModule):
    """Text rows of a local jsonl or csv file, tokenized with the pretrained model's tokenizer, cut into clients.

    Args:
        path: the data file (.jsonl or .csv), or a folder `datasets` saved one data set into (`save_to_disk`).
        tokenizer: the folder holding the tokenizer (usually the pretrained model's folder).
        text_column, label_column: the columns of the text and of its label.
        group_column: the column of the rows' natural groups, for the `Groups` partition (None: none).
        max_length: tokens kept per row (longer rows are truncated, shorter ones padded).
        num_clients, partition, val_fraction, test_fraction, public_size, split_seed, holdout_clients: as in
            FederatedDataModule.
    """

    def __init__(
        self,
        path: str,
        tokenizer: str,
        text_column: str = "text",
        label_column: str = "label",
        group_column: str | None = None,
        max_length: int = 64,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if max_length < 2:
            raise ValueError(f"max_length must be at least 2, got {max_length}")
        self.path, self.tokenizer_path = Path(path), Path(tokenizer)
        self.text_column, self.label_column, self.group_column = text_column, label_column, group_column
        self.max_length = max_length
        self.label_names: list[str] = []

    @property
    def num_classes(self) -> int:
        """How many classes the label column has (`label_codes`' class names; the file is read the first time it is
        asked)."""
        if not self.label_names:
            self.load_pool()
        return len(self.label_names)

    def load_pool(self) -> tuple[Tensor, Tensor]:
        columns = [self.text_column, self.label_column] + ([self.group_column] if self.group_column else [])
        rows = read_rows(self.path, columns)
        y, self.label_names = label_codes([row[self.label_column] for row in rows])
        if self.group_column:
            self.pool_owners = np.asarray([str(row[self.group_column]) for row in rows])
        return self.token_ids([str(row[self.text_column]) for row in rows]), torch.from_numpy(y)

    def cache_path(self) -> Path:
        """Where the tokenized rows are kept: beside the data file, keyed by everything they depend on."""
        return cache_file(self.path, cache_key(self.path, self.tokenizer_path, f"{self.text_column}|{self.max_length}"))

    def token_ids(self, texts: list[str]) -> Tensor:
        """(N, max_length) token ids of `texts`, from the cache when it has them."""
        if not self.tokenizer_path.is_dir():
            raise FileNotFoundError(
                f"tokenizer folder {self.tokenizer_path} not found: give the pretrained model's "
                "folder (its tokenizer's files are saved beside the weights)"
            )
        cache = self.cache_path()
        if cache.is_file():
            return torch.load(cache)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        if tokenizer.pad_token_id is None:
            raise ValueError(
                f"the tokenizer in {self.tokenizer_path} has no pad token: text rows are padded to "
                "max_length, so give it one (the model's config.json pad_token_id)"
            )
        ids = tokenizer(texts, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt")[
            "input_ids"
        ]
        torch.save(ids, cache)
        return ids
