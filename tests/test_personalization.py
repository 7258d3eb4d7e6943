"""Layer personalization: layer-count masks (whole and half layers), the engine's re-slicing of personal
storage, FedPer and LG-FedAvg, all checked against hand-listed tensors and hand-computed averages."""
import pytest
import torch

from fedlight import RoundUpdates
from conftest import small_federation
from fedlight.plugin.updates import Updates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.lgfedavg import LGFedAvg
from fedlight.training.flat import FlatModel
from fedlight.models import FedTSDPCNN, ResNet18
from fedlight.training.layer_masks import first_layers, half_step, last_layers, layer_count_mask, tensor_names

CNN_TENSORS = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
               "fc2.weight", "fc2.bias"]


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
        return next(k for k in range(100) if half_step(4 * 0.98 ** k, rounding) <= target)

    assert [first_event(t, "floor") for t in (3.5, 3.0, 2.5, 2.0)] == [1, 7, 15, 24]
    assert [first_event(t, "round") for t in (3.5, 3.0, 2.5)] == [4, 11, 19]
    assert half_step(4.0) == 4.0 and half_step(3.92) == 3.5 and half_step(3.92, "round") == 4.0
    assert half_step(3.5 - 1e-12) == 3.5  # a rounding error below a grid point is that point
    with pytest.raises(ValueError, match="rounding"):
        half_step(3.0, "ceil")


def test_fedtsdp_cnn_half_layer_split_shares_the_weight_and_keeps_the_bias():
    flat = FlatModel(FedTSDPCNN(1, 10, 8))
    shared = layer_count_mask(flat, half_step(4 * 0.98), "first")       # 3.92 -> 3.5
    assert covered(flat, shared) == CNN_TENSORS[:7]
    assert covered(flat, ~shared) == ["fc2.bias"]
    shared = layer_count_mask(flat, half_step(4 * 0.98 ** 7), "first")  # 3.47 -> 3.0: fc2 wholly personal
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
    half = ["layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.bn1.running_mean",
            "layer1.0.bn1.running_var"]
    assert covered(flat, layer_count_mask(flat, 1.5, "first")) == stem + half
    assert covered(flat, layer_count_mask(flat, 0.5, "last")) == ["fc.bias"]


def test_layer_names_of_a_wrapped_network_are_prefixed_and_still_split():
    fed = small_federation(FedAvg(), num_clients=2)
    assert fed.flat.layers() == ["network.conv1", "network.conv2", "network.fc"]
    assert covered(fed.flat, layer_count_mask(fed.flat, 0.5, "last")) == ["network.fc.bias"]


# ----------------------------------------------------------------------------- the engine's personal storage

def test_set_personal_mask_reslices_storage_by_hand():
    fed = small_federation(FedAvg(), num_clients=3)
    alg, d = fed.algorithm, fed.flat.numel
    sizes = fed.server.train_sizes.double()
    alg.models = torch.stack([torch.full((d,), 1.0), torch.full((d,), 2.0)])
    alg.assignment = torch.tensor([0, 1, 1])
    A = torch.zeros(d, dtype=torch.bool)
    A[:4] = True
    B = torch.zeros(d, dtype=torch.bool)
    B[4:6] = True
    alg.set_personal_mask(A)                                      # from the cluster models
    assert alg.personal.shape == (3, 4)
    assert torch.equal(alg.personal, torch.tensor([[1.0] * 4, [2.0] * 4, [2.0] * 4]))
    alg.personal = torch.tensor([[10.0] * 4, [20.0] * 4, [30.0] * 4])
    trained = torch.full((1, d), 7.0)
    update = Updates(torch.tensor([1]), trained, trained.clone(), torch.tensor([5]), torch.zeros(1))
    alg.set_personal_mask(A | B, update)                          # grow: client 1's new entries from its upload
    assert alg.personal.shape == (3, 6)
    assert torch.equal(alg.personal, torch.tensor([[10.0] * 4 + [1.0] * 2, [20.0] * 4 + [7.0] * 2,
                                                   [30.0] * 4 + [2.0] * 2]))
    assert torch.equal(alg.client_model(1)[:6], torch.tensor([20.0] * 4 + [7.0] * 2))
    alg.set_personal_mask(B)                                      # shrink: A goes back, averaged per cluster
    expected_1 = (sizes[1] * 20 + sizes[2] * 30) / (sizes[1] + sizes[2])
    assert torch.allclose(alg.models[0, :4], torch.full((4,), 10.0))
    assert torch.allclose(alg.models[1, :4], torch.full((4,), float(expected_1)))
    assert torch.equal(alg.personal, torch.tensor([[1.0] * 2, [7.0] * 2, [2.0] * 2]))
    alg.set_personal_mask(torch.zeros(d, dtype=torch.bool))       # nothing personal: plain cluster models
    assert alg.personal_mask is None and alg.personal is None
    assert torch.equal(alg.client_model(2), alg.models[1])


# ----------------------------------------------------------------------------- FedPer and LG-FedAvg

def test_fedper_with_no_personal_layers_equals_fedavg():
    a = small_federation(FedAvg(), rounds=2)
    b = small_federation(FedPer(personal_layers=0), rounds=2)
    for r in (1, 2):
        ma, mb = a.run_round(r), b.run_round(r)
    assert b.algorithm.personal is None
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    assert ma.scalars["test/acc_mean"] == mb.scalars["test/acc_mean"]


@pytest.mark.parametrize("algorithm, personal", [
    (FedPer(personal_layers=1), ["network.fc.weight", "network.fc.bias"]),
    (LGFedAvg(global_layers=1), ["network.conv1.weight", "network.conv1.bias", "network.conv2.weight",
                                 "network.conv2.bias"]),
    (FedPer(personal_layers=0.5), ["network.fc.bias"]),
])
def test_personal_layers_are_untouched_by_aggregation(algorithm, personal):
    fed = small_federation(algorithm, num_clients=3)
    alg = fed.algorithm
    assert covered(fed.flat, alg.personal_mask) == personal
    assert alg.personal.shape == (3, int(alg.personal_mask.sum()))  # memory: the personal part only
    before = alg.models[0].clone()
    updates = fed.execution.train(1, [0, 1, 2])
    alg.aggregate(1, RoundUpdates.of(updates))
    mask = alg.personal_mask
    assert torch.equal(alg.models[0][mask], before[mask])  # the server never averages personal entries
    n = fed.server.train_sizes.double()
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
    assert torch.equal(b.algorithm.personal, a.algorithm.personal)
    a.run_round(3), b.run_round(3)
    assert torch.equal(a.algorithm.personal, b.algorithm.personal)
    assert torch.equal(a.algorithm.models, b.algorithm.models)


def test_counts_larger_than_the_network_are_refused():
    with pytest.raises(ValueError, match="half number"):
        small_federation(FedPer(personal_layers=4), num_clients=2)
    with pytest.raises(ValueError, match="exceeds"):
        small_federation(LGFedAvg(global_layers=4), num_clients=2)
    with pytest.raises(ValueError, match=">= 0"):
        FedPer(personal_layers=-1)


def test_fedper_and_lgfedavg_have_short_names():
    from fedlight.run.registry import short_names

    names = short_names()
    assert names["fedper"].endswith("fedper.FedPer") and names["lgfedavg"].endswith("lgfedavg.LGFedAvg")
