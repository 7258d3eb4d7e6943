"""Max-pooling vmapped clients as one pooling over their channels: the outputs, indices and gradients each client's
own max-pooling gives (computed client by client, without vmap), and the pooling really runs on the merged view."""

import pytest
import torch
from torch import nn
from torch.func import grad, vmap
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import MLP, Classifier
from fedlight.training.client_pooling import clients_in_channels


class PoolingShapes(TorchDispatchMode):
    """The input shapes of every max-pooling kernel (forward and backward) run within."""

    def __init__(self) -> None:
        super().__init__()
        self.forward: list[tuple[int, ...]] = []
        self.backward: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.max_pool2d_with_indices:
            self.forward.append(tuple(args[0].shape))
        if func.overloadpacket is torch.ops.aten.max_pool2d_with_indices_backward:
            self.backward.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


def clients_images(clients=3, batch=2, channels=4, side=7, ties=True, seed=0) -> torch.Tensor:
    """(clients, batch, channels, side, side) images; with `ties`, small integers, so that windows hold equal
    maxima and the tie-breaking must match too."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(-2, 3, (clients, batch, channels, side, side), generator=g).float()
    return torch.randn(clients, batch, channels, side, side, generator=g)


SETTINGS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=1, dilation=(2, 1)),
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("ties", [True, False])
def test_pooled_values_and_indices_are_each_clients_own(settings, ties):
    x = clients_images(ties=ties)
    expected = [F.max_pool2d(x[c], return_indices=True, **settings) for c in range(len(x))]
    with clients_in_channels() as in_place:
        out, indices = vmap(lambda t: F.max_pool2d(t, return_indices=True, **settings))(x)
    assert in_place
    assert torch.equal(out, torch.stack([o for o, _ in expected]))
    assert torch.equal(indices, torch.stack([i for _, i in expected]))


@pytest.mark.parametrize("settings", SETTINGS)
def test_gradients_are_each_clients_own_with_ties(settings):
    """d/dx of sum(w * maxpool(x)), each client alone by autograd against vmap(grad(...)) under the rule; with ties
    both must route a window's gradient to the same position (the kernel's first maximum)."""
    x = clients_images()
    w = torch.randn(F.max_pool2d(x[0], **settings).shape, generator=torch.Generator().manual_seed(1))

    def objective(t: torch.Tensor) -> torch.Tensor:
        return (w * F.max_pool2d(t, **settings)).sum()

    expected = []
    for c in range(len(x)):
        leaf = x[c].clone().requires_grad_()
        objective(leaf).backward()
        expected.append(leaf.grad)
    with clients_in_channels():
        got = vmap(grad(objective))(x)
    assert torch.equal(got, torch.stack(expected))


def test_a_per_sample_input_and_another_client_dimension_are_pooled_right():
    """Per-client (channels, h, w) inputs (no batch dimension), vmapped over a dimension other than the first."""
    x = clients_images(clients=3, batch=4).movedim(0, 2)  # (batch, channels, clients, h, w), vmapped over 2
    expected = torch.stack([F.max_pool2d(x[:, :, c], 2) for c in range(3)], dim=2)
    with clients_in_channels():
        got = vmap(vmap(lambda t: F.max_pool2d(t, 2), in_dims=1, out_dims=1), in_dims=2, out_dims=2)(x)
    assert torch.equal(got, expected)


def test_the_backward_takes_unbatched_inputs_and_indices():
    """The gradient's batching rule with only the incoming gradient batched (the input and indices shared)."""
    x = clients_images(clients=1)[0]
    _, indices = F.max_pool2d(x, 2, return_indices=True)
    grads = torch.randn(5, *indices.shape, generator=torch.Generator().manual_seed(2))

    def backward(g: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices)

    expected = torch.stack([backward(g) for g in grads])
    with clients_in_channels():
        assert torch.equal(vmap(backward)(grads), expected)


def test_clients_are_pooled_in_their_channels_only_within():
    """Within, the kernels see (batch, clients x channels, h, w) forward and backward; after, vmap's own rule
    (clients x batch, channels, h, w) is back."""
    x = clients_images(clients=3, batch=2, channels=4, ties=False)

    def objective(t: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(t, 2).square().sum()

    with clients_in_channels(), PoolingShapes() as within:
        vmap(grad(objective))(x)
    with PoolingShapes() as after:
        vmap(grad(objective))(x)
    assert within.forward == [(2, 12, 7, 7)] and within.backward == [(2, 12, 7, 7)]
    assert after.forward == [(6, 4, 7, 7)] and after.backward == [(6, 4, 7, 7)]


def pooling_federation(vectorize: int, network: nn.Module | None = None) -> Federation:
    torch.manual_seed(0)
    net = network or nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(36, 10)
    )  # digits' 8x8 -> 6x6 -> 3x3
    config = FederationConfig(rounds=1, local_epochs=1, batch_size=16, accelerator="cpu", vectorize=vectorize)
    return Federation(DigitsFederated(num_clients=4), Classifier(net, lr=0.05, momentum=0.9), FedAvg(), config)


def test_the_vectorized_trainer_pools_clients_in_channels_and_trains_as_sequentially():
    """A forced group on a CPU takes the channels-last layout (the default where a convolution makes the layout
    matter): its pooling runs on the merged view, and the models are sequential training's to float rounding."""
    fed = pooling_federation(vectorize=4)
    assert fed.execution.training.vectorized.channels_last_inputs
    with PoolingShapes() as shapes:
        vectorized = fed.execution.train(1, [0, 1, 2, 3])
    # (batch of at most 16, rows x 4 channels): steps of all 4 clients, and the short last batches' ranges of rows
    assert (16, 4 * 4, 6, 6) in shapes.forward and (16, 4 * 4, 6, 6) in shapes.backward
    assert all(shape[0] <= 16 and shape[1] % 4 == 0 for shape in shapes.forward + shapes.backward)
    sequential = torch.stack([fed.algorithm.train_client(1, c, vectorized.starts[c])[0] for c in range(4)])
    assert torch.allclose(vectorized.params, sequential, atol=1e-5)


def test_without_a_convolution_the_layout_stays_as_given():
    fed = pooling_federation(vectorize=4, network=MLP(64, [16], 10))
    assert not fed.execution.training.vectorized.channels_last_inputs
