"""Where a GPU run parts from the CPU's: one client's local training and whole FedAvg rounds, sequential and
vectorized, each compared with the same work on the CPU (max absolute parameter difference), next to the
spread that a one-ulp nudge of the start gives on the CPU alone (what float rounding alone can explain).

    python benchmarks/gpu_diagnose.py          # on a machine with a CUDA GPU
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.federations import mlp_federation, nudge_by_one_ulp  # noqa: E402

from fedlight.algorithms.fedavg import FedAvg  # noqa: E402


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for vectorize in (0, 3):  # the sequential and the vectorized trainer
        cpu, nudged, gpu = (
            mlp_federation(FedAvg(), vectorize=vectorize, accelerator=a) for a in ("cpu", "cpu", "cuda")
        )
        nudge_by_one_ulp(nudged.algorithm.models)
        start = cpu.server.model.initial_params
        one_cpu = cpu.server.clients.train(1, 0, start).params
        one_gpu = gpu.server.clients.train(1, 0, start.to(gpu.device)).params.cpu()
        print(f"vectorize={vectorize}: client 0 alone, 1 round: gpu-cpu {float((one_gpu - one_cpu).abs().max()):.2e}")
        for r in (1, 2):
            cpu.run_round(r), nudged.run_round(r), gpu.run_round(r)
            g = float((gpu.algorithm.models.cpu() - cpu.algorithm.models).abs().max())
            n = float((nudged.algorithm.models - cpu.algorithm.models).abs().max())
            print(f"vectorize={vectorize} round {r}: gpu-cpu {g:.2e}  one-ulp nudge on the cpu {n:.2e}")


if __name__ == "__main__":
    main()
