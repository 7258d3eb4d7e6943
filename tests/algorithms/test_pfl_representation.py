"""Ditto, FedRep and FedBABU against independent computations: Local and FedAvg runs, a gradient step worked by
hand, plain PyTorch loops whose optimizer holds only the trained tensors, hand-weighted means, and exact resumes."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fedlight import Federation, FederationConfig, RoundUpdates
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedbabu import FedBABU
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.fedrep import FedRep
from fedlight.algorithms.lgfedavg import LGFedAvg
from fedlight.algorithms.local import Local
from fedlight.datamodules import ClassesPerClient, DigitsFederated
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.models import Classifier, SmallCNN

from helpers.federations import every_row


def federation(
    algorithm, num_clients: int = 5, momentum: float = 0.0, weight_decay: float = 0.0, rounds: int = 3, **config
) -> Federation:
    """A small label-skewed digits federation (two classes per client) whose optimizer may carry momentum and
    weight decay; clients train one after another unless `vectorize` is given."""
    torch.manual_seed(0)
    model = Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    data = DigitsFederated(num_clients=num_clients, partition=ClassesPerClient(2))
    settings = {"rounds": rounds, "local_epochs": 1, "batch_size": 32, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(data, model, algorithm, FederationConfig(**settings), seed=0)


def plain_phases(fed: Federation, round: int, client: int, start: torch.Tensor, phases, momentum: float, batches=None):
    """A plain PyTorch loop: for each (mask of trained entries, epochs, batch stream) a fresh torch.optim.SGD over
    the trained tensors only (the others are simply not in the optimizer), on the batches `server.clients.batches` gives
    (or `batches(client, epochs, purpose)`: a newcomer's)."""
    batches = batches or (lambda c, epochs, purpose: fed.server.clients.batches(round, c, epochs, purpose))
    entries = fed.flat.entries
    tensors = {e.name: start[e.start : e.stop].view(e.shape).clone().requires_grad_() for e in entries}
    for part, epochs, purpose in phases:
        trained = [tensors[e.name] for e in entries if e.is_parameter and bool(part[e.start])]
        optimizer = torch.optim.SGD(trained, lr=fed.server.clients.learning_rate(round), momentum=momentum)
        for _, _, (x, y) in batches(client, epochs, purpose):
            optimizer.zero_grad()
            F.cross_entropy(torch.func.functional_call(fed.module, tensors, (x,)), y).backward()
            optimizer.step()
    return torch.cat([tensors[e.name].detach().reshape(-1) for e in entries])


def assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


# ----------------------------------------------------------------------------- Ditto


def test_ditto_with_lam_zero_personal_models_are_local_training_and_the_global_model_is_fedavg():
    ditto, local, fedavg = (federation(alg) for alg in (Ditto(lam=0.0), Local(), FedAvg()))
    for r in (1, 2):
        for fed in (ditto, local, fedavg):
            fed.run_round(r)
    assert torch.equal(every_row(ditto.algorithm.personal_models), every_row(local.algorithm.local_models))
    assert torch.equal(ditto.algorithm.models, fedavg.algorithm.models)
    models, groups = ditto.algorithm.evaluation_models()
    assert torch.equal(torch.stack(list(models)), every_row(local.algorithm.local_models))
    assert torch.equal(groups, torch.arange(5))


def test_ditto_personal_step_adds_the_proximal_gradient_worked_by_hand():
    lam = 0.5
    fed = federation(Ditto(lam=lam), batch_size=10_000)  # one batch: one SGD step per epoch
    alg, server = fed.algorithm, fed.server
    noise = torch.Generator().manual_seed(1)
    w = server.model.initial_params + 0.05 * torch.randn(server.model.num_params, generator=noise)
    v = server.model.initial_params + 0.05 * torch.randn(server.model.num_params, generator=noise)
    alg.personal_models.write([1], v[None])
    out = alg.train_group(1, [1], w[None])
    trained, state = out.params[0], {"personal": out.state["personal"][0]}
    [(_, _, batch)] = list(server.clients.batches(1, 1, 1))
    lr = server.clients.learning_rate(1)
    grad_v, grad_w = server.model.loss_and_grad(v, batch)[1], server.model.loss_and_grad(w, batch)[1]
    expected = v - lr * (grad_v + lam * (v - w))
    assert torch.allclose(state["personal"], expected, atol=1e-6)
    assert torch.allclose(trained, w - lr * grad_w, atol=1e-6)  # the global update is FedAvg's
    assert (state["personal"] - w).norm() < (v - lr * grad_v - w).norm()  # pulled towards w


def test_ditto_keeps_unselected_clients_personal_models_and_evaluates_with_them():
    fed = federation(Ditto(participation=0.5))
    alg = fed.algorithm
    selected = alg.select_clients(1)
    result = fed.run_round(1)
    for k in range(5):
        moved = not torch.equal(alg.personal_models[k], fed.server.model.initial_params)
        assert moved == (k in selected)
    accuracy = []
    for k in range(5):
        x, y = fed.data.test.client(k)
        accuracy.append((fed.server.model.predict(alg.personal_models[k], x).argmax(1) == y).double().mean())
    assert result.scalars["test/acc_mean"] == pytest.approx(float(torch.stack(accuracy).mean()))


def test_ditto_refuses_bad_input():
    with pytest.raises(ValueError, match="lam"):
        Ditto(lam=-0.1)
    with pytest.raises(ValueError, match="personal_epochs"):
        Ditto(personal_epochs=0)


# ----------------------------------------------------------------------------- FedRep


def test_fedrep_phases_leave_the_frozen_part_bit_for_bit_under_momentum_and_weight_decay():
    fed = federation(FedRep(head_epochs=2), momentum=0.9, weight_decay=0.01)
    alg = fed.algorithm
    head, start = alg.head, alg.client_model(0)
    tuned = fed.server.clients.train_many(1, [0], start[None], 2, trainable=head, purpose="head").params[0]
    assert torch.equal(tuned[~head], start[~head]) and not torch.equal(tuned[head], start[head])
    trained = fed.server.clients.train_many(1, [0], tuned[None], 1, trainable=~head).params[0]
    assert torch.equal(trained[head], tuned[head]) and not torch.equal(trained[~head], tuned[~head])
    assert torch.equal(alg.train_group(1, [0], start[None]).params[0], trained)  # train_group is the two phases


def test_fedrep_client_update_is_a_plain_loop_that_trains_the_head_then_the_body():
    fed = federation(FedRep(head_epochs=2, body_epochs=1), momentum=0.9)
    alg = fed.algorithm
    head, start = alg.head, alg.client_model(2)
    expected = plain_phases(fed, 1, 2, start, [(head, 2, "head"), (~head, 1, "train")], momentum=0.9)
    assert torch.allclose(alg.train_group(1, [2], start[None]).params[0], expected, atol=1e-5)


def test_fedrep_averages_bodies_and_never_heads():
    fed = federation(FedRep(head_epochs=1))
    alg = fed.algorithm
    head = alg.head
    assert [e.name for e in fed.flat.entries if head[e.start]] == ["network.fc.weight", "network.fc.bias"]
    before = alg.models[0].clone()
    updates = fed.execution.train(1, [0, 1, 2, 3, 4])
    alg.aggregate(1, RoundUpdates.of(updates))
    assert torch.equal(alg.models[0][head], before[head])
    n = fed.server.clients.train_sizes.double()
    body_mean = (n[:, None] * updates.params.double()).sum(0) / n.sum()
    assert torch.allclose(alg.models[0][~head].double(), body_mean[~head], atol=1e-6)
    for k in range(5):
        assert torch.equal(alg.client_model(k)[head], updates.params[k][head])
    assert not torch.equal(alg.personal[0], alg.personal[1])


def test_fedrep_fits_a_newcomers_head_on_the_global_body_and_evaluates_it_with_that_head():
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=5, partition=ClassesPerClient(2), holdout_clients=2)
    fed = Federation(
        data,
        Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1),
        FedRep(head_epochs=2),
        FederationConfig(rounds=1, batch_size=32, accelerator="cpu", vectorize=0),
        seed=0,
    )
    result = fed.run_round(1)
    alg, newcomers, initial = fed.algorithm, fed.extension(NewcomerEvaluation).clients, fed.server.model.initial_params
    head, body = alg.head, alg.models[0][~alg.head]
    models, groups, placed = alg.newcomer_models(newcomers)  # at round 1, as the round's evaluation asked
    assert placed is None and len(groups) == 2
    for j in range(2):
        model = models[int(groups[j])]
        assert torch.equal(model[~head], body)  # the global body, exactly
        assert not torch.equal(model[head], initial[head])  # the initial head, fitted
        expected = plain_phases(
            fed,
            1,
            j,
            torch.where(head, initial, alg.models[0]),
            [(head, 2, "head")],
            momentum=0.0,
            batches=newcomers.batches,
        )  # 2 epochs on its training split
        assert torch.allclose(model, expected, atol=1e-5)
        x, y = fed.data.newcomers.test.client(j)
        accuracy = float((fed.server.model.predict(model, x).argmax(dim=1) == y).float().mean())
        assert result.newcomers["acc"][j] == pytest.approx(accuracy)  # the evaluation used the fitted head


