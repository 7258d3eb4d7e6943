"""The virtual clock charges what a method's clients actually ran (`fedlight.system.work_cost`): every round time
below is worked by hand from the clients' sizes, the batch size and the devices' speeds, never read from the code."""

import math

import numpy as np
import pytest

from fedlight.algorithms.apfl import APFL
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.scaffold import SCAFFOLD
from fedlight.system.config import SpeedDistribution, SystemConfig
from fedlight.system.system_model import SystemModel

from helpers.federations import small_federation

SPEED, LINK, BATCH = 200.0, 2.0, 32  # samples a second, Mbit/s, samples a step


def devices(**settings) -> SystemConfig:
    return SystemConfig(compute=SpeedDistribution(SPEED), link=SpeedDistribution(LINK), **settings)


def by_hand(fed):
    """(training samples of each client, its local steps: one epoch of full and short batches, the model's bits)."""
    sizes = fed.data.train.sizes().astype(float)
    steps = np.array([math.ceil(n / BATCH) for n in sizes])
    return sizes, steps, fed.flat.numel * 32.0


def test_fedavgs_round_is_its_local_steps_and_one_model_each_way():
    fed = small_federation(FedAvg(), num_clients=4, rounds=1, system=devices())
    _, steps, bits = by_hand(fed)
    expected = (steps * BATCH / SPEED).max() + 2 * bits / (LINK * 1e6)
    assert fed.run_round(1).scalars["system/round_virtual_s"] == pytest.approx(expected, rel=1e-12)


def test_ifca_pays_for_its_k_loss_passes_and_the_k_models_its_clients_receive():
    """IFCA (k = 3): a client receives the 3 cluster models, passes its training samples forward through each (a
    forward pass a third of a training step's cost), trains the one of least loss and sends it."""
    k = 3
    fed = small_federation(IFCA(num_clusters=k), num_clients=4, rounds=3, eval_every=3, system=devices())
    sizes, steps, bits = by_hand(fed)
    compute = (steps * BATCH + k * sizes / 3) / SPEED
    expected = compute.max() + (k + 1) * bits / (LINK * 1e6)
    plain = (steps * BATCH / SPEED).max() + 2 * bits / (LINK * 1e6)
    seconds = fed.run_round(1).scalars["system/round_virtual_s"]
    assert seconds == pytest.approx(expected, rel=1e-12) and seconds > plain


def test_scaffold_sends_its_control_variate_beside_the_model():
    fed = small_federation(SCAFFOLD(), num_clients=4, rounds=1, system=devices())
    _, steps, bits = by_hand(fed)
    expected = (steps * BATCH / SPEED).max() + 3 * bits / (LINK * 1e6)  # one model down, the model and c_i up
    assert fed.run_round(1).scalars["system/round_virtual_s"] == pytest.approx(expected, rel=1e-12)


def test_power_of_choices_candidates_loss_passes_are_a_phase_before_the_round():
    """d = 4 candidates of 6 each receive the model and pass their training samples forward once; the round then
    trains the 2 of highest loss. The round lasts the slowest candidate's pass, then the slowest trained client."""
    fed = small_federation(
        FedAvg(),
        num_clients=6,
        rounds=1,
        clients_per_round=2,
        system=devices(selection="power_of_choice", candidates=4),
    )
    sizes, steps, bits = by_hand(fed)
    result = fed.run_round(1)
    model = fed.extension(SystemModel)
    candidates = np.flatnonzero(model.last_selection.forward_samples)
    assert len(candidates) == 4
    phase = (sizes[candidates] / 3 / SPEED).max() + bits / (LINK * 1e6)
    trained = np.asarray(fed.algorithm.select_clients(1))
    expected = phase + (steps[trained] * BATCH / SPEED).max() + 2 * bits / (LINK * 1e6)
    assert result.scalars["system/round_virtual_s"] == pytest.approx(expected, rel=1e-12)


def test_a_deadline_the_nominal_work_meets_is_judged_on_the_measured_work_from_the_next_round_on():
    """IFCA's clients meet a deadline set between their nominal time and their counted one: round 1 keeps them (their
    time as last measured, the nominal, met it), runs as long as their counted work takes and counts them late;
    round 2 knows their counted times and drops them."""
    k = 3
    probe = small_federation(IFCA(num_clusters=k), num_clients=4, rounds=2, eval_every=2, system=devices())
    sizes, steps, bits = by_hand(probe)
    nominal = steps * BATCH / SPEED + 2 * bits / (LINK * 1e6)
    counted = (steps * BATCH + k * sizes / 3) / SPEED + (k + 1) * bits / (LINK * 1e6)
    deadline = float(nominal.max()) + 1e-3
    assert (counted > deadline).all()
    fed = small_federation(
        IFCA(num_clusters=k), num_clients=4, rounds=2, eval_every=2, system=devices(deadline_s=deadline)
    )
    first = fed.run_round(1).scalars
    assert first["system/late"] == 4 and first["system/dropped_deadline"] == 0
    assert first["system/round_virtual_s"] == pytest.approx(counted.max(), rel=1e-12)
    second = fed.run_round(2).scalars
    assert second["system/late"] == 0 and second["system/dropped_deadline"] == 3  # the server waits for the first


def test_a_custom_loop_is_charged_its_gradient_passes_apfls_two_models_a_batch():
    """APFL's clients take, on every batch, the gradient of the global model and of their mixed personal one: two
    training steps' work a batch, one model received (the personal one stays on the device)."""
    fed = small_federation(APFL(), num_clients=4, rounds=1, system=devices())
    _, steps, bits = by_hand(fed)
    expected = (2 * steps * BATCH / SPEED).max() + 2 * bits / (LINK * 1e6)
    assert fed.run_round(1).scalars["system/round_virtual_s"] == pytest.approx(expected, rel=1e-12)
