"""pFedHN against independent computations: the server's step on a linear hypernetwork h(v) = W v worked by hand
(W + lr delta v^T, v + lr W^T delta), its SGD and clipping against torch's own, the head's bias moving by lr times the
round's summed changes, personalized generated models, a newcomer's embedding fit against a plain PyTorch loop, exact
resumption and the refusal of bad options."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fedlight import Federation, FederationConfig
from fedlight.algorithms.pfedhn import PFedHN, clip_scale, pseudo_gradients, sgd_step_
from fedlight.datamodules import ClassesPerClient, DigitsFederated
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.models import Classifier, SmallCNN

from helpers.federations import every_row, small_federation


def test_one_step_of_a_linear_hypernetwork_is_lr_delta_v_transposed_and_lr_w_transposed_delta():
    """h(v) = W v, theta_i = W v_i: the pseudo-gradient of -sum_i <delta_i, W v_i> is -sum_i delta_i v_i^T for W and
    -W^T delta_i for v_i, so plain SGD gives W + lr sum_i delta_i v_i^T and v_i + lr W^T delta_i."""
    hypernet = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        hypernet.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 0.5]]))
    W = hypernet.weight.detach().clone()
    v = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    delta = torch.tensor([[0.1, 0.0, -0.2], [0.0, 0.3, 0.1]])
    lr = 0.5
    (w_grad,), v_grad = pseudo_gradients(hypernet, v, delta)
    # by hand: W + lr (delta_1 v_1^T + delta_2 v_2^T)
    expected_w = W + lr * torch.tensor(
        [[0.1 * 1.0 + 0.0, 0.1 * -2.0 + 0.0], [0.0 + 0.3 * 0.5, 0.0 + 0.0], [-0.2 * 1.0 + 0.1 * 0.5, -0.2 * -2.0 + 0.0]]
    )
    # by hand: v_i + lr W^T delta_i: W^T delta_1 = (0.1 - 0.6, 0.2 - 0.1), W^T delta_2 = (0.3, -0.3 + 0.05)
    expected_v = v + lr * torch.tensor([[-0.5, 0.1], [0.3, -0.25]])
    with torch.no_grad():
        sgd_step_(hypernet.weight, w_grad, torch.zeros_like(W), lr, momentum=0.9, weight_decay=0.0)
    sgd_step_(v, v_grad, torch.zeros_like(v), lr, momentum=0.9, weight_decay=0.0)  # the first step: no momentum yet
    assert torch.allclose(hypernet.weight, expected_w, atol=1e-6)
    assert torch.allclose(v, expected_v, atol=1e-6)


def test_the_server_step_is_torch_sgd_and_the_clip_is_torch_clip_grad_norm():
    g = torch.Generator().manual_seed(0)
    mine, reference = torch.randn(5, generator=g), torch.zeros(5)
    reference.copy_(mine)
    reference.requires_grad_(True)
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9, weight_decay=0.01)
    buffer = torch.zeros(5)
    for _ in range(3):
        grad = torch.randn(5, generator=g)
        sgd_step_(mine, grad, buffer, 0.1, 0.9, 0.01)
        reference.grad = grad.clone()
        optimizer.step()
    assert torch.allclose(mine, reference.detach(), atol=1e-7)
    grads = [torch.randn(3, 2, generator=g) * 40, torch.randn(4, generator=g) * 40]
    params = [torch.zeros_like(t, requires_grad=True) for t in grads]
    for p, t in zip(params, grads):
        p.grad = t.clone()
    norm = float(torch.nn.utils.clip_grad_norm_(params, 50.0))
    total, scale = clip_scale(grads, 50.0)
    assert total == pytest.approx(norm) and scale < 1
    for p, t in zip(params, grads):
        assert torch.allclose(p.grad, t * scale, atol=1e-6)


def test_a_round_moves_the_heads_bias_by_lr_times_the_summed_changes_and_each_client_gets_its_own_model():
    """The head's bias b enters every theta_i as b itself (d theta / d b = I): its pseudo-gradient is -sum_i delta_i,
    so the first step is b - lr (wd b - sum_i delta_i), the changes recomputed here by training each client alone."""
    alg = PFedHN(hn_lr=0.05, hn_weight_decay=0.01, participation=0.5)
    fed = small_federation(alg, num_clients=4, rounds=2)
    clients = alg.select_clients(1)
    starts = {c: alg.client_model(c).clone() for c in range(4)}
    assert all(not torch.equal(starts[0], starts[c]) for c in (1, 2, 3))  # a model of its own for every client
    bias = alg.hypernet.head.bias.detach().clone()
    assert torch.equal(bias, fed.server.model.initial_params)  # SmallCNN has no buffers: h generates every entry
    result = fed.run_round(1)
    deltas = sum(alg.train_group(1, [c], starts[c][None]).params[0] - starts[c] for c in clients)
    assert result.scalars["pfedhn/grad_norm"] < 50  # not clipped
    expected = bias - 0.05 * (0.01 * bias - deltas)
    assert torch.allclose(alg.hypernet.head.bias.detach(), expected, atol=1e-6)
    for c in range(4):  # the round's clients' embeddings moved, the others' not
        assert torch.equal(alg.embeddings[c], alg.initial_embeddings(torch.tensor([c]))[0]) == (c not in clients)
    accuracy = []
    for c in range(4):  # every client is evaluated with its own generated model
        x, y = fed.server.clients.split("test").client(c)
        accuracy.append((fed.server.model.predict(alg.client_model(c), x).argmax(1) == y).double().mean())
    assert result.scalars["test/acc_mean"] == pytest.approx(float(torch.stack(accuracy).mean()))


def test_a_newcomers_embedding_is_fitted_by_a_plain_sgd_loop_through_the_frozen_hypernetwork():
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=5, partition=ClassesPerClient(2), holdout_clients=1)
    alg = PFedHN(newcomer_epochs=2, embed_lr=0.5)
    fed = Federation(
        data,
        Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1),
        alg,
        FederationConfig(rounds=1, batch_size=32, accelerator="cpu", vectorize=0),
        seed=0,
    )
    fed.run_round(1)
    newcomers = fed.extension(NewcomerEvaluation).clients
    phi = {k: v.clone() for k, v in alg.hypernet.state_dict().items()}
    models, groups, placed = alg.newcomer_models(newcomers)
    assert placed is None and groups.tolist() == [0]
    assert all(torch.equal(phi[k], v) for k, v in alg.hypernet.state_dict().items())  # phi is frozen
    start = alg.fresh_embeddings([0], "pfedhn_newcomer")[0]
    v = start.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([v], lr=0.5, momentum=0.9, weight_decay=1e-3)
    entries = fed.flat.entries
    for _, _, (x, y) in newcomers.batches(0, 2, "pfedhn_embedding"):
        theta = alg.hypernet(v[None])[0]  # every entry: SmallCNN has no buffers
        tensors = {e.name: theta[e.start : e.stop].view(e.shape) for e in entries}
        optimizer.zero_grad()
        F.cross_entropy(torch.func.functional_call(fed.module, tensors, (x,)), y).backward()
        optimizer.step()
    assert not torch.equal(v.detach(), start)
    assert torch.allclose(models[0], alg.hypernet(v.detach()[None])[0].detach(), atol=1e-5)


def test_a_run_resumed_from_its_state_ends_as_an_uninterrupted_one():
    def make() -> Federation:
        return small_federation(PFedHN(participation=0.5), num_clients=4, rounds=2)

    a = make()
    a.run_round(1)
    b = make()
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # no tensor shared with the run that goes on
    ra, rb = a.run_round(2), b.run_round(2)
    for (name, x), y in zip(a.algorithm.hypernet.state_dict().items(), b.algorithm.hypernet.state_dict().values()):
        assert torch.equal(x, y), name
    for x, y in zip(a.algorithm.momenta, b.algorithm.momenta):
        assert torch.equal(x, y)
    for name in ("embeddings", "embedding_momentum"):
        assert torch.equal(every_row(getattr(a.algorithm, name)), every_row(getattr(b.algorithm, name))), name
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]


@pytest.mark.parametrize(
    "options, name",
    [
        ({"embed_dim": 0}, "embed_dim"),
        ({"embed_dim": -3}, "embed_dim"),
        ({"hidden_dim": 0}, "hidden_dim"),
        ({"n_hidden": -1}, "n_hidden"),
        ({"hn_lr": 0.0}, "hn_lr"),
        ({"embed_lr": -1.0}, "embed_lr"),
        ({"hn_momentum": 1.0}, "hn_momentum"),
        ({"hn_weight_decay": -0.1}, "hn_weight_decay"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"newcomer_epochs": 0}, "newcomer_epochs"),
    ],
)
def test_pfedhn_refuses_bad_options_in_one_line(options, name):
    with pytest.raises(ValueError, match=f"^{name} must") as error:
        PFedHN(**options)
    assert "\n" not in str(error.value)