def test_fedrep_refuses_bad_input():
    with pytest.raises(ValueError, match="head_layers"):
        FedRep(head_layers=0)
    with pytest.raises(ValueError, match="head_epochs"):
        FedRep(head_epochs=0)


# ----------------------------------------------------------------------------- FedBABU


@pytest.mark.parametrize("vectorize", [0, 5])
def test_fedbabu_server_head_is_the_initial_head_under_momentum_and_weight_decay(vectorize):
    fed = federation(FedBABU(), momentum=0.9, weight_decay=0.01, vectorize=vectorize)
    alg = fed.algorithm
    head, initial = alg.head, fed.server.model.initial_params
    for r in (1, 2):
        fed.run_round(r)
        assert torch.equal(alg.models[0][head], initial[head])
    assert not torch.equal(alg.models[0][~head], initial[~head])
    assert fed.execution.plan.trainer == ("vectorized" if vectorize else "sequential")
    trained = fed.execution.train(3, [0]).params[0]  # weight decay does not move a client's head: it takes no step
    assert torch.equal(trained[head], initial[head]) and not torch.equal(trained[~head], alg.models[0][~head])


def test_fedbabu_clients_train_the_body_as_a_plain_loop_without_the_head():
    fed = federation(FedBABU(), momentum=0.9)
    alg = fed.algorithm
    head, start = alg.head, alg.models[0].clone()
    updates = fed.execution.train(1, [0, 1])
    for row, k in enumerate((0, 1)):
        assert torch.equal(updates.params[row][head], start[head])
        expected = plain_phases(fed, 1, k, start, [(~head, 1, "train")], momentum=0.9)
        assert torch.allclose(updates.params[row], expected, atol=1e-5)


