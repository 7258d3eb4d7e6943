"""Client-level DP: clipping (a client's rows together, when it sends one to each of several clusters), the noise's
standard deviation, adaptive clipping's step, the accountant against closed forms (FedEM's components too), target
epsilon (sigma up front, or a stop), resume with the same epsilon, and the refusals."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from fedlight import RoundUpdates, Updates
from fedlight.algorithms.fedem import FedEM
from fedlight.cluster.differences import Differences
from fedlight.aggregators.privacy import PrivacyConfig, PrivacyMechanism, epsilon_of, make_accountant, update_noise
from fedlight.run import checkpoint
from fedlight.run.cli import main

from helpers.federations import small_federation
from helpers.resume import crash_and_resume

DELTA = 1e-5


def mechanism(z: float = 1.0, clip: float = 1.0, **config) -> PrivacyMechanism:
    found = PrivacyMechanism(
        PrivacyConfig(noise_multiplier=z, clip=clip, **config),
        rounds=10,
        clients_per_round=4,
        num_clients=8,
        seed_parts=[0, 1],
    )
    found.begin_round(1)
    return found


def aggregate(
    found: PrivacyMechanism, clusters: list[int], updates: torch.Tensor, start: torch.Tensor, rows_per_client: int = 1
):
    rows = found.aggregator(3, updates.shape[1], torch.float64, torch.device("cpu"), None, rows_per_client)
    starts = start.expand(len(updates), -1)
    rows.add(torch.tensor(clusters), torch.ones(len(updates)), starts + updates, starts)
    return rows.means()


def test_each_update_counts_at_most_the_clip():
    found = mechanism(z=1e-9, clip=2.0)  # next to no noise: what is left is the clipped mean
    updates = torch.tensor([[30.0, 40.0], [0.3, 0.4], [-6.0, 8.0]])  # norms 50, 0.5, 10
    active, models = aggregate(found, [0, 0, 1], updates, torch.tensor([1.0, 1.0]))
    assert active.tolist() == [0, 1]
    # cluster 0: (1.2, 1.6) + (0.3, 0.4) over 2; cluster 1: (-1.2, 1.6); each moved from the start (1, 1)
    assert torch.allclose(models, torch.tensor([[1.75, 2.0], [-0.2, 2.6]], dtype=torch.float64), atol=1e-6)
    assert float((models[1] - 1).norm()) <= 2.0 + 1e-6
    assert found.within_clip == (1.0, 3.0)  # only the update of norm 0.5 was within the clip


def test_a_client_with_a_row_in_each_of_two_clusters_is_clipped_as_a_whole():
    """Two rows a client (FedEM's components): each row is clipped to C / sqrt(2), so a client's two rows together
    stay within C, and a row within its clip counts 1/2, so the count is in clients."""
    found = mechanism(z=1e-9, clip=2.0)  # a row's clip: sqrt(2)
    # client A: (3, 4) to cluster 0 (norm 5, clipped to sqrt(2) (0.6, 0.8)), (0.3, 0.4) to cluster 1 (within);
    # client B: (0, 1) to cluster 0 (within), (-6, 8) to cluster 1 (norm 10, clipped to sqrt(2) (-0.6, 0.8))
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 1.0], [-6.0, 8.0]])
    active, models = aggregate(found, [0, 1, 0, 1], updates, torch.tensor([1.0, 1.0]), rows_per_client=2)
    r = math.sqrt(2)
    expected = torch.tensor(
        [[1 + 0.6 * r / 2, 1 + (0.8 * r + 1) / 2], [1 + (0.3 - 0.6 * r) / 2, 1 + (0.4 + 0.8 * r) / 2]],
        dtype=torch.float64,
    )
    assert active.tolist() == [0, 1] and torch.allclose(models, expected, atol=1e-6)
    assert found.within_clip == (1.0, 2.0)  # 2 rows of 4 within: 1 client's worth of 2


@pytest.mark.parametrize("rows_per_client", [1, 3])
def test_the_noise_is_sigma_times_the_clients_clip_however_many_rows_it_sends(rows_per_client):
    found = mechanism(z=0.7, clip=3.0)
    dim = 40_000
    _, models = aggregate(found, [1], torch.zeros(1, dim), torch.zeros(dim), rows_per_client)
    assert abs(float(models[0].std()) - 0.7 * 3.0) < 0.02 * 0.7 * 3.0


def test_fedem_under_dp_clips_each_clients_copies_together():
    """Two clients, two components, clip C = 2, next to no noise: each copy's update is clipped to C / sqrt(2) (so a
    client's two copies together stay within C) and each component moves by the mean of its two clipped rows."""
    fed = small_federation(
        FedEM(num_components=2), num_clients=2, rounds=1, privacy=PrivacyConfig(noise_multiplier=1e-9, clip=2.0)
    )
    alg, r = fed.algorithm, math.sqrt(2)
    fed.extension(PrivacyMechanism).begin_round(1)
    start = alg.models.clone()
    moves = torch.zeros(2, 2, start.shape[1])  # (client, component, d): updates on the first three entries
    moves[0, 0, :2] = torch.tensor([3.0, 4.0])  # norm 5: clipped to sqrt(2) (0.6, 0.8)
    moves[0, 1, 2] = 0.1  # within
    moves[1, 0, 0] = 6.0  # clipped to sqrt(2) (1, 0)
    moves[1, 1, 1] = 8.0  # clipped to sqrt(2) (0, 1)
    copies = start + moves
    component = alg.assignment[:2]  # each client sends its copy of the component it started from
    updates = Updates(
        torch.tensor([0, 1]),
        copies[[0, 1], component],
        start[component],
        fed.server.clients.train_sizes,
        torch.zeros(2),
        state={"copies": copies, "component": component, "mixture": alg.mixture.read([0, 1])},
    )
    alg.aggregate(1, RoundUpdates.of(updates))
    expected = start.clone()
    expected[0, :2] += torch.tensor([0.6 * r + r, 0.8 * r]) / 2
    expected[1, 1:3] += torch.tensor([r, 0.1]) / 2
    assert torch.allclose(alg.models, expected, atol=1e-6)


def test_fedem_under_dp_steps_the_accountant_once_a_round_for_its_clients():
    """The privacy unit is the client: one round of all 4 clients (sample rate 1) at z spends exactly one Gaussian
    mechanism's RDP epsilon (not one per component, nor one at z / sqrt(2))."""
    fed = small_federation(
        FedEM(num_components=2), num_clients=4, rounds=1, privacy=PrivacyConfig(noise_multiplier=1.5, clip=1.0)
    )
    result = fed.run_round(1)
    assert result.scalars["privacy/epsilon"] == pytest.approx(rdp_epsilon(1.5, 1, DELTA), rel=1e-9)
    assert result.scalars["privacy/epsilon"] > 0


def test_updates_read_lazily_are_clipped_and_noised_as_the_built_updates():
    """OCFL hands the aggregator its updates as `Differences` (built on demand): the same clipped, noised means."""
    g = torch.Generator().manual_seed(0)
    starts = torch.randn(6, 30, generator=g, dtype=torch.float64)
    params = starts + torch.randn(6, 30, generator=g, dtype=torch.float64)
    found = []
    for values in (params - starts, Differences(params, starts)):
        rows = mechanism(clip=2.0).aggregator(3, 30, torch.float64, torch.device("cpu"), None)
        rows.add(torch.tensor([0, 2, 2, 0, 2, 0]), torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0]), values)
        found.append(rows.means())
    assert torch.equal(found[0][0], found[1][0]) and torch.equal(found[0][1], found[1][1])


