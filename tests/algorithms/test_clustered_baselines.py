"""FeSEM, FL+HC, FedEM and PACFL against independent computations: known reductions to FedAvg, scikit-learn's and
SciPy's clustering, principal angles and EM posteriors worked by hand, and each one's hook for clients that arrive
after training (a `Newcomers` stand-in built from another federation over the same partition)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from fedlight import RoundUpdates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.aggregators.attacks import Attack, AttackConfig
from fedlight.algorithms.fedem import FedEM, MixturePredictor, fit_mixture_weights, posterior
from fedlight.algorithms.fesem import FeSEM
from fedlight.algorithms.flhc import FLHC, ward_to_clusters
from fedlight.algorithms.pacfl import PACFL, data_subspace, principal_angles, smallest_angles, stacked_bases
from fedlight.cluster.clusterers import linkage_to_clusters
from fedlight.datamodules import Rotations
from fedlight.plugin.newcomers import Newcomers
from fedlight.plugin.updates import Updates

from helpers.federations import every_row, small_federation
from helpers.newcomers import FederationNewcomers

ROTATED = dict(num_clients=8, partition=Rotations(2), lr=0.05, momentum=0.9)


def run(fed, rounds):
    return [fed.run_round(r) for r in range(1, rounds + 1)]


def newcomer_ari(alg, rounds: int = 1) -> float:
    other = small_federation(None, seed=1, **ROTATED)
    newcomers = FederationNewcomers(other, rounds)
    assert isinstance(newcomers, Newcomers)
    _, _, clusters = alg.newcomer_models(newcomers)
    return adjusted_rand_score(other.data.cluster_labels, clusters.cpu().numpy())


# -- one cluster is FedAvg -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "one_cluster", [lambda: FeSEM(num_clusters=1), lambda: FedEM(num_components=1)], ids=["fesem", "fedem"]
)
def test_one_cluster_or_component_is_fedavg_number_for_number(one_cluster):
    ours, theirs = small_federation(one_cluster(), rounds=3), small_federation(FedAvg(), rounds=3)
    for a, b in zip(run(ours, 3), run(theirs, 3)):
        assert a.scalars["test/acc_mean"] == b.scalars["test/acc_mean"]
        assert a.scalars["train/loss"] == b.scalars["train/loss"]
    assert torch.equal(ours.algorithm.models, theirs.algorithm.models)


# -- FeSEM -----------------------------------------------------------------------------------------------------------
def test_fesem_e_step_joins_the_nearest_center_and_m_step_takes_the_members_mean():
    fed = small_federation(FeSEM(num_clusters=2, weighted=False), num_clients=4)
    alg = fed.algorithm
    d = alg.models.shape[1]
    alg.models = torch.stack([torch.zeros(d), torch.full((d,), 10.0)])
    alg.seeded = True
    local = torch.stack([torch.full((d,), v) for v in (1.0, 9.0, 4.0, 6.0)])  # nearest: 0, 1, 0, 1
    updates = RoundUpdates.of(
        Updates(torch.arange(4), local, torch.zeros(4, d), torch.tensor([1, 1, 1, 3]), torch.zeros(4))
    )
    alg.pre_aggregation(2, updates)
    alg.aggregate(2, updates)
    assert alg.assignment.tolist() == [0, 1, 0, 1]
    assert torch.allclose(alg.models[0], torch.full((d,), 2.5)) and torch.allclose(alg.models[1], torch.full((d,), 7.5))


def test_fesem_recovers_rotations_and_places_newcomers_in_their_true_cluster():
    fed = small_federation(FeSEM(num_clusters=2, seed_round=2), rounds=4, **ROTATED)
    results = run(fed, 4)
    assert results[0].clustering == {}  # FedAvg before the seeding round
    assert results[-1].clustering["cluster/ari"] == 1.0
    assert newcomer_ari(fed.algorithm, 4) == 1.0


# -- FL+HC -----------------------------------------------------------------------------------------------------------
def blocks(d: int = 30, seed: int = 0) -> torch.Tensor:
    """Updates of 9 clients around 3 directions, shuffled (members about 0.3 sqrt(2d) apart, centers ten times
    farther)."""
    g = torch.Generator().manual_seed(seed)
    centers = 3 * torch.randn(3, d, generator=g)
    points = centers.repeat_interleave(3, dim=0) + 0.3 * torch.randn(9, d, generator=g)
    return points[torch.randperm(9, generator=g)]


@pytest.mark.parametrize(
    "settings",
    [
        dict(linkage="ward", distance_threshold=100.0),
        dict(linkage="average", metric="cosine", distance_threshold=0.5),
        dict(linkage="complete", metric="manhattan", num_clusters=3),
    ],
)
def test_flhc_clusters_its_updates_as_scikit_learn_and_scipy_do(settings):
    fed = small_federation(FLHC(cluster_round=2, **settings), num_clients=9)
    alg = fed.algorithm
    deltas = blocks(fed.flat.numel)
    start = alg.models[0].clone()
    updates = RoundUpdates.of(
        Updates(torch.arange(9), start + deltas, start.repeat(9, 1), torch.ones(9), torch.zeros(9))
    )
    alg.pre_aggregation(1, updates)
    assert alg.cluster_labels() is None  # FedAvg before the clustering round
    alg.pre_aggregation(2, updates)
    ours = alg.cluster_labels()
    x = deltas.double().numpy()
    metric = settings.get("metric", "euclidean")
    sklearn = AgglomerativeClustering(
        n_clusters=settings.get("num_clusters"),
        metric=metric,
        distance_threshold=settings.get("distance_threshold"),
        linkage=settings["linkage"],
    ).fit_predict(x)
    tree = linkage(x, method=settings["linkage"], metric={"manhattan": "cityblock"}.get(metric, metric))
    scipy_labels = (
        fcluster(tree, 3, criterion="maxclust")
        if "num_clusters" in settings
        else fcluster(tree, settings["distance_threshold"], criterion="distance")
    )
    assert adjusted_rand_score(sklearn, ours) == 1.0 and adjusted_rand_score(scipy_labels, ours) == 1.0
    assert len(set(ours)) == 3 and len(alg.models) == 3


def test_ward_distance_to_a_cluster_is_the_square_root_of_twice_the_growth_of_its_squared_error():
    members = np.array([[0.0, 0.0], [2.0, 0.0], [5.0, 5.0], [7.0, 5.0], [6.0, 8.0]])
    labels = np.array([0, 0, 1, 1, 1])
    point = np.array([[1.0, 3.0]])

    def sse(rows):
        return float(((rows - rows.mean(axis=0)) ** 2).sum())

    for k in (0, 1):
        cluster = members[labels == k]
        growth = sse(np.vstack([cluster, point])) - sse(cluster)
        assert ward_to_clusters(point, members, labels)[0, k] == pytest.approx(math.sqrt(2 * growth))


def test_linkage_to_clusters_by_hand():
    distances = np.array([[1.0, 3.0, 2.0, 8.0]])  # to members of clusters 0, 0, 1, 1
    labels = np.array([0, 0, 1, 1])
    assert linkage_to_clusters(distances, labels, "average").tolist() == [[2.0, 5.0]]
    assert linkage_to_clusters(distances, labels, "complete").tolist() == [[3.0, 8.0]]
    assert linkage_to_clusters(distances, labels, "single").tolist() == [[1.0, 2.0]]


def test_flhc_recovers_rotations_and_places_newcomers_by_their_update():
    fed = small_federation(FLHC(cluster_round=2, num_clusters=2), rounds=3, **ROTATED)
    results = run(fed, 3)
    assert results[-1].clustering["cluster/ari"] == 1.0
    assert newcomer_ari(fed.algorithm, 3) == 1.0


# -- PACFL -----------------------------------------------------------------------------------------------------------
def test_principal_angles_by_hand_in_the_plane_and_against_scipy():
    x_axis, y_axis = torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0], [1.0]])
    diagonal = torch.tensor([[1.0], [1.0]]) / math.sqrt(2)
    assert principal_angles(x_axis, x_axis).tolist() == pytest.approx([0.0], abs=1e-6)
    assert principal_angles(x_axis, y_axis).tolist() == pytest.approx([90.0])
    assert principal_angles(x_axis, diagonal).tolist() == pytest.approx([45.0])
    # in R^3: span(e1, e2) and span(e1, e3) share e1 and are otherwise orthogonal
    e = torch.eye(3, dtype=torch.float64)
    assert principal_angles(e[:, :2], e[:, [0, 2]]).tolist() == pytest.approx([0.0, 90.0], abs=1e-6)
    g = torch.Generator().manual_seed(0)
    u, v = (torch.linalg.qr(torch.randn(10, 3, generator=g, dtype=torch.float64))[0] for _ in range(2))
    expected = np.sort(np.degrees(scipy.linalg.subspace_angles(u.numpy(), v.numpy())))
    assert principal_angles(u, v).numpy() == pytest.approx(expected, abs=1e-6)


def test_the_data_subspace_of_samples_in_a_plane_is_that_plane():
    g = torch.Generator().manual_seed(0)
    plane = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)  # spans e1 and (e2 + e3)
    samples = torch.randn(50, 2, generator=g, dtype=torch.float64) @ plane
    basis = data_subspace(samples, 2)
    assert torch.allclose(basis.T @ basis, torch.eye(2, dtype=torch.float64))
    assert principal_angles(basis, torch.linalg.qr(plane.T)[0]).tolist() == pytest.approx([0.0, 0.0], abs=1e-5)
    # a basis kept for every client holds its p columns alone, not all 3 x 3 of U (a 784 x 200 U at FEMNIST's size)
    assert basis.untyped_storage().nbytes() == 3 * 2 * 8


def rotated_planes(degrees: list[float], columns: int = 3, dimension: int = 9) -> torch.Tensor:
    """(n, dimension, columns) bases whose k-th column turns by (k + 1) * degrees[i] in the plane (e_2k, e_2k+1),
    the whole space then rotated by one random orthogonal matrix: U_i^T U_j is diagonal with the cosines of
    (k + 1) * (degrees[i] - degrees[j]), so for differences up to 45 degrees the smallest angle is the difference."""
    g = torch.Generator().manual_seed(0)
    rotation = torch.linalg.qr(torch.randn(dimension, dimension, generator=g, dtype=torch.float64))[0]
    bases = torch.zeros(len(degrees), dimension, columns, dtype=torch.float64)
    for i, angle in enumerate(degrees):
        for k in range(columns):
            turn = math.radians((k + 1) * angle)
            bases[i, 2 * k, k], bases[i, 2 * k + 1, k] = math.cos(turn), math.sin(turn)
    return rotation @ bases


def test_batched_smallest_angles_of_turned_planes_are_the_turns():
    degrees = [0.0, 5.0, 12.5, 30.0, 41.0]
    expected = np.abs(np.subtract.outer(degrees, degrees))
    bases = rotated_planes(degrees)
    angles = smallest_angles(bases)
    assert angles.numpy() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(angles, angles.T) and torch.all(angles.diagonal() == 0)
    # one row at a time (the smallest chunk) and against other bases: the same angles
    assert smallest_angles(bases, block_bytes=1).numpy() == pytest.approx(expected, abs=1e-6)
    assert smallest_angles(bases[:2], bases[1:], block_bytes=1).numpy() == pytest.approx(expected[:2, 1:], abs=1e-6)


def test_batched_smallest_angles_agree_with_each_pairs_principal_angles():
    g = torch.Generator().manual_seed(1)
    bases = [torch.linalg.qr(torch.randn(20, 3, generator=g, dtype=torch.float64))[0] for _ in range(7)]
    bases.append(bases[0][:, :1])  # a client with one sample: one column, padded with zeros
    stacked = stacked_bases(iter(bases), len(bases), 3)
    assert stacked.shape == (8, 20, 3) and torch.all(stacked[7, :, 1:] == 0)
    pairwise = torch.tensor(
        [
            [float(principal_angles(u, v)[0]) if i != j else 0.0 for j, v in enumerate(bases)]
            for i, u in enumerate(bases)
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(smallest_angles(stacked, block_bytes=500), pairwise, atol=1e-9, rtol=0)
    assert float(smallest_angles(stacked)[0, 7]) == pytest.approx(0.0, abs=1e-6)  # its one column is in basis 0


def test_pacfl_clusters_rotations_before_training_and_places_newcomers_by_principal_angles():
    fed = small_federation(PACFL(threshold=8.0), rounds=1, **ROTATED)
    alg = fed.algorithm
    assert adjusted_rand_score(fed.data.cluster_labels, alg.cluster_labels()) == 1.0
    proximity = alg.proximity.numpy()
    assert np.allclose(proximity, proximity.T) and np.all(np.diag(proximity) == 0)
    result = fed.run_round(1)
    assert "principal_angle_proximity" in result.matrices
    assert newcomer_ari(alg) == 1.0


PHI = (1 + math.sqrt(5)) / 2  # the golden ratio


class TwoClients:
    """A `ClientSplit` stand-in: client k's samples are `samples[k]`."""

    def __init__(self, *samples: list[list[float]]) -> None:
        self.samples = [torch.tensor(s) for s in samples]

    def client(self, k: int):
        return self.samples[k], torch.zeros(len(self.samples[k]), dtype=torch.long)


