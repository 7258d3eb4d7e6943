"""`federation.vectorize: -1` (auto): time both client trainers on the same work once, and keep the faster one.

Which trainer is faster depends on the model, the batch size and the device: batched kernels win when every
client's step is small (small batches, linear layers, a GPU), and a grouped convolution over the clients can lose
to one ordinary convolution per client on a CPU when batches are large. A cost model would have to know every
kernel of every device, so the engine measures instead. In the first round, the clients of the first group train
`PROBE_STEPS` local steps on their own first batches, once as a batch and once one after another (after a warm-up
step of each, interleaved, best of `PROBE_REPEATS`).

The probe bounds its own cost: it spends about `PROBE_SHARE` of the round's sequential training time (estimated
from the first warm-up step and the round's client steps), or `PROBE_FLOOR_S` when that is more. When the full
probe would cost more, it takes fewer steps and then fewer clients (at least 2); it stops repeating once the budget
is spent or one trainer is clearly slower (`CLEARLY_SLOWER` times the other). A round of 15 ResNet-34 clients of
one step each used to be trained about 7 times over before it started. Both must give the same models up to float rounding, or
vectorized training is off. The two trainers draw different dropout masks by design (one stream per client against
one per group), so dropout layers are switched off while the probe runs (`without_dropout`): the check compares like
with like, and a model with dropout vectorizes when vectorized training is faster. The probe's training is discarded: it uses each client's own seeds, and the round then
trains as it would have anyway. The decision is part of the checkpoint, so a resumed run keeps it.

Timings are noisy (another process on the same cores can flip them), so a decision is also remembered on the machine,
keyed by what it depends on (the model, its size, the batch size, the clients timed, the precision, the device, the
threads and torch's version; `probe_key`): the same config run again on the same machine trains the same way and
gives the same numbers. The memory is a JSON file in `$FEDLIGHT_CACHE_DIR` (default `~/.cache/fedlight`); delete
it to measure again.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.nn.modules.dropout import _DropoutNd

PROBE_STEPS = 8
PROBE_REPEATS = 3
PROBE_CLIENTS = 64        # at most this many clients per probe (the vectorized speed-up saturates well before)
AGREEMENT = 0.05          # mean |vectorized - sequential| at most this share of the mean |update|
PROBE_SHARE = 0.2         # the probe's budget: this share of the round's estimated sequential training time ...
PROBE_FLOOR_S = 1.0       # ... or this many seconds, when that is more (a tiny round's probe is cheap anyway)
CLEARLY_SLOWER = 2.0      # a trainer this many times slower than the other is not timed again

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
    remembered: bool = False  # taken from an earlier run's probe on this machine (`recall`)

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
          vectorized: TrainMany, device: torch.device, round_steps: int | None = None) -> ProbeResult:
    """Time `sequential` and `vectorized` (each: (starts, data) -> trained rows, one local epoch) on the clients'
    first `PROBE_STEPS` batches; choose the faster when both give the same models. `round_steps`, the client steps
    of the whole round, bounds the probe's cost (None: no bound)."""
    began = time.perf_counter()
    starts, data = starts[:PROBE_CLIENTS], data[:PROBE_CLIENTS]
    steps = min(PROBE_STEPS, max(-(-len(y) // batch_size) for _, y in data))
    warm = [(x[:batch_size], y[:batch_size]) for x, y in data]
    step_s = _timed(device, sequential, starts[:1], warm[:1])[1]  # one client step, first-call costs included
    budget = float("inf") if round_steps is None else max(PROBE_SHARE * step_s * round_steps, PROBE_FLOOR_S)
    clients, steps = _within(budget - (time.perf_counter() - began), step_s, len(starts), steps)
    starts, data, warm = starts[:clients], data[:clients], warm[:clients]
    first = [(x[: steps * batch_size], y[: steps * batch_size]) for x, y in data]
    vectorized(starts, warm)
    best = {"sequential": float("inf"), "vectorized": float("inf")}
    results = {}
    for _ in range(PROBE_REPEATS):
        for name, train in (("vectorized", vectorized), ("sequential", sequential)):
            results[name], seconds = _timed(device, train, starts, first)
            best[name] = min(best[name], seconds)
        slower = max(best.values()) / max(min(best.values()), 1e-12)
        if time.perf_counter() - began >= budget or slower >= CLEARLY_SLOWER:
            break
    update = (results["sequential"] - starts).abs().mean()
    difference = float((results["vectorized"] - results["sequential"]).abs().mean() / update.clamp(min=1e-12))
    faster = best["vectorized"] <= best["sequential"]
    choice = "vectorized" if faster and difference <= AGREEMENT else "sequential"
    return ProbeResult(len(starts), steps, best["sequential"], best["vectorized"], difference, choice)


@contextmanager
def without_dropout(module: nn.Module) -> Iterator[None]:
    """Every dropout layer of `module` at p = 0 for the duration (restored after)."""
    layers = [m for m in module.modules() if isinstance(m, _DropoutNd)]
    saved = [m.p for m in layers]
    for m in layers:
        m.p = 0.0
    try:
        yield
    finally:
        for m, p in zip(layers, saved):
            m.p = p


def _within(budget_s: float, step_s: float, clients: int, steps: int) -> tuple[int, int]:
    """(clients, steps) whose vectorized warm-up and one timed repeat of both trainers (about clients x (1 + 2 steps)
    client steps) fit in `budget_s`: fewer steps first, then fewer clients, never below 1 step and 2 clients."""
    def cost(c: int, s: int) -> float:
        return c * (1 + 2 * s) * step_s

    while steps > 1 and cost(clients, steps) > budget_s:
        steps -= 1
    while clients > 2 and cost(clients, steps) > budget_s:
        clients -= 1
    return clients, steps


def _timed(device: torch.device, train: TrainMany, starts: Tensor, data: list) -> tuple[Tensor, float]:
    """(what `train` returned, its wall time), the device synchronized around it."""
    _sync(device)
    began = time.perf_counter()
    out = train(starts, data)
    _sync(device)
    return out, time.perf_counter() - began


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """What the device is, for the memory's key: the GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "cpu")
    except OSError:
        return platform.processor() or "cpu"


def probe_key(**facts: Any) -> str:
    """A short stable key of what a decision depends on (threads and torch's version are added here)."""
    facts = {**facts, "threads": torch.get_num_threads(), "torch": torch.__version__}
    return hashlib.sha1(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def memory_file() -> Path:
    root = os.environ.get("FEDLIGHT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedlight"
    return Path(root) / "trainer_choices.json"


def recall(key: str) -> ProbeResult | None:
    """The decision remembered under `key` on this machine, or None."""
    try:
        known = json.loads(memory_file().read_text())
        return ProbeResult(**{**known[key], "remembered": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember(key: str, result: ProbeResult) -> None:
    """Keep `result` under `key` (atomically; a memory that cannot be written is only a lost shortcut)."""
    path = memory_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = json.loads(path.read_text()) if path.is_file() else {}
        known[key] = {**result.as_dict(), "remembered": False}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass
