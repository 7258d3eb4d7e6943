"""HetLoRA (Cho, Liu, Joshi, Ding: "Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation Models",
EMNLP 2024, section 3): clients of different LoRA ranks, zero-padded to the server's rank and averaged with weights by
the norm of each client's adapter product."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from fedlight.algorithms.lora_base import factor_names, require_adapters
from fedlight.plugin import Algorithm, ModelParts, Plan

if TYPE_CHECKING:
    from fedlight.plugin import GroupModels, RoundUpdates, ServerContext


class HetLoRA(Algorithm):
    """The server holds adapters of the model's rank r (`lora.rank`); client k has its own rank r_k <= r. It receives
    the global adapters truncated to r_k (the first r_k rows of each A, the first r_k columns of each B: section 3.1's
    distribution), trains only those, and sends them back zero-padded to r (a component whose A row and B column are
    both zero has a zero gradient in each, as d(BA)/dB = (.) A and d(BA)/dA = B^T (.), so the truncated start keeps the
    client at its rank with no gradient mask), as the paper's aggregation pads them. The server's new adapters are the
    weighted mean of the padded ones (section 3.2): with `weighting: norm`, the paper's sparsity-weighted aggregation,
    client k's weight is proportional to the Frobenius norm of its adapters' product, sqrt(sum over adapted layers of
    ||B_k A_k||_F^2), so a client whose adapters changed the network more counts more; `size` weighs by training-set
    size (plain zero-padding). A component beyond some clients' ranks is thus pulled towards zero by them, which is the
    paper's design. A head the model trains is averaged with the same weights. Each client is evaluated with the global
    adapters truncated to its rank, as it deploys them; a newcomer, whose rank is unknown, with the full rank.

    The message is the padded row, so `comm/sent_bytes` counts rank r for every client: a client of rank r_k would
    send r_k / r of the adapters' bytes.

    Not built: the paper's rank self-pruning (section 3.1, a client lowering its rank when its last components' norm
    is small), an option of the paper rather than the method's core.

    Args:
        ranks: each client's rank (a list as long as the clients, or cycled); None draws each client's rank uniformly
            from min_rank .. r with the run's seed (the paper's heterogeneous setting).
        min_rank: the smallest rank drawn when `ranks` is None.
        weighting: "norm" (sparsity-weighted, the paper's) or "size".
        participation: share of clients selected each round.
    """

    plan = Plan(holds_updates=True)

    def __init__(
        self,
        ranks: list[int] | None = None,
        min_rank: int = 1,
        weighting: Literal["norm", "size"] = "norm",
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if min_rank < 1:
            raise ValueError(f"min_rank must be at least 1, got {min_rank}")
        if ranks is not None and (not ranks or min(ranks) < 1):
            raise ValueError(f"ranks must be a non-empty list of ranks >= 1, got {ranks}")
        self.ranks, self.min_rank, self.weighting = ranks, min_rank, weighting

    def extend_model(self, parts: ModelParts) -> None:
        require_adapters(parts.module, "HetLoRA")
        self.a_names = factor_names(parts.module, "lora_A")
        self.b_names = [name.replace(".lora_A.", ".lora_B.") for name in self.a_names]  # layer by layer

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        views = server.model.named_tensors(self.models[0])
        full = {int(views[name].shape[0]) for name in self.a_names}
        if len(full) != 1:
            raise ValueError(f"HetLoRA needs one LoRA rank for every adapted layer, found {sorted(full)}")
        self.full_rank = full.pop()
        n = server.num_clients
        if self.ranks is None:
            if self.min_rank > self.full_rank:
                raise ValueError(f"min_rank {self.min_rank} exceeds the model's LoRA rank {self.full_rank}")
            drawn = server.random.rng(0, "hetlora ranks").integers(self.min_rank, self.full_rank + 1, size=n)
        else:
            if max(self.ranks) > self.full_rank:
                raise ValueError(
                    f"ranks {self.ranks}: the largest exceeds the model's LoRA rank {self.full_rank}; "
                    "raise model.init_args.lora.rank or lower the ranks"
                )
            drawn = np.resize(np.asarray(self.ranks), n)
        self.client_rank = torch.as_tensor(drawn, dtype=torch.long, device=server.device)
        self.levels = torch.unique(self.client_rank)  # the distinct ranks, ascending
        self.level_of_client = torch.searchsorted(self.levels, self.client_rank)
        self.rank_masks = torch.stack([self.rank_mask(int(r)) for r in self.levels])

    def rank_mask(self, rank: int) -> Tensor:
        """(d,) 1 on the entries a client of `rank` trains (A's first rows, B's first columns, every other entry),
        0 on the adapters' components beyond it."""
        mask = torch.ones_like(self.models[0])
        views = self.server.model.named_tensors(mask)
        for name in self.a_names:
            views[name][rank:] = 0
        for name in self.b_names:
            views[name][:, rank:] = 0
        return mask

    def client_model(self, client: int) -> Tensor:
        """The global adapters truncated to the client's rank (zero beyond it)."""
        return self.models[0] * self.rank_masks[self.level_of_client[client]]

    def adapter_norms(self, params: Tensor) -> Tensor:
        """(k,) sqrt(sum over adapted layers of ||B A||_F^2) of each row of `params`."""
        views = self.server.model.named_tensors(params)
        squares = sum((views[b] @ views[a]).square().sum(dim=(-2, -1)) for a, b in zip(self.a_names, self.b_names))
        return torch.as_tensor(squares).sqrt()

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        trained = updates.all()
        sizes = trained.num_samples.to(trained.params.dtype)
        weights = self.adapter_norms(trained.params) if self.weighting == "norm" else sizes
        if not bool(weights.sum() > 0):  # no client moved its adapters: plain zero-padding
            weights = sizes
        self.set_shared(*self.cluster_means(trained, weights))

    def evaluation_models(self) -> tuple[GroupModels, Tensor]:
        """One model a rank: the global adapters truncated to it, for the clients of that rank."""
        return self.models[0] * self.rank_masks, self.level_of_client

    def round_metrics(self) -> dict[str, float]:
        return {"hetlora/mean_rank": float(self.client_rank.float().mean())}
