"""FedGMM: the E-step over (Gaussian, model) pairs, the Gaussians' M-step and the federated PCA against numpy (the
server's sum of client statistics equals the pooled computation), the paper's prediction rule worked by hand; a
digits run above chance that logs clusters; the weights' running total; exact resume; bad options in one line."""

import math

import numpy as np
import pytest
import torch

from fedlight.algorithms.fedgmm import (
    FedGMM,
    GaussianMixturePredictor,
    gaussian_log_densities,
    gaussians_from_statistics,
    joint_posterior,
    moment_statistics,
    pca_projection,
)

from helpers.federations import small_federation
from helpers.resume import resumed_and_whole


def normal_density(x: float, mean: float, variance: float) -> float:
    return math.exp(-((x - mean) ** 2) / (2 * variance)) / math.sqrt(2 * math.pi * variance)


def test_the_e_step_weighs_each_pair_by_its_weight_density_and_likelihood():
    """1-D: Gaussians N(0, 1) and N(2, 1/2), models with losses 0.2 and 1.0 on the sample e = 0.5,
    pi = [[0.1, 0.2], [0.3, 0.4]]: q[m, k] = pi[m, k] N_m(0.5) exp(-l_k) / the sum of the four."""
    pi = [[0.1, 0.2], [0.3, 0.4]]
    density = [normal_density(0.5, 0.0, 1.0), normal_density(0.5, 2.0, 0.5)]
    loss = [0.2, 1.0]
    mass = [[pi[m][k] * density[m] * math.exp(-loss[k]) for k in range(2)] for m in range(2)]
    total = sum(sum(row) for row in mass)
    expected = torch.tensor([[v / total for v in row] for row in mass], dtype=torch.float64)
    log_densities = gaussian_log_densities(
        torch.tensor([[0.5]], dtype=torch.float64),
        torch.tensor([[0.0], [2.0]], dtype=torch.float64),
        torch.tensor([[[1.0]], [[0.5]]], dtype=torch.float64),
    )
    assert torch.allclose(log_densities, torch.tensor([density], dtype=torch.float64).log())
    q = joint_posterior(
        torch.tensor(pi, dtype=torch.float64).log(), log_densities, torch.tensor([[0.2], [1.0]], dtype=torch.float64)
    )
    assert q.shape == (1, 2, 2) and torch.allclose(q[0], expected)


def test_the_gaussians_m_step_from_two_clients_statistics_is_numpys_pooled_weighted_fit():
    rng = np.random.default_rng(0)
    e, w = rng.normal(size=(9, 3)), rng.uniform(size=(9, 2))
    summed = sum(moment_statistics(torch.tensor(e[part]), torch.tensor(w[part])) for part in (slice(0, 4), slice(4, 9)))
    means, covariances = gaussians_from_statistics(summed)
    for m in range(2):
        assert np.allclose(means[m].numpy(), np.average(e, axis=0, weights=w[:, m]))
        assert np.allclose(covariances[m].numpy(), np.cov(e.T, aweights=w[:, m], bias=True))


def test_the_federated_pca_is_numpys_pca_of_the_pooled_inputs():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 4)) * np.array([3.0, 0.3, 2.0, 1.0])
    summed = moment_statistics(torch.tensor(x[:10]), torch.ones(10, 1)) + moment_statistics(
        torch.tensor(x[10:]), torch.ones(20, 1)
    )
    mean, basis, variances = pca_projection(summed, 2)
    values, vectors = np.linalg.eigh(np.cov(x.T, bias=True))
    top = np.argsort(values)[::-1][:2]
    assert np.allclose(mean.numpy(), x.mean(axis=0))
    assert np.allclose(variances.numpy(), values[top])
    assert np.allclose(np.abs(basis.numpy()), np.abs(vectors[:, top]))  # eigenvectors up to their sign


def test_a_round_with_every_client_sets_the_gaussians_to_the_pooled_fit_of_their_responsibilities():
    """The round's E-step on each client (its responsibilities of each Gaussian, summed over the models), pooled over
    the clients, fitted by numpy: the server's Gaussians after the round, from the clients' summed statistics."""
    fed = small_federation(FedGMM(num_components=2, num_gaussians=2, embedding_dim=3), num_clients=4, rounds=1)
    alg = fed.algorithm
    train = fed.server.clients.split("train")
    embedded, weights = [], []
    for c in range(4):
        e, densities = alg.log_densities(train.client(c)[0])
        q = joint_posterior(alg.mixture[c].to(torch.float64).log(), densities, alg.sample_losses(c).to(torch.float64))
        embedded.append(e.numpy())
        weights.append(q.sum(dim=2).numpy())
    e, w = np.concatenate(embedded), np.concatenate(weights)
    fed.run_round(1)
    for m in range(2):
        assert np.allclose(alg.means[m].numpy(), np.average(e, axis=0, weights=w[:, m]))
        assert np.allclose(alg.covariances[m].numpy(), np.cov(e.T, aweights=w[:, m], bias=True), atol=1e-10)


