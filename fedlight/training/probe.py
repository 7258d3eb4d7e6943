"""`federation.vectorize: -1` (auto): time both client trainers on round 1's own training, and keep the faster one.

Which trainer is faster depends on the model, the batch size and the device: batched kernels win when every
client's step is small (small batches, linear layers, a GPU), and a grouped convolution over the clients can lose
to one ordinary convolution per client on a CPU when batches are large. A cost model would have to know every
kernel of every device, so the engine measures instead, on work the round needs anyway: round 1's first group
trains its first `sequential_share(n)` clients one after another, timed client by client, and the rest of the group
vectorized, timed as one call. The faster per client step is kept for the rest of the run. Nothing is trained twice,
so the probe costs only the slower trainer's excess on part of one round (a probe that repeated both trainers on
the same clients cost a round of 15 ResNet-34 clients 9.2x its time, and short runs of small models up to 1.47x).

Vectorized training must give the models of sequential training up to float rounding, or it is off. That is
checked before any client trains vectorized for real: 1 local step of the clients about to train vectorized, and of
the first 2 of them one after another, dropout switched off (`without_dropout`: the trainers draw other masks by
design, one stream per client against one per group, so the check compares like with like). The check is also the
vectorized trainer's warm-up at the group size it is then timed at (a first call costs 20-30 % more per step), so
first-call costs stay out of the timing; the first sequential client is left out of its timing for the same reason.
Where the layout matters (a convolution on a CPU), the check's vectorized step runs in both layouts, taking turns,
and the faster is kept (`faster_layout`, `VectorizedTrainer.channels_last_inputs`): channels-last image batches with
the clients max-pooled in their channels made every network we ship 1.07-1.73x faster a vectorized round on this CPU
(docs/results.md, "client_pooling.py"), but a network of the user's own may differ.

Timings are noisy (another process on the same cores can flip them), so a decision is also remembered on the machine,
keyed by what it depends on (the model, its size, the batch size, the group's clients, the precision, the device,
the threads, torch's version and the probe's; `probe_key`). The same config run again on the same machine takes the
remembered decision, and round 1 still trains the same clients each way, so it gives the same numbers. The memory is
a JSON file in `$FEDLIGHT_CACHE_DIR` (default `~/.cache/fedlight`); delete it to measure again. The decision is part of
the checkpoint, so a resumed run keeps it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor, nn
from torch.nn.modules.dropout import _DropoutNd

AGREEMENT = 0.05  # mean |vectorized - sequential| at most this share of the mean |update|
CHECK_CLIENTS = 2  # clients the agreement check also trains sequentially (one local step each)
#: on the CPU, a client step at least this long one client at a time is compute-bound: vectorizing removes per-step
#: Python and dispatch overhead (about a millisecond for a small network), a few percent of such a step at most, and
#: its copies cost more, so auto trains the rest one after another without trying the vectorized trainer (whose
#: warm-up and check on a large network cost a 1-round run a third of its time)
COMPUTE_BOUND_S = 0.05
LAYOUT_TRIES = 3  # timed check calls per input layout (`faster_layout`)
#: part of the memory's key: a decision remembered by an older probe is measured again (1 did not time the layouts;
#: 2 timed channels-last inputs with vmap's own pooling, slower than the channels-last layout is now)
PROBE_VERSION = 3

T = TypeVar("T")


@dataclass
class ProbeResult:
    """What round 1 measured and chose (recorded in summary.json and the checkpoint)."""

    sequential_clients: int
    vectorized_clients: int
    sequential_step_s: float  # seconds per client step, one client after another (the first client left out)
    vectorized_step_s: float  # seconds per client step in the vectorized group (nan when it did not run)
    difference: float  # the check: mean |vectorized - sequential| over mean |update|
    choice: str  # "vectorized" or "sequential"
    remembered: bool = False  # taken from an earlier run's probe on this machine (`recall`)
    compute_bound: bool = False  # sequential without trying vectorized: a CPU step of COMPUTE_BOUND_S or more
    channels_last_inputs: bool = False  # the vectorized trainer's image batches channels-last (`faster_layout`)

    @property
    def reason(self) -> str | None:
        """Why clients train one after another, or None when they train vectorized."""
        if self.choice == "vectorized":
            return None
        if self.compute_bound:
            return (
                f"auto: a client step took {_duration(self.sequential_step_s)} one client at a time on the CPU "
                f"(compute-bound: {_duration(COMPUTE_BOUND_S)} or more), where vectorizing gains nothing; not tried "
                "(federation.vectorize: a group size forces it)"
            )
        if not self.difference <= AGREEMENT:
            return (
                f"auto: vectorized training gave other models than sequential training in the check (mean "
                f"difference {self.difference:.1%} of an update)"
            )
        if self.vectorized_clients == 0:
            return "auto: round 1 had one client per group, nothing to train vectorized"
        return (
            f"auto: one client at a time was faster in round 1 ({_duration(self.sequential_step_s)} against "
            f"{_duration(self.vectorized_step_s)} per client step vectorized)"
        )

    def as_dict(self) -> dict:
        """The fields as a dict (for summary.json, the checkpoint and the machine's memory of choices)."""
        return asdict(self)


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{1e3 * seconds:.3g} ms"


def sequential_share(clients: int) -> int:
    """How many of round 1's first group train one after another while the rest train vectorized: a quarter (at least
    2, so that one is timed warm, and at least 1 left to vectorize), all of a group of one."""
    if clients <= 1:
        return clients
    return min(clients - 1, max(2, math.ceil(clients / 4)))


def step_seconds(seconds: list[float], steps: list[int]) -> float:
    """Seconds per client step of clients timed one by one, the first left out when there are others (it pays the
    trainer's first-call costs)."""
    if len(seconds) > 1:
        seconds, steps = seconds[1:], steps[1:]
    return sum(seconds) / max(1, sum(steps))


def agreement(sequential: Tensor, vectorized: Tensor, starts: Tensor) -> float:
    """Mean |vectorized - sequential| as a share of the mean |update| (sequential minus start)."""
    update = (sequential - starts).abs().mean()
    return float((vectorized - sequential).abs().mean() / update.clamp(min=1e-12))


def decide(
    sequential_clients: int,
    vectorized_clients: int,
    sequential_step_s: float,
    vectorized_step_s: float,
    difference: float,
    channels_last_inputs: bool = False,
) -> ProbeResult:
    """Vectorized when the check agreed and its step was at most the sequential one."""
    faster = vectorized_clients > 0 and vectorized_step_s <= sequential_step_s
    choice = "vectorized" if faster and difference <= AGREEMENT else "sequential"
    return ProbeResult(
        sequential_clients,
        vectorized_clients,
        sequential_step_s,
        vectorized_step_s,
        difference,
        choice,
        channels_last_inputs=channels_last_inputs,
    )


def faster_layout(device: torch.device, work: Callable[[bool], T], tries: int = LAYOUT_TRIES) -> tuple[bool, T]:
    """Whether `work` (one vectorized call, run with image batches channels-last or not) was faster channels-last, by
    the best of `tries` timed calls each, the two layouts taking turns (a layout's first call pays its first-call
    costs, so the best of several compares warm calls); with what the last call in the faster layout returned."""
    best = {False: math.inf, True: math.inf}
    outputs: dict[bool, T] = {}
    for _ in range(tries):
        for channels_last in (False, True):
            outputs[channels_last], seconds = timed(device, lambda: work(channels_last))
            best[channels_last] = min(best[channels_last], seconds)
    chosen = best[True] < best[False]
    return chosen, outputs[chosen]


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


def timed(device: torch.device, work: Callable[[], T]) -> tuple[T, float]:
    """(what `work` returned, its wall time), the device synchronized around it."""
    _sync(device)
    began = time.perf_counter()
    out = work()
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
    """A short stable key of what a decision depends on (threads, torch's version and the probe's are added here)."""
    facts = {**facts, "threads": torch.get_num_threads(), "torch": torch.__version__, "probe": PROBE_VERSION}
    return hashlib.sha1(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def machine_cache_dir() -> Path:
    """fedlight's folder of things remembered on this machine: `$FEDLIGHT_CACHE_DIR`, else `~/.cache/fedlight`
    (under `$XDG_CACHE_HOME` when set). The trainer choices live here, and data caches that cannot sit beside
    their data (`fedlight.datamodules.femnist_cache`)."""
    root = (
        os.environ.get("FEDLIGHT_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedlight"
    )
    return Path(root)


def memory_file() -> Path:
    """The file of this machine's remembered trainer choices: trainer_choices.json in `machine_cache_dir()`."""
    return machine_cache_dir() / "trainer_choices.json"


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
