"""DP's accounting follows how a round's clients are chosen: amplification by sampling only for a uniform draw
independent of the clients' data. A loss-driven selection (power-of-choice, Oort) is refused in one line; a
non-uniform selection is accounted per client, its epsilon the composition worked by hand and larger than the uniform
run's; an algorithm whose round's clients are not the run's draw is accounted per client in that round only; the
start line and summary.json say which accounting ran, and a resumed run keeps it."""

import copy

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp

from fedlight.aggregators.privacy import PrivacyConfig, PrivacyMechanism
from fedlight.algorithms.fedavg import FedAvg
from fedlight.system.config import SystemConfig

from helpers.federations import small_federation

ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))  # Opacus's default RDP orders
DELTA = 1e-5


def epsilon_from_rdp(rdp: np.ndarray, delta: float = DELTA) -> float:
    """(epsilon, delta) from RDP at ORDERS, as Balle et al. 2020 (the conversion Opacus uses)."""
    return float(np.min(rdp + np.log1p(-1 / ORDERS) - (np.log(delta) + np.log(ORDERS)) / (ORDERS - 1)))


def worst_client_epsilon(z: float, sampled: list[float], releases: int) -> float:
    """Each sampled round at its rate (Mironov et al.'s sampled Gaussian RDP), then `releases` unsampled Gaussian
    mechanisms (RDP alpha / (2 z^2) each), composed by adding RDP."""
    rdp = sum((compute_rdp(q=q, noise_multiplier=z, steps=1, orders=ORDERS) for q in sampled), np.zeros(len(ORDERS)))
    return epsilon_from_rdp(rdp + releases * ORDERS / (2 * z**2))


class FirstClientsInRoundTwo(FedAvg):
    """FedAvg whose round 2 takes clients 0, 1 and 2, not the run's draw: a selection of its own."""

    def select_clients(self, round: int) -> list[int]:
        return [0, 1, 2] if round == 2 else super().select_clients(round)


def private_run(algorithm, rounds: int, system: SystemConfig | None = None, z: float = 2.0):
    return small_federation(
        algorithm,
        num_clients=6,
        rounds=rounds,
        clients_per_round=3,
        eval_every=rounds,
        system=system,
        privacy=PrivacyConfig(noise_multiplier=z, clip=1.0),
    )


@pytest.mark.parametrize("selection", ["power_of_choice", "oort"])
def test_a_loss_driven_selection_is_refused_under_privacy_in_one_line(selection):
    with pytest.raises(ValueError) as refused:
        private_run(FedAvg(), 2, SystemConfig(selection=selection, candidates=4))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("privacy:") and selection in message
    assert "losses" in message and "leave privacy out" in message


def test_a_uniform_run_is_accounted_as_sampled_rounds():
    fed = private_run(FedAvg(), 3)
    scalars = [fed.run_round(t).scalars for t in (1, 2, 3)]
    assert scalars[-1]["privacy/epsilon"] == pytest.approx(worst_client_epsilon(2.0, [0.5] * 3, 0), rel=1e-9)
    assert "privacy/most_releases" not in scalars[-1]
    assert fed.extensions.summary()["privacy"]["accounting"] == "sampled"
    assert "amplified by uniform sampling" in fed.describe_threats()


def test_a_selection_by_data_size_is_accounted_per_client_and_costs_more_than_uniform():
    uniform, sized = private_run(FedAvg(), 4), private_run(FedAvg(), 4, SystemConfig(selection="data_size"))
    last = [[fed.run_round(t) for t in (1, 2, 3, 4)][-1].scalars for fed in (uniform, sized)]
    most = int(last[1]["privacy/most_releases"])
    assert 1 <= most <= 4
    assert most == int(sized.extension(PrivacyMechanism).releases.max())
    assert last[1]["privacy/epsilon"] == pytest.approx(worst_client_epsilon(2.0, [], most), rel=1e-9)
    assert last[1]["privacy/epsilon"] > last[0]["privacy/epsilon"]
    summary = sized.extensions.summary()["privacy"]
    assert summary["accounting"] == "each client" and "data_size" in summary["why"]
    assert "each client's releases (system.selection data_size" in sized.describe_threats()


def test_a_round_whose_clients_are_not_the_draw_is_accounted_per_client_that_round_only():
    """Rounds 1 and 3 take the run's draw (3 of 6: q = 1/2); round 2 takes clients 0, 1, 2, released once each."""
    fed = private_run(FirstClientsInRoundTwo(), 3)
    scalars = [fed.run_round(t).scalars for t in (1, 2, 3)]
    assert "privacy/unsampled_rounds" not in scalars[0]
    assert scalars[1]["privacy/unsampled_rounds"] == 1 and scalars[2]["privacy/most_releases"] == 1
    assert fed.extension(PrivacyMechanism).releases.tolist() == [1, 1, 1, 0, 0, 0]
    assert scalars[2]["privacy/epsilon"] == pytest.approx(worst_client_epsilon(2.0, [0.5, 0.5], 1), rel=1e-9)
    assert scalars[2]["privacy/epsilon"] > private_run(FedAvg(), 3).run_round(1).scalars["privacy/epsilon"]
    assert fed.extensions.summary()["privacy"]["accounting"] == "sampled, 1 rounds per client"


def test_a_resumed_run_keeps_its_per_client_rounds():
    whole = private_run(FirstClientsInRoundTwo(), 3)
    whole.run_round(1)
    whole.run_round(2)
    saved = copy.deepcopy(whole.state_dict())
    last = whole.run_round(3).scalars
    resumed = private_run(FirstClientsInRoundTwo(), 3)
    resumed.load_state_dict(saved)
    assert resumed.run_round(3).scalars == last


def test_a_checkpoint_of_per_client_accounting_before_the_sampled_history_is_read_as_its_releases():
    """Before, a run accounted per client saved its most released client's steps as the history beside the releases."""
    mechanism = PrivacyMechanism(PrivacyConfig(noise_multiplier=2.0, clip=1.0), 4, 3, 6, [0])
    mechanism.load_state_dict(
        {"history": [[2.0, 1.0, 2]], "clip": 1.0, "noise_multiplier": 2.0, "releases": [2, 1, 0, 0, 1, 0]}
    )
    assert mechanism.accountant.history == []
    assert mechanism.summary()["privacy"]["epsilon"] == pytest.approx(worst_client_epsilon(2.0, [], 2), rel=1e-9)