def test_a_client_predicts_with_each_models_share_of_its_joint_density_given_x():
    """1-D embedding e(x) = x, Gaussians N(0, 1) and N(3, 1), pi = [[0.5, 0.1], [0.1, 0.3]], models predicting
    (0.8, 0.2) and (0.3, 0.7) on x = 1: p(k | x) ~ sum_m pi[m, k] N_m(1), p(y | x) = sum_k p(k | x) p_k(y | x)."""
    probs = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    pi = [[0.5, 0.1], [0.1, 0.3]]
    density = [normal_density(1.0, 0.0, 1.0), normal_density(1.0, 3.0, 1.0)]
    share = [sum(pi[m][k] * density[m] for m in range(2)) for k in range(2)]
    expected = [sum(share[k] * float(probs[k, y]) for k in range(2)) / sum(share) for y in range(2)]
    predictor = GaussianMixturePredictor(
        lambda theta, x: probs[int(theta[0])].log().expand(len(x), -1),
        torch.tensor([[0.0], [1.0]]),
        torch.tensor(pi).log(),
        lambda x: x.to(torch.float64),
        torch.tensor([[0.0], [3.0]], dtype=torch.float64),
        torch.eye(1, dtype=torch.float64).expand(2, 1, 1),
    )
    assert torch.allclose(predictor(torch.tensor([[1.0]])).exp(), torch.tensor([expected]))


def test_on_rotations_a_run_beats_chance_logs_clusters_and_keeps_every_clients_weights_summed():
    fed = small_federation(
        FedGMM(num_components=2, num_gaussians=2, embedding_dim=8, participation=0.5),
        num_clients=6,
        rounds=6,
        lr=0.3,
        vectorize=6,
    )
    alg = fed.algorithm
    results = [fed.run_round(r) for r in range(1, 7)]
    assert all("cluster/ari" in result.scalars for result in results)
    assert results[-1].scalars["test/acc_mean"] > 0.3  # chance is 0.1
    assert alg.cluster_labels().shape == (6,)
    stored = (
        alg.mixture.read(range(6)).to(torch.float64) * fed.server.clients.train_sizes.to(torch.float64)[:, None, None]
    )
    assert torch.allclose(alg.mass, stored.sum(dim=0))  # the running total, kept from the rounds' clients alone


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    """Half the clients a round: the Gaussians, the weights' total and the stored weights all carry over."""
    args = tiny_run_args + [
        "--algorithm",
        "fedgmm",
        "--algorithm.init_args.num_components",
        "2",
        "--algorithm.init_args.num_gaussians",
        "2",
        "--algorithm.init_args.embedding_dim",
        "4",
        "--algorithm.init_args.participation",
        "0.5",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch)
    assert crashed == whole


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_gaussians": 0}, "num_gaussians must be >= 1, got 0"),
        ({"embedding_dim": 0}, "embedding_dim must be >= 1, got 0"),
        ({"covariance_regularization": 0.0}, "covariance_regularization must be > 0"),
        ({"num_components": 0}, "num_components must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        FedGMM(**options)


def test_an_embedding_wider_than_the_inputs_is_refused_in_one_line():
    with pytest.raises(ValueError, match="embedding_dim is 65, more than the 64 input features: give at most 64"):
        small_federation(FedGMM(embedding_dim=65), num_clients=4)


def test_a_run_under_privacy_is_refused_in_one_line_as_its_statistics_go_in_the_clear():
    from fedlight.aggregators.privacy import PrivacyConfig

    with pytest.raises(
        ValueError,
        match=r"^privacy: FedGMM's clients send 'gaussian_statistics' \(a statistic summed "
        r"over clients\).*leave the privacy section out for FedGMM$",
    ) as error:
        small_federation(
            FedGMM(num_components=2, num_gaussians=2, embedding_dim=4),
            num_clients=3,
            rounds=1,
            privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0),
        )
    assert "\n" not in str(error.value)
