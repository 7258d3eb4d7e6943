"""FedPAC: the feature statistics, the alignment term and the prototype average worked by hand, the classifier
combination's quadratic program on hand-solved 2- and 3-client cases (and its optimality conditions on random ones),
one client's local work against a plain PyTorch loop, the server's round on given updates, exact resume, newcomers,
and the refusals."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight import Federation, FederationConfig, RoundUpdates
from fedlight.algorithms.fedpac import (
    BIAS,
    COUNTS,
    PROTOTYPES,
    VARIANCE,
    FedPAC,
    alignment_loss,
    average_prototypes,
    combination_statistics,
    head_weights,
    simplex_qp,
)
from fedlight.datamodules import ClassesPerClient, DigitsFederated
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.models import Classifier, SmallCNN
from fedlight.plugin import Updates

from helpers.federations import every_row, mlp_federation


# -- what a client computes -----------------------------------------------------------------------------------------
def test_the_statistics_of_section_4_2_by_hand():
    """Features (1, 0), (3, 0) of class 0 and (0, 2) of class 1, none of class 2: p = (2/3, 1/3, 0), class means
    (2, 0) and (0, 2), so h = ((4/3, 0), (0, 2/3), 0); V = (mean ||f||^2 - sum_k ||h_k||^2) / n
    = (14/3 - 20/9) / 3 = 22/27, as the authors' sum_k p_k tr(F_k'F_k / n_k) - p_k^2 ||mu_k||^2 over n gives."""
    features, labels = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 0, 1])
    variance, bias = combination_statistics(features, labels, 3)
    assert torch.allclose(bias, torch.tensor([[4 / 3, 0.0], [0.0, 2 / 3], [0.0, 0.0]]))
    authors = (2 / 3 * (1 + 9) / 2 + 1 / 3 * 4 - (4 / 9 * 4 + 1 / 9 * 4)) / 3
    assert math.isclose(float(variance), 22 / 27, rel_tol=1e-6) and math.isclose(authors, 22 / 27)


def test_the_alignment_term_is_the_mean_squared_distance_to_the_class_prototype():
    """Features (1, 2) of class 0 and (3, 4) of class 1, prototypes (0, 0) and (1, 1): squared differences 1, 4, 4, 9,
    their mean over batch and dimension 18 / 4."""
    loss = alignment_loss(
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0, 1]), torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    )
    assert math.isclose(float(loss), 4.5)


@pytest.mark.parametrize("vectorize", [0, 4], ids=["one by one", "vectorized"])
def test_a_clients_local_work_is_head_then_aligned_body(vectorize):
    """Written out with plain torch on the MLP (64 -> 32 -> 10): one epoch of the head on the batch stream "head",
    then the federation's two epochs of the body on cross-entropy + lam x mean((f - c_y)^2), each phase with its
    own SGD (momentum 0.9, the module's); c_y the global prototype where known, else the client's own class mean of
    its features under the received model. It sends its class counts and its trained class means."""
    lam, client = 0.5, 1
    fed = mlp_federation(FedPAC(lam=lam), vectorize=vectorize, batch_size=32)
    alg = fed.algorithm
    x_all, y_all = fed.server.clients.split("train").client(client)
    present = torch.unique(y_all)
    alg.known = torch.zeros(10, dtype=torch.bool)
    alg.known[present[1:]] = True  # the client's first class has no global prototype
    alg.prototypes = torch.randn(10, 32, generator=torch.Generator().manual_seed(1))
    start = alg.client_model(client)
    trained = alg.train_group(2, [client], start[None])

    entries = fed.flat.entries
    t = {e.name: start[e.start : e.stop].view(e.shape).clone().requires_grad_() for e in entries}

    def forward(x):
        rep = torch.relu(torch.flatten(x, 1) @ t["network.hidden.0.weight"].T + t["network.hidden.0.bias"])
        return rep, rep @ t["network.out.weight"].T + t["network.out.bias"]

    with torch.no_grad():
        rep, _ = forward(fed.server.data.inputs(x_all))
    own = torch.stack([rep[y_all == k].mean(0) if (y_all == k).any() else torch.zeros(32) for k in range(10)])
    targets = torch.where(alg.known[:, None], alg.prototypes, own)
    head, body = ["network.out.weight", "network.out.bias"], ["network.hidden.0.weight", "network.hidden.0.bias"]
    for names, epochs, purpose, aligned in ((head, 1, "head", False), (body, 2, "train", True)):
        step = torch.optim.SGD([t[n] for n in names], lr=0.05, momentum=0.9)
        for _, _, (x, y) in fed.server.clients.batches(2, client, epochs, purpose):
            features, outputs = forward(x)
            loss = F.cross_entropy(outputs, y)
            if aligned:
                loss = loss + lam * ((features - targets[y]) ** 2).mean()
            step.zero_grad()
            loss.backward()
            step.step()
    expected = torch.cat([t[e.name].detach().reshape(-1) for e in entries])
    assert torch.allclose(trained.params[0], expected, atol=1e-5)
    with torch.no_grad():
        rep, _ = forward(fed.server.data.inputs(x_all))
    counts = torch.bincount(y_all, minlength=10).float()
    assert torch.equal(trained.state[COUNTS][0], counts)
    means = torch.stack([rep[y_all == k].mean(0) if counts[k] else torch.zeros(32) for k in range(10)])
    assert torch.allclose(trained.state[PROTOTYPES][0], means, atol=1e-5)


# -- what the server computes ---------------------------------------------------------------------------------------
def test_prototypes_are_averaged_per_class_weighted_by_the_clients_counts():
    """Class 0: one sample at (0, 0) on client 0 and three at mean (4, 8) on client 1 -> (3, 6); class 1 on client 0
    alone -> its (1, 1); class 2 on neither -> not known."""
    counts = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    means = torch.tensor([[[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [[4.0, 8.0], [0.0, 0.0], [0.0, 0.0]]])
    prototypes, known = average_prototypes(counts, means)
    assert torch.equal(prototypes, torch.tensor([[3.0, 6.0], [1.0, 1.0], [0.0, 0.0]]))
    assert known.tolist() == [True, True, False]


def test_two_clients_weights_solved_by_hand():
    """V = (1, 1), h = (0, 1) (one class, one feature): client 0's P = diag(V) + (h_0 - h_j)(h_0 - h_l) =
    [[1, 0], [0, 2]], min a'Pa on the simplex at a ~ P^-1 1 = (1, 1/2) -> (2/3, 1/3); client 1's symmetric."""
    weights = head_weights(torch.tensor([1.0, 1.0]), torch.tensor([[[0.0]], [[1.0]]]))
    assert torch.allclose(weights, torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]], dtype=torch.float64))


def test_three_clients_weights_solved_by_hand_one_on_the_boundary():
    """V = (1, 1, 1), h = (0, 1, 3). Client 0: P = I + [[0,0,0],[0,1,3],[0,3,9]]; P^-1 1 has a negative third entry
    (-1/11), so a_2 = 0 and on {0, 1} P = diag(1, 2): (2/3, 1/3, 0), with multiplier 2(Pa)_2 - nu = 2 - 4/3 >= 0.
    Client 1: P = I + dd', d = (1, 0, -2): P^-1 1 = (7/6, 1, 2/3) > 0 -> (7, 6, 4) / 17 (the biases of clients 0 and
    2 partly cancel). Client 2: d = (3, 2, 0), P^-1 1 has a_0 < 0; on {1, 2} P = diag(5, 1): (0, 1/6, 5/6)."""
    weights = head_weights(torch.ones(3), torch.tensor([0.0, 1.0, 3.0]).view(3, 1, 1))
    expected = torch.tensor([[2 / 3, 1 / 3, 0], [7 / 17, 6 / 17, 4 / 17], [0, 1 / 6, 5 / 6]], dtype=torch.float64)
    assert torch.allclose(weights, expected, atol=1e-9)


def test_weights_at_most_1e_3_are_dropped_and_the_rest_renormalized():
    """P = diag(1, 1000) (no bias): a ~ (1, 1/1000), i.e. 1/1001 < 1e-3 for the second head, which is dropped."""
    weights = head_weights(torch.tensor([1.0, 1000.0]), torch.zeros(2, 1, 1))
    assert torch.equal(weights, torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("seed", range(4))
def test_the_solver_meets_the_optimality_conditions(seed):
    """On random positive semi-definite P (rank-deficient ones included), the weights are feasible and satisfy KKT:
    2(Pa)_j equals one value nu where a_j > 0 and is >= nu where a_j = 0."""
    g = torch.Generator().manual_seed(seed)
    m = 7
    A = torch.randn(m, 3 + seed, generator=g, dtype=torch.float64)
    P = A @ A.T + torch.diag(torch.rand(m, generator=g, dtype=torch.float64) * (seed % 2))
    a = simplex_qp(P)
    assert bool((a >= 0).all()) and math.isclose(float(a.sum()), 1.0, rel_tol=1e-12)
    gradient = 2 * P @ a
    support = a > 1e-12
    nu = gradient[support].mean()
    assert torch.allclose(gradient[support], nu.expand(int(support.sum())), atol=1e-9)
    assert bool((gradient[~support] >= nu - 1e-9).all())
    assert (
        float(a @ P @ a)
        <= float(torch.full((m,), 1 / m, dtype=torch.float64) @ P @ torch.full((m,), 1 / m, dtype=torch.float64))
        + 1e-12
    )


def test_the_server_averages_bodies_and_prototypes_and_combines_the_heads():
    """Two clients with the statistics of the two-client case (weights (2/3, 1/3) and (1/3, 2/3)) send given models:
    the body becomes their size-weighted mean, each client's head the combination of both trained heads, and the
    global prototypes the count-weighted class means."""
    fed = mlp_federation(FedPAC())
    alg = fed.algorithm
    head = alg.head
    params = torch.randn(2, fed.server.model.num_params, generator=torch.Generator().manual_seed(0))
    bias = torch.zeros(2, 10, 32)
    bias[1, 3, 5] = 1.0  # ||h_0 - h_1||^2 = 1
    counts = torch.zeros(2, 10)
    counts[0, 3], counts[1, 3], counts[1, 4] = 1.0, 3.0, 2.0
    means = torch.zeros(2, 10, 32)
    means[0, 3], means[1, 3], means[1, 4] = 4.0, 8.0, -1.0
    state = {VARIANCE: torch.ones(2, 1), BIAS: bias, COUNTS: counts, PROTOTYPES: means}
    sizes = torch.tensor([30.0, 10.0])
    updates = Updates(
        torch.tensor([0, 2]),
        params,
        torch.stack([alg.client_model(0), alg.client_model(2)]),
        sizes,
        torch.zeros(2),
        state=state,
    )
    alg.aggregate(1, RoundUpdates.of(updates))
    assert torch.allclose(alg.models[0][~head], (0.75 * params[0] + 0.25 * params[1])[~head], atol=1e-6)
    assert torch.allclose(alg.client_model(0)[head], (2 / 3 * params[0] + 1 / 3 * params[1])[head], atol=1e-6)
    assert torch.allclose(alg.client_model(2)[head], (1 / 3 * params[0] + 2 / 3 * params[1])[head], atol=1e-6)
    assert torch.equal(alg.client_model(1)[head], fed.server.model.initial_params[head])  # not in the round: untouched
    assert alg.known.nonzero().flatten().tolist() == [3, 4]
    assert torch.allclose(alg.prototypes[3], torch.full((32,), (4.0 + 3 * 8.0) / 4))
    assert torch.equal(alg.prototypes[4], torch.full((32,), -1.0))


# -- a run ----------------------------------------------------------------------------------------------------------
def test_resume_after_round_one_repeats_round_two_exactly():
    """Round 2 aligns to the prototypes of round 1: restored from round 1's state, it ends exactly as the
    uninterrupted run, client state included."""
    a = mlp_federation(FedPAC(body_epochs=1, participation=0.5), num_clients=4, batch_size=64)
    a.run_round(1)
    assert bool(a.algorithm.known.any())
    b = mlp_federation(FedPAC(body_epochs=1, participation=0.5), num_clients=4, batch_size=64)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ra, rb = a.run_round(2), b.run_round(2)
    for name in ("models", "prototypes", "known"):
        assert torch.equal(getattr(a.algorithm, name), getattr(b.algorithm, name)), name
    assert torch.equal(every_row(a.algorithm.personal), every_row(b.algorithm.personal))
    assert ra.scalars == rb.scalars


def test_a_newcomer_gets_the_global_body_and_a_head_fitted_on_it():
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=5, partition=ClassesPerClient(2), holdout_clients=1)
    fed = Federation(
        data,
        Classifier(SmallCNN(1, 10, 8, width=4), lr=0.1),
        FedPAC(),
        FederationConfig(rounds=1, batch_size=32, accelerator="cpu", vectorize=0),
        seed=0,
    )
    alg, newcomers = fed.algorithm, fed.extension(NewcomerEvaluation).clients
    alg.models[0] += 0.01  # a global model other than the initial one
    models, groups, placed = alg.newcomer_models(newcomers)
    model = models[int(groups[0])]
    assert placed is None and torch.equal(model[~alg.head], alg.models[0][~alg.head])
    assert not torch.equal(model[alg.head], fed.server.model.initial_params[alg.head])


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lam must be >= 0"):
        FedPAC(lam=-0.1)
    with pytest.raises(ValueError, match="head_epochs and body_epochs"):
        FedPAC(body_epochs=0)

    with pytest.raises(ValueError, match="must be one nn.Linear, not LayerNorm: set model.network"):
        mlp_federation(FedPAC(), network=nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.LayerNorm(10)))
