"""Pairwise matrices against hand-worked examples, scikit-learn and scipy (independent computations)."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from sklearn.metrics.pairwise import cosine_distances, cosine_similarity, euclidean_distances

from fedlight.cluster.differences import Differences, true_runs
from fedlight.cluster.similarity import (
    agreement_similarity,
    cosine_distance_matrix,
    cosine_similarity_matrix,
    flatten,
    gram_matrix,
    js_divergence_matrix,
    l2_distance_matrix,
    stack_flat,
)

R2 = math.sqrt(2.0)
U3 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_cosine_hand_worked_3x2():
    expected = torch.tensor([[1.0, 0.0, 1 / R2], [0.0, 1.0, 1 / R2], [1 / R2, 1 / R2, 1.0]])
    torch.testing.assert_close(cosine_similarity_matrix(U3), expected)
    torch.testing.assert_close(cosine_distance_matrix(U3), 1.0 - expected)


def test_l2_hand_worked_3x2():
    expected = torch.tensor([[0.0, R2, 1.0], [R2, 0.0, 1.0], [1.0, 1.0, 0.0]])
    torch.testing.assert_close(l2_distance_matrix(U3), expected)


def test_against_sklearn_pairwise():
    U = torch.randn(20, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    X = U.double().numpy()
    np.testing.assert_allclose(cosine_similarity_matrix(U).numpy(), cosine_similarity(X), atol=1e-6)
    D = cosine_distance_matrix(U).numpy()
    np.testing.assert_allclose(D, cosine_distances(X), atol=1e-6)
    assert (D >= 0).all() and (np.diag(D) == 0).all()
    L = l2_distance_matrix(U).numpy()
    np.testing.assert_allclose(L, euclidean_distances(X), atol=1e-4)
    assert (np.diag(L) == 0).all() and np.array_equal(L, L.T)


def test_l2_accurate_for_rows_near_a_common_point():
    # Weights that share a large common part and differ a little: the naive Gram trick would lose them.
    g = torch.Generator().manual_seed(1)
    base = 100.0 * torch.randn(1, 5000, generator=g)
    U = base + 1e-2 * torch.randn(6, 5000, generator=g)
    np.testing.assert_allclose(l2_distance_matrix(U).numpy(), euclidean_distances(U.double().numpy()), rtol=1e-4)


def test_zero_rows():
    U = torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]])
    S = cosine_similarity_matrix(U)
    assert torch.isfinite(S).all()
    torch.testing.assert_close(S, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    D = cosine_distance_matrix(U)
    torch.testing.assert_close(D, 1.0 - S)


@pytest.mark.parametrize("chunk", [64, 333, 999, 5000])
def test_chunked_equals_unchunked(chunk):
    U = torch.randn(30, 1000, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(gram_matrix(U, chunk), gram_matrix(U), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(cosine_similarity_matrix(U, chunk), cosine_similarity_matrix(U), atol=1e-5, rtol=0)
    torch.testing.assert_close(cosine_distance_matrix(U, chunk), cosine_distance_matrix(U), atol=1e-5, rtol=0)
    torch.testing.assert_close(l2_distance_matrix(U, chunk), l2_distance_matrix(U), atol=1e-5, rtol=1e-5)


def test_list_of_rows_and_low_precision_input():
    U = torch.randn(10, 300, generator=torch.Generator().manual_seed(3))
    rows = list(U)
    torch.testing.assert_close(cosine_similarity_matrix(rows, chunk_size=32), cosine_similarity_matrix(U))
    S = cosine_similarity_matrix(U.bfloat16(), chunk_size=50)
    assert S.dtype == torch.float32
    expected = cosine_similarity(U.bfloat16().double().numpy())
    np.testing.assert_allclose(S.numpy(), expected, atol=1e-5)


def test_flatten_helpers():
    a, b = torch.arange(6.0).reshape(2, 3), torch.tensor([7.0])
    torch.testing.assert_close(flatten([a, b]), torch.tensor([0.0, 1, 2, 3, 4, 5, 7]))
    torch.testing.assert_close(flatten({"w": a, "b": b}), flatten([a, b]))
    M = stack_flat([{"w": a, "b": b}, [a + 1, b + 1]])
    assert M.shape == (2, 7)
    with pytest.raises(ValueError):
        stack_flat([a, b])


def test_input_validation():
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        cosine_similarity_matrix(torch.ones(3))
    with pytest.raises(ValueError, match="chunk_size"):
        cosine_similarity_matrix(torch.ones(3, 2), chunk_size=0)


# ----------------------------------------------------------------------------- Jensen-Shannon


def test_js_hand_computation():
    # JS([1,0],[0,1]) = ln 2.  JS([.5,.5],[1,0]): M = [.75,.25],
    # KL(p||M) = .5 ln(.5/.75) + .5 ln(.5/.25) = .5 ln(4/3), KL(q||M) = ln(4/3)  ->  JS = .75 ln(4/3).
    P = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    J = js_divergence_matrix(P)
    assert J[0, 1].item() == pytest.approx(math.log(2.0), abs=1e-6)
    assert J[0, 2].item() == pytest.approx(0.75 * math.log(4.0 / 3.0), abs=1e-6)
    # JS([.5,.5],[0,1]) is the mirror case; identical rows give exactly 0.
    assert J[1, 2].item() == pytest.approx(0.75 * math.log(4.0 / 3.0), abs=1e-6)
    assert (torch.diag(J) == 0).all()


def test_js_matches_scipy_squared_and_averages_over_samples():
    g = torch.Generator().manual_seed(4)
    P = torch.softmax(2.0 * torch.randn(6, 8, 5, generator=g, dtype=torch.float64), dim=-1)
    P[0, 0] = torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64)  # zeros are handled (0 log 0 = 0)
    J = js_divergence_matrix(P.float(), block_size=4).numpy()
    Pn = P.numpy()
    expected = np.array(
        [[np.mean([jensenshannon(Pn[i, s], Pn[j, s]) ** 2 for s in range(8)]) for j in range(6)] for i in range(6)]
    )
    np.testing.assert_allclose(J, expected, atol=1e-6)
    assert np.array_equal(J, J.T) and (np.diag(J) == 0).all()
    assert J.max() <= math.log(2.0)


def test_js_identical_is_zero_and_rejects_logits():
    P = torch.softmax(torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(5)), -1).repeat(3, 1, 1)
    assert (js_divergence_matrix(P) == 0).all()
    with pytest.raises(ValueError, match="softmax"):
        js_divergence_matrix(torch.randn(3, 4, 3))
    with pytest.raises(ValueError, match="sum to 1"):
        js_divergence_matrix(torch.full((3, 4, 3), 0.5))


# ----------------------------------------------------------------------------- agreement (inference similarity)


def test_agreement_constructed_example():
    preds = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 0], [1, 1, 2, 3]])
    expected = torch.tensor([[1.0, 2 / 4, 3 / 4], [2 / 4, 1.0, 1 / 4], [3 / 4, 1 / 4, 1.0]])
    torch.testing.assert_close(agreement_similarity(preds), expected)


def test_agreement_random_against_brute_force_and_scores():
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(7, 40, 4, generator=g)
    preds = scores.argmax(-1).numpy()
    brute = np.array([[np.mean(preds[i] == preds[j]) for j in range(7)] for i in range(7)])
    np.testing.assert_allclose(agreement_similarity(torch.as_tensor(preds)).numpy(), brute, atol=1e-7)
    np.testing.assert_allclose(agreement_similarity(scores).numpy(), brute, atol=1e-7)


def test_soft_agreement():
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(5, 12, 3, generator=g), dim=-1)
    S = agreement_similarity(probs, soft=True).numpy()
    np.testing.assert_allclose(S, cosine_similarity(probs.reshape(5, -1).double().numpy()), atol=1e-6)
    assert S.min() >= 0 and S.max() <= 1
    # With one-hot rows the soft formula is the agreement rate (FLIS, "FLIS: Clustered Federated Learning via
    # Inference Similarity for Non-IID Data Distribution", section 2.2, with the inner product for its norm).
    onehot = torch.nn.functional.one_hot(probs.argmax(-1), 3).float()
    torch.testing.assert_close(agreement_similarity(onehot, soft=True), agreement_similarity(probs))
    with pytest.raises(ValueError, match="probabilities"):
        agreement_similarity(torch.randn(5, 12, 3), soft=True)


def test_true_runs_by_hand():
    mask = torch.tensor([True, True, False, True, False, False, True])
    assert true_runs(mask) == [(0, 2), (3, 4), (6, 7)]
    assert true_runs(torch.zeros(4, dtype=torch.bool)) == []
    assert true_runs(torch.ones(3, dtype=torch.bool)) == [(0, 3)]


def trained_and_starts(shared_start: bool, n: int = 6, d: int = 41) -> tuple[torch.Tensor, torch.Tensor]:
    """Trained rows and their starts: one start expanded to every row (stride 0, as `stacked_starts` gives when
    every client starts from one model) or a start of each row's own."""
    g = torch.Generator().manual_seed(3)
    starts = torch.randn(d, generator=g).expand(n, d) if shared_start else torch.randn(n, d, generator=g)
    return starts + 0.1 * torch.randn(n, d, generator=g), starts