@pytest.mark.parametrize("members", [1, 4])
def test_the_noise_has_standard_deviation_sigma_times_clip_over_the_members(members):
    found = mechanism(z=0.7, clip=3.0)
    dim = 40_000
    _, models = aggregate(found, [2] * members, torch.zeros(members, dim), torch.zeros(dim))
    measured = float(models[0].std())
    expected = 0.7 * 3.0 / members
    assert abs(measured - expected) < 0.02 * expected  # 40,000 draws: the std's relative error is about 0.4 %
    assert abs(float(models[0].mean())) < 5 * expected / math.sqrt(dim)


def test_the_noise_is_a_function_of_seed_round_and_cluster():
    first, again = mechanism(), mechanism()
    a = aggregate(first, [0], torch.zeros(1, 100), torch.zeros(100))[1]
    b = aggregate(again, [0], torch.zeros(1, 100), torch.zeros(100))[1]
    other_cluster = aggregate(again, [1], torch.zeros(1, 100), torch.zeros(100))[1]
    assert torch.equal(a, b) and not torch.equal(a, other_cluster)


def test_adaptive_clipping_moves_the_clip_towards_the_quantile():
    # Andrew et al.: C <- C exp(-eta (b - gamma)); every update within the clip (b = 1), gamma 0.5, eta 0.2
    found = mechanism(z=1e-6, clip=2.0, adaptive=True, count_noise=1e-5)
    aggregate(found, [0, 0, 0, 0], torch.full((4, 3), 0.1), torch.zeros(3))
    scalars, _ = found.end_round(1, 4)  # 4 of the 8 clients
    assert scalars["privacy/clip"] == 2.0  # the clip this round used
    assert found.clip == pytest.approx(2.0 * math.exp(-0.2 * 0.5), rel=1e-4)
    # the updates' noise keeps the pair as private as noise z (Theorem 1): (1 - 1/4)^(-1/2) for z = sigma_b = 1
    assert update_noise(1.0, 1.0) == pytest.approx(1 / math.sqrt(0.75))


