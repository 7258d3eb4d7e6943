"""The devices a run uses: the Fabric that runs it (accelerator, precision, processes), the precision's default and
input conversion, and the memory free for new tensors."""

from __future__ import annotations

import os
from typing import Any, Callable

import lightning as L
import torch

from fedlight.engine.config import FederationConfig


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


CLIENT_STATE_SHARE = 0.25  # of the available memory kept for client state when `client_state_memory` is None
UNKNOWN_MEMORY_BUDGET = 1 << 30  # bytes of client state in memory where the available memory cannot be read


def client_state_budget(gigabytes: float | None, device: torch.device) -> int:
    """Bytes of per-client state kept in memory (`fedlight.plugin.client_state`): `federation.client_state_memory`,
    or a quarter of `device`'s available memory."""
    if gigabytes is not None:
        return int(gigabytes * 1e9)
    free = available_memory(device)
    return UNKNOWN_MEMORY_BUDGET if free is None else int(CLIENT_STATE_SHARE * free)


def make_fabric(config: FederationConfig, precision: str) -> L.Fabric:
    """A Fabric for the configured device(s), with its processes started and joined; or a one-line error naming
    the setting when this machine cannot honour it."""
    accelerator = config.accelerator
    if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ValueError(
            f"federation.accelerator={accelerator}, but this machine has no usable CUDA GPU "
            "(torch.cuda.is_available() is False): use --federation.accelerator cpu, or auto to take a "
            "GPU where there is one"
        )
    single = config.devices == 1 and config.num_nodes == 1
    try:
        # the configured string as given: Fabric refuses one it does not know (the one-line error below)
        fabric = L.Fabric(
            accelerator=accelerator,
            precision=precision,  # type: ignore[arg-type]
            devices=config.devices,
            num_nodes=config.num_nodes,
            strategy="auto" if single else config.strategy,
        )
    except (RuntimeError, ValueError) as error:  # Lightning's MisconfigurationException is a RuntimeError
        raise ValueError(
            f"federation.accelerator={accelerator}, federation.precision={precision}, "
            f"federation.devices={config.devices}: {str(error).splitlines()[0]}"
        ) from None
    if not single and not launched_by_fabric_cli():
        launch(fabric)  # starts the other local processes (unless a launcher did), then joins the process group
    return fabric


def launch(fabric: L.Fabric) -> None:
    """`fabric.launch()`, leaving `OMP_NUM_THREADS` as the user left it: Lightning sets it when it is unset (the cores
    over the processes), which would read as the user's choice where fedlight sizes the threads and says why
    (`fedlight.engine.threads`); the number it would set is the one fedlight takes itself."""
    user_set = "OMP_NUM_THREADS" in os.environ
    fabric.launch()
    if not user_set:
        os.environ.pop("OMP_NUM_THREADS", None)


def launched_by_fabric_cli() -> bool:
    """Whether `fabric run` started this process: Fabric then joins the process group when it is built, and refuses
    `launch()` (Lightning marks such processes with LT_CLI_USED=1)."""
    return os.environ.get("LT_CLI_USED", "0") == "1"


def default_precision(accelerator: str) -> str:
    """The precision when `federation.precision` is not set: "32-true" on a CPU, else "bf16-mixed" where the GPU
    supports bf16 and "16-mixed" where it does not."""
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