def test_fedbabu_reports_the_fine_tuned_evaluation_and_keeps_the_server_state():
    fed = federation(FedBABU(), finetune_epochs=1)
    result = fed.run_round(1)
    assert {"test/acc_mean", "test_ft/acc_mean"} <= set(result.scalars)
    assert torch.equal(fed.algorithm.models[0][fed.algorithm.head], fed.server.model.initial_params[fed.algorithm.head])


def test_fedbabu_refuses_bad_input():
    with pytest.raises(ValueError, match="head_layers"):
        FedBABU(head_layers=0)


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "make",
    [
        lambda: Ditto(lam=0.5, participation=0.5),
        lambda: FedRep(head_epochs=2, participation=0.5),
        lambda: FedBABU(participation=0.5),
    ],
    ids=["ditto", "fedrep", "fedbabu"],
)
def test_resume_repeats_round_three_exactly(make):
    a = federation(make(), momentum=0.5)
    for r in (1, 2):
        a.run_round(r)
    b = federation(make(), momentum=0.5)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ra, rb = a.run_round(3), b.run_round(3)
    assert_states_equal(a.algorithm.state_dict(), b.algorithm.state_dict())
    assert_states_equal(
        *({name: every_row(store) for name, store in fed.client_states.stores.items()} for fed in (a, b))
    )
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]


@pytest.mark.parametrize(
    "algorithm, option",
    [
        (lambda: FedRep(head_layers=3), "head_layers"),
        (lambda: FedBABU(head_layers=4), "head_layers"),
        (lambda: FedPer(personal_layers=3), "personal_layers"),
        (lambda: LGFedAvg(global_layers=3), "global_layers"),
    ],
)
def test_a_head_that_is_the_whole_network_is_refused_in_one_line(algorithm, option):
    """This SmallCNN has 3 layers (conv1, conv2, fc): a head (or a personal or global part) of 3 or more leaves no
    body."""
    with pytest.raises(
        ValueError,
        match=f"algorithm.init_args.{option} is .*, the whole network \\(3 layers: "
        "network.conv1, network.conv2, network.fc\\): give fewer than 3",
    ):
        federation(algorithm())