def analytic_gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    """The exact epsilon of `rounds` Gaussian mechanisms of noise z without sampling: one Gaussian of mu = sqrt(T)/z,
    delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) ("Improving the Gaussian Mechanism for Differential
    Privacy", Balle and Wang, ICML 2018, Theorem 8), solved for eps."""
    mu = math.sqrt(rounds) / z
    return brentq(lambda e: norm.cdf(mu / 2 - e / mu) - math.exp(e) * norm.cdf(-mu / 2 - e / mu) - delta, 0, 100)


def rdp_epsilon(z: float, rounds: int, delta: float) -> float:
    """RDP of the Gaussian mechanism, T alpha / (2 z^2) ("Renyi Differential Privacy", Mironov, 2017, Proposition 7),
    converted by "Hypothesis Testing Interpretations and Renyi Differential Privacy" (Balle et al., AISTATS 2020,
    Theorem 21) over Opacus's orders."""
    alphas = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)), dtype=float)
    rdp = rounds * alphas / (2 * z * z)
    return float(np.min(rdp - (np.log(delta) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)))


@pytest.mark.parametrize("z, rounds", [(2.0, 10), (1.1, 1), (4.0, 50)])
def test_epsilon_matches_closed_forms_to_two_decimals(z, rounds):
    prv, rdp = make_accountant("prv"), make_accountant("rdp")
    for _ in range(rounds):
        prv.step(noise_multiplier=z, sample_rate=1.0)
        rdp.step(noise_multiplier=z, sample_rate=1.0)
    assert round(epsilon_of(prv, DELTA, eps_error=1e-3), 2) == round(analytic_gaussian_epsilon(z, rounds, DELTA), 2)
    assert round(epsilon_of(rdp, DELTA), 2) == round(rdp_epsilon(z, rounds, DELTA), 2)


def test_epsilon_of_opacus_published_configuration():
    """Opacus's own accountant tests publish: z = 1.5, sample rate 0.04, 90 epochs (2,250 steps), delta 1e-5 ->
    RDP epsilon 7.32911117143. The mechanism's accountant, stepped as a run of 2,250 rounds with one client of 25
    a round, reports it: 2,249 rounds restored from a checkpoint's history, then the last one run."""
    found = PrivacyMechanism(
        PrivacyConfig(noise_multiplier=1.5, clip=1.0), rounds=2250, clients_per_round=1, num_clients=25, seed_parts=[0]
    )
    found.load_state_dict({"history": [[1.5, 0.04, 2249]], "clip": 1.0, "noise_multiplier": 1.5})
    found.begin_round(2250)
    found.released_sums(1.0, 1.0)  # what an aggregator reports when it releases its noised sums
    scalars, _ = found.end_round(2250, 1)  # 1 of the 25 clients
    assert round(scalars["privacy/epsilon"], 2) == round(7.32911117143, 2)


def test_sampling_amplifies_privacy_and_rdp_bounds_prv():
    accountants = {(kind, q): make_accountant(kind) for kind in ("rdp", "prv") for q in (0.1, 1.0)}
    for (kind, q), accountant in accountants.items():
        for _ in range(20):
            accountant.step(noise_multiplier=1.5, sample_rate=q)
    eps = {key: epsilon_of(accountant, DELTA) for key, accountant in accountants.items()}
    assert eps[("rdp", 0.1)] < eps[("rdp", 1.0)] / 3 and eps[("prv", 0.1)] < eps[("prv", 1.0)] / 3
    assert eps[("prv", 0.1)] <= eps[("rdp", 0.1)] + 0.01  # PRV is the tighter of the two


def test_target_epsilon_sets_the_noise_for_the_configured_rounds():
    found = PrivacyMechanism(
        PrivacyConfig(clip=1.0, target_epsilon=4.0), rounds=10, clients_per_round=5, num_clients=20, seed_parts=[0]
    )
    accountant = make_accountant("rdp")
    for _ in range(10):
        accountant.step(noise_multiplier=found.noise_multiplier, sample_rate=0.25)
    assert 3.9 < epsilon_of(accountant, DELTA) <= 4.0


def rows(path, drop=("time/round_s",)):
    with path.open() as f:
        return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]


