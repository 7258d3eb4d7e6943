"""`federation.finetune_epochs`: every client's evaluation model fine-tuned on its own training split before a second
evaluation, logged beside the plain one, without touching the server's state."""

from __future__ import annotations

import pytest
import torch

from fedlight.algorithms.fedavg import FedAvg

from helpers.federations import small_federation


def test_fine_tuned_results_are_each_clients_model_trained_alone_then_evaluated():
    fed = small_federation(FedAvg(), num_clients=4, rounds=1, finetune_epochs=2)
    tuned_by_engine = fed.run_round(1)
    global_model = fed.algorithm.models[0].clone()
    # by hand: each client trains the global model on its own data (its fine-tuning stream), then is evaluated
    accuracies = []
    for client in range(4):
        tuned = fed.server.clients.train(1, client, global_model, epochs=2, purpose="finetune").params
        x, y = fed.data.test.client(client)
        logits = fed.server.model.predict(tuned, x)
        accuracies.append(float((logits.argmax(dim=1) == y).float().mean()))
    assert tuned_by_engine.per_client["ft_acc"].tolist() == pytest.approx(accuracies)
    assert tuned_by_engine.scalars["test_ft/acc_mean"] == pytest.approx(sum(accuracies) / 4)
    assert "test/acc_mean" in tuned_by_engine.scalars  # the plain evaluation is still there
    assert torch.equal(fed.algorithm.models[0], global_model)  # the server's state is untouched


def test_without_fine_tuning_nothing_changes_and_the_state_is_the_same_with_it():
    plain, tuned = (small_federation(FedAvg(), num_clients=3, rounds=2, finetune_epochs=e) for e in (0, 1))
    for round in (1, 2):
        a, b = plain.run_round(round), tuned.run_round(round)
        assert not any(k.startswith("test_ft/") for k in a.scalars)
        assert a.scalars["test/acc_mean"] == b.scalars["test/acc_mean"]
    assert torch.equal(plain.algorithm.models, tuned.algorithm.models)


def test_a_negative_fine_tuning_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="federation.finetune_epochs"):
        small_federation(FedAvg(), finetune_epochs=-1)