@pytest.mark.parametrize(
    "inputs, angle", [("raw", 45.0), ("model", math.degrees(math.acos((PHI - 1) / math.sqrt(2 * (1 + PHI**2)))))]
)
def test_pacfl_takes_its_subspaces_of_the_raw_data_or_of_what_the_model_sees(inputs, angle):
    """Two clients of 2-pixel samples, p = 1, and a model conversion that subtracts a mean of 1 from every pixel.
    Raw, client 0's samples (1, 1), (3, 3) span (1, 1) and client 1's (1, 0), (2, 0) span (1, 0): 45 degrees. As the
    model sees them, client 0's (0, 0), (2, 2) still span (1, 1), but client 1's (0, -1), (1, -1), the columns of
    M = [[0, 1], [-1, -1]], have as top left singular vector the eigenvector (1, -phi) of M M^T = [[1, -1], [-1, 2]]
    (eigenvalue (3 + sqrt 5) / 2), at arccos((phi - 1) / sqrt(2 (1 + phi^2))) = 76.7 degrees from (1, 1)."""
    alg = PACFL(basis_size=1, inputs=inputs)
    alg.server = SimpleNamespace(data=SimpleNamespace(inputs=lambda x: x - 1.0))
    bases = alg.client_bases(TwoClients([[1.0, 1.0], [3.0, 3.0]], [[1.0, 0.0], [2.0, 0.0]]), 2)
    assert float(smallest_angles(bases)[0, 1]) == pytest.approx(angle, abs=1e-9)


