"""The engine on a CUDA GPU: the same rounds as on the CPU (to float rounding), vectorized groups equal to one
client at a time, bf16 mixed precision that still learns, and per-client state kept on the GPU within its budget.
These run only where PyTorch sees a GPU (the device checks in docs/results.md, "On a GPU"); CI's machine has none."""

import pytest
import torch

from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedavg import FedAvg

from helpers.federations import mlp_federation, noisy_starts, nudge_by_one_ulp, small_federation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_fedavg_rounds_on_the_gpu_give_the_cpus_numbers_to_float_rounding():
    """An MLP (no max-pool ties to break differently) in full float32 (no TF32). One round agrees to 1e-5; after
    the second, the GPU may be no further from the CPU than the CPU is from itself when its start is nudged by one
    ulp. Some CPUs amplify rounding to 1e-3 in two rounds of momentum SGD (see gpu_diagnose.py); a real divergence,
    such as other batches, shows as 1e-2 and more."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu, nudged = mlp_federation(FedAvg(), vectorize=3), mlp_federation(FedAvg(), vectorize=3)
    gpu = mlp_federation(FedAvg(), vectorize=3, accelerator="cuda")
    assert gpu.device.type == "cuda"
    nudge_by_one_ulp(nudged.algorithm.models)

    def gap(fed) -> float:
        return float((fed.algorithm.models.cpu() - cpu.algorithm.models).abs().max())

    a, _, b = cpu.run_round(1), nudged.run_round(1), gpu.run_round(1)
    assert gap(gpu) <= 1e-5
    a, _, b = cpu.run_round(2), nudged.run_round(2), gpu.run_round(2)
    assert gap(gpu) <= max(1e-5, 4 * gap(nudged))
    assert abs(a.scalars["test/acc_mean"] - b.scalars["test/acc_mean"]) <= 0.02


def test_a_vectorized_group_on_the_gpu_trains_what_each_client_trains_alone():
    torch.backends.cuda.matmul.allow_tf32 = False
    grouped, single = mlp_federation(vectorize=3, accelerator="cuda"), mlp_federation(vectorize=0, accelerator="cuda")
    starts, clients = noisy_starts(grouped, 5), [0, 1, 2, 3, 4]
    got = grouped.server.clients.train_many(1, clients, starts).params
    expected = torch.stack([single.server.clients.train(1, c, s).params for c, s in zip(clients, starts)])
    assert grouped.execution.plan.trainer == "vectorized"
    assert torch.allclose(got.cpu(), expected.cpu(), atol=1e-5)


def test_bf16_mixed_precision_learns_and_keeps_float32_models():
    fp32 = small_federation(FedAvg(), rounds=3, vectorize=6, accelerator="cuda", lr=0.3, precision="32-true")
    bf16 = small_federation(FedAvg(), rounds=3, vectorize=6, accelerator="cuda", lr=0.3, precision="bf16-mixed")
    for r in (1, 2, 3):
        a, b = fp32.run_round(r), bf16.run_round(r)
    assert bf16.algorithm.models.dtype == torch.float32
    assert b.scalars["test/acc_mean"] > 0.3  # chance is 0.1
    assert abs(a.scalars["test/acc_mean"] - b.scalars["test/acc_mean"]) < 0.1


def test_per_client_state_lives_on_the_gpu_within_its_budget_and_rounds_do_not_grow_memory():
    fed = small_federation(Ditto(), num_clients=6, rounds=2, vectorize=6, accelerator="cuda")
    fed.run_round(1)
    torch.cuda.synchronize()
    after_one = torch.cuda.memory_allocated()
    fed.run_round(2)
    torch.cuda.synchronize()
    stores = list(fed.client_states.stores.values())
    assert stores and all(s.read([0]).device.type == "cuda" for s in stores)
    assert sum(s.memory_bytes for s in stores) <= fed.client_states.budget.limit
    assert torch.cuda.memory_allocated() <= after_one + (1 << 20)
