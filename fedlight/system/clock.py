"""The virtual clock: what each client's round costs on its device, and the time a run has spent.

A client's round is its local work and two transfers of the model (FedScale's completion time):
compute = local steps x batch size / training samples per second (each step counted as a full batch, as FedScale
counts it), transfer = model bits sent down and the same sent up / link bits per second. Synchronous rounds add the
slowest kept client's time to the clock (`fedlight.system.stragglers`); the asynchronous server
(`fedlight.system.buffered`) reads each client's arrival off the same `DeviceProfiles` and `VirtualClock`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlight.system.config import SystemConfig
from fedlight.system.speeds import draw_speeds
from fedlight.system.traces import device_speeds


@dataclass(frozen=True)
class DeviceProfiles:
    """Every client's device: `samples_per_s` (training samples a second, forward and backward) and `link_mbps`
    (Mbit/s, both ways), (clients,) each."""

    samples_per_s: np.ndarray
    link_mbps: np.ndarray

    @classmethod
    def of(cls, config: SystemConfig, count: int, seed: int) -> "DeviceProfiles":
        """The devices `config` describes: read from `device_trace`, or drawn from `compute` and `link`."""
        if config.device_trace:
            return cls(*device_speeds(config.device_trace, count))
        return cls(draw_speeds(config.compute, count, seed, "compute"), draw_speeds(config.link, count, seed, "link"))

    def compute_s(self, steps: np.ndarray, batch_size: int) -> np.ndarray:
        """(clients,) seconds each client's `steps` local steps of `batch_size` samples take."""
        return np.asarray(steps, dtype=float) * batch_size / self.samples_per_s

    def transfer_s(self, model_bits: float) -> np.ndarray:
        """(clients,) seconds each client takes to receive the model and send its update, `model_bits` each way."""
        return 2.0 * model_bits / (self.link_mbps * 1e6)


class VirtualClock:
    """The virtual seconds a run has spent, part of its checkpoint."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def advance(self, seconds: float) -> None:
        """Move the clock on by `seconds`."""
        self.now_s += seconds

    def state_dict(self) -> dict[str, float]:
        """The clock's time, `now_s`."""
        return {"now_s": self.now_s}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Set the clock to the `now_s` of `state_dict`."""
        self.now_s = float(state["now_s"])
