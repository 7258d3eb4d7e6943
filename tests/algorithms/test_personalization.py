"""Layer personalization: layer-count masks (whole and half layers), the engine's re-slicing of personal
storage, FedPer and LG-FedAvg, all checked against hand-listed tensors and hand-computed averages."""

import pytest
import torch

from fedlight import Federation, FederationConfig, RoundUpdates
from fedlight.datamodules import DigitsFederated
from fedlight.run import checkpoint
from fedlight.plugin import personal_part
from fedlight.engine.client_states import ClientStates
from fedlight.plugin.updates import Updates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.lgfedavg import LGFedAvg
from fedlight.training.flat import FlatModel
from fedlight.models import Classifier, FedTSDPCNN, ResNet18, SmallCNN
from fedlight.training.layer_masks import first_layers, half_step, last_layers, layer_count_mask, tensor_names

from helpers.federations import every_row, small_federation

CNN_TENSORS = [
    "conv1.weight",
    "conv1.bias",
    "conv2.weight",
    "conv2.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
]


def covered(flat: FlatModel, mask: torch.Tensor) -> list[str]:
    """The tensors inside `mask`, after checking that the mask covers whole tensors only."""
    names = tensor_names(flat, mask)
    sizes = {e.name: e.numel for e in flat.entries}
    assert int(mask.sum()) == sum(sizes[n] for n in names), "the mask covers part of a tensor"
    return names


# ----------------------------------------------------------------------------- layer counts


def test_first_and_last_layers():
    layers = ["a", "b", "c", "d"]
    assert first_layers(layers, 0) == [] and first_layers(layers, 3) == ["a", "b", "c"]
    assert last_layers(layers, 0) == [] and last_layers(layers, 1) == ["d"] and last_layers(layers, 4) == layers
    for bad in (5, -1, 1.5):
        with pytest.raises(ValueError, match="whole number"):
            last_layers(layers, bad)


def test_half_step_reproduces_the_half_layer_schedule():
    # FedTSDP ("Federated Two Stage Decoupling With Adaptive Personalization Layers", Eq. 11, section 4.5: "from 4
    # to 3.5"; the half-layer rounding is our choice): from 4 layers with psi = 0.98, floor reaches
    # 3.5 / 3.0 / 2.5 / 2.0 after 1 / 7 / 15 / 24 events, round reaches 3.5 / 3.0 / 2.5 after 4 / 11 / 19.
    def first_event(target, rounding):
        return next(k for k in range(100) if half_step(4 * 0.98**k, rounding) <= target)

    assert [first_event(t, "floor") for t in (3.5, 3.0, 2.5, 2.0)] == [1, 7, 15, 24]
    assert [first_event(t, "round") for t in (3.5, 3.0, 2.5)] == [4, 11, 19]
    assert half_step(4.0) == 4.0 and half_step(3.92) == 3.5 and half_step(3.92, "round") == 4.0
    assert half_step(3.5 - 1e-12) == 3.5  # a rounding error below a grid point is that point
    with pytest.raises(ValueError, match="rounding"):
        half_step(3.0, "ceil")


def test_fedtsdp_cnn_half_layer_split_shares_the_weight_and_keeps_the_bias():
    flat = FlatModel(FedTSDPCNN(1, 10, 8))
    shared = layer_count_mask(flat, half_step(4 * 0.98), "first")  # 3.92 -> 3.5
    assert covered(flat, shared) == CNN_TENSORS[:7]
    assert covered(flat, ~shared) == ["fc2.bias"]
    shared = layer_count_mask(flat, half_step(4 * 0.98**7), "first")  # 3.47 -> 3.0: fc2 wholly personal
    assert covered(flat, shared) == CNN_TENSORS[:6]
    assert covered(flat, layer_count_mask(flat, 1, "last")) == ["fc2.weight", "fc2.bias"]
    assert covered(flat, layer_count_mask(flat, 1.5, "first")) == ["conv1.weight", "conv1.bias", "conv2.weight"]


def test_first_and_last_counts_are_complements_on_the_whole_grid():
    flat = FlatModel(FedTSDPCNN(1, 10, 8))
    for doubled in range(9):
        c = doubled / 2
        assert torch.equal(layer_count_mask(flat, c, "first"), ~layer_count_mask(flat, 4 - c, "last"))
    assert not layer_count_mask(flat, 0, "last").any() and layer_count_mask(flat, 4, "first").all()
    with pytest.raises(ValueError, match="half number"):
        layer_count_mask(flat, 3.7)
    with pytest.raises(ValueError, match="half number"):
        layer_count_mask(flat, 4.5)