@pytest.mark.parametrize("shared_start", [True, False], ids=["stride-0 starts", "stacked starts"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "mask"])
def test_cosine_of_differences_in_blocks_smaller_than_a_row_matches_a_dense_float64_reference(shared_start, masked):
    params, starts = trained_and_starts(shared_start)
    d = params.shape[1]
    # runs of every shape: the first and last columns masked, a run of one, runs longer than a block
    columns = [c for c in range(d) if c % 7 not in (2, 3)] if masked else list(range(d))
    mask = torch.zeros(d, dtype=torch.bool)
    mask[columns] = True
    rows = Differences(params, starts, mask if masked else None)
    deltas = params.double()[:, columns] - starts.double()[:, columns]  # built explicitly, in float64
    reference = torch.nn.functional.cosine_similarity(deltas[:, None, :], deltas[None, :, :], dim=-1)
    assert rows.shape == (6, len(columns))
    for chunk_size in (1, 5, 13, None):
        torch.testing.assert_close(cosine_similarity_matrix(rows, chunk_size).double(), reference, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            cosine_distance_matrix(rows, chunk_size).double(), (1 - reference).fill_diagonal_(0), atol=1e-6, rtol=0
        )
    # rows and column blocks are built with float32's subtraction, exactly as the dense matrix would hold them
    dense = (params - starts)[:, columns]
    assert torch.equal(rows[:], dense) and torch.equal(rows[2], dense[2]) and torch.equal(rows[-1], dense[-1])
    assert torch.equal(rows[torch.tensor([4, 1])], dense[[4, 1]])
    assert torch.equal(rows[torch.tensor([True, False, True, False, False, True])], dense[[0, 2, 5]])
    assert torch.equal(rows[1:5], dense[1:5]) and torch.equal(rows.columns(3, 17), dense[:, 3:17])
