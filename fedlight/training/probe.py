"""`federation.vectorize: -1` (auto): time both client trainers on the same work once, and keep the faster one.

Which trainer is faster depends on the model, the batch size and the device: batched kernels win when every
client's step is small (small batches, linear layers, a GPU), and a grouped convolution over the clients can lose
to one ordinary convolution per client on a CPU when batches are large. A cost model would have to know every
kernel of every device, so the engine measures instead. In the first round, the clients of the first group train
`PROBE_STEPS` local steps on their own first batches, once as a batch and once one after another (after a warm-up
step of each, interleaved, best of `PROBE_REPEATS`). Both must give the same models up to float rounding, or
vectorized training is off. The probe's training is discarded: it uses each client's own seeds, and the round then
trains as it would have anyway. The decision is part of the checkpoint, so a resumed run keeps it.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import Tensor

PROBE_STEPS = 8
PROBE_REPEATS = 3
PROBE_CLIENTS = 64        # at most this many clients per probe (the vectorized speed-up saturates well before)
AGREEMENT = 0.05          # mean |vectorized - sequential| at most this share of the mean |update|

TrainMany = Callable[[Tensor, list[tuple[Tensor, Tensor]]], Tensor]


@dataclass
class ProbeResult:
    """What the probe measured and chose (recorded in summary.json)."""

    clients: int
    steps: int
    sequential_s: float
    vectorized_s: float
    difference: float  # mean |vectorized - sequential| over mean |update|
    choice: str        # "vectorized" or "sequential"

    @property
    def reason(self) -> str | None:
        """Why clients train one after another, or None when they train vectorized."""
        if self.choice == "vectorized":
            return None
        if self.difference > AGREEMENT:
            return (f"auto: vectorized training gave other models than sequential training in the probe (mean "
                    f"difference {self.difference:.1%} of an update)")
        return (f"auto: one client at a time was faster in the probe ({self.sequential_s:.3f} s against "
                f"{self.vectorized_s:.3f} s vectorized for {self.clients} clients x {self.steps} steps)")

    def as_dict(self) -> dict:
        return asdict(self)


def probe(starts: Tensor, data: list[tuple[Tensor, Tensor]], batch_size: int, sequential: TrainMany,
          vectorized: TrainMany, device: torch.device) -> ProbeResult:
    """Time `sequential` and `vectorized` (each: (starts, data) -> trained rows, one local epoch) on the clients'
    first `PROBE_STEPS` batches; choose the faster when both give the same models."""
    starts, data = starts[:PROBE_CLIENTS], data[:PROBE_CLIENTS]
    steps = min(PROBE_STEPS, max(-(-len(y) // batch_size) for _, y in data))
    first = [(x[: steps * batch_size], y[: steps * batch_size]) for x, y in data]
    warm = [(x[:batch_size], y[:batch_size]) for x, y in data]
    sequential(starts[:1], warm[:1]), vectorized(starts, warm)
    best = {"sequential": float("inf"), "vectorized": float("inf")}
    results = {}
    for _ in range(PROBE_REPEATS):
        for name, train in (("vectorized", vectorized), ("sequential", sequential)):
            _sync(device)
            began = time.perf_counter()
            results[name] = train(starts, first)
            _sync(device)
            best[name] = min(best[name], time.perf_counter() - began)
    update = (results["sequential"] - starts).abs().mean()
    difference = float((results["vectorized"] - results["sequential"]).abs().mean() / update.clamp(min=1e-12))
    faster = best["vectorized"] <= best["sequential"]
    choice = "vectorized" if faster and difference <= AGREEMENT else "sequential"
    return ProbeResult(len(starts), steps, best["sequential"], best["vectorized"], difference, choice)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