def test_pacfl_refuses_unknown_inputs_in_one_line():
    with pytest.raises(ValueError, match=r"^algorithm.init_args.inputs must be raw or model, got 'scaled'$"):
        PACFL(inputs="scaled")


# -- FedEM -----------------------------------------------------------------------------------------------------------
def test_fedem_e_step_is_the_hand_computed_posterior():
    # sample 1: pi = (1/2, 1/2), likelihoods e^-l = (1/2, 1/4) -> q = (2/3, 1/3)
    # sample 2: the same pi, equal losses -> q = pi
    losses = torch.tensor([[math.log(2), 1.0], [math.log(4), 1.0]], dtype=torch.float64)  # (components, samples)
    q = posterior(torch.tensor([0.5, 0.5], dtype=torch.float64).log(), losses)
    assert q.tolist() == [pytest.approx([2 / 3, 1 / 3]), pytest.approx([0.5, 0.5])]
    # per-sample weights (0.25, 0.75) and equal losses: the posterior is the prior
    q = posterior(torch.tensor([0.25, 0.75]).log(), torch.zeros(2, 3))
    assert torch.allclose(q, torch.tensor([0.25, 0.75]).expand(3, 2))


def test_fedem_mixture_weights_reach_the_maximum_likelihood_worked_by_hand():
    # client 0: likelihoods (1, e^-30) and (1/4, 1): log L = log pi + log(1 - 3 pi / 4), maximal at pi = 2/3
    # client 1: every sample explained by component 1 alone -> pi = (0, 1)
    losses = torch.tensor([[0.0, math.log(4), 30.0, 30.0], [30.0, 0.0, 0.0, 0.0]])
    weights = fit_mixture_weights(losses, torch.tensor([0, 0, 1, 1]), 2)
    assert weights[0].tolist() == pytest.approx([2 / 3, 1 / 3], abs=1e-4)
    assert weights[1].tolist() == pytest.approx([0.0, 1.0], abs=1e-6)


