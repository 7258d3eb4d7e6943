"""Pairwise similarity and distance matrices between clients, computed on the input's device.

Rows are clients. Every function returns an (n, n) float32 tensor on the device of its input and is a handful
of matrix operations: no Python loop over client pairs. The matrices feed the clustering components of
`fedlight.cluster.clusterers`:

- `cosine_similarity_matrix` / `cosine_distance_matrix`: cosine of flattened model updates (the divergence
  matrix of one-shot clustered FL, Γ_ij = 1 - cos(Δ_i, Δ_j), and CFL's split rule).
- `l2_distance_matrix`: Euclidean distance between flattened weights (FedTSDP stage 2).
- `js_divergence_matrix`: Jensen-Shannon divergence between per-client softmax outputs on shared public samples,
  averaged over the samples (FedTSDP stage 1).
- `agreement_similarity`: fraction of shared public samples on which two clients predict the same class, or
  its soft version (FLIS's inference similarity, "FLIS: Clustered Federated Learning via Inference Similarity
  for Non-IID Data Distribution", section 2.2, with the inner product for the printed Hadamard norm, as the
  authors' code computes it).

Memory. The Gram matrix U Uᵀ is accumulated over column blocks (about 2^26 entries each unless `chunk_size`
says otherwise), so besides the input and the (n, n) result the peak extra memory is one (n, chunk_size) fp32
block, and only when a block needs a dtype conversion or centring. No normalized copy of U is ever made: cosine
divides the Gram matrix by the outer product of the row norms afterwards. Accumulation is always in fp32,
whatever the input dtype, so updates can be stored in bf16 (1000 clients x 11M parameters: 22 GB instead of
44 GB) with cosines within about 1e-4 of fp32's (`benchmarks/similarity.py` measures it). A list of n flat
rows also works: only one (n, chunk_size) block is ever stacked. So does a `fedlight.cluster.differences.Differences`
(clients' updates as trained minus start, on a mask's entries, never built whole): one block of it is built at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Union

import torch
from torch import Tensor

from fedlight.cluster.differences import Differences

Rows = Union[Tensor, Sequence[Tensor], Differences]

_EPS = 1e-12
BLOCK_ENTRIES = 1 << 26


def flatten(tensors: Sequence[Tensor] | Mapping[str, Tensor]) -> Tensor:
    """One 1-D vector from a list of tensors or a dict (in its iteration order, e.g. a state dict's)."""
    items = list(tensors.values()) if isinstance(tensors, Mapping) else list(tensors)
    if not items:
        raise ValueError("flatten needs at least one tensor")
    return torch.cat([t.reshape(-1) for t in items])


def stack_flat(items: Sequence[Tensor | Sequence[Tensor] | Mapping[str, Tensor]]) -> Tensor:
    """An (n, d) matrix whose row i is `flatten(items[i])` (a 1-D tensor is taken as already flat)."""
    if not items:
        raise ValueError("stack_flat needs at least one client")
    rows = [it.reshape(-1) if isinstance(it, Tensor) else flatten(it) for it in items]
    if len({r.numel() for r in rows}) != 1:
        raise ValueError(f"clients have different numbers of entries: {sorted({r.numel() for r in rows})}")
    return torch.stack(rows)


def _shape(U: Rows) -> tuple[int, int, torch.device]:
    if isinstance(U, Differences):
        return U.shape[0], U.shape[1], U.device
    if isinstance(U, Tensor):
        if U.dim() != 2:
            raise ValueError(f"expected an (n, d) matrix with one row per client, got shape {tuple(U.shape)}")
        return U.shape[0], U.shape[1], U.device
    if len(U) == 0:
        raise ValueError("expected at least one client row")
    sizes = {u.numel() for u in U}
    if len(sizes) != 1:
        raise ValueError(f"client rows have different sizes: {sorted(sizes)}")
    return len(U), sizes.pop(), U[0].device


def _block(U: Rows, start: int, stop: int) -> Tensor:
    """Columns [start, stop) of U as fp32, (n, stop - start); a view when U is already fp32."""
    if isinstance(U, Tensor):
        return U[:, start:stop].float()
    if isinstance(U, Differences):
        return U.columns(start, stop).float()
    return torch.stack([u.reshape(-1)[start:stop] for u in U]).float()


def auto_chunk_size(n: int) -> int:
    """Columns per block when none is given: blocks of about 2^26 entries (256 MB in fp32), large enough
    for full-speed matrix products and small enough that a converted bf16 block never costs much memory."""
    return max(1, BLOCK_ENTRIES // max(1, n))


def gram_matrix(U: Rows, chunk_size: int | None = None, center: bool = False) -> Tensor:
    """U Uᵀ in fp32, accumulated over column blocks of `chunk_size` (default `auto_chunk_size`).

    U is an (n, d) tensor, a list of n flat tensors (then only one (n, chunk_size) block is ever stacked) or a
    `Differences` (then only one block of it is ever built).
    With `center=True` each block is centred on its column mean first, which gives the Gram matrix of the
    centred rows: distances are unchanged by it and it avoids cancellation when rows share a large common part.
    Peak extra memory: the (n, n) result plus one (n, chunk_size) fp32 block. The products run in full fp32
    (TF32 is switched off for the duration, whatever the global `float32_matmul_precision`).
    """
    n, d, device = _shape(U)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
    step = auto_chunk_size(n) if chunk_size is None else chunk_size
    G = torch.zeros(n, n, dtype=torch.float32, device=device)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # TF32 would put ~1e-3 relative errors into the cosines
    try:
        for start in range(0, d, max(step, 1)):
            B = _block(U, start, min(start + step, d))
            if center:
                B = B - B.mean(dim=0, keepdim=True)
            G.addmm_(B, B.T)
    finally:
        torch.set_float32_matmul_precision(previous)
    return G


def cosine_similarity_matrix(U: Rows, chunk_size: int | None = None, eps: float = _EPS) -> Tensor:
    """cos(u_i, u_j) for every pair of rows, in [-1, 1], diagonal exactly 1.

    Same as `F.normalize(U) @ F.normalize(U).T` (norms clamped at `eps`), so a zero row has similarity 0 to
    every other row; its self-similarity is still set to 1 so that `1 - S` is a proper distance.
    """
    G = gram_matrix(U, chunk_size)
    inv = 1.0 / G.diagonal().clamp_min(0).sqrt().clamp_min(eps)
    S = (G * inv[:, None] * inv[None, :]).clamp_(-1.0, 1.0)
    S.fill_diagonal_(1.0)
    return S


def cosine_distance_matrix(U: Rows, chunk_size: int | None = None, eps: float = _EPS) -> Tensor:
    """1 - cos(u_i, u_j), in [0, 2], with an exact zero diagonal (the one-shot clustered FL matrix Γ)."""
    D = (1.0 - cosine_similarity_matrix(U, chunk_size, eps)).clamp_(min=0.0)
    D.fill_diagonal_(0.0)
    return D


def l2_distance_matrix(U: Rows, chunk_size: int | None = None) -> Tensor:
    """‖u_i - u_j‖₂ for every pair of rows, with an exact zero diagonal.

    Computed with the Gram trick ‖a‖² + ‖b‖² - 2a·b on column-centred blocks (see `gram_matrix`), so it
    supports `chunk_size` and stays accurate when all rows are close to a common point (model weights near
    their initialization). Absolute error is about 1e-7 times the squared spread of the rows, before the sqrt.
    """
    G = gram_matrix(U, chunk_size, center=True)
    sq = G.diagonal()
    D2 = (sq[:, None] + sq[None, :] - 2.0 * G).clamp_(min=0.0)
    D2 = 0.5 * (D2 + D2.T)
    D = D2.sqrt_()
    D.fill_diagonal_(0.0)
    return D


def js_divergence_matrix(P: Tensor, block_size: int | None = None, atol: float = 1e-3) -> Tensor:
    """Jensen-Shannon divergence between clients' output distributions, natural log, averaged over samples.

    P is (n, m, c): client i's softmax output on each of m shared public samples (or (n, c): one sample).
    JS(p, q) = ½ KL(p ‖ M) + ½ KL(q ‖ M) with M = ½(p + q), computed with the natural log, so it lies in
    [0, ln 2]; it equals `scipy.spatial.distance.jensenshannon(p, q) ** 2` with the default base e (scipy
    returns the square root, the JS *distance*). Entry (i, j) is the mean over the m samples: our reading
    of FedTSDP's Eq. 5 over a batch (section 3.2.1 does not say), equal to the JS of the flattened (m·c) vectors
    divided by m.

    Pairs are processed `block_size` rows at a time (an automatic size keeps each (block, n, m, c) temporary
    near 2^24 entries); the loop is over row blocks, never over pairs.
    """
    if P.dim() == 2:
        P = P[:, None, :]
    if P.dim() != 3:
        raise ValueError(f"expected (n, m, c) or (n, c) probabilities, got shape {tuple(P.shape)}")
    P = P.float()
    if (P < 0).any():
        raise ValueError(
            "js_divergence_matrix expects probabilities (softmax outputs), found negative entries; "
            "apply softmax to logits first"
        )
    sums = P.sum(-1)
    if (sums - 1).abs().max() > atol:
        raise ValueError(
            f"each output row must sum to 1 (got sums in [{sums.min():.4g}, {sums.max():.4g}]); "
            "apply softmax to logits first"
        )
    n, m, c = P.shape
    if block_size is None:
        block_size = max(1, (1 << 24) // max(1, n * m * c))
    logP = torch.where(P > 0, P.log(), torch.zeros_like(P))
    out = torch.empty(n, n, dtype=torch.float32, device=P.device)
    for start in range(0, n, block_size):
        Pi, logPi = P[start : start + block_size, None], logP[start : start + block_size, None]  # (b, 1, m, c)
        Pj, logPj = P[None], logP[None]  # (1, n, m, c)
        logM = (0.5 * (Pi + Pj)).clamp_min(torch.finfo(torch.float32).tiny).log()
        # p·(log p − log M) is exactly 0 where p = q, so identical outputs give exactly 0 divergence.
        kl_i = torch.where(Pi > 0, Pi * (logPi - logM), torch.zeros((), device=P.device)).sum(-1)
        kl_j = torch.where(Pj > 0, Pj * (logPj - logM), torch.zeros((), device=P.device)).sum(-1)
        out[start : start + block_size] = (0.5 * (kl_i + kl_j)).mean(-1)
    out = (0.5 * (out + out.T)).clamp_(0.0, math.log(2.0))
    out.fill_diagonal_(0.0)
    return out


def agreement_similarity(preds: Tensor, soft: bool = False, chunk_size: int | None = None) -> Tensor:
    """Inference similarity of clients from their predictions on the same m public samples, in [0, 1].

    Hard (default): `preds` is (n, m) predicted labels, or (n, m, c) scores whose argmax is taken. Entry (i, j)
    is the fraction of samples on which clients i and j predict the same class. This is the cosine of the
    flattened one-hot inference matrices, FLIS's formula (section 2.2) as the authors' code computes it,
    ⟨B_i, B_j⟩_F / (‖B_i‖_F ‖B_j‖_F) (the paper's printed ‖B_i ⊙ B_j‖_F is a norm, not a sum, and is wrong). Computed as
    a sum over classes of indicator Gram matrices: exact integer counts, peak memory two (n, m) blocks.

    Soft (`soft=True`): `preds` is (n, m, c) probabilities (softmax outputs) and the result is the cosine of
    the flattened (m·c) matrices, FLIS's soft-label option (section 2.2); non-negative entries keep it in [0, 1].
    """
    if soft:
        if preds.dim() != 3:
            raise ValueError(f"soft agreement needs (n, m, c) probabilities, got shape {tuple(preds.shape)}")
        if (preds < 0).any():
            raise ValueError("soft agreement expects probabilities (softmax outputs), found negative entries")
        return cosine_similarity_matrix(preds.reshape(preds.shape[0], -1), chunk_size).clamp_(min=0.0)
    if preds.dim() == 3:
        preds = preds.argmax(-1)
    if preds.dim() != 2:
        raise ValueError(f"expected (n, m) labels or (n, m, c) scores, got shape {tuple(preds.shape)}")
    if preds.is_floating_point():
        raise ValueError(
            "hard agreement expects integer labels (n, m) or scores (n, m, c); got a floating (n, m) tensor"
        )
    n, m = preds.shape
    if m == 0:
        raise ValueError("agreement needs at least one public sample")
    counts = torch.zeros(n, n, dtype=torch.float32, device=preds.device)
    for label in torch.unique(preds):  # a loop over classes, not over client pairs
        ind = (preds == label).float()
        counts.addmm_(ind, ind.T)
    S = counts / m
    S.fill_diagonal_(1.0)
    return S
