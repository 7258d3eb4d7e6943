"""What a client sends beside its trained model is one schema every round extension reads
(`fedlight.plugin.message`): an entry that is neither a client-state store nor declared stops the run in one line;
DP refuses a summed statistic or a per-client value (FedRC's label counts); FedBuff re-bases a model copy whose origin
the algorithm gives (StoCFL's global copy, FedEM's copies) and refuses a round that needs every client (SR-FCA)
unless the buffer takes every client, where it is the synchronous run bit for bit; an update attack tampers with
every model entry an algorithm says the origin of."""

import re

import pytest
import torch

from fedlight.aggregators.attacks import Attack, AttackConfig
from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedem import FedEM
from fedlight.algorithms.fedrc import FedRC
from fedlight.algorithms.srfca import SRFCA
from fedlight.algorithms.stocfl import StoCFL
from fedlight.plugin import MODEL, SUMMED, Algorithm, RoundExtension, Trained
from fedlight.plugin.message import MessageSchema
from fedlight.system.config import SystemConfig

from helpers.federations import small_federation


class SendsCounts(Algorithm):
    """FedAvg whose clients also return their label counts; `declare` says so in setup, or not."""

    def __init__(self, declare: str | None = None) -> None:
        super().__init__()
        self.declare = declare

    def setup(self, server) -> None:
        super().setup(server)
        if self.declare:
            server.message.sends("label_counts", self.declare)

    def train_group(self, round: int, clients: list[int], starts: torch.Tensor) -> Trained:
        trained = super().train_group(round, clients, starts)
        split = self.server.clients.split("train")
        counts = torch.stack([torch.bincount(split.client(c)[1], minlength=10).float() for c in clients])
        return Trained(trained.params, trained.loss, trained.logs, {"label_counts": counts})


class Listens(RoundExtension):
    """Records the schema and the algorithm it is handed."""

    name = "listens"

    def check_message(self, schema: MessageSchema, algorithm: str) -> None:
        self.seen = (algorithm, dict(schema.entries), list(schema.every_client))


def test_an_entry_that_is_neither_a_store_nor_declared_stops_the_run_in_one_line():
    fed = small_federation(SendsCounts(), rounds=1)
    with pytest.raises(ValueError) as stopped:
        fed.run_round(1)
    message = str(stopped.value)
    assert "\n" not in message and "SendsCounts's clients return 'label_counts'" in message
    assert "server.message.sends('label_counts', kind)" in message


def test_a_store_entry_is_the_clients_own_and_needs_no_declaration():
    fed = small_federation(Ditto(lam=0.5), rounds=1)
    fed.run_round(1)
    assert fed.server.message.entries == {}


def test_every_extension_reads_the_declared_entries_and_the_rounds_that_need_every_client():
    listens = Listens()
    fed = small_federation(SendsCounts(declare=SUMMED), rounds=1)
    assert fed.server.message.entries == {"label_counts": SUMMED}
    from fedlight import Federation
    from fedlight.datamodules import DigitsFederated, Rotations
    from fedlight.models import Classifier, SmallCNN
    from fedlight import FederationConfig

    Federation(
        DigitsFederated(num_clients=6, partition=Rotations(2)),
        Classifier(SmallCNN(1, 10, 8, width=8)),
        SRFCA(),
        FederationConfig(rounds=1, accelerator="cpu", vectorize=0),
        extensions=[listens],
    )
    assert listens.seen == ("SRFCA", {}, ["in its one-shot round (round 1), whose local models it clusters"])
    fed.run_round(1)  # declared: it runs


@pytest.mark.parametrize("kind, refused", [(SUMMED, True), (MODEL, False)])
def test_privacy_refuses_a_summed_statistic_and_takes_a_model_entry(kind, refused):
    def make():
        return small_federation(
            SendsCounts(declare=kind), rounds=1, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0)
        )

    if refused:
        with pytest.raises(
            ValueError,
            match=re.escape(
                "privacy: SendsCounts's clients send 'label_counts' (a "
                "statistic summed over clients) beside their models"
            ),
        ):
            make()
    else:
        make()


