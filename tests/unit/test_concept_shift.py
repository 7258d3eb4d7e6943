"""ConceptShift (FedRC's split): every sample once, every concept its clients, labels mapped by exactly the concept's
permutation, label mixes that differ inside a concept, corruptions on the stated share, ARI against the concepts, and
newcomers with their concepts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlight.cluster.scores import clustering_scores
from fedlight.datamodules import ConceptShift, FederatedDataModule
from fedlight.datamodules.corruptions import CORRUPTIONS, corrupt
from fedlight.plugin.data import SPLITS, FederatedData

K, PER_CLASS = 10, 300
REVERSED = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]  # FedRC's concept 1: y -> K - 1 - y, written out
SHIFTED = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]  # FedRC's concept 2: y -> (y + 1) mod K


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """10 classes x 300 samples, scrambled."""
    return np.random.default_rng(7).permutation(np.repeat(np.arange(K), PER_CLASS))


class IndexPool(FederatedDataModule):
    """Sample i is a 1 x 1 image holding the number i, so every row says which pool sample it is."""

    def __init__(self, labels: np.ndarray, **kwargs) -> None:
        super().__init__(**kwargs)
        self.labels = labels

    @property
    def num_classes(self) -> int:
        return K

    def load_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.labels)
        return torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), torch.as_tensor(self.labels, dtype=torch.long)


def rows_of(data: FederatedData) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(client, pool indices, labels) of every client and split."""
    out = []
    for split in SPLITS:
        for k in range(data.num_clients):
            x, y = data.split(split).client(k)
            out.append((k, x.flatten().long().numpy(), y.numpy()))
    return out


def fedrc_scheme(**kwargs) -> ConceptShift:
    return ConceptShift(3, concept_shares=[0.5, 0.25, 0.25], **kwargs)


