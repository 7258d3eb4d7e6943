"""Setting a run up: the federation's settings, the Fabric that runs it (devices, precision, processes), the data
module's clients, and the checks that refuse or warn before any round."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import lightning as L
import numpy as np
import torch

from fedlight.data import ClientDataModule, FederatedData

SMALL_EVALUATION = 10  # below this many evaluation samples per client, per-client accuracy is noise


@dataclass
class FederationConfig:
    """How the federation runs.

    Args:
        rounds: communication rounds.
        local_epochs: passes over its training data each selected client makes per round.
        batch_size: local mini-batch size.
        accelerator: "auto", "cpu", "cuda", ... (Lightning Fabric's names).
        precision: Fabric precision; None picks bf16-mixed (or 16-mixed) on a GPU and 32-true on a CPU.
        eval_every: evaluate every client's model every this many rounds (and always after the last).
        eval_split: the per-client split evaluated ("test", "val", or "train" for methods such as data
            clustering that are scored on the data they fit).
        eval_batch_size: rows per forward pass during evaluation and inference.
        vectorize: train this many clients at once through torch.func (0 = one after another; -1 = auto: groups
            of as many as half the free memory holds, on a CPU at most 256, and in the first round both trainers
            are timed on the same batches and the faster is kept, see `fedlight.probe`). Give 0 or a group size
            for runs that must repeat bit for bit on other machines: the two trainers agree only up to float
            rounding. What cannot be vectorized (other optimizers, a gradient scaler) trains sequentially. An
            algorithm that aggregates by running sums (FedAvg, FedProx, FedPer, ...) also receives the updates
            in groups of this size, so memory does not grow with clients x parameters.
        devices: processes per machine ("auto": one per GPU, and one on a CPU, as Fabric counts); each trains
            its share of every round's clients (`fedlight.distributed`). More than one starts the other
            processes itself, unless a launcher (torchrun, `fabric run`, SLURM) already started them.
        num_nodes: machines the processes are spread over (each runs `devices` processes).
        strategy: Fabric's multi-process strategy ("ddp": gloo on CPUs, NCCL on GPUs).
    """

    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 32
    accelerator: str = "auto"
    precision: str | None = None
    eval_every: int = 1
    eval_split: str = "test"
    eval_batch_size: int = 4096
    vectorize: int = -1
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "ddp"

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"federation.{name} must be at least 1, got {getattr(self, name)}")
        if self.vectorize < -1:
            raise ValueError(f"federation.vectorize must be -1 (auto), 0 (off) or a client count, got {self.vectorize}")
        if self.eval_split not in ("test", "val", "train"):
            raise ValueError(f"federation.eval_split must be 'test', 'val' or 'train', got {self.eval_split!r}")
        if not (self.devices == "auto" or isinstance(self.devices, int) and self.devices >= 1) or self.num_nodes < 1:
            raise ValueError(f"federation.devices must be 'auto' or at least 1 and federation.num_nodes at least 1, got "
                             f"{self.devices!r} and {self.num_nodes}")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: the GPU's free memory, or the host's available memory
    (Linux's MemAvailable); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def make_fabric(config: FederationConfig, precision: str) -> L.Fabric:
    """A Fabric for the configured device(s), with its processes started and joined; or a one-line error naming
    the setting when this machine cannot honour it."""
    accelerator = config.accelerator
    if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ValueError(f"federation.accelerator={accelerator}, but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False): use --federation.accelerator cpu, or auto to take a "
                         "GPU where there is one")
    single = config.devices == 1 and config.num_nodes == 1
    try:
        fabric = L.Fabric(accelerator=accelerator, precision=precision, devices=config.devices,
                          num_nodes=config.num_nodes, strategy="auto" if single else config.strategy)
    except (RuntimeError, ValueError) as error:  # Lightning's MisconfigurationException is a RuntimeError
        raise ValueError(f"federation.accelerator={accelerator}, federation.precision={precision}, "
                         f"federation.devices={config.devices}: {str(error).splitlines()[0]}") from None
    if not single and not launched_by_fabric_cli():
        fabric.launch()  # starts the other local processes (unless a launcher did), then joins the process group
    return fabric


def launched_by_fabric_cli() -> bool:
    """Whether `fabric run` started this process: Fabric then joins the process group when it is built, and refuses
    `launch()` (Lightning marks such processes with LT_CLI_USED=1)."""
    return os.environ.get("LT_CLI_USED", "0") == "1"


def default_precision(accelerator: str) -> str:
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"


def batch_transform(on_after_batch_transfer: Callable, fabric: L.Fabric) -> Callable:
    """The data module's on-device conversion followed by the precision's input conversion (bf16-true and
    16-true models take their floating inputs in that dtype)."""
    convert = fabric.strategy.precision.convert_input

    def transform(batch: Any, dataloader_idx: int = 0) -> Any:
        return convert(on_after_batch_transfer(batch, dataloader_idx))

    return transform


def load_clients(data: ClientDataModule, seed: int) -> FederatedData:
    """Prepare and set up a data module for `seed` and return its clients (checked against the contract)."""
    if not isinstance(data, ClientDataModule):
        raise ValueError(f"{type(data).__name__} is not a federated data module: subclass "
                        "fedlight.datamodules.FederatedDataModule (or provide seed, federated, prepare_data, setup "
                        "and on_after_batch_transfer)")
    data.seed = seed
    data.prepare_data()
    data.setup("fit")
    if not isinstance(data.federated, FederatedData):
        raise ValueError(f"{type(data).__name__}.setup() left no FederatedData in `federated`")
    return data.federated


def check_evaluation_split(sizes: np.ndarray, split: str) -> None:
    """Refuse a split with no sample at all; warn when some clients have none (they are left out of the means)
    or when most have so few that their accuracy is noise."""
    fix = (f"give the clients more samples or raise the data module's {split}_fraction" if split != "train" else
           "give the clients more samples")
    if sizes.sum() == 0:
        raise ValueError(f"federation.eval_split={split!r}, but no client has a sample in that split: {fix}, or "
                         "evaluate on eval_split='train'")
    empty = int((sizes == 0).sum())
    if empty:
        warnings.warn(f"{empty} of {len(sizes)} clients have no {split!r} samples: they are left out of the {split} "
                      f"means and their per-client values are empty ({fix})", stacklevel=3)
    if np.median(sizes) < SMALL_EVALUATION:
        warnings.warn(f"most clients have fewer than {SMALL_EVALUATION} {split!r} samples (median "
                      f"{float(np.median(sizes)):g}): their accuracy is noise ({fix})", stacklevel=3)