def test_half_layers_of_a_resnet_block_carry_their_batchnorm_statistics():
    flat = FlatModel(ResNet18(3, 10))
    stem = ["stem.0.weight", "stem.1.weight", "stem.1.bias", "stem.1.running_mean", "stem.1.running_var"]
    half = [
        "layer1.0.conv1.weight",
        "layer1.0.bn1.weight",
        "layer1.0.bn1.bias",
        "layer1.0.bn1.running_mean",
        "layer1.0.bn1.running_var",
    ]
    assert covered(flat, layer_count_mask(flat, 1.5, "first")) == stem + half
    assert covered(flat, layer_count_mask(flat, 0.5, "last")) == ["fc.bias"]


def test_layer_names_of_a_wrapped_network_are_prefixed_and_still_split():
    fed = small_federation(FedAvg(), num_clients=2)
    assert fed.flat.layers() == ["network.conv1", "network.conv2", "network.fc"]
    assert covered(fed.flat, layer_count_mask(fed.flat, 0.5, "last")) == ["network.fc.bias"]


# ----------------------------------------------------------------------------- the engine's personal storage


def two_clusters_of_three_clients():
    """(federation, d, training-set sizes, mask A = entries 0-3, mask B = entries 4-5): cluster models of 1.0 and
    2.0, client 0 in cluster 0, clients 1 and 2 in cluster 1, nothing personal yet."""
    fed = small_federation(FedAvg(), num_clients=3)
    alg, d = fed.algorithm, fed.flat.numel
    alg.models = torch.stack([torch.full((d,), 1.0), torch.full((d,), 2.0)])
    alg.assignment = torch.tensor([0, 1, 1])
    A = torch.zeros(d, dtype=torch.bool)
    A[:4] = True
    B = torch.zeros(d, dtype=torch.bool)
    B[4:6] = True
    return fed, d, fed.server.clients.train_sizes.double(), A, B


def test_set_personal_mask_reslices_storage_by_hand():
    fed, d, sizes, A, B = two_clusters_of_three_clients()
    alg = fed.algorithm
    alg.set_personal_mask(A)  # from the cluster models
    assert alg.personal.row_shape == (4,) and alg.personal.touched().tolist() == []  # nothing stored yet
    assert torch.equal(every_row(alg.personal), torch.tensor([[1.0] * 4, [2.0] * 4, [2.0] * 4]))
    alg.personal.write([0, 1, 2], torch.tensor([[10.0] * 4, [20.0] * 4, [30.0] * 4]))
    trained = torch.full((1, d), 7.0)
    update = Updates(torch.tensor([1]), trained, trained.clone(), torch.tensor([5]), torch.zeros(1))
    alg.set_personal_mask(A | B, update)  # grow: client 1's new entries from its upload
    assert alg.personal.row_shape == (6,)
    assert torch.equal(
        every_row(alg.personal), torch.tensor([[10.0] * 4 + [1.0] * 2, [20.0] * 4 + [7.0] * 2, [30.0] * 4 + [2.0] * 2])
    )
    assert torch.equal(alg.client_model(1)[:6], torch.tensor([20.0] * 4 + [7.0] * 2))
    alg.set_personal_mask(B)  # shrink: A goes back, averaged per cluster
    expected_1 = (sizes[1] * 20 + sizes[2] * 30) / (sizes[1] + sizes[2])
    assert torch.allclose(alg.models[0, :4], torch.full((4,), 10.0))
    assert torch.allclose(alg.models[1, :4], torch.full((4,), float(expected_1)))
    assert torch.equal(every_row(alg.personal), torch.tensor([[1.0] * 2, [7.0] * 2, [2.0] * 2]))
    alg.set_personal_mask(torch.zeros(d, dtype=torch.bool))  # nothing personal: plain cluster models
    assert alg.personal_mask is None and alg.personal is None
    assert torch.equal(alg.client_model(2), alg.models[1])