def test_fedem_predicts_with_the_log_of_its_weighted_mixture():
    logits = {0: torch.tensor([[2.0, 0.0, -1.0]]), 1: torch.tensor([[0.0, 1.0, 0.0]])}
    predictor = MixturePredictor(
        lambda theta, x: logits[int(theta[0])], torch.tensor([[0.0], [1.0]]), torch.tensor([0.2, 0.8]).log()
    )
    p = (
        0.2 * np.exp([2.0, 0.0, -1.0]) / np.exp([2.0, 0.0, -1.0]).sum()
        + 0.8 * np.exp([0.0, 1.0, 0.0]) / np.exp([0.0, 1.0, 0.0]).sum()
    )
    assert predictor(torch.zeros(1, 1)).exp()[0].tolist() == pytest.approx(p.tolist())


def test_fedem_trains_each_component_with_its_posterior_weights_and_stores_the_mixture():
    fed = small_federation(FedEM(num_components=2), num_clients=4, rounds=2)
    alg = fed.algorithm
    before, mixture = alg.models.clone(), every_row(alg.mixture)
    q = posterior(mixture[1].log(), alg.sample_losses(1))
    out = alg.train_group(1, [1], alg.client_model(1)[None])
    sent = {name: value[0] for name, value in out.state.items()}
    expected = fed.server.clients.train(1, 1, before[1], sample_weights=q[:, 1]).params
    assert torch.equal(sent["copies"][1], expected)
    assert int(sent["component"]) == int(alg.assignment[1])
    assert torch.equal(out.params[0], sent["copies"][int(alg.assignment[1])])  # the copy of its start component
    assert torch.allclose(sent["mixture"], q.mean(dim=0))
    result = fed.run_round(1)
    assert torch.allclose(every_row(alg.mixture).sum(dim=1), torch.ones(4))
    assert alg.cluster_labels().tolist() == every_row(alg.mixture).argmax(dim=1).tolist()
    assert "test/acc_mean" in result.scalars


