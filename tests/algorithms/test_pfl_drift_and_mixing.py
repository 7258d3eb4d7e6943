"""SCAFFOLD (control variates against client drift) and APFL (a mixture of a local and a global model), each checked
against FedAvg where the paper's algorithm reduces to it, and against hand computations on a linear model (softmax
regression, whose cross-entropy gradient is written out below)."""

import json
import math

import pytest
import torch

from fedlight import RoundUpdates
from fedlight.algorithms.apfl import APFL
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.scaffold import SCAFFOLD
from fedlight.datamodules import ClassesPerClient, QuantitySkew
from fedlight.run.cli import main

from helpers.federations import every_row, small_federation
from helpers.softmax_regression import LR, client_data, linear_federation, linear_gradient, resumed_equals_uninterrupted

# ----------------------------------------------------------------------------- SCAFFOLD


def test_scaffold_first_round_is_the_unweighted_mean_of_fedavg_clients():
    clients = [0, 1, 2, 3]
    fedavg = small_federation(FedAvg(), num_clients=4, partition=QuantitySkew(min_size=30))
    trained = fedavg.execution.train(1, clients).params.double()  # FedAvg's clients, trained on their own
    sizes = fedavg.server.clients.train_sizes.double()
    assert sizes.max() > 2 * sizes.min()  # unequal sizes: weighted and unweighted means differ
    scaffold = small_federation(SCAFFOLD(), num_clients=4, partition=QuantitySkew(min_size=30))
    scaffold.run_round(1)  # zero control variates: no correction, server_lr 1
    model = scaffold.algorithm.models[0].double()
    assert torch.allclose(model, trained.mean(0), rtol=0, atol=1e-7)
    assert not torch.allclose(model, (sizes[:, None] * trained).sum(0) / sizes.sum(), rtol=0, atol=1e-4)
    # with every client taking part, c moves to the mean of the clients' variates (c = 0 before)
    alg = scaffold.algorithm
    assert torch.allclose(alg.control, every_row(alg.client_controls).mean(0), atol=1e-6)


def test_scaffold_control_variates_follow_option_two_by_hand():
    fed = linear_federation(
        SCAFFOLD(server_lr=0.7, participation=0.5), num_clients=4, partition=QuantitySkew(min_size=30)
    )
    fed.run_round(1)
    alg = fed.algorithm
    x, c, c_i = alg.models[0].double(), alg.control.double(), every_row(alg.client_controls).double()
    clients = alg.select_clients(2)
    assert len(clients) == 2 and c_i.abs().sum() > 0
    assert fed.server.clients.train_sizes[clients[0]] != fed.server.clients.train_sizes[clients[1]]  # steps K differ
    updates = fed.execution.train(2, clients)
    round_updates = RoundUpdates.of(updates)
    alg.aggregate(2, round_updates)
    fed.client_states.write_returned(round_updates)  # the engine stores each client's returned c_i+ after the round
    expected_ci = c_i.clone()
    for row, k in enumerate(clients):
        steps = math.ceil(int(fed.server.clients.train_sizes[k]) / 32)  # one local epoch of batches of 32
        expected_ci[k] = c_i[k] - c + (x - updates.params[row].double()) / (steps * LR)
    assert torch.allclose(every_row(alg.client_controls).double(), expected_ci, atol=1e-5)
    change = sum(expected_ci[k] - c_i[k] for k in clients) / 4  # (|S| / N) times the mean change
    assert torch.allclose(alg.control.double(), c + change, atol=1e-6)
    step = (updates.params.double() - x).mean(0)
    assert torch.allclose(alg.models[0].double(), x + 0.7 * step, atol=1e-6)


@pytest.mark.parametrize("vectorize", [0, 3])
def test_scaffold_corrected_step_is_g_plus_c_minus_ci(vectorize):
    # one batch holds a client's whole training split: one local step, whatever the order of the rows
    fed = linear_federation(SCAFFOLD(), num_clients=3, batch_size=4096, vectorize=vectorize)
    fed.run_round(1)
    alg = fed.algorithm
    x, c, c_i = alg.models[0].double(), alg.control.double(), every_row(alg.client_controls).double()
    assert (c_i - c).abs().max() > 1e-3  # a real correction in round 2
    updates = fed.execution.train(2, [0, 1, 2])
    grads = [linear_gradient(alg.models[0], *client_data(fed, k)) for k in range(3)]
    for k in range(3):
        assert torch.allclose(updates.params[k].double(), x - LR * (grads[k] + c - c_i[k]), atol=1e-6)
    round_updates = RoundUpdates.of(updates)
    alg.aggregate(2, round_updates)
    fed.client_states.write_returned(round_updates)
    for k in range(3):  # K = 1: option II gives back the gradient at x, c_i+ = g_i(x)
        assert torch.allclose(alg.client_controls[k].double(), grads[k], atol=1e-5)


def test_scaffold_resumes_exactly():
    resumed_equals_uninterrupted(
        lambda: small_federation(SCAFFOLD(participation=0.5), num_clients=4, rounds=3), ("control", "client_controls")
    )


