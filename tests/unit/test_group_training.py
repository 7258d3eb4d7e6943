"""Group training (`ServerContext.clients.train_many`, `group_batches`, `group_loss_and_grad`) against independent
computations: each client trained alone by the sequential trainer, each client's batches drawn alone, and the
personalized methods' group work vectorized against the same work one client at a time."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch import nn

from fedlight.algorithms.apfl import APFL
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedala import FedALA
from fedlight.algorithms.fedem import FedEM
from fedlight.algorithms.fedfomo import FedFomo
from fedlight.algorithms.fedrep import FedRep
from fedlight.algorithms.perfedavg import PerFedAvg
from fedlight.algorithms.pfedme import PFedMe
from fedlight.datamodules import DigitsFederated
from fedlight.plugin.algorithm import Algorithm
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.models import MLP, Classifier

from helpers.federations import mlp_federation, noisy_starts


def alone(fed: Federation, round: int, clients: list[int], starts: torch.Tensor, **options) -> torch.Tensor:
    """Each client trained by the sequential trainer alone, with `server.clients.train`'s options."""
    return torch.stack([fed.server.clients.train(round, c, s, **options).params for c, s in zip(clients, starts)])


def test_clients_are_unequal_so_groups_have_short_and_missing_batches():
    sizes = mlp_federation().data.train.sizes()
    assert len(set(sizes.tolist())) > 3 and len(set((sizes % 16).tolist())) > 1


