"""Partition schemes: every sample lands with exactly one client, and each scheme keeps its promise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlight.datamodules.partition import (
    IID,
    OCFL_CLASS_SETS,
    ClassesPerClient,
    Dirichlet,
    LabelPermutations,
    MissingClasses,
    Natural,
    PartitionScheme,
    QuantitySkew,
    Rotations,
    Shards,
)

K, PER_CLASS = 10, 500


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """10 classes x 500 samples, in a scrambled order."""
    return np.random.default_rng(123).permutation(np.repeat(np.arange(K), PER_CLASS))


def split(
    scheme: PartitionScheme, labels: np.ndarray, num_clients: int = 10, seed: int = 0, owners: np.ndarray | None = None
) -> list[np.ndarray]:
    return scheme.assign(labels, num_clients, np.random.default_rng(seed), owners)


def check_exact_cover(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    """One sorted int64 array per client; together they hold every index 0..n-1 exactly once."""
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique"
    allidx = np.concatenate(parts)
    assert len(allidx) == n, "overlap or lost samples"
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def class_sets(parts: list[np.ndarray], labels: np.ndarray) -> list[set[int]]:
    return [set(np.unique(labels[p]).tolist()) for p in parts]


SCHEMES = {
    "iid": IID(),
    "dirichlet": Dirichlet(alpha=0.5),
    "classes": ClassesPerClient(2),
    "classes_fraction": ClassesPerClient(fraction=0.3),
    "shards": Shards(2),
    "quantity": QuantitySkew(alpha=0.5),
    "rotations": Rotations(4),
    "rotations_dirichlet": Rotations(2, base=Dirichlet(0.3)),
    "permutations": LabelPermutations(4),
    "missing": MissingClasses(3),
    "missing_overlap": MissingClasses(3, overlap=True, base=Dirichlet(1.0)),
}


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("num_clients", [5, 12])
def test_every_sample_goes_to_exactly_one_client(name: str, num_clients: int, labels: np.ndarray) -> None:
    check_exact_cover(split(SCHEMES[name], labels, num_clients), len(labels), num_clients)


@pytest.mark.parametrize("name", SCHEMES)
def test_same_seed_same_split_other_seed_other_split(name: str, labels: np.ndarray) -> None:
    a, b, c = (split(SCHEMES[name], labels, 10, seed) for seed in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))


# -- Dirichlet ---------------------------------------------------------------------------------------
def mean_max_class_share(parts: list[np.ndarray], labels: np.ndarray) -> float:
    return float(np.mean([np.bincount(labels[p], minlength=K).max() / len(p) for p in parts]))


def test_dirichlet_skew_grows_as_alpha_falls(labels: np.ndarray) -> None:
    skew = {a: mean_max_class_share(split(Dirichlet(alpha=a), labels, 20), labels) for a in (0.1, 1.0, 100.0)}
    assert skew[0.1] > skew[1.0] > skew[100.0]
    assert skew[100.0] < 0.2  # near the IID share of 1/10
    assert skew[0.1] > 0.5


def test_dirichlet_min_size_and_errors(labels: np.ndarray) -> None:
    parts = split(Dirichlet(alpha=0.1, min_size=50), labels, 20)
    assert min(len(p) for p in parts) >= 50
    with pytest.raises(ValueError, match="min_size"):  # cannot fit at all
        split(Dirichlet(min_size=600), labels, 10)
    with pytest.raises(ValueError, match="draws"):  # bounded retries, then a clear error
        split(Dirichlet(alpha=0.01, min_size=200, max_tries=3), labels, 20)


# -- classes per client ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "num_clients,scheme,s",
    [
        (10, ClassesPerClient(2), 2),
        (25, ClassesPerClient(3), 3),
        (4, ClassesPerClient(3), 3),
        (5, ClassesPerClient(2), 2),
        (20, ClassesPerClient(fraction=0.2), 2),
        (20, ClassesPerClient(fraction=0.3), 3),
    ],
)
def test_classes_per_client_is_exact(num_clients: int, scheme: ClassesPerClient, s: int, labels: np.ndarray) -> None:
    parts = split(scheme, labels, num_clients)
    check_exact_cover(parts, len(labels), num_clients)
    sets = class_sets(parts, labels)
    assert all(len(cs) == s for cs in sets)
    if num_clients >= K:  # NIID-Bench: client i's first class is i mod K
        assert all(i % K in cs for i, cs in enumerate(sets))
    for k in range(K):  # each class is split evenly among the clients holding it
        counts = [int(np.sum(labels[p] == k)) for p, cs in zip(parts, sets) if k in cs]
        assert max(counts) - min(counts) <= 1 and sum(counts) == PER_CLASS


def test_classes_per_client_errors(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="cover"):
        split(ClassesPerClient(2), labels, 4)  # 4 x 2 < 10 classes
    with pytest.raises(ValueError, match="exceeds"):
        split(ClassesPerClient(11), labels, 20)
    with pytest.raises(ValueError, match="samples"):
        split(ClassesPerClient(2), np.repeat(np.arange(10), 2), 30)  # 6 holders of a 2-sample class


# -- shards ------------------------------------------------------------------------------------------
def test_shards_are_label_sorted_slices(labels: np.ndarray) -> None:
    parts = split(Shards(2), labels, 50)  # 100 shards of 50, each inside one class
    check_exact_cover(parts, len(labels), 50)
    assert all(len(p) == 100 for p in parts)
    for p in parts:
        counts = np.bincount(labels[p], minlength=K)
        assert len(np.flatnonzero(counts)) <= 2 and set(counts[counts > 0].tolist()) <= {50, 100}
    with pytest.raises(ValueError, match="shards"):
        split(Shards(3), labels[:20], 10)


# -- quantity skew -----------------------------------------------------------------------------------
def test_quantity_skew_sizes_spread_as_alpha_falls(labels: np.ndarray) -> None:
    def spread(alpha: float) -> float:
        sizes = np.array([len(p) for p in split(QuantitySkew(alpha=alpha, min_size=5), labels, 20)])
        assert sizes.min() >= 5
        return float(sizes.std() / sizes.mean())

    assert spread(0.3) > spread(100.0)
    assert spread(100.0) < 0.3


# -- natural -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def owners(labels: np.ndarray) -> np.ndarray:
    return np.random.default_rng(5).integers(100, 130, size=len(labels))  # 30 owners with odd ids


def test_natural_one_client_per_owner(labels: np.ndarray, owners: np.ndarray) -> None:
    parts = split(Natural(), labels, 30, owners=owners)
    check_exact_cover(parts, len(labels), 30)
    assert sorted(int(np.unique(owners[p]).item()) for p in parts) == list(range(100, 130))


def test_natural_picks_owners_and_leaves_the_rest_out(labels: np.ndarray, owners: np.ndarray) -> None:
    scheme = Natural()
    parts = split(scheme, labels, 12, seed=3, owners=owners)
    picked = [int(np.unique(owners[p]).item()) for p in parts]
    assert picked == scheme.owner_ids.tolist() and len(set(picked)) == 12
    for p, o in zip(parts, picked):  # each client holds all of its owner's samples
        np.testing.assert_array_equal(p, np.flatnonzero(owners == o))
    left_out = np.setdiff1d(np.arange(len(labels)), np.concatenate(parts))
    assert not set(owners[left_out].tolist()) & set(picked)
    again = split(Natural(), labels, 12, seed=3, owners=owners)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = split(Natural(), labels, 12, seed=4, owners=owners)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    ordered = Natural(shuffle=False)
    split(ordered, labels, 5, owners=owners)
    assert ordered.owner_ids.tolist() == [100, 101, 102, 103, 104]


def test_natural_errors(labels: np.ndarray, owners: np.ndarray) -> None:
    with pytest.raises(ValueError, match="no natural owners; use another partition"):
        split(Natural(), labels, 10)
    with pytest.raises(ValueError, match="fewer than num_clients"):
        split(Natural(), labels, 31, owners=owners)


# -- rotations ---------------------------------------------------------------------------------------
def test_rotation_clusters_and_transform() -> None:
    scheme = Rotations(4)
    assert scheme.angles == [0.0, 90.0, 180.0, 270.0]
    np.testing.assert_array_equal(scheme.cluster_labels(10), [0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
    np.testing.assert_array_equal(scheme.cluster_labels(8), [0, 0, 1, 1, 2, 2, 3, 3])
    img = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
    x, y = img.expand(3, 1, 2, 2), torch.arange(3)
    x0, y0 = scheme.transform(x, y, 0)
    assert torch.equal(x0, x) and torch.equal(y0, y)
    x1, y1 = scheme.transform(x, y, 1)  # 90 degrees counter-clockwise
    assert x1.dtype == torch.uint8 and torch.equal(y1, y)
    assert torch.equal(x1[0, 0], torch.tensor([[2, 4], [1, 3]], dtype=torch.uint8))
    assert torch.equal(x1, torch.rot90(x, 1, dims=(-2, -1)))
    assert torch.equal(scheme.transform(x, y, 2)[0][0, 0], torch.tensor([[4, 3], [2, 1]], dtype=torch.uint8))
    flat = torch.rand(5, 6, 6)  # (n, H, W) images
    assert torch.equal(scheme.transform(flat, y, 3)[0], torch.rot90(flat, 3, dims=(-2, -1)))


def test_rotation_by_any_angle() -> None:
    from torchvision.transforms.functional import rotate

    x = torch.rand(4, 1, 9, 9)
    scheme = Rotations(2, angles=[0.0, 90.0])
    # torch.rot90 turns the same way as torchvision's rotate
    assert torch.allclose(scheme.transform(x, torch.zeros(4), 1)[0], rotate(x, 90.0), atol=1e-5)
    odd = Rotations(2, angles=[0.0, 30.0])
    r = odd.transform(x, torch.zeros(4), 1)[0]
    assert r.shape == x.shape and not torch.allclose(r, x)
    assert torch.allclose(r[..., 4, 4], x[..., 4, 4])  # the centre stays put
    u8 = (x * 255).to(torch.uint8)
    assert odd.transform(u8, torch.zeros(4), 1)[0].dtype == torch.uint8


# -- label permutations ------------------------------------------------------------------------------
def test_label_permutations(labels: np.ndarray) -> None:
    scheme = LabelPermutations(4, seed=1)
    parts = split(scheme, labels, 8)
    check_exact_cover(parts, len(labels), 8)
    perms = scheme.permutations
    assert perms.shape == (4, K)
    np.testing.assert_array_equal(perms[0], np.arange(K))
    assert all(sorted(p.tolist()) == list(range(K)) for p in perms)
    assert len({tuple(p) for p in perms}) == 4  # distinct across clusters
    y = torch.arange(K).repeat(3)
    x = torch.rand(len(y), 2)
    for c in range(4):
        xc, yc = scheme.transform(x, y, c)
        assert torch.equal(xc, x)
        np.testing.assert_array_equal(yc.numpy(), perms[c][y.numpy()])
    same = LabelPermutations(4, seed=1, num_classes=K).permutations
    other = LabelPermutations(4, seed=2, num_classes=K).permutations
    np.testing.assert_array_equal(same, perms)
    assert not np.array_equal(other, perms)
    np.testing.assert_array_equal(scheme.cluster_labels(8), [0, 0, 1, 1, 2, 2, 3, 3])


def test_label_permutations_with_few_classes() -> None:
    perms = LabelPermutations(3, num_classes=3).permutations  # 3! = 6 permutations to choose from
    assert len({tuple(p) for p in perms}) == 3
    with pytest.raises(ValueError, match="distinct permutations"):
        LabelPermutations(3, num_classes=2)


# -- missing classes ---------------------------------------------------------------------------------
def test_missing_classes_default_sets_follow_ocfl() -> None:
    assert MissingClasses(3).kept_classes(10) == OCFL_CLASS_SETS["NO"]
    assert MissingClasses(3).kept_classes(9) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert MissingClasses(3).kept_classes(8) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    sets = [set(s) for s in MissingClasses(3, overlap=True).kept_classes(9)]
    assert all(len(a & b) == 3 for i, a in enumerate(sets) for b in sets[i + 1 :])  # pairwise overlap
    assert not set.intersection(*sets) and set.union(*sets) == set(range(9))


@pytest.mark.parametrize(
    "scheme",
    [
        MissingClasses(3),
        MissingClasses(3, overlap=True),
        MissingClasses(3, class_sets=OCFL_CLASS_SETS["O"]),
        MissingClasses(2, base=Dirichlet(0.5)),
        MissingClasses(3, cluster_sizes=[3, 7, 5]),
    ],
)
def test_missing_class_clients_never_hold_missing_classes(scheme: MissingClasses, labels: np.ndarray) -> None:
    parts = split(scheme, labels, 15)
    check_exact_cover(parts, len(labels), 15)
    clusters = scheme.cluster_labels(15)
    kept = scheme.kept_classes(K)
    for p, c in zip(parts, clusters):
        assert class_sets([p], labels)[0] <= set(kept[c])
    size = np.bincount(clusters)  # a class is shared among the clusters keeping it by their client counts
    for k in range(K):
        holders = [c for c in range(scheme.num_clusters) if k in kept[c]]
        for c in holders:
            got = sum(int(np.sum(labels[p] == k)) for p, cp in zip(parts, clusters) if cp == c)
            assert abs(got - PER_CLASS * size[c] / size[holders].sum()) <= 1


def test_missing_classes_cluster_blocks_and_errors(labels: np.ndarray) -> None:
    np.testing.assert_array_equal(MissingClasses(3).cluster_labels(15), np.repeat([0, 1, 2], 5))
    np.testing.assert_array_equal(
        MissingClasses(3, cluster_sizes=[3, 7, 5]).cluster_labels(15), np.repeat([0, 1, 2], [3, 7, 5])
    )
    with pytest.raises(ValueError, match="kept by no cluster"):
        split(MissingClasses(2, class_sets=[[0, 1], [2, 3]]), labels, 4)
    with pytest.raises(ValueError, match="add up"):
        split(MissingClasses(3, cluster_sizes=[3, 7, 5]), labels, 16)
    with pytest.raises(ValueError, match="cannot fill"):
        split(MissingClasses(3), labels, 2)


# -- argument checks ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: Dirichlet(alpha=0),
        lambda: Dirichlet(alpha=-1),
        lambda: Dirichlet(min_size=-1),
        lambda: QuantitySkew(alpha=0),
        lambda: ClassesPerClient(0),
        lambda: ClassesPerClient(fraction=0),
        lambda: ClassesPerClient(fraction=1.5),
        lambda: Shards(0),
        lambda: Rotations(0),
        lambda: Rotations(3, angles=[0, 90]),
        lambda: LabelPermutations(num_classes=1),
        lambda: MissingClasses(2, class_sets=[[0, 1]]),
        lambda: MissingClasses(2, class_sets=[[0], []]),
        lambda: MissingClasses(3, cluster_sizes=[5, 5]),
        lambda: MissingClasses(2, cluster_sizes=[0, 5]),
    ],
)
def test_bad_arguments_raise(make) -> None:
    with pytest.raises(ValueError):
        make()


# -- end to end through a data module ----------------------------------------------------------------
def test_digits_rotations_end_to_end() -> None:
    from fedlight.datamodules import DigitsFederated

    dm = DigitsFederated(num_clients=8, partition=Rotations(4), public_size=97, split_seed=0)
    data = dm.build()
    pool_x, _ = dm.load_pool()
    np.testing.assert_array_equal(data.cluster_labels, np.repeat([0, 1, 2, 3], 2))
    splits = (data.train, data.val, data.test)
    assert sum(s.bounds[-1] for s in splits) == len(pool_x) - 97
    for s in splits:
        assert s.bounds[0] == 0 and s.bounds[-1] == len(s.x) == len(s.y) and np.all(s.sizes() >= 0)
    # undo each client's rotation: together with the public data, that is the pool, each image once
    unrotated = [
        torch.rot90(s.client(k)[0], -int(data.cluster_labels[k]), dims=(-2, -1))
        for s in splits
        for k in range(data.num_clients)
    ]
    seen = torch.cat(unrotated + [data.public_x]).flatten(1)
    key = lambda t: sorted(map(tuple, (t * 16).round().int().tolist()))  # noqa: E731
    assert key(seen) == key(pool_x.flatten(1))
