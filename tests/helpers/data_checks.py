"""Checks shared by the data-module tests (tests/unit/test_data_*.py): shapes, label ranges, client counts, and that
no sample is in two clients (or in a client and the public data)."""

from __future__ import annotations

import os

import torch

from fedlight.datamodules.base import SPLITS, FederatedData


def all_rows(data: FederatedData, public: bool = True) -> torch.Tensor:
    """Every sample of every client and split (and the public data), flattened to rows."""
    parts = [getattr(data, s).x.flatten(1) for s in SPLITS]
    if public and data.public_x is not None:
        parts.append(data.public_x.flatten(1))
    return torch.cat(parts)


def check_federated(
    data: FederatedData,
    *,
    num_clients: int,
    num_classes: int,
    sample_shape: tuple[int, ...],
    dtype: torch.dtype,
    total: int | None = None,
    pool_x: torch.Tensor | None = None,
) -> None:
    """Shapes, dtypes, label ranges, client count, non-empty training splits, and disjoint clients.

    The pool's samples must be distinct rows (the tests make them so); then "no duplicate row among all
    clients' splits and the public data" means no two clients (or splits) share a sample. With `pool_x`,
    the union must also be exactly the pool (nothing lost, nothing invented)."""
    assert data.num_clients == num_clients
    assert data.num_classes == num_classes
    for s in SPLITS:
        split = getattr(data, s)
        assert split.num_clients == num_clients
        assert split.x.shape[1:] == sample_shape, (s, split.x.shape)
        assert split.x.dtype == dtype
        assert split.y.dtype == torch.long and len(split.y) == len(split.x) == split.bounds[-1]
        if len(split.y):
            assert 0 <= int(split.y.min()) and int(split.y.max()) < num_classes
    assert (data.train.sizes() > 0).all()
    if data.public_x is not None:
        assert data.public_x.shape[1:] == sample_shape and data.public_x.dtype == dtype
    rows = all_rows(data)
    assert len(torch.unique(rows, dim=0)) == len(rows), "a sample is in two places"
    if total is not None:
        assert len(rows) == total
    if pool_x is not None:
        pool = pool_x.flatten(1)
        assert len(pool) == len(rows)
        assert torch.equal(torch.unique(pool, dim=0), torch.unique(rows, dim=0))


def file_url(path: os.PathLike) -> str:
    """A file:// address for a local file (downloads are tested with these: no network needed)."""
    from pathlib import Path

    return Path(path).resolve().as_uri()


def leftovers(folder: os.PathLike) -> list[str]:
    """Temporary files or folders a download might have left behind."""
    from pathlib import Path

    return sorted(p.name for p in Path(folder).rglob("*") if p.name.startswith(".") or p.name.endswith(".part"))