@pytest.mark.parametrize("server_lr", [0.0, -1.0])
def test_scaffold_refuses_a_non_positive_server_lr(server_lr):
    with pytest.raises(ValueError, match="server_lr"):
        SCAFFOLD(server_lr=server_lr)


# ----------------------------------------------------------------------------- APFL


def test_apfl_with_alpha_fixed_at_zero_is_fedavg():
    # its w-step is plain SGD at the module's rate, so FedAvg's module has momentum 0 (small_federation's default)
    fedavg = small_federation(FedAvg(), num_clients=4, rounds=3)
    apfl = small_federation(APFL(alpha=0.0, adaptive=False), num_clients=4, rounds=3)
    for r in (1, 2, 3):
        a, b = fedavg.run_round(r), apfl.run_round(r)
        assert torch.allclose(fedavg.algorithm.models, apfl.algorithm.models, rtol=0, atol=1e-6)
    assert a.scalars["test/acc_mean"] == pytest.approx(b.scalars["test/acc_mean"])
    assert torch.equal(every_row(apfl.algorithm.alpha), torch.zeros(4))


@pytest.mark.parametrize("alpha_lr, clipped", [(None, False), (1e6, True)])
def test_apfl_one_step_matches_a_hand_computation(alpha_lr, clipped):
    fed = linear_federation(APFL(alpha=0.5, alpha_lr=alpha_lr), num_clients=3, batch_size=4096)
    fed.run_round(1)  # v and w part: round 2's alpha gradient <v - w, g> is not zero
    alg = fed.algorithm
    w, v, alpha = alg.models[0].double(), every_row(alg.local).double(), every_row(alg.alpha).double()
    fed.run_round(2)
    sizes = fed.server.clients.train_sizes.double()
    rate = LR if alpha_lr is None else alpha_lr
    trained_w = []
    for k in range(3):
        x, y = client_data(fed, k)
        mixed = alpha[k] * v[k] + (1 - alpha[k]) * w
        g_mixed = linear_gradient(mixed, x, y)
        trained_w.append(w - LR * linear_gradient(w, x, y))
        new_alpha = float((alpha[k] - rate * torch.dot(v[k] - w, g_mixed)).clamp(0, 1))
        assert (new_alpha in (0.0, 1.0)) == clipped
        assert abs(new_alpha - float(alpha[k])) > 1e-6  # the step moved alpha
        assert float(alg.alpha[k]) == pytest.approx(new_alpha, abs=1e-6)
        assert torch.allclose(alg.local[k].double(), v[k] - LR * alpha[k] * g_mixed, atol=1e-6)
    expected_w = sum(n * t for n, t in zip(sizes, trained_w)) / sizes.sum()  # FedAvg of the w's
    assert torch.allclose(alg.models[0].double(), expected_w, atol=1e-6)


def test_apfl_evaluates_each_client_with_its_mixture():
    fed = small_federation(APFL(alpha=0.3), num_clients=4, rounds=2)
    fed.run_round(1)
    result = fed.run_round(2)
    alg = fed.algorithm
    assert not torch.equal(every_row(alg.alpha), torch.full((4,), 0.3))  # adapted
    models, groups = alg.evaluation_models()
    assert torch.equal(groups, torch.arange(4))
    for k in range(4):
        mixture = alg.alpha[k] * alg.local[k] + (1 - alg.alpha[k]) * alg.models[0]
        assert torch.allclose(models[k], mixture)
        x, y = fed.server.clients.split("test").client(k)
        accuracy = (fed.server.model.predict(mixture, x).argmax(1) == y).double().mean()
        assert result.per_client["acc"][k] == pytest.approx(float(accuracy))


def test_apfl_resumes_exactly():
    resumed_equals_uninterrupted(
        lambda: small_federation(APFL(participation=0.5), num_clients=4, rounds=3), ("local", "alpha")
    )


@pytest.mark.parametrize(
    "options, name", [({"alpha": -0.1}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"alpha_lr": 0.0}, "alpha_lr")]
)
def test_apfl_refuses_bad_options(options, name):
    with pytest.raises(ValueError, match=f"^{name} must"):
        APFL(**options)


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("class_path", ["fedlight.algorithms.scaffold.SCAFFOLD", "fedlight.algorithms.apfl.APFL"])
def test_a_short_run_through_the_command_line(tmp_path, tiny_run_args, class_path):
    assert main(tiny_run_args + ["--federation.rounds", "2", "--algorithm", class_path]) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 2 and 0 <= summary["test/acc_mean"] <= 1


def test_scaffold_corrects_client_drift_under_label_skew_where_fedavg_does_not():
    """SCAFFOLD's reason to exist: with 2 classes a client and 2 local epochs, plain SGD for both, its control
    variates take softmax regression (convex) to a lower loss of the global objective than FedAvg's in 10 rounds."""
    losses = {}
    for algorithm in (FedAvg(), SCAFFOLD()):
        fed = linear_federation(algorithm, num_clients=10, batch_size=16, partition=ClassesPerClient(2), local_epochs=2)
        for round in range(1, 11):
            fed.run_round(round)
        losses[type(algorithm).__name__] = fed.evaluate("train")[0]["train/loss_mean"]
    assert losses["SCAFFOLD"] < 0.8 * losses["FedAvg"], losses
