"""One federation spread over several processes (GPUs, nodes) with Lightning Fabric's collectives.

Every process holds the whole server state and runs the algorithm's hooks itself; what is split is the clients'
work. Each round, every process trains its shard of the round's clients (`shard`, the same on every process), and:

- running-sum aggregation (FedAvg and the algorithms that keep it) adds each shard's weighted sums and weights in
  one all-reduce, and all-gathers the personal parts, so memory still holds one group of models per process;
- algorithms that look at every update (OCFL, CFL, FLIS, IFCA, ...) get them all, all-gathered back into the
  single-process order, so they run unchanged and every process reaches the same state;
- evaluation is sharded the same way and the per-client values are all-gathered.

Processes only ever exchange tensors of equal shape: lists that differ in length are padded to the longest.
With one process every method is the identity, so the single-process path is the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    import lightning as L

T = TypeVar("T")


class Collective:
    """The collectives of a federation's processes (a no-op for one process; `fabric` None: one process)."""

    def __init__(self, fabric: L.Fabric | None = None) -> None:
        self.fabric = fabric
        self.world, self.rank = (fabric.world_size, fabric.global_rank) if fabric is not None else (1, 0)

    @property
    def spread(self) -> bool:
        """Whether the federation runs on more than one process."""
        return self.world > 1

    @property
    def device(self) -> torch.device:
        """Where this process's tensors live."""
        return self.fabric.device if self.fabric is not None else torch.device("cpu")

    def shard(self, clients: list[int]) -> list[int]:
        """This process's share of `clients`: every `world`-th client, so shards differ by one client at most."""
        return clients[self.rank :: self.world] if self.spread else clients

    def sum_(self, tensor: Tensor) -> Tensor:
        """Sum `tensor` over the processes, in place."""
        if self.spread:
            torch.distributed.all_reduce(tensor)
        return tensor

    def stack(self, tensor: Tensor) -> Tensor:
        """Every process's `tensor` (all of one shape), stacked in rank order: (world, *shape). Plain
        torch.distributed: Fabric's all_gather goes through a differentiable gather that warns on every call."""
        if not self.spread:
            return tensor[None]
        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        torch.distributed.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def gather(self, tensor: Tensor) -> Tensor:
        """Every process's `tensor` (rows may differ in number), concatenated in rank order."""
        if not self.spread:
            return tensor
        counts = self.stack(torch.tensor([len(tensor)], device=tensor.device)).reshape(-1).tolist()
        padded = tensor.new_zeros((max(counts), *tensor.shape[1:]))
        padded[: len(tensor)] = tensor
        gathered = self.stack(padded)  # (world, max rows, ...)
        return torch.cat([gathered[r, :n] for r, n in enumerate(counts)])

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's picklable `obj`, in rank order."""
        if not self.spread:
            return [obj]
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    def close(self) -> None:
        """Leave the process group together: a barrier, then its destruction. Without it a process that ends first
        can take the group's store down under another one still exiting, which then aborts ("terminate called
        without an active exception") on a loaded machine."""
        if self.spread and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every process."""
        return self.fabric.broadcast(obj, src=0) if self.spread and self.fabric is not None else obj