# -- the partition -------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients", [7, 20])
def test_every_sample_goes_to_one_client_and_sizes_differ_by_at_most_one(num_clients: int, labels) -> None:
    parts = fedrc_scheme().assign(labels, num_clients, np.random.default_rng(0))
    assert len(parts) == num_clients
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    n = len(labels)
    assert {len(p) for p in parts} <= {n // num_clients, n // num_clients + 1}


@pytest.mark.parametrize(
    "shares, num_clients, expected",
    [
        ([0.5, 0.25, 0.25], 20, [0] * 10 + [1] * 5 + [2] * 5),  # FedRC's 50 / 25 / 25
        (None, 10, [0] * 4 + [1] * 3 + [2] * 3),  # 3.33 each: the one left over goes to the first
        ([0.5, 0.25, 0.25], 6, [0] * 3 + [1] * 2 + [2] * 1),  # 3, 1.5, 1.5: the tie goes to the first
    ],
)
def test_every_concept_has_its_clients(shares, num_clients: int, expected: list[int]) -> None:
    assert ConceptShift(3, concept_shares=shares).cluster_labels(num_clients).tolist() == expected


def test_labels_are_mapped_by_exactly_their_concepts_permutation(labels) -> None:
    module = IndexPool(labels, num_clients=12, partition=fedrc_scheme(), split_seed=3, public_size=50)
    data = module.build()
    maps = {0: list(range(K)), 1: REVERSED, 2: SHIFTED}
    seen = [data.public_x.flatten().long().numpy()]
    for client, index, y in rows_of(data):
        concept = int(data.cluster_labels[client])
        np.testing.assert_array_equal(y, np.asarray(maps[concept])[labels[index]])
        seen.append(index)
    assert sorted(np.concatenate(seen).tolist()) == list(range(len(labels)))


def test_random_label_maps_are_distinct_permutations_applied_per_concept(labels) -> None:
    scheme = ConceptShift(4, label_maps="random", seed=5)
    data = IndexPool(labels, num_clients=8, partition=scheme, split_seed=0).build()
    perms = scheme.permutations
    assert perms.shape == (4, K) and perms[0].tolist() == list(range(K))
    assert all(sorted(p.tolist()) == list(range(K)) for p in perms)
    assert len({tuple(p) for p in perms.tolist()}) == 4
    for client, index, y in rows_of(data):
        np.testing.assert_array_equal(y, perms[data.cluster_labels[client]][labels[index]])


def test_label_mixes_differ_inside_a_concept_and_tend_to_the_pool_as_alpha_grows(labels) -> None:
    def distances(alpha: float) -> np.ndarray:
        scheme = fedrc_scheme(alpha=alpha)
        parts = scheme.assign(labels, 20, np.random.default_rng(1))
        concepts = scheme.cluster_labels(20)
        mixes = np.stack([np.bincount(labels[p], minlength=K) / len(p) for p in parts])
        inside = [
            0.5 * np.abs(mixes[i] - mixes[j]).sum()
            for i in range(20)
            for j in range(i + 1, 20)
            if concepts[i] == concepts[j]
        ]
        return np.asarray(inside)

    skewed, near_iid = distances(1.0), distances(1000.0)
    assert skewed.min() > 0  # no two clients of a concept share a label mix
    assert skewed.mean() > 0.6 and near_iid.mean() < 0.25  # total variation: FedRC's 1.0 against almost IID


# -- feature shift ---------------------------------------------------------------------------------------
def test_feature_shift_corrupts_the_stated_share_of_each_concept_and_leaves_the_labels(labels) -> None:
    scheme = fedrc_scheme(feature_shift=[0.4, 0.2, 0.2])
    parts = scheme.assign(labels, 20, np.random.default_rng(2))
    concepts = scheme.cluster_labels(20)
    corrupted = np.array([c is not None for c in scheme.client_corruptions])
    assert [int(corrupted[concepts == c].sum()) for c in range(3)] == [4, 1, 1]  # 40% of 10, 20% of 5 (rounded)
    images = torch.rand(len(labels), 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y_pool = torch.as_tensor(labels)
    for client, part in enumerate(parts):
        x, y = scheme.transform_client(images[part], y_pool[part], client, int(concepts[client]))
        assert torch.equal(y, scheme.transform(images[part], y_pool[part], int(concepts[client]))[1])
        assert torch.equal(x, images[part]) != corrupted[client]


def test_corruptions_by_hand() -> None:
    half = torch.full((1, 1, 8, 8), 0.5)
    assert torch.allclose(corrupt(half, "brightness", 2, seed=0), torch.full_like(half, 0.7))
    assert torch.allclose(corrupt(half, "contrast", 5, seed=0), half)  # a flat image is its own mean
    striped = corrupt(torch.zeros(1, 1, 8, 8), "stripe", 1, seed=0)[0, 0]
    assert striped[:, [0, 1, 6, 7]].eq(1).all() and striped[:, 2:6].eq(0).all()  # a quarter of each side inverted
    dot = torch.zeros(1, 1, 8, 8)
    dot[0, 0, 4, 4] = 1
    moved = corrupt(dot, "translate", 5, seed=0)[0, 0]  # 5 of 28 pixels scaled to 8: one pixel each way
    ((r, c),) = moved.nonzero().tolist()
    assert abs(r - 4) == 1 and abs(c - 4) == 1 and moved.sum() == 1
    bright = torch.full((2, 1, 4, 4), 200, dtype=torch.uint8)
    assert corrupt(bright, "brightness", 5, seed=0).eq(255).all()  # 200 / 255 + 0.5 clipped to 1
    for name in CORRUPTIONS:
        x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        once, again = corrupt(x, name, 3, seed=9), corrupt(x, name, 3, seed=9)
        assert torch.equal(once, again) and once.shape == x.shape and 0 <= once.min() and once.max() <= 1


# -- ground truth: ARI and newcomers ---------------------------------------------------------------------
def test_ari_against_the_concepts_by_hand() -> None:
    truth = ConceptShift(2).cluster_labels(6)  # [0, 0, 0, 1, 1, 1]
    # pairs together: both 2 (of 15), truth 3 + 3 = 6, found 1 + 1 + 1 = 3; expected 6 x 3 / 15 = 1.2, max 4.5:
    # ARI = (2 - 1.2) / (4.5 - 1.2) = 8 / 33
    assert clustering_scores(truth, [0, 0, 1, 1, 2, 2])["ari"] == pytest.approx(8 / 33)
    assert clustering_scores(truth, [2, 2, 2, 0, 0, 0])["ari"] == pytest.approx(1.0)  # the concepts, renamed


def test_newcomers_carry_their_concepts(labels) -> None:
    module = IndexPool(labels, num_clients=24, partition=fedrc_scheme(), split_seed=4, holdout_clients=4)
    module.setup("fit")
    data = module.federated
    blocks = np.repeat([0, 1, 2], [12, 6, 6])  # the concepts of the 24 partition clients
    new = data.newcomers
    assert new.num_clients == 4 and sorted(new.cluster_labels.tolist()) == [0, 0, 1, 2]  # 4 x 12/24, 6/24, 6/24
    np.testing.assert_array_equal(new.cluster_labels, blocks[new.info["partition_clients"]])
    np.testing.assert_array_equal(data.cluster_labels, blocks[data.info["partition_clients"]])
    maps = np.asarray([list(range(K)), REVERSED, SHIFTED])
    for client, index, y in rows_of(new):
        np.testing.assert_array_equal(y, maps[new.cluster_labels[client]][labels[index]])


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, classes, num_clients, option",
    [
        (lambda: ConceptShift(0), K, 10, "num_concepts"),
        (lambda: ConceptShift(4), K, 10, "label_maps='random'"),  # FedRC has 3 maps
        (lambda: ConceptShift(3), 2, 10, "label_maps='random'"),  # 2 classes: y -> 1 - y twice
        (lambda: ConceptShift(3, label_maps="random"), 2, 10, "num_concepts"),  # 2! = 2 permutations
        (lambda: ConceptShift(3, concept_shares=[0.8, 0.1, 0.1]), K, 5, "concept_shares"),  # 4, 1, 0 clients
        (lambda: ConceptShift(3), K, 2, "concept_shares"),  # fewer clients than concepts
        (lambda: ConceptShift(2, concept_shares=[1.0]), K, 10, "concept_shares"),
        (lambda: ConceptShift(2, feature_shift=[0.5]), K, 10, "feature_shift"),
        (lambda: ConceptShift(2, corruptions=["fog"]), K, 10, "corruptions"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(make, classes: int, num_clients: int, option: str) -> None:
    with pytest.raises(ValueError) as caught:
        make().assign(np.repeat(np.arange(classes), 5), num_clients, np.random.default_rng(0))
    assert option in str(caught.value) and "\n" not in str(caught.value)


def test_holding_out_a_whole_concept_is_refused(labels) -> None:
    module = IndexPool(labels, num_clients=4, partition=fedrc_scheme(), split_seed=0, holdout_clients=2)
    with pytest.raises(ValueError, match="holdout_clients .* true cluster 1"):  # 2, 1, 1 clients: quota 1, 1, 0
        module.setup("fit")