def test_fedem_attacker_flips_the_update_of_every_components_copy():
    """A sign-flip attacker (scale s) sends start_m - s (trained_m - start_m) for its copy of every component m (each
    copy is a model entry trained from component m, `fedlight.plugin.message`), worked here from an honest run's
    trained copies; the model it sends is its flipped copy of component 1 (its most likely one, which the engine
    gives it); every honest client's copies are the honest run's, and the mean averages those."""
    s, clients = 3.0, [0, 1, 2, 3]
    clean = small_federation(FedEM(num_components=3), num_clients=4, rounds=1)
    attacked = small_federation(
        FedEM(num_components=3), num_clients=4, rounds=1, attack=AttackConfig("sign_flip", 0.25, scale=s)
    )
    attacker = int(attacked.extension(Attack).malicious[0])
    for fed in (clean, attacked):
        fed.algorithm.assignment[attacker] = 1
    honest, sent = clean.execution.train(1, clients), attacked.execution.train(1, clients)
    components = clean.algorithm.models  # (components, d): what every copy was trained from
    expected = honest.state["copies"].clone()  # (clients, components, d)
    expected[attacker] = components - s * (honest.state["copies"][attacker] - components)
    assert torch.allclose(sent.params[attacker], expected[attacker, 1], atol=1e-5)
    assert torch.allclose(sent.state["copies"], expected, atol=1e-5)
    assert torch.allclose(sent.starts[attacker], components[1])
    assert not torch.allclose(expected[attacker, 0], honest.state["copies"][attacker, 0])
    attacked.algorithm.aggregate(1, RoundUpdates.of(sent))
    n = sent.num_samples.to(torch.float64)
    mean = torch.einsum("c,cmd->md", n, expected.to(torch.float64)) / n.sum()
    assert torch.allclose(attacked.algorithm.models, mean.to(torch.float32), atol=1e-5)


