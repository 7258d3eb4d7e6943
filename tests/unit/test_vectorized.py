"""Vectorized client training gives the parameters sequential training gives, with the same seeds."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fedlight import RoundUpdates
from fedlight.plugin.algorithm import Algorithm
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedprox import FedProx
from fedlight.datamodules import DigitsFederated, QuantitySkew
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import MLP, Classifier

from helpers.federations import small_federation


def mlp_federation(
    algorithm,
    vectorize=8,
    optimizer="sgd",
    momentum=0.9,
    lr=0.05,
    num_clients=5,
    partition=None,
    batch_size=32,
    weight_decay=0.0,
):
    """An MLP on digits: no max-pool ties, whose tie-breaking (a valid subgradient either way) can differ
    between the batched and the single-model kernels and would blur an exact comparison."""
    torch.manual_seed(0)
    model = Classifier(MLP(64, [32], 10), optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
    config = FederationConfig(rounds=2, local_epochs=2, batch_size=batch_size, accelerator="cpu", vectorize=vectorize)
    return Federation(DigitsFederated(num_clients=num_clients, partition=partition), model, algorithm, config)


class LastLayerPersonal(Algorithm):
    def setup(self, server):
        super().setup(server)
        self.set_personal_mask(server.model.layer_mask(server.model.layers()[-1:]))


@pytest.mark.parametrize(
    "make_algorithm", [FedAvg, lambda: FedProx(mu=0.5), LastLayerPersonal], ids=["fedavg", "fedprox", "personal"]
)
def test_each_round_matches_sequential_training_from_the_same_server_state(make_algorithm):
    """Both trainers start every round from the same server state (training at lr 0.1 with momentum 0.9
    amplifies float rounding, so runs that drift apart for rounds are not compared)."""
    fed = mlp_federation(make_algorithm())
    alg, clients = fed.algorithm, list(range(5))
    assert fed.execution.vectorized is not None
    for r in (1, 2):
        vectorized = fed.execution.train(r, clients)
        sequential = torch.stack([alg.train_client(r, c, vectorized.starts[c])[0] for c in clients])
        assert torch.allclose(vectorized.params, sequential, atol=1e-6), r
        if r == 2 and alg.personal is not None:
            assert not torch.equal(vectorized.starts[0], vectorized.starts[1])  # clients start apart
        vectorized.params = sequential
        held = RoundUpdates.of(vectorized)
        alg.pre_aggregation(r, held), alg.aggregate(r, held), alg.post_aggregation(r, held)
    assert alg.plan.corrects_gradient == isinstance(alg, FedProx)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_matches(optimizer):
    fed = mlp_federation(FedAvg(), optimizer=optimizer, lr=0.01, weight_decay=0.01, num_clients=4)
    vectorized = fed.execution.train(1, [0, 1, 2, 3])
    sequential = [fed.algorithm.train_client(1, c, vectorized.starts[c]) for c in range(4)]
    # Adam divides by sqrt(v): rounding in near-zero gradients is amplified, hence 1e-5 rather than 1e-6
    assert torch.allclose(vectorized.params, torch.stack([p for p, _ in sequential]), atol=1e-5)
    assert torch.allclose(vectorized.train_loss, torch.stack([loss for _, loss in sequential]), atol=1e-6)


def test_unequal_clients_take_their_own_number_of_steps_in_groups():
    fed = mlp_federation(
        FedAvg(), vectorize=4, num_clients=6, partition=QuantitySkew(alpha=0.5, min_size=20), batch_size=16
    )  # groups of 4 and 2 clients
    sizes = fed.data.train.sizes()
    assert len(set(sizes.tolist())) > 3 and len(set((sizes % 16).tolist())) > 1
    vectorized = fed.execution.train(1, list(range(6)))
    sequential = torch.stack([fed.algorithm.train_client(1, c, vectorized.starts[c])[0] for c in range(6)])
    assert torch.allclose(vectorized.params, sequential, atol=1e-6)


def test_a_cnn_matches_up_to_max_pool_tie_breaking():
    """With max pooling, ties between equal activations may be broken differently by the batched kernel;
    the parameters still agree closely."""
    fed = small_federation(FedAvg(), num_clients=4, momentum=0.9, lr=0.02, vectorize=4)
    vectorized = fed.execution.train(1, [0, 1, 2, 3])
    sequential = torch.stack([fed.algorithm.train_client(1, c, vectorized.starts[c])[0] for c in range(4)])
    assert (vectorized.params - sequential).abs().max() < 1e-3
    assert (vectorized.params - sequential).abs().mean() < 1e-6


@pytest.mark.parametrize(
    "net, optimizer, reason",
    [
        (
            nn.Sequential(
                nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 10)
            ),
            "sgd",
            "cumulative average",
        ),
        (MLP(64, [16], 10), torch.optim.Rprop, "no vectorized form"),
    ],
)
def test_what_cannot_be_vectorized_falls_back_to_sequential_training_and_says_why(net, optimizer, reason):
    torch.manual_seed(0)
    model = Classifier(net)
    if not isinstance(optimizer, str):
        model.configure_optimizers = lambda: optimizer(model.parameters(), lr=0.01)
    config = FederationConfig(rounds=1, accelerator="cpu", vectorize=-1)
    with pytest.warns(UserWarning, match=reason):
        fed = Federation(DigitsFederated(num_clients=3), model, FedAvg(), config)
    assert fed.execution.vectorized is None and reason in fed.execution.plan.reason
    fed.run_round(1)


class ReadsBackLoss(Classifier):
    """A training_step that reads a value back (.item()), which torch.func cannot trace."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.last_loss = loss.item()
        return loss


