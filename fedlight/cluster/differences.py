"""Rows of differences `a - b` (clients' updates: trained minus start), optionally on a mask's columns, that are never
built whole: a held round of m large models already holds the (m, d) trained models, and one more (m, d) matrix of
their updates would double it (1.28 GB for 15 ResNet-34 clients).

`Differences` stands for the (m, masked d) matrix `(a - b)[:, mask]`. Indexing its rows (`rows[i]`, `rows[a:b]`, a
boolean or index tensor) builds just those rows; `columns(start, stop)` builds one block of columns for every row,
which is how `fedlight.cluster.similarity` reads it (the Gram matrix is accumulated over column blocks). Every entry
is the same float subtraction `a - b` would do, so results match those of the dense matrix bit for bit. `b` may be a
stride-0 expanded row (every client started from one model); the mask becomes its runs of True columns, so no index
of every masked entry is made either.
"""

from __future__ import annotations

import torch
from torch import Tensor


def true_runs(mask: Tensor) -> list[tuple[int, int]]:
    """The [begin, end) column ranges where a 1-D boolean mask is True, in order."""
    edges = torch.diff(
        mask.to(torch.int8), prepend=mask.new_zeros(1, dtype=torch.int8), append=mask.new_zeros(1, dtype=torch.int8)
    )
    bounds = edges.nonzero().flatten().tolist()
    return list(zip(bounds[0::2], bounds[1::2]))


class Differences:
    """The matrix `(minuend - subtrahend)[:, mask]` (every column when `mask` is None), built on demand a row
    selection or a block of columns at a time. Both operands are (m, d); the subtrahend may be an expanded view."""

    def __init__(self, minuend: Tensor, subtrahend: Tensor, mask: Tensor | None = None) -> None:
        if minuend.dim() != 2 or subtrahend.shape != minuend.shape:
            raise ValueError(
                f"Differences needs two (m, d) matrices of one shape, got {tuple(minuend.shape)} and "
                f"{tuple(subtrahend.shape)}"
            )
        if mask is not None and mask.shape != minuend.shape[1:]:
            raise ValueError(f"the mask has {mask.numel()} entries for rows of {minuend.shape[1]}")
        self.minuend, self.subtrahend = minuend, subtrahend
        d = minuend.shape[1]
        self.runs = [(0, d)] if mask is None else true_runs(mask)
        self.shape = torch.Size((minuend.shape[0], sum(end - begin for begin, end in self.runs)))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the built rows: what `minuend - subtrahend` would have."""
        return torch.result_type(self.minuend, self.subtrahend)

    @property
    def device(self) -> torch.device:
        """Where the operands, and so the built rows, are."""
        return self.minuend.device

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: int | slice | Tensor) -> Tensor:
        """The rows selected (as a tensor index would select them), built: (k, masked d), or (masked d) for an int."""
        if isinstance(rows, int):
            if not -len(self) <= rows < len(self):
                raise IndexError(f"row {rows} out of range for {len(self)} rows")
            index = rows % len(self)
            return self._build(slice(index, index + 1), 0, self.shape[1])[0]
        return self._build(rows, 0, self.shape[1])

    def columns(self, start: int, stop: int) -> Tensor:
        """Columns [start, stop) of every row, built: (m, stop - start)."""
        return self._build(slice(None), start, min(stop, self.shape[1]))

    def _build(self, rows: slice | Tensor, start: int, stop: int) -> Tensor:
        """Rows `rows`, masked columns [start, stop): each run of masked columns that overlaps them is subtracted
        straight into its place in the result."""
        a, b = self.minuend, self.subtrahend
        if isinstance(rows, slice):
            count = len(range(*rows.indices(len(self))))
        else:
            count = int(rows.sum()) if rows.dtype == torch.bool else rows.numel()
        out = torch.empty(count, max(0, stop - start), dtype=self.dtype, device=self.device)
        offset = 0  # masked column where the current run begins
        for begin, end in self.runs:
            lo, hi = max(start, offset), min(stop, offset + end - begin)
            if lo < hi:
                columns = slice(begin + lo - offset, begin + hi - offset)
                torch.sub(a[rows, columns], b[rows, columns], out=out[:, lo - start : hi - start])
            offset += end - begin
            if offset >= stop:
                break
        return out
