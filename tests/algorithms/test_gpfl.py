"""GPFL: each loss term, the valve and the conditional inputs worked by hand; one local epoch against the authors'
three-optimizer step written out here with plain torch; vectorized against one by one; what is averaged and what
stays personal, the prediction through the personalized route; a resumed run; bad input refused in one line."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight.algorithms.gpfl import (
    COV,
    GCE,
    GPFL,
    INPUTS,
    ConditionalValve,
    angle_level_loss,
    class_shares,
    conditional_inputs,
    magnitude_level_loss,
    weight_decay,
)
from fedlight.plugin import ClientSplit

from helpers.federations import ConvHead, every_row, mlp_federation


def test_the_angle_level_loss_is_cross_entropy_of_the_cosines():
    """Feature (1, 0), embeddings (2, 0) and (0, 3): cosines 1 and 0, so label 0 costs log(1 + e^-1) and label 1
    log(1 + e); the lengths of features and embeddings do not count."""
    features, embeddings = torch.tensor([[1.0, 0.0], [5.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    loss = angle_level_loss(features, embeddings, torch.tensor([0, 1]))
    assert math.isclose(float(loss), (math.log(1 + math.exp(-1)) + math.log(1 + math.e)) / 2, rel_tol=1e-6)


def test_the_magnitude_level_loss_is_the_norm_of_the_whole_batchs_differences():
    """Rows (1, 2) and (3, 4) against their classes' embeddings (0, 1) and (0, 0): differences (1, 1), (3, 4);
    sqrt(1 + 1 + 9 + 16) = sqrt(27), neither squared nor divided by the batch."""
    features, embeddings = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    loss = magnitude_level_loss(features, embeddings, torch.tensor([1, 0]))
    assert math.isclose(float(loss), math.sqrt(27), rel_tol=1e-6)


def test_the_valve_scales_and_shifts_the_features_by_its_condition():
    """Zero weights and biases (1, 3) for gamma: LayerNorm(ReLU(1, 3)) = (-1, 1) (up to its eps); beta's biases
    (2, 2) normalize to (0, 0). f = (2, 3) -> ReLU(2 * 0 + 0, 3 * 2 + 0) = (0, 6), whatever the condition."""
    valve = ConditionalValve(2)
    with torch.no_grad():
        for net, bias in ((valve.gamma, [1.0, 3.0]), (valve.beta, [2.0, 2.0])):
            net[0].weight.zero_()
            net[0].bias.copy_(torch.tensor(bias))
    scale = 1 / math.sqrt(1 + 1e-5)
    out = valve(torch.tensor([[2.0, 3.0], [-1.0, 1.0]]), torch.tensor([7.0, -7.0]))
    expected = torch.tensor([[2 * (1 - scale), 3 * (1 + scale)], [0.0, 1 + scale]])
    assert torch.allclose(out, expected, atol=1e-6)


def test_the_conditional_inputs_are_the_mean_and_the_class_weighted_sum_of_the_embeddings():
    embeddings = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    inputs = conditional_inputs(embeddings, torch.tensor([0.5, 0.5, 0.0]))
    assert torch.equal(inputs, torch.tensor([[3.0, 4.0], [2.0, 3.0]]))
    split = ClientSplit(torch.zeros(5, 1), torch.tensor([0, 2, 2, 2, 1]), [0, 4, 4, 5])
    assert torch.equal(class_shares(split, [0, 1, 2], 3), torch.tensor([[0.25, 0, 0.75], [0, 0, 0], [0, 1, 0]]))


def test_the_weight_decay_term_has_the_gradient_mu_theta_and_no_value():
    theta = torch.tensor([1.0, -2.0], requires_grad=True)
    term = weight_decay(0.3, [theta])
    term.backward()
    assert float(term.detach()) == 0 and torch.allclose(theta.grad, torch.tensor([0.3, -0.6]))


def valve(x: torch.Tensor, condition: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The authors' CoV written out: ReLU(x * (gamma + 1) + beta), each of gamma and beta Linear-ReLU-LayerNorm."""

    def route(name: str) -> torch.Tensor:
        hidden = F.relu(F.linear(condition, p[f"{name}.0.weight"], p[f"{name}.0.bias"]))
        return F.layer_norm(hidden, hidden.shape, p[f"{name}.2.weight"], p[f"{name}.2.bias"])

    return F.relu(x * (route("gamma") + 1) + route("beta"))