@pytest.mark.parametrize("average", ["all_clients", "sampled"])
def test_fedem_with_one_client_of_three_mixes_the_previous_components_in_as_the_authors_code(average):
    """Client 1 of 3 trains: the authors' server averages every client's copy weighted by its training-set size,
    the two others' copies being the previous components, theta_m <- (n_1 copy_m + (n_0 + n_2) theta_m) / n;
    `average: sampled` takes client 1's copies as they are."""
    fed = small_federation(FedEM(num_components=2, average=average), num_clients=3, rounds=1)
    alg = fed.algorithm
    d = alg.models.shape[1]
    alg.models = torch.stack([torch.full((d,), 1.0), torch.full((d,), -2.0)])
    copies = torch.stack([torch.full((d,), 4.0), torch.full((d,), 7.0)])[None]  # client 1's trained copies
    n0, n1, n2 = fed.server.clients.train_sizes.tolist()
    updates = Updates(
        torch.tensor([1]),
        copies[:, 0],
        alg.models[:1].clone(),
        torch.tensor([n1]),
        torch.zeros(1),
        state={"copies": copies, "component": torch.tensor([0]), "mixture": torch.tensor([[0.4, 0.6]])},
    )
    alg.aggregate(1, RoundUpdates.of(updates))
    if average == "all_clients":
        expected = [(n1 * 4.0 + (n0 + n2) * 1.0) / (n0 + n1 + n2), (n1 * 7.0 + (n0 + n2) * -2.0) / (n0 + n1 + n2)]
    else:
        expected = [4.0, 7.0]
    assert torch.allclose(alg.models, torch.tensor(expected)[:, None].expand(2, d), atol=1e-6)
    assert alg.assignment.tolist() == [0, 1, 0]


def test_fedem_refuses_an_unknown_average_in_one_line():
    with pytest.raises(
        ValueError,
        match=r"^algorithm.init_args.average must be one of all_clients, sampled, "
        r"got 'some'$",
    ):
        FedEM(average="some")


def test_weighted_training_with_unit_weights_is_the_mean_cross_entropy_step():
    fed = small_federation(FedAvg(), num_clients=2)
    server = fed.server
    start = server.model.initial_params
    plain = server.clients.train(1, 0, start).params
    weighted = server.clients.train(1, 0, start, sample_weights=torch.ones(int(server.clients.train_sizes[0]))).params
    assert torch.allclose(plain, weighted, atol=1e-6)
    unmoved = server.clients.train(
        1, 0, start, epochs=1, sample_weights=torch.zeros(int(server.clients.train_sizes[0]))
    ).params
    assert torch.equal(unmoved, start)  # zero weights: zero gradient, no step


def test_fedem_newcomers_fit_their_mixture_with_the_components_fixed():
    fed = small_federation(FedEM(num_components=2), num_clients=4)
    alg = fed.algorithm
    newcomers = FederationNewcomers(small_federation(None, seed=1, num_clients=4))
    losses, owner = newcomers.sample_losses(alg.models)
    models, groups, clusters = alg.newcomer_models(newcomers)
    expected = fit_mixture_weights(losses, owner, 4)
    assert groups.tolist() == [0, 1, 2, 3] and clusters.tolist() == expected.argmax(dim=1).tolist()
    assert torch.allclose(models[2].log_weights.exp(), expected[2])


# -- every algorithm -------------------------------------------------------------------------------------------------
ALGORITHMS = {
    "fesem": lambda: FeSEM(num_clusters=2, seed_round=1),
    "flhc": lambda: FLHC(cluster_round=2, num_clusters=2),
    "fedem": lambda: FedEM(num_components=2),
    "pacfl": lambda: PACFL(threshold=8.0),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_run_resumed_from_its_state_ends_as_an_uninterrupted_one(name):
    whole = small_federation(ALGORITHMS[name](), num_clients=4, rounds=3)
    expected = run(whole, 3)[-1]
    first = small_federation(ALGORITHMS[name](), num_clients=4, rounds=3)
    run(first, 2)
    state = copy.deepcopy(first.state_dict())
    resumed = small_federation(ALGORITHMS[name](), num_clients=4, rounds=3)
    resumed.load_state_dict(state)
    last = resumed.run_round(3)
    assert last.scalars == expected.scalars
    assert torch.equal(resumed.algorithm.models, whole.algorithm.models)


@pytest.mark.parametrize(
    "name, option",
    [("fesem", "num_clusters"), ("flhc", "num_clusters"), ("pacfl", "num_clusters"), ("fedem", "num_components")],
)
def test_more_clusters_than_clients_is_one_line_naming_the_option_and_no_run_folder(
    name, option, tmp_path, tiny_run_args, capsys
):
    from fedlight.run.cli import main

    args = tiny_run_args + ["--algorithm", name, f"--algorithm.init_args.{option}", "7", "--run_name", "too_many"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"algorithm.init_args.{option}" in err and "6 clients" in err
    assert not (tmp_path / "too_many").exists()
