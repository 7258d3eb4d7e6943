"""The flat-vector binding: module state and gradients are views of one vector each."""

import torch
from torch import nn

from fedlight.training.flat import FlatModel


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_layout_covers_every_floating_tensor_once():
    module = net()
    flat = FlatModel(module)
    floating = [t for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()]
    assert flat.numel == sum(t.numel() for t in floating) == (3 * 4 + 4) + (4 + 4 + 4 + 4) + (4 * 2 + 2)
    starts = [e.start for e in flat.entries]
    assert starts == sorted(starts) and flat.entries[-1].stop == flat.numel
    assert flat.layers() == ["0", "1", "3"]


def test_binding_keeps_values_and_load_changes_the_module():
    module = net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    flat = FlatModel(module)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    flat.load(torch.arange(flat.numel, dtype=torch.float32))
    assert module[0].weight.flatten().tolist() == list(range(12))
    # after linear weight (12) and bias (4), bn weight (4) and bias (4): offset 24
    assert module[1].running_mean.tolist() == [24.0, 25.0, 26.0, 27.0]
    x = torch.randn(5, 3)
    module.eval()
    manual = module[3](torch.relu(module[1](module[0](x))))
    assert torch.allclose(module(x), manual)


def test_gradients_accumulate_into_the_flat_gradient():
    module = net()
    flat = FlatModel(module)
    module(torch.randn(8, 3)).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in module.parameters()])
    params = flat.parameter_mask()
    assert torch.equal(flat.grad[params], expected)
    assert flat.grad[~params].abs().sum() == 0  # buffers have no gradient
    flat.zero_grad()
    assert all(p.grad.abs().sum() == 0 for p in module.parameters())


def test_batchnorm_statistics_update_in_the_flat_vector():
    module = net()
    flat = FlatModel(module)
    before = flat.read()
    module.train()
    module(torch.randn(8, 3) + 5)
    mean_slice = next(e for e in flat.entries if e.name == "1.running_mean")
    assert not torch.equal(before[mean_slice.start : mean_slice.stop], flat.vector[mean_slice.start : mean_slice.stop])


def test_layer_mask_selects_named_layers():
    flat = FlatModel(net())
    mask = flat.layer_mask(["3"])
    assert mask.sum() == 4 * 2 + 2 and mask[-10:].all()


def test_fresh_gradients_are_new_tensors_inside_and_the_flat_views_come_back_zeroed():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    flat = FlatModel(module)
    x = torch.randn(5, 3)
    module(x).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in module.parameters()])  # into the flat views
    flat.zero_grad()
    with flat.fresh_gradients() as drop:
        assert all(p.grad is None for p in module.parameters())
        module(x).sum().backward()
        fresh = torch.cat([p.grad.flatten() for p in module.parameters()])
        assert torch.equal(fresh, expected) and not flat.grad.any()  # handed over, the flat gradient untouched
        drop()
        assert all(p.grad is None for p in module.parameters())
    module(x).sum().backward()  # the views are bound again: backward writes the flat gradient
    assert torch.equal(flat.grad, expected)