@pytest.mark.parametrize("vectorize", [0, 4], ids=["one by one", "vectorized"])
def test_one_local_epoch_is_the_authors_three_optimizer_step(vectorize):
    """PFLlib's clientgpfl.py: per batch, CE(head(CoV(f, p))) + the GCE's softmax of cosines of CoV(f, g) +
    lam * ||CoV(f, g) - frozen embedding of y||_2, one backward, then steps of the model's optimizer and of the GCE's
    and the CoV's (weight decay mu). Written here with three torch optimizers at the module's learning rate and
    momentum (0.05, 0.9), batch by batch in the engine's order, from conditional inputs that are not zero."""
    lam, mu = 0.3, 0.2
    fed = mlp_federation(GPFL(lam=lam, mu=mu), vectorize=vectorize)
    alg, client = fed.algorithm, 1
    start = alg.client_model(client)
    start[alg.inputs] = torch.randn(int(alg.inputs.sum()), generator=torch.Generator().manual_seed(1))
    trained = fed.server.clients.train_many(
        1, [client], start[None], epochs=1, objective=alg._objective, client_inputs=start[alg.embeddings][None]
    ).params[0]
    fed.flat.load(start)
    state = {name: t.detach().clone() for name, t in fed.module.state_dict().items()}
    network = {k.removeprefix("network."): v.requires_grad_() for k, v in state.items() if k.startswith("network.")}
    cov = {k.removeprefix(f"{COV}."): v.requires_grad_() for k, v in state.items() if k.startswith(f"{COV}.")}
    gce = state[f"{GCE}.weight"].requires_grad_()
    frozen = gce.detach().clone()
    generic, personalized = state[f"{INPUTS}.values"]
    steps = [
        torch.optim.SGD(list(network.values()), lr=0.05, momentum=0.9),
        torch.optim.SGD([gce], lr=0.05, momentum=0.9, weight_decay=mu),
        torch.optim.SGD(list(cov.values()), lr=0.05, momentum=0.9, weight_decay=mu),
    ]
    for _, _, (x, y) in fed.server.clients.batches(1, client, epochs=1):
        feat = torch.relu(F.linear(torch.flatten(x, 1), network["hidden.0.weight"], network["hidden.0.bias"]))
        output = F.linear(valve(feat, personalized, cov), network["out.weight"], network["out.bias"])
        feat_g = valve(feat, generic, cov)
        cosine = F.normalize(feat_g) @ F.normalize(gce).T
        softmax_loss = -torch.mean(torch.sum(F.one_hot(y, 10) * F.log_softmax(cosine, dim=1), dim=1))
        loss = F.cross_entropy(output, y) + softmax_loss + torch.norm(feat_g - frozen[y], 2) * lam
        for step in steps:
            step.zero_grad()
        loss.backward()
        for step in steps:
            step.step()
    fed.flat.load(trained)
    mine = dict(fed.module.named_parameters())
    theirs = {
        **{f"network.{k}": v for k, v in network.items()},
        **{f"{COV}.{k}": v for k, v in cov.items()},
        f"{GCE}.weight": gce,
    }
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.allclose(mine[name], theirs[name], atol=1e-5), name