@pytest.mark.parametrize("chunk_bytes", [personal_part.CHUNK_BYTES, 1], ids=["one chunk", "a client a chunk"])
def test_clients_never_written_keep_their_values_from_when_the_mask_was_set_through_grow_and_shrink(
    monkeypatch, chunk_bytes
):
    """The example above with client 2 never written and moved to cluster 0 after the mask is set: it keeps its
    values from cluster 1 (2.0) and takes its newly personal ones from cluster 0 (1.0), as a (clients x p) tensor
    would hold them, while only the written clients' rows are stored; re-sliced in one chunk or a client at a
    time."""
    monkeypatch.setattr(personal_part, "CHUNK_BYTES", chunk_bytes)
    fed, d, sizes, A, B = two_clusters_of_three_clients()
    alg = fed.algorithm
    alg.set_personal_mask(A)
    alg.personal.write([0, 1], torch.tensor([[10.0] * 4, [20.0] * 4]))
    alg.assignment[2] = 0  # reassigned: its personal values stay
    assert torch.equal(alg.client_model(2)[:6], torch.tensor([2.0] * 4 + [1.0] * 2))
    trained = torch.full((1, d), 7.0)
    update = Updates(torch.tensor([1]), trained, trained.clone(), torch.tensor([5]), torch.zeros(1))
    alg.set_personal_mask(A | B, update)
    assert torch.equal(
        every_row(alg.personal), torch.tensor([[10.0] * 4 + [1.0] * 2, [20.0] * 4 + [7.0] * 2, [2.0] * 4 + [1.0] * 2])
    )
    assert alg.personal.touched().tolist() == [0, 1] and alg.personal.memory_bytes == 2 * 6 * 4
    alg.set_personal_mask(B)  # cluster 0 is now clients 0 and 2
    expected_0 = (sizes[0] * 10 + sizes[2] * 2) / (sizes[0] + sizes[2])
    assert torch.allclose(alg.models[0, :4], torch.full((4,), float(expected_0)))
    assert torch.equal(alg.models[1, :4], torch.full((4,), 20.0))
    assert torch.equal(every_row(alg.personal), torch.tensor([[1.0] * 2, [7.0] * 2, [1.0] * 2]))
    assert alg.personal.touched().tolist() == [0, 1] and alg.personal.memory_bytes == 2 * 2 * 4
    assert fed.client_states.budget.used == 2 * 2 * 4  # the earlier stores' rows left the budget


def test_a_dropped_store_leaves_the_budget_and_the_checkpoints_and_stays_readable():
    states = ClientStates(torch.device("cpu"), 1 << 20)
    old = states.declare("personal_part.1", 5, torch.zeros(3))
    old.write([1, 4], torch.ones(2, 3))
    assert states.budget.used == 2 * 3 * 4
    assert states.drop("personal_part.1") is old
    assert states.budget.used == 0 and states.state_dict() == {}
    assert torch.equal(old.read([4, 0]), torch.tensor([[1.0] * 3, [0.0] * 3]))
    states.declare("personal_part.1", 5, torch.zeros(2))  # the name is free again
    with pytest.raises(KeyError, match="client state 'personal_part.2' is not declared"):
        states.drop("personal_part.2")


# ----------------------------------------------------------------------------- FedPer and LG-FedAvg


def test_fedper_with_no_personal_layers_equals_fedavg():
    a = small_federation(FedAvg(), rounds=2)
    b = small_federation(FedPer(personal_layers=0), rounds=2)
    for r in (1, 2):
        ma, mb = a.run_round(r), b.run_round(r)
    assert b.algorithm.personal is None
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    assert ma.scalars["test/acc_mean"] == mb.scalars["test/acc_mean"]


@pytest.mark.parametrize(
    "algorithm, personal",
    [
        (FedPer(personal_layers=1), ["network.fc.weight", "network.fc.bias"]),
        (
            LGFedAvg(global_layers=1),
            ["network.conv1.weight", "network.conv1.bias", "network.conv2.weight", "network.conv2.bias"],
        ),
        (FedPer(personal_layers=0.5), ["network.fc.bias"]),
    ],
)
def test_personal_layers_are_untouched_by_aggregation(algorithm, personal):
    fed = small_federation(algorithm, num_clients=3)
    alg = fed.algorithm
    assert covered(fed.flat, alg.personal_mask) == personal
    assert alg.personal.row_shape == (int(alg.personal_mask.sum()),)  # memory: the personal part only
    before = alg.models[0].clone()
    updates = fed.execution.train(1, [0, 1, 2])
    alg.aggregate(1, RoundUpdates.of(updates))
    mask = alg.personal_mask
    assert torch.equal(alg.models[0][mask], before[mask])  # the server never averages personal entries
    n = fed.server.clients.train_sizes.double()
    shared_mean = (n[:, None] * updates.params.double()).sum(0) / n.sum()
    assert torch.allclose(alg.models[0][~mask].double(), shared_mean[~mask], atol=1e-6)
    for k in range(3):
        model = alg.client_model(k)  # what client k starts from next round: shared mean + its own personal
        assert torch.equal(model[mask], updates.params[k][mask])
        assert torch.equal(model[~mask], alg.models[0][~mask])