def test_fedrc_under_privacy_is_refused_as_its_label_counts_go_in_the_clear():
    with pytest.raises(ValueError) as refused:
        small_federation(FedRC(num_components=2), rounds=1, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("privacy: FedRC's clients send 'label_mass' (a statistic summed over clients)")


def test_an_unknown_kind_is_refused_with_the_nearest():
    with pytest.raises(
        ValueError,
        match=r"must be one of model, summed, per_client, routing, got 'sumed' \(did you "
        r"mean 'summed'\?\)",
    ):
        MessageSchema({}).sends("x", "sumed")


def test_srfca_under_a_smaller_buffer_is_refused_in_one_line():
    with pytest.raises(ValueError) as refused:
        small_federation(SRFCA(), num_clients=6, rounds=1, system=SystemConfig(buffer_size=2))
    assert str(refused.value) == (
        "system.buffer_size: SRFCA needs every client's update in its one-shot round (round "
        "1), whose local models it clusters, but FedBuff aggregates the first 2 arrivals of "
        "6 clients: leave buffer_size out for SRFCA"
    )


def test_srfca_under_a_buffer_of_every_client_is_the_synchronous_run_bit_for_bit():
    runs = []
    for system in (SystemConfig(), SystemConfig(buffer_size=6)):
        fed = small_federation(SRFCA(refine_rounds=1, init_epochs=2), num_clients=6, rounds=2, system=system)
        runs.append((fed, [fed.run_round(t) for t in (1, 2)]))
    (sync, sync_rounds), (buffered, buffered_rounds) = runs
    assert torch.equal(sync.algorithm.models, buffered.algorithm.models)
    assert (sync.algorithm.cluster_labels() == buffered.algorithm.cluster_labels()).all()
    assert [r.evaluation for r in sync_rounds] == [r.evaluation for r in buffered_rounds]


@pytest.mark.parametrize(
    "make, entry",
    [
        (StoCFL, "global_copy"),
        (lambda: FedEM(num_components=2), "copies"),
    ],
)
def test_an_update_attack_tampers_with_every_model_entry_against_the_model_it_was_trained_from(make, entry):
    """sign_flip with scale 10: an attacker's rows of a model entry become start - 10 (trained - start), its start the
    server model the entry was trained from (StoCFL's omega, FedEM's components); honest rows are as trained."""
    attack = AttackConfig(kind="sign_flip", fraction=0.5)
    clean, attacked = (small_federation(make(), num_clients=6, rounds=1, attack=a) for a in (None, attack))
    clients = list(range(6))
    starts = attacked.server.message.trained_from[entry](clients).double()
    plain, tampered = (fed.execution.train(1, clients).state[entry].double() for fed in (clean, attacked))
    malicious = attacked.extension(Attack).is_malicious
    assert 0 < malicious.sum() < 6
    for c in clients:
        expected = starts[c] - 10 * (plain[c] - starts[c]) if malicious[c] else plain[c]
        assert torch.allclose(tampered[c], expected, atol=1e-4), c


@pytest.mark.parametrize("make", [StoCFL, lambda: FedEM(num_components=2)])
def test_a_model_entry_of_known_origin_runs_under_fedbuff_and_a_buffer_of_the_cohort_is_synchronous(make):
    runs = []
    for system in (SystemConfig(), SystemConfig(buffer_size=6)):
        fed = small_federation(make(), num_clients=6, rounds=2, system=system)
        runs.append((fed, [fed.run_round(t) for t in (1, 2)]))
    (sync, sync_rounds), (buffered, buffered_rounds) = runs
    assert torch.equal(sync.algorithm.models, buffered.algorithm.models)
    assert [r.evaluation for r in sync_rounds] == [r.evaluation for r in buffered_rounds]


def test_a_stale_model_entry_is_re_based_on_the_models_it_would_be_trained_from_now():
    """Client 0's global copy was trained [1, 1] -> [3, -3] from omega = [1, 1]; three versions later (weight 1/2)
    omega is [5, 1]: entry 0 moved, 5 + 1/2 x (3 - 1) = 6; entry 1 did not, -3 as trained."""
    import numpy as np

    from fedlight.plugin.updates import Updates
    from fedlight.system.buffered import InFlight, take_arrivals

    omega = {"now": torch.tensor([5.0, 1.0])}
    trained_from = {"global_copy": lambda clients: omega["now"].expand(len(clients), -1)}
    waiting = InFlight(
        np.array([0]),
        np.array([0]),
        np.array([2.0]),
        torch.tensor([[3.0, -3.0]]),
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([0.5]),
        {},
        {"global_copy": torch.tensor([[3.0, -3.0]])},
        {"global_copy": torch.tensor([[1.0, 1.0]])},
    )
    arrived, _ = take_arrivals(
        waiting,
        None,
        np.zeros(0),
        3,
        1,
        "polynomial",
        lambda c: torch.tensor([1.0, 1.0]),
        torch.tensor([4.0]),
        trained_from,
    )
    assert arrived.updates.state["global_copy"].tolist() == [[6.0, -3.0]]
    fresh = Updates(
        torch.tensor([1]),
        torch.tensor([[2.0, 2.0]]),
        torch.tensor([[5.0, 1.0]]),
        torch.tensor([9.0]),
        torch.tensor([0.7]),
        {},
        {"global_copy": torch.tensor([[4.0, 0.0]])},
    )
    arrived, left = take_arrivals(
        InFlight.empty(torch.zeros(2)),
        fresh,
        np.array([1.0]),
        3,
        1,
        "polynomial",
        lambda c: torch.tensor([5.0, 1.0]),
        torch.tensor([4.0, 9.0]),
        trained_from,
    )
    assert arrived.updates.state["global_copy"].tolist() == [[4.0, 0.0]]  # fresh: as trained