def test_vectorized_training_is_one_client_after_another_and_writes_each_clients_conditional_inputs():
    """`train_group` on three clients, vectorized and one by one, from starts with conditional inputs; each trained
    client's inputs are then the mean of the embeddings it trained and their sum weighted by its class shares
    (counted here with numpy)."""
    trained = {}
    for vectorize in (0, 4):
        fed = mlp_federation(GPFL(lam=0.3, mu=0.2), vectorize=vectorize, batch_size=64)
        alg, clients = fed.algorithm, [0, 2, 4]
        starts = torch.stack([alg.client_model(c) for c in clients])
        starts[:, alg.inputs] = torch.randn(3, int(alg.inputs.sum()), generator=torch.Generator().manual_seed(2))
        trained[vectorize] = alg.train_group(1, clients, starts).params
    assert torch.allclose(trained[0], trained[4], atol=1e-4)  # float rounding over two epochs
    for row, client in enumerate(clients):
        embeddings = trained[4][row, alg.embeddings].view(10, 32).numpy()
        counts = np.bincount(fed.data.train.client(client)[1].numpy(), minlength=10)
        written = trained[4][row, alg.inputs].view(2, 32).numpy()
        assert np.allclose(written[0], embeddings.mean(axis=0), atol=1e-6)
        assert np.allclose(written[1], counts @ embeddings / counts.sum(), atol=1e-5)


def test_the_head_and_conditional_inputs_are_personal_and_a_client_predicts_through_its_personalized_route():
    fed = mlp_federation(GPFL(), vectorize=0, num_clients=3, batch_size=64)
    alg, server = fed.algorithm, fed.server
    personal = server.model.layer_mask(["network.out", INPUTS])
    assert int(personal.sum()) == 32 * 10 + 10 + 2 * 32 and torch.equal(alg.personal_mask, personal)
    fed.run_round(1)
    models = [alg.client_model(c) for c in range(3)]
    assert torch.equal(models[0][~personal], models[1][~personal])  # extractor, GCE and CoV averaged
    assert not torch.equal(models[0][personal], models[1][personal])  # each client's head and inputs
    x = fed.data.test.client(2)[0]
    fed.flat.load(models[2])
    p = {name: t.detach() for name, t in fed.module.state_dict().items()}
    cov = {k.removeprefix(f"{COV}."): v for k, v in p.items() if k.startswith(f"{COV}.")}
    feat = torch.relu(F.linear(torch.flatten(x, 1), p["network.hidden.0.weight"], p["network.hidden.0.bias"]))
    by_hand = F.linear(valve(feat, p[f"{INPUTS}.values"][1], cov), p["network.out.weight"], p["network.out.bias"])
    assert torch.allclose(server.model.predict(models[2], x), by_hand, atol=1e-5)


def test_a_resumed_run_repeats_round_two_exactly():
    a = mlp_federation(GPFL(participation=0.5), vectorize=0, num_clients=3, batch_size=64)
    a.run_round(1)
    saved = copy.deepcopy(a.state_dict())
    b = mlp_federation(GPFL(participation=0.5), vectorize=0, num_clients=3, batch_size=64)
    b.load_state_dict(saved)
    ra, rb = a.run_round(2), b.run_round(2)
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    for name, store in a.client_states.stores.items():
        assert torch.equal(every_row(store), every_row(b.client_states.stores[name])), name
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]


@pytest.mark.parametrize("options, name", [({"lam": -0.1}, "lam"), ({"mu": float("nan")}, "mu")])
def test_negative_or_missing_loss_weights_are_refused_in_one_line(options, name):
    with pytest.raises(ValueError, match=rf"GPFL's {name} must be a finite number >= 0.*init_args\.{name}"):
        GPFL(**options)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_a_head_that_is_not_linear_or_takes_no_feature_is_refused_in_one_line():
    with pytest.raises(ValueError, match="GPFL reads the features at the network's head, which must be a linear"):
        mlp_federation(GPFL(), network=ConvHead())
    empty = nn.Sequential(nn.Flatten(), nn.Linear(64, 4), nn.Linear(4, 0), nn.Linear(0, 10))
    with pytest.raises(ValueError, match="GPFL's category embeddings are 10 x 0"):
        mlp_federation(GPFL(), network=empty)