def test_personal_layers_survive_a_checkpoint_and_the_run_continues_identically():
    a = small_federation(FedPer(personal_layers=1), rounds=3)
    for r in (1, 2):
        a.run_round(r)
    state = {k: v for k, v in a.state_dict().items()}
    state["algorithm"] = {k: v.clone() for k, v in state["algorithm"].items()}
    b = small_federation(FedPer(personal_layers=1), rounds=3)
    b.load_state_dict(state)
    assert torch.equal(every_row(b.algorithm.personal), every_row(a.algorithm.personal))
    a.run_round(3), b.run_round(3)
    assert torch.equal(every_row(a.algorithm.personal), every_row(b.algorithm.personal))
    assert torch.equal(a.algorithm.models, b.algorithm.models)


class ManyWriters(DigitsFederated):
    """The digits pool six times over (10,782 images): 2,000 clients of about five samples each."""

    def load_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().load_pool()
        return x.repeat(6, 1, 1, 1), y.repeat(6)


@pytest.mark.filterwarnings("ignore:most clients have fewer than 10")  # five samples each: accuracy is not tested
def test_fedper_over_2000_clients_stores_the_personal_rows_of_the_clients_it_trained_only():
    """Cross-device: 3 of 2,000 clients a round. The store holds one row per client trained (memory: those rows,
    not 2,000), each client trained starts from its last trained personal part, and every other client's model is
    the shared model with the initial model's personal entries (what it held when FedPer set its mask)."""
    torch.manual_seed(0)
    settings = FederationConfig(
        rounds=3, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0, clients_per_round=3
    )
    fed = Federation(
        ManyWriters(num_clients=2000),
        Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1),
        FedPer(personal_layers=1),
        settings,
        seed=0,
    )
    alg, n = fed.algorithm, 2000
    mask, store = alg.personal_mask, alg.personal
    trained = {}
    for r in (1, 2, 3):
        updates = fed.execution.train(r, alg.select_clients(r))
        alg.aggregate(r, RoundUpdates.of(updates))
        trained.update({c: updates.params[i][mask] for i, c in enumerate(updates.clients.tolist())})
    assert 3 < len(trained) <= 9 and store.touched().tolist() == sorted(trained)
    row = 4 * int(mask.sum())
    assert store.memory_bytes == fed.client_states.budget.used == len(trained) * row  # a dense part: 2,000 rows
    models, groups = alg.evaluation_models()
    assert torch.equal(groups, torch.arange(n))
    initial = fed.server.model.initial_params[mask]
    for c in range(n):
        model = models[c]
        assert torch.equal(model[~mask], alg.models[0][~mask])
        assert torch.equal(model[mask], trained[c] if c in trained else initial)
    assert store.touched().tolist() == sorted(trained)  # reading the others stored nothing


def test_a_format_4_checkpoint_with_a_dense_personal_part_resumes_with_every_row_stored():
    """Format 4 kept `personal` as a (clients x p) tensor in the algorithm's state; upgraded, every client's row is
    in the store and the run goes on as the uninterrupted one."""
    a = small_federation(FedPer(personal_layers=1, participation=0.5), num_clients=4, rounds=3)
    for r in (1, 2):
        a.run_round(r)
    dense = every_row(a.algorithm.personal)
    written = dict(a.state_dict())
    written["algorithm"] = {
        "models": a.algorithm.models.clone(),
        "assignment": a.algorithm.assignment.clone(),
        "personal": dense.clone(),
        "personal_mask": a.algorithm.personal_mask,
    }
    written["client_state"] = {}
    state = checkpoint.upgrade({"federation": written, "callbacks": {}, "format_version": 4}, [])
    b = small_federation(FedPer(personal_layers=1, participation=0.5), num_clients=4, rounds=3)
    b.load_state_dict(state["federation"])
    assert b.algorithm.personal.touched().tolist() == [0, 1, 2, 3]
    assert torch.equal(every_row(b.algorithm.personal), dense)
    a.run_round(3), b.run_round(3)
    assert torch.equal(every_row(a.algorithm.personal), every_row(b.algorithm.personal))
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    nothing = checkpoint.upgrade(
        {"federation": {"round": 1, "algorithm": {"personal": None, "personal_mask": None}}, "format_version": 4}, []
    )
    assert nothing["federation"]["algorithm"]["personal_start"] is None and "client_state" not in nothing["federation"]


def test_counts_larger_than_the_network_are_refused():
    with pytest.raises(ValueError, match="personal_layers is 4, the whole network"):
        small_federation(FedPer(personal_layers=4), num_clients=2)
    with pytest.raises(ValueError, match="exceeds"):
        small_federation(LGFedAvg(global_layers=4), num_clients=2)
    with pytest.raises(ValueError, match=">= 0"):
        FedPer(personal_layers=-1)


def test_fedper_and_lgfedavg_have_short_names():
    from fedlight.run.registry import short_names

    names = short_names()
    assert names["fedper"].endswith("fedper.FedPer") and names["lgfedavg"].endswith("lgfedavg.LGFedAvg")
