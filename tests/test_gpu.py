"""The engine on a CUDA GPU: the same rounds as on the CPU (to float rounding), vectorized groups equal to one
client at a time, bf16 mixed precision that still learns, and per-client state
kept on the GPU within its budget. These run only
where PyTorch sees a GPU (the device checks in benchmarks/RESULTS.md); CI's machine has none."""
import pytest
import torch

from conftest import small_federation
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedavg import FedAvg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_fedavg_rounds_on_the_gpu_give_the_cpus_numbers_to_float_rounding():
    """An MLP (no max-pool ties to break differently) in full float32 (no TF32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu, gpu = mlp_federation_on("cpu", 3, FedAvg()), mlp_federation_on("cuda", 3, FedAvg())
    assert gpu.device.type == "cuda"
    for r in (1, 2):
        a, b = cpu.run_round(r), gpu.run_round(r)
    assert torch.allclose(cpu.algorithm.models, gpu.algorithm.models.cpu(), atol=1e-4)
    assert abs(a.scalars["test/acc_mean"] - b.scalars["test/acc_mean"]) <= 0.02


def test_a_vectorized_group_on_the_gpu_trains_what_each_client_trains_alone():
    torch.backends.cuda.matmul.allow_tf32 = False
    grouped, single = mlp_federation_on("cuda", 3), mlp_federation_on("cuda", 0)
    noise = torch.randn(5, grouped.server.num_params, generator=torch.Generator().manual_seed(3))
    starts, clients = grouped.server.initial_params + 0.05 * noise.cuda(), [0, 1, 2, 3, 4]
    got = grouped.server.train_many(1, clients, starts).params
    expected = torch.stack([single.server.train(1, c, s)[0] for c, s in zip(clients, starts)])
    assert grouped.execution.plan.trainer == "vectorized"
    assert torch.allclose(got.cpu(), expected.cpu(), atol=1e-5)


def mlp_federation_on(accelerator: str, vectorize: int, algorithm=None):
    from fedlight.datamodules import DigitsFederated, QuantitySkew
    from fedlight.engine.federation import Federation, FederationConfig
    from fedlight.models import MLP, Classifier
    from fedlight.plugin.algorithm import Algorithm

    torch.manual_seed(0)
    model = Classifier(MLP(64, [32], 10), lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=2, local_epochs=2, batch_size=16, accelerator=accelerator, vectorize=vectorize,
                              precision="32-true")
    data = DigitsFederated(num_clients=5, partition=QuantitySkew(alpha=0.5, min_size=20))
    return Federation(data, model, algorithm or Algorithm(), config)


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
