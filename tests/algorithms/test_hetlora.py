"""HetLoRA: each client trains the global adapters truncated to its own rank, sends them zero-padded, and the server
averages them weighted by the norm of each client's adapter product (checked against products computed here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.hetlora import HetLoRA
from fedlight.datamodules import Groups, TextFederated
from fedlight.datamodules.planted_text import write_planted
from fedlight.models import LoRA, PretrainedClassifier
from fedlight.models.tiny_pretrained import make_tiny
from fedlight.plugin import Plan

RANKS = [1, 2, 4, 8]  # the model's rank is 8


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hetlora")
    make_tiny("gpt2", root / "gpt2", write_planted(root / "planted.jsonl", samples=400), num_classes=4)
    return root


class Recording(HetLoRA):
    """HetLoRA keeping the last round's starts, trained rows and training-set sizes."""

    plan = Plan(holds_updates=True)

    def aggregate(self, round, updates):
        trained = updates.all()
        self.clients, self.starts, self.rows = trained.clients.clone(), trained.starts.clone(), trained.params.clone()
        self.sizes = trained.num_samples.clone().double()
        super().aggregate(round, updates)


def federation(root, algorithm: HetLoRA) -> Federation:
    torch.manual_seed(0)
    data = TextFederated(
        str(root / "planted.jsonl"),
        str(root / "gpt2"),
        group_column="category",
        max_length=16,
        num_clients=8,
        partition=Groups(),
    )
    model = PretrainedClassifier(str(root / "gpt2"), num_classes=4, lr=0.01, lora=LoRA(rank=8))
    config = FederationConfig(rounds=2, local_epochs=1, batch_size=16, accelerator="cpu", vectorize=0)
    return Federation(data, model, algorithm, config, seed=0)


def factors(run, rows: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """(A, B) of every adapted layer, for each row: arrays (k, r, in) and (k, out, r)."""
    views = run.flat.views(rows)
    return [
        (views[a].double().numpy(), views[a.replace(".lora_A.", ".lora_B.")].double().numpy())
        for a in run.algorithm.a_names
    ]


@pytest.fixture(scope="module")
def trained(root):
    run = federation(root, Recording(ranks=RANKS))
    run.run_round(1)
    run.run_round(2)  # round 2: the global A and B are both nonzero, so truncation is visible in the starts
    return run


def test_a_client_starts_from_and_trains_only_its_ranks_components(trained):
    algorithm = trained.algorithm
    global_before = algorithm.starts  # rows: each client's start, truncated from the round's global adapters
    for i, client in enumerate(algorithm.clients.tolist()):
        rank = RANKS[client % len(RANKS)]
        for (a_start, b_start), (a, b) in zip(
            factors(trained, global_before[i : i + 1]), factors(trained, algorithm.rows[i : i + 1])
        ):
            assert not a_start[0, rank:].any() and not b_start[0, :, rank:].any()
            assert not a[0, rank:].any() and not b[0, :, rank:].any()  # never trained beyond its rank
            assert not np.array_equal(a[0, :rank], a_start[0, :rank])  # but trained within it
    full = [i for i, c in enumerate(algorithm.clients.tolist()) if RANKS[c % len(RANKS)] == 8]
    assert full and all(a[0, 4:].any() for a, _ in factors(trained, algorithm.starts[full[0] : full[0] + 1]))


def test_the_server_averages_the_padded_adapters_weighted_by_their_products_norm(trained):
    """sqrt(sum over layers of ||B_k A_k||_F^2) per client, computed with numpy; the new global row is the weighted
    mean of the trained (zero-padded) rows, the head included."""
    algorithm = trained.algorithm
    rows = algorithm.rows.double().numpy()
    norms = np.zeros(len(rows))
    for a, b in factors(trained, algorithm.rows):
        norms += np.array([np.linalg.norm(b[k] @ a[k]) ** 2 for k in range(len(rows))])
    weights = np.sqrt(norms)
    expected = (weights[:, None] * rows).sum(axis=0) / weights.sum()
    assert np.allclose(algorithm.models[0].double().numpy(), expected, atol=1e-6)
    assert not np.allclose(weights / weights.sum(), algorithm.sizes.numpy() / algorithm.sizes.sum().item())


def test_size_weighting_is_plain_zero_padding(root):
    run = federation(root, Recording(ranks=RANKS, weighting="size"))
    run.run_round(1)
    algorithm = run.algorithm
    sizes = algorithm.sizes.numpy()
    expected = (sizes[:, None] * algorithm.rows.double().numpy()).sum(axis=0) / sizes.sum()
    assert np.allclose(algorithm.models[0].double().numpy(), expected, atol=1e-6)


def test_each_client_is_evaluated_with_the_global_adapters_cut_to_its_rank(trained):
    algorithm = trained.algorithm
    models, group = algorithm.evaluation_models()
    ((global_a, _),) = factors(trained, algorithm.models[:1])[:1]
    for client in range(8):
        rank = RANKS[client % len(RANKS)]
        ((a, _),) = factors(trained, models[group[client]][None])[:1]
        assert np.array_equal(a[0, :rank], global_a[0, :rank]) and not a[0, rank:].any()


def test_ranks_are_drawn_within_the_models_rank_and_larger_ones_are_refused(root):
    run = federation(root, HetLoRA(min_rank=2))
    ranks = run.algorithm.client_rank
    assert int(ranks.min()) >= 2 and int(ranks.max()) <= 8
    with pytest.raises(ValueError, match="the largest exceeds the model's LoRA rank 8"):
        federation(root, HetLoRA(ranks=[4, 16]))