def test_the_run_stops_before_the_target_epsilon_is_exceeded(tmp_path, tiny_run_args):
    args = tiny_run_args + [
        "--run_name",
        "budget",
        "--federation.rounds",
        "10",
        "--privacy.noise_multiplier",
        "2",
        "--privacy.clip",
        "1",
        "--privacy.target_epsilon",
        "8",
    ]
    assert main(args) == 0
    metrics = rows(tmp_path / "budget" / "metrics.csv")
    epsilons = [float(r["privacy/epsilon"]) for r in metrics]
    # q = 1, z = 2: rdp epsilon after T rounds, worked independently; the run keeps the rounds within 8
    expected = [rdp_epsilon(2.0, t, DELTA) for t in range(1, 11)]
    assert epsilons == pytest.approx(expected[: len(epsilons)], abs=1e-9)
    assert epsilons[-1] <= 8 < expected[len(epsilons)]
    summary = json.loads((tmp_path / "budget" / "summary.json").read_text())
    assert "target_epsilon" in summary["stopped"] and summary["rounds"] == len(epsilons) < 10


def test_resume_gives_the_same_epsilon_and_numbers(tmp_path, tiny_run_args, monkeypatch):
    args = tiny_run_args + [
        "--federation.rounds",
        "4",
        "--privacy.noise_multiplier",
        "1.5",
        "--privacy.clip",
        "0.5",
        "--privacy.adaptive",
        "true",
        "--privacy.count_noise",
        "1",
        "--algorithm.init_args.participation",
        "0.5",
    ]
    assert main(args + ["--run_name", "whole"]) == 0
    crashed = tmp_path / "crashed"
    crash_and_resume(args, crashed, monkeypatch)
    whole = rows(tmp_path / "whole" / "metrics.csv")
    assert rows(crashed / "metrics.csv") == whole
    assert len({r["privacy/clip"] for r in whole}) == 4 and float(whole[-1]["privacy/epsilon"]) > 0


def test_a_checkpoint_that_kept_dp_under_aggregation_resumes_with_its_accountant():
    """Format 2 kept the accountant's history and the clip under the federation's `aggregation` (None without DP):
    upgraded, a resumed run takes them (2 rounds at z = 1.5 and sample rate 1: two Gaussian mechanisms' epsilon)."""
    fed = small_federation(num_clients=4, rounds=3, privacy=PrivacyConfig(noise_multiplier=1.5, clip=1.0))
    written = {k: v for k, v in fed.state_dict().items() if k != "privacy"}
    written["aggregation"] = {"history": [[1.5, 1.0, 2]], "clip": 0.7, "noise_multiplier": 1.5}
    state = checkpoint.upgrade({"federation": written, "callbacks": {}, "format_version": 2}, [])
    assert state["format_version"] == 6 and "aggregation" not in state["federation"]
    fed.load_state_dict(state["federation"])
    found = fed.extension(PrivacyMechanism)
    assert found.clip == 0.7 and epsilon_of(found.accountant, DELTA) == pytest.approx(rdp_epsilon(1.5, 2, DELTA))
    without = checkpoint.upgrade({"federation": {"round": 1, "aggregation": None}, "format_version": 2}, [])
    assert without["federation"] == {"round": 1}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--privacy.noise_multiplier", "1"], "privacy.clip must be given"),
        (["--privacy.clip", "1"], "privacy needs privacy.noise_multiplier or privacy.target_epsilon"),
        (
            ["--privacy.noise_multiplier", "1", "--privacy.clip", "1", "--aggregator.rule", "median"],
            "needs aggregator.rule mean",
        ),
        (
            ["--privacy.noise_multiplier", "1", "--privacy.clip", "1", "--algorithm", "local"],
            "Local combined its clients' updates in round 1 without the engine's cluster aggregator, so the privacy "
            "section could not apply",
        ),
        (
            ["--privacy.noise_multiplier", "3", "--privacy.clip", "1", "--privacy.adaptive", "true"],
            "raise privacy.count_noise above 1.5",
        ),
    ],
)
def test_bad_privacy_settings_are_refused_in_one_line_without_a_run_folder(
    tmp_path, tiny_run_args, capsys, extra, message
):
    assert main(tiny_run_args + ["--run_name", "bad", *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and message in error, error
    assert not (tmp_path / "bad").exists()


def test_streamed_groups_give_the_sums_of_one_group():
    """DP's sums are streamed a group at a time: three groups give what one does (float64 sums, one noise draw)."""
    torch.manual_seed(1)
    updates, clusters = torch.randn(9, 50), [0, 1, 2, 0, 1, 2, 0, 0, 1]
    whole = aggregate(mechanism(z=0.3, clip=2.0), clusters, updates, torch.ones(50))
    grouped = mechanism(z=0.3, clip=2.0)
    rows = grouped.aggregator(3, 50, torch.float64, torch.device("cpu"), None)
    for part in (slice(0, 2), slice(2, 7), slice(7, 9)):
        starts = torch.ones(len(updates[part]), 50)
        rows.add(torch.tensor(clusters[part]), torch.ones(len(starts)), starts + updates[part], starts)
    active, models = rows.means()
    assert torch.equal(active, whole[0]) and torch.allclose(models, whole[1], rtol=0, atol=1e-12)
