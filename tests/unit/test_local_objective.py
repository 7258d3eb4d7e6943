"""A method's own local objective (`LocalWork.objective`), the features at the network's head (`head_inputs`,
`server.model.features`), flat models' tensors by name (`server.model.named_tensors`) and modules a method adds to the
model (`Algorithm.extend_model`), against hand computations."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight.models import MLP
from fedlight.plugin import Algorithm, LocalWork, ModelParts, head_inputs

from helpers.federations import mlp_federation, noisy_starts


def bias_objective(module, batch, inputs):
    """c times the sum of the head's bias: its gradient is c on the bias and 0 everywhere else."""
    return inputs[0] * module.network.out.bias.sum()


@pytest.mark.parametrize("vectorize", [0, 3], ids=["one by one", "vectorized"])
def test_an_objective_with_client_inputs_moves_exactly_what_its_hand_gradient_says(vectorize):
    fed = mlp_federation(vectorize=vectorize)  # SGD, lr 0.05, momentum 0.9, 2 local epochs, batches of 16
    clients = [0, 1, 2, 3]
    starts = noisy_starts(fed, len(clients))
    c = torch.tensor([[0.5], [-1.0], [2.0], [0.0]])
    trained = fed.server.clients.train_many(1, clients, starts, objective=bias_objective, client_inputs=c).params
    bias = fed.server.model.layer_mask(["network.out"]) & fed.flat.mask(lambda e: e.name.endswith("out.bias"))
    for row, client in enumerate(clients):
        steps = fed.server.clients.local_steps(client)
        # momentum buffer after t steps of a constant gradient g: g (1 + 0.9 + ... + 0.9^(t-1))
        travelled = 0.05 * sum(sum(0.9**j for j in range(t)) for t in range(1, steps + 1))
        expected = starts[row].clone()
        expected[bias] -= travelled * float(c[row, 0])
        assert torch.allclose(trained[row], expected, atol=1e-5), client


def test_the_trainer_probe_hands_the_objective_its_client_inputs():
    """Under vectorize -1 the first call's agreement check trains with the call's objective and client inputs, so an
    objective that reads its inputs stays vectorized rather than failing into sequential training."""
    fed = mlp_federation(vectorize=-1)
    c = torch.tensor([[0.5], [-1.0], [2.0], [1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "vectorized training is off: training_step failed ..."
        fed.server.clients.train_many(1, [0, 1, 2, 3], noisy_starts(fed, 4), objective=bias_objective, client_inputs=c)
    assert "failed" not in str(fed.execution.plan.reason)


def test_head_inputs_are_the_hidden_activations_and_server_features_evaluate_them():
    torch.manual_seed(0)
    network = MLP(4, [3], 2)
    x = torch.randn(5, 4)
    hidden = torch.relu(x @ network.hidden[0].weight.T + network.hidden[0].bias)
    features, outputs = head_inputs(network, network.out, x)
    assert torch.allclose(features, hidden) and torch.allclose(
        outputs, hidden @ network.out.weight.T + network.out.bias
    )
    fed = mlp_federation()
    params = noisy_starts(fed, 1)[0]
    x = fed.data.train.client(0)[0][:7]
    fed.flat.load(params)
    layer = fed.module.network.hidden[0]
    by_hand = torch.relu(torch.flatten(x, 1) @ layer.weight.T + layer.bias)
    features, logits = fed.server.model.features(params, x)
    assert torch.allclose(features, by_hand, atol=1e-6)
    assert torch.allclose(logits, fed.server.model.predict(params, x))


def test_named_tensors_are_views_of_flat_models_under_the_modules_names():
    """Rows of flat models, named as the module names its tensors: loading row 1 gives the module those values, and
    `functional_call` with them computes what `predict` computes on that row."""
    fed = mlp_federation()
    rows = noisy_starts(fed, 2)
    named = fed.server.model.named_tensors(rows)
    assert named["network.out.weight"].shape == (2, 10, 32)
    assert named["network.out.weight"].untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()  # views
    fed.flat.load(rows[1])
    for name, tensor in fed.module.named_parameters():
        assert torch.equal(named[name][1], tensor), name
    x = fed.data.test.client(0)[0][:5]
    with torch.no_grad():
        outputs = torch.func.functional_call(
            fed.module, {n: t[0] for n, t in named.items()}, (fed.server.data.inputs(x),)
        )
    assert torch.allclose(outputs, fed.server.model.predict(rows[0], x), atol=1e-6)


class PersonalShift(Algorithm):
    """Adds a learned shift of the features before the head: a method's own module in every client's model."""

    def extend_model(self, parts: ModelParts) -> None:
        self.head_name = parts.head_name
        parts.add("shift", nn.Linear(parts.feature_size("PersonalShift"), 1, bias=False))


def test_a_module_added_by_a_method_is_part_of_every_clients_flat_model_and_trains_under_its_objective():
    plain = mlp_federation()
    fed = mlp_federation(PersonalShift())
    assert fed.algorithm.head_name == "network.out" and fed.server.model.head is fed.module.network.out
    assert fed.server.model.num_params == plain.server.model.num_params + 32  # the shift's 32 x 1 weights
    shift = fed.server.model.layer_mask(["shift"])
    assert int(shift.sum()) == 32 and bool(shift[-32:].all())  # the method's layer comes after the network's

    def shifted(module, batch, inputs):
        x, y = batch
        features, outputs = head_inputs(module, module.network.out, x)
        return F.cross_entropy(outputs + module.shift(features), y)

    starts = noisy_starts(fed, 2)
    moved = fed.server.clients.train_many(1, [0, 1], starts, objective=shifted).params
    kept = fed.server.clients.train_many(1, [0, 1], starts).params
    assert not torch.equal(moved[:, shift], starts[:, shift])  # the objective trains it
    assert torch.equal(kept[:, shift], starts[:, shift])  # the module's training_step never reaches it


def test_bad_uses_are_refused_in_one_line():
    with pytest.raises(ValueError, match="sample_weights or an objective"):
        LocalWork(objective=bias_objective, sample_weights=[torch.ones(3)])
    with pytest.raises(ValueError, match="client_inputs are handed to an objective"):
        LocalWork(client_inputs=torch.ones(2, 1))
    parts = ModelParts(nn.Sequential(nn.Linear(3, 3), nn.Conv1d(1, 1, 1)), "1", 3)
    with pytest.raises(ValueError, match="must be a linear layer; 1 is a Conv1d"):
        parts.feature_size("FedProto")
    with pytest.raises(ValueError, match="already has an attribute '0'"):
        parts.add("0", nn.Linear(1, 1))