def test_train_many_one_client_after_another_is_train_for_each_client_bit_for_bit():
    fed = mlp_federation(vectorize=0)
    starts, clients = noisy_starts(fed, 4), [3, 0, 4, 1]
    weights = [
        torch.rand(int(fed.server.clients.train_sizes[c]), generator=torch.Generator().manual_seed(c)) for c in clients
    ]
    got = fed.server.clients.train_many(
        2, clients, starts, epochs=1, lr_scale=0.5, sample_weights=weights, purpose="other"
    ).params
    expected = torch.stack(
        [
            fed.server.clients.train(2, c, s, epochs=1, lr_scale=0.5, purpose="other", sample_weights=w).params
            for c, s, w in zip(clients, starts, weights)
        ]
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize("weighted", [False, True])
def test_train_many_vectorized_matches_each_client_alone(weighted):
    fed = mlp_federation(vectorize=3)  # groups of 3 and 2
    starts, clients = noisy_starts(fed, 5), [0, 1, 2, 3, 4]
    weights = (
        [
            torch.rand(int(fed.server.clients.train_sizes[c]), generator=torch.Generator().manual_seed(c))
            for c in clients
        ]
        if weighted
        else None
    )
    got = fed.server.clients.train_many(1, clients, starts, sample_weights=weights)
    expected = torch.stack(
        [
            fed.server.clients.train(1, c, s, sample_weights=None if weights is None else weights[i]).params
            for i, (c, s) in enumerate(zip(clients, starts))
        ]
    )
    assert fed.execution.plan.trainer == "vectorized"
    assert torch.allclose(got.params, expected, atol=1e-6)


@pytest.mark.parametrize("buffers", [False, True], ids=["parameters only", "with BatchNorm's buffers"])
def test_a_group_hook_sees_each_clients_rows_and_positions(buffers):
    """A proximal pull towards a per-client anchor, written once for the group, equals the per-client hook; the
    vectorized trainer hands the hook its parameter rows directly, or full-length rows when the flat rows hold
    buffers too."""
    bn = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    fed = mlp_federation(vectorize=2, batch_size=20, network=bn if buffers else None)
    starts, anchors, clients = noisy_starts(fed, 4), noisy_starts(fed, 4).flip(0), [4, 2, 1, 0]
    seen = set()

    def group_hook(rows, params, grad, begin):
        seen.update(rows)
        grad.add_(params - anchors[rows], alpha=0.3)

    got = fed.server.clients.train_many(1, clients, starts, gradient_hook=group_hook).params
    expected = torch.stack(
        [
            fed.server.clients.train(1, c, s, gradient_hook=lambda p, g, b, a=a: g.add_(p - a, alpha=0.3)).params
            for c, s, a in zip(clients, starts, anchors)
        ]
    )
    assert seen == {0, 1, 2, 3}
    assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("vectorize", [0, 3])
def test_trainable_entries_train_and_the_rest_keep_their_start_exactly(vectorize):
    """The frozen entries hold still throughout, under weight decay too: the trained head is that of plain SGD whose
    gradient on the body cancels SGD's weight-decay term (-wd * p there, so the body's step is zero)."""
    wd = 0.01
    fed = mlp_federation(vectorize=vectorize, weight_decay=wd)
    last = fed.server.model.layer_mask(fed.server.model.layers()[-1:])
    starts = noisy_starts(fed, 5)
    got = fed.server.clients.train_many(1, list(range(5)), starts, trainable=last).params
    assert torch.equal(got[:, ~last], starts[:, ~last]) and not torch.equal(got[:, last], starts[:, last])
    still = alone(fed, 1, list(range(5)), starts, gradient_hook=lambda p, g, b: g.copy_(torch.where(last, g, -wd * p)))
    assert torch.allclose(still[:, ~last], starts[:, ~last], atol=1e-7)  # the reference's body did hold still
    assert torch.allclose(got[:, last], still[:, last], atol=1e-6)


class MatrixProducts(TorchDispatchMode):
    """Counts the matrix products the dispatcher runs (forward and backward, under vmap too)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("vectorize", [0, 3])
def test_a_frozen_body_costs_no_backward_pass(vectorize):
    """Training only the last layer skips the body's backward: of the MLP's 5 products a step (2 forward; backward:
    the head's weight and input gradients, the body's weight gradient), 3 remain (the head's input gradient is
    needed by nothing). A hook zeroing the body's gradient instead runs all 5. The models are the same."""
    fed = mlp_federation(vectorize=vectorize)
    last = fed.server.model.layer_mask(fed.server.model.layers()[-1:])
    starts, clients = noisy_starts(fed, 3), [0, 1, 2]
    fed.server.clients.train_many(1, clients, starts, trainable=last)  # the vectorized trainer's first call: warm-up
    with MatrixProducts() as frozen:
        got = fed.server.clients.train_many(1, clients, starts, trainable=last).params
    with MatrixProducts() as masked:
        expected = fed.server.clients.train_many(
            1, clients, starts, gradient_hook=lambda rows, p, g, s: g.masked_fill_(~last, 0)
        ).params
    assert frozen.count * 5 == masked.count * 3
    assert torch.equal(got[:, last], expected[:, last])


def test_group_batches_give_each_client_its_own_batches_in_order():
    """Every client's rows of the group steps, in order, are the batches `server.clients.batches` gives it alone; every
    step stacks batches of one size."""
    fed = mlp_federation()
    clients = [4, 1, 0, 3]
    mine = {row: [] for row in range(len(clients))}
    for step in fed.server.clients.group_batches(1, clients, purpose="meta"):
        x, y = step.batch
        assert x.shape[:2] == y.shape and len(step.rows) == len(x)
        for i, row in enumerate(step.rows):
            mine[row].append((step.epoch, step.step, x[i], y[i]))
    for row, client in enumerate(clients):
        expected = list(fed.server.clients.batches(1, client, purpose="meta"))
        assert len(mine[row]) == len(expected) == fed.server.clients.local_steps(client)
        for (epoch, step, x, y), (e, s, (ex, ey)) in zip(mine[row], expected):
            assert (epoch, step) == (e, s) and torch.equal(x, ex) and torch.equal(y, ey)


def test_group_loss_and_grad_is_each_models_loss_and_grad():
    fed = mlp_federation(vectorize=4)
    params = noisy_starts(fed, 3)
    step = next(iter(fed.server.clients.group_batches(1, [0, 1, 2])))
    losses, grads = fed.server.model.group_loss_and_grad(params, step.batch, step.step)
    x, y = step.batch
    for i in range(3):
        loss, grad = fed.server.model.loss_and_grad(params[i], (x[i], y[i]), step.step)
        assert torch.allclose(losses[i], loss, atol=1e-6) and torch.allclose(grads[i], grad, atol=1e-6)


METHODS = {
    "ditto": lambda: Ditto(lam=0.5),
    "fedrep": lambda: FedRep(head_epochs=2),
    "fedem": lambda: FedEM(num_components=2),
    "apfl": lambda: APFL(alpha=0.3),
    "pfedme": lambda: PFedMe(lam=5.0, K=2, personal_lr=0.05),
    "perfedavg": lambda: PerFedAvg(alpha=0.01, beta=0.01, variant="fo"),
    "perfedavg_hf": lambda: PerFedAvg(alpha=0.01, beta=0.01, variant="hf", delta=0.05),
    "fedfomo": lambda: FedFomo(M=2),
    "fedala": lambda: FedALA(rand_percent=25, num_pre_loss=1, threshold=1e9),
}  # first W learning: 2 passes
#: HF's Hessian-vector product is a difference of two gradients divided by 2 delta: it multiplies the gradients'
#: float rounding, which differs between the batched and the single-model kernels and between thread counts, by
#: 1 / (2 delta) (250 at the default delta, up to 9e-4 apart in two rounds here), so the test takes delta = 0.05
TOLERANCE = {"perfedavg_hf": 1e-4}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_methods_group_work_vectorized_matches_one_client_at_a_time(name):
    """Two rounds: each method's round, vectorized, gives the models and the state each client sends of the same
    work run for one client at a time (`vectorize: 0`), to float rounding; the plan says vectorized."""
    vectorized, sequential = mlp_federation(METHODS[name](), vectorize=5), mlp_federation(METHODS[name](), vectorize=0)
    assert vectorized.execution.plan.trainer == "vectorized" and sequential.execution.plan.trainer == "sequential"
    atol = TOLERANCE.get(name, 1e-5)
    for round in (1, 2):
        got, expected = (fed.execution.train(round, list(range(5))) for fed in (vectorized, sequential))
        assert torch.allclose(got.params, expected.params, atol=atol), round
        assert torch.allclose(got.train_loss, expected.train_loss, atol=1e-5), round
        assert got.state.keys() == expected.state.keys()
        for key in got.state:
            assert torch.allclose(got.state[key], expected.state[key], atol=atol), (round, key)
        for fed in (vectorized, sequential):
            fed.run_round(round)  # the same server state for the next round (up to rounding)
        assert torch.allclose(vectorized.algorithm.models, sequential.algorithm.models, atol=1e-4)


def test_a_group_loop_that_cannot_run_vectorized_falls_back_to_one_model_at_a_time():
    class ReadsBack(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = MLP(64, [32], 10)

        def forward(self, x):
            float(x.sum())  # .item()-like read: fails under torch.func
            return self.inner(x)

    torch.manual_seed(0)
    model = Classifier(ReadsBack(), lr=0.05)
    config = FederationConfig(rounds=1, batch_size=16, accelerator="cpu", vectorize=3)
    fed = Federation(DigitsFederated(num_clients=3), model, APFL(), config)
    with pytest.warns(UserWarning, match="vectorized training is off"):
        fed.run_round(1)
    assert fed.execution.plan.trainer == "sequential" and "torch.func" in fed.execution.plan.reason


@pytest.mark.parametrize("vectorize", [0, 4])
def test_newcomers_train_as_a_group_what_each_trains_alone(vectorize):
    torch.manual_seed(0)
    model = Classifier(MLP(64, [32], 10), lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=1, batch_size=16, accelerator="cpu", vectorize=vectorize)
    fed = Federation(DigitsFederated(num_clients=8, holdout_clients=3), model, Algorithm(), config)
    newcomers = fed.extension(NewcomerEvaluation).clients
    newcomers.round = 2
    starts = noisy_starts(fed, 3)
    group = newcomers.train_many([2, 0, 1], starts, epochs=2, purpose="finetune")
    each = torch.stack([newcomers.train(j, s, 2, "finetune") for j, s in zip([2, 0, 1], starts)])
    if vectorize:
        assert torch.allclose(group, each, atol=1e-6) and not torch.equal(group, starts)
    else:
        assert torch.equal(group, each)


class Copies(TorchDispatchMode):
    """Counts the copies of `size` entries or more the dispatcher runs (clones and in-place copies)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.count = size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.copy_, torch.ops.aten.clone) and args[0].numel() >= self.size:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_one_client_after_another_writes_each_model_once_into_the_rounds_rows():
    """The base class's `train_group`, one client at a time: each trained model is the client's training alone, and
    it costs two full-length copies a client (its start loaded into the module, its trained model written into the
    round's rows), not three (a copy of its own first, then into the rows); and one for the round: the shared
    starting model, copied once (`stacked_starts`)."""
    fed = mlp_federation(vectorize=0)
    clients = [4, 1, 3]
    starts = torch.stack([fed.algorithm.client_model(c) for c in clients])
    with Copies(fed.flat.numel) as copies:
        got = fed.execution.train(1, clients).params
    assert torch.equal(got, alone(fed, 1, clients, starts))
    assert copies.count == 2 * len(clients) + 1


class TrainsTwice(Algorithm):
    """A `train_group` of two training calls: one call's models kept (a stand-in for per-client state), the other's
    sent; `keep_first` says which is kept."""

    kept: list[torch.Tensor] = []
    keep_first = True

    def train_group(self, round, clients, starts):
        first = self.server.clients.train_many(round, clients, starts, purpose="first")
        second = self.server.clients.train_many(round, clients, starts, purpose="second")
        self.kept.append(first.params if self.keep_first else second.params)
        return second if self.keep_first else first


@pytest.mark.parametrize("keep_first", [True, False])
def test_an_override_training_twice_keeps_both_models_one_client_after_another(keep_first):
    """A client's first training call writes into the round's rows; when the algorithm keeps that model and sends
    another, the kept one is not overwritten by the sent one."""
    fed = mlp_federation(TrainsTwice(), vectorize=0)
    clients = [2, 0, 3]
    starts = torch.stack([fed.algorithm.client_model(c) for c in clients])
    TrainsTwice.kept, TrainsTwice.keep_first = [], keep_first
    sent = fed.execution.train(1, clients).params.clone()
    first, second = (alone(fed, 1, clients, starts, purpose=p) for p in ("first", "second"))
    assert torch.equal(sent, second if keep_first else first)
    assert torch.equal(torch.cat(TrainsTwice.kept), first if keep_first else second)
    assert not torch.equal(first, second)
