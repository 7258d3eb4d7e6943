"""The clients of a round: an exact count (`federation.clients_per_round`) honoured by every algorithm, reproducible
per seed and across a resume, its bad inputs refused in one line; and a share that float rounding never enlarges."""

import pytest
import torch

from fedlight import Algorithm, FederationConfig
from fedlight.aggregators.privacy import PrivacyConfig, PrivacyMechanism
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fesem import FeSEM
from fedlight.algorithms.flhc import FLHC
from fedlight.algorithms.flis import FlisHC
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.local import Local
from fedlight.plugin.cohort import Cohort, share_count
from fedlight.run.cli import main

from helpers.federations import every_row, small_federation

CLIENTS, COUNT = 12, 3
MAKERS = {"fedavg": FedAvg, "ifca": lambda: IFCA(num_clusters=2), "ditto": lambda: Ditto(lam=0.5), "local": Local}


def recorded_cohorts(federation, rounds: range) -> list[list[int]]:
    """Run `rounds` of `federation`, recording the clients its algorithm selects in each. A round may ask more than
    once (IFCA asks in `begin_round`, to pick its clients' clusters before they train): the same clients each time."""
    algorithm, cohorts = federation.algorithm, {}
    select = algorithm.select_clients

    def recorded(round: int) -> list[int]:
        clients = select(round)
        assert cohorts.setdefault(round, clients) == clients, f"round {round} selected other clients when asked again"
        return clients

    algorithm.select_clients = recorded
    for round in rounds:
        assert federation.run_round(round).clients_trained == COUNT
    return [cohorts[round] for round in rounds]


def counted(make, seed: int = 0, rounds: int = 3):
    return small_federation(make(), num_clients=CLIENTS, rounds=rounds, seed=seed, clients_per_round=COUNT)


# ----------------------------------------------------------------------------- a share's count


@pytest.mark.parametrize(
    "share, clients, expected",
    [
        (10 / 3400, 3400, 10),  # 10 of LEAF's 3,400 writers as a share
        (0.00294, 3400, 10),  # rounded down as a decimal: 9.996 -> 10
        (0.07, 100, 7),  # the float product is 7.000000000000001: its plain ceiling was 8
        (0.14, 100, 14),  # 14.000000000000002
        (0.105, 100, 11),  # 10.5: a real fraction still rounds up
        (0.001, 100, 1),  # at least one
    ],
)
def test_a_share_selects_the_ceiling_of_the_exact_product(share, clients, expected):
    assert share_count(share, clients) == expected


def test_the_share_m_over_n_selects_exactly_m_clients():
    wrong = [(m, n) for n in range(1, 400) for m in range(1, n + 1) if share_count(m / n, n) != m]
    assert wrong == []


# ----------------------------------------------------------------------------- the count every round


@pytest.mark.parametrize("name", list(MAKERS))
def test_every_round_trains_exactly_the_count(name):
    cohorts = recorded_cohorts(counted(MAKERS[name]), range(1, 4))
    assert [len(set(c)) for c in cohorts] == [COUNT] * 3
    assert all(0 <= k < CLIENTS for c in cohorts for k in c)
    assert len({tuple(c) for c in cohorts}) > 1  # drawn anew each round


@pytest.mark.parametrize("name", ["fedavg", "ifca", "ditto"])
def test_the_same_seed_draws_the_same_cohorts_and_another_seed_others(name):
    first = recorded_cohorts(counted(MAKERS[name], seed=0), range(1, 4))
    assert recorded_cohorts(counted(MAKERS[name], seed=0), range(1, 4)) == first
    assert recorded_cohorts(counted(MAKERS[name], seed=1), range(1, 4)) != first


@pytest.mark.parametrize("name, kept", [("fedavg", ()), ("ifca", ("assignment",)), ("ditto", ("personal_models",))])
def test_a_resumed_run_draws_the_same_cohort_and_ends_the_same(name, kept):
    whole = counted(MAKERS[name])
    recorded_cohorts(whole, range(1, 3))
    state = whole.state_dict()
    state["algorithm"] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state["algorithm"].items()}
    resumed = counted(MAKERS[name])
    resumed.load_state_dict(state)
    assert recorded_cohorts(resumed, range(3, 4)) == recorded_cohorts(whole, range(3, 4))
    for attribute in ("models", *kept):
        assert torch.equal(
            every_row(getattr(whole.algorithm, attribute)), every_row(getattr(resumed.algorithm, attribute))
        ), attribute


def test_the_count_sets_the_privacy_sample_rate_and_the_robust_rules_clients():
    fed = small_federation(
        FedAvg(), num_clients=CLIENTS, clients_per_round=COUNT, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0)
    )
    assert fed.extension(PrivacyMechanism).sample_rate == COUNT / CLIENTS
    with pytest.raises(ValueError, match="for krum with 3 clients a round"):  # Krum needs 2f + 3 = 5
        small_federation(FedAvg(), num_clients=CLIENTS, clients_per_round=COUNT, aggregator="krum", aggregator_f=1)


# ----------------------------------------------------------------------------- refused in one line


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert len(text.splitlines()) == 1, text
    return text


def test_bad_counts_are_one_line_naming_the_setting():
    with pytest.raises(ValueError) as error:
        FederationConfig(clients_per_round=0)
    assert "federation.clients_per_round must be at least 1" in one_line(error)
    with pytest.raises(ValueError) as error:
        Cohort(3400, clients_per_round=3401)
    assert "more than the 3,400 clients: give at most 3400" in one_line(error)
    with pytest.raises(ValueError) as error:
        small_federation(FedAvg(participation=0.5), num_clients=CLIENTS, clients_per_round=COUNT)
    assert "give one of the two" in one_line(error)


@pytest.mark.parametrize(
    "make, when",
    [
        (lambda: FLHC(cluster_round=2, num_clusters=2), "clustering round"),
        (lambda: FeSEM(num_clusters=2), "seeding round"),
        (lambda: FlisHC(), "phase 0"),
    ],
)
def test_a_method_that_trains_every_client_in_a_round_refuses_a_smaller_count(make, when):
    with pytest.raises(ValueError) as error:
        small_federation(make(), num_clients=CLIENTS, clients_per_round=COUNT, public_size=60)
    assert when in one_line(error) and "leave clients_per_round out" in str(error.value)


def test_an_override_that_breaks_the_count_stops_the_round_in_one_line():
    class Everyone(Algorithm):
        def select_clients(self, round):
            return list(range(self.server.num_clients))

    fed = small_federation(Everyone(), num_clients=CLIENTS, clients_per_round=COUNT)
    with pytest.raises(ValueError) as error:
        fed.run_round(1)
    assert "Everyone.select_clients chose 12 clients in round 1" in one_line(error)


# ----------------------------------------------------------------------------- the command line


def test_the_start_line_says_the_count_and_bad_input_leaves_no_run_folder(tmp_path, tiny_run_args, capsys):
    fedavg = tiny_run_args + ["--algorithm", "fedavg"]
    assert main(fedavg + ["--run_name", "two", "--federation.rounds", "1", "--federation.clients_per_round", "2"]) == 0
    assert any(line.startswith("FedAvg, 2 of 6 clients a round: ") for line in capsys.readouterr().out.splitlines())
    for given in (
        ["--federation.clients_per_round", "7"],
        ["--federation.clients_per_round", "0"],
        ["--federation.clients_per_round", "2", "--algorithm.init_args.participation", "0.5"],
    ):
        assert main(fedavg + given + ["--run_name", "refused"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "clients_per_round" in err, err
        assert not (tmp_path / "refused").exists()