def test_a_training_step_that_fails_under_vmap_falls_back_and_still_trains():
    torch.manual_seed(0)
    config = FederationConfig(rounds=1, accelerator="cpu", vectorize=-1)
    fed = Federation(DigitsFederated(num_clients=3), ReadsBackLoss(MLP(64, [16], 10)), FedAvg(), config)
    assert fed.execution.vectorized is not None
    with pytest.warns(UserWarning, match="training_step failed under torch.func"):
        fed.run_round(1)
    assert fed.execution.vectorized is None and fed.module.last_loss > 0
    assert not torch.equal(fed.algorithm.models[0], fed.server.model.initial_params)


@pytest.mark.parametrize(
    "kind, settings",
    [
        ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01}),
        ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
        ("SGD", {"lr": 0.1}),
        ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
        ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ],
)
def test_functional_optimizer_matches_torch_optim_on_every_row_and_on_subsets(kind, settings):
    """Rows 0-2 step first (a range), then rows 1-3 (row 3's first step, the others' second), then all, the
    parameters split into two tensors: each row must follow what torch.optim does to a single tensor given the
    same gradients."""
    from fedlight.training.vectorized import FunctionalOptimizer

    g = torch.Generator().manual_seed(0)
    start = torch.randn(4, 5, generator=g)
    schedule = [[0, 1, 2], [1, 2, 3], [0, 1, 2, 3]]
    grads = [torch.randn(len(rows), 5, generator=g) for rows in schedule]
    reference = []
    for row in range(4):
        p = start[row].clone().requires_grad_(True)
        opt = getattr(torch.optim, kind)([p], **settings)
        for rows, grad in zip(schedule, grads):
            if row in rows:
                p.grad = grad[rows.index(row)].clone()
                opt.step()
        reference.append(p.detach())
    functional = FunctionalOptimizer(getattr(torch.optim, kind)([torch.zeros(1, requires_grad=True)], **settings))
    params = start.clone()
    state = functional.init_state(params)
    for rows, grad in zip(schedule, grads):
        rows = range(rows[0], rows[-1] + 1)

        def views(matrix, rows=rows):  # two "parameter tensors": entries 0-1 and 2-4 of every row
            return [matrix[rows.start : rows.stop, :2], matrix[rows.start : rows.stop, 2:]]

        grad = grad.clone()
        functional.step(views(params), [grad[:, :2], grad[:, 2:]], state, views, rows, functional.h["lr"])
    torch.testing.assert_close(params, torch.stack(reference), rtol=1e-5, atol=1e-6)


class ConvolutionLayouts(TorchDispatchMode):
    """Records whether each convolution the dispatcher runs (under vmap: the clients' grouped one) has a
    channels-last weight, and whether each grouped one (more than one client) has a channels-last input (a range of
    one client's 1-channel images is laid out both ways, and PyTorch does not call it channels-last)."""

    def __init__(self) -> None:
        super().__init__()
        self.channels_last: list[bool] = []
        self.inputs_channels_last: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.convolution:
            self.channels_last.append(args[1].is_contiguous(memory_format=torch.channels_last))
            if args[8] > 1:  # groups: more than one client
                self.inputs_channels_last.append(args[0].is_contiguous(memory_format=torch.channels_last))
        return func(*args, **(kwargs or {}))


def test_clients_convolutions_run_channels_last_on_a_cpu_and_train_as_sequentially():
    """The vectorized step hands its grouped convolutions channels-last weights, and with `channels_last_inputs` (the
    probe's choice when faster) channels-last inputs, the first one's (the data's) included (oneDNN's faster path
    on a CPU, a layout only): the trained models are sequential training's to float rounding."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(96, 10))
    model = Classifier(net, lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=1, local_epochs=1, batch_size=16, accelerator="cpu", vectorize=4)
    fed = Federation(DigitsFederated(num_clients=4), model, FedAvg(), config)
    fed.execution.training.vectorized.channels_last_inputs = True
    with ConvolutionLayouts() as layouts:
        vectorized = fed.execution.train(1, [0, 1, 2, 3])
    assert layouts.channels_last and all(layouts.channels_last)
    assert layouts.inputs_channels_last and all(layouts.inputs_channels_last)
    sequential = torch.stack([fed.algorithm.train_client(1, c, vectorized.starts[c])[0] for c in range(4)])
    assert torch.allclose(vectorized.params, sequential, atol=1e-5)
