"""Evaluation's channels-last convolutions on a CPU: the same outputs, and the module's own tensors (views into the
flat model) back in place afterwards, even when the forward pass fails."""

import pytest
import torch

from fedlight.models import LeafCNN
from fedlight.plugin.channels_last import channels_last_on_cpu
from fedlight.training.flat import FlatModel


def test_channels_last_outputs_equal_nchw_and_the_flat_views_come_back():
    torch.manual_seed(0)
    network = LeafCNN(num_classes=62).eval()
    flat = FlatModel(network)
    x = torch.rand(64, 1, 28, 28)
    with torch.no_grad():
        nchw = network(x)
        with channels_last_on_cpu(network):
            assert network.conv2.weight.is_contiguous(memory_format=torch.channels_last)
            assert not network.conv2.weight.is_contiguous()
            nhwc = network(x)
    assert torch.allclose(nhwc, nchw, rtol=1e-5, atol=1e-6)
    flat.vector.zero_()  # the parameters are the flat vector's views again: zeroing it zeroes them
    assert (
        float(network.conv2.weight.detach().abs().sum()) == 0.0 and float(network.fc1.weight.detach().abs().sum()) == 0
    )


def test_the_module_tensors_come_back_after_a_failed_pass():
    network = LeafCNN(num_classes=62)
    own = network.conv1.weight.data
    with pytest.raises(RuntimeError), torch.no_grad(), channels_last_on_cpu(network):
        network(torch.rand(2, 3, 28, 28))  # three channels where the network reads one
    assert network.conv1.weight.data.data_ptr() == own.data_ptr() and network.conv1.weight.is_contiguous()


def test_a_one_channel_first_convolution_gives_channels_last_outputs():
    """A grayscale network's first weight (32, 1, 5, 5) passes for channels-last as it is; the copy must still get
    channels-last strides, or its outputs come out NCHW and the max-pooling after it runs on the slow layout."""
    network = LeafCNN(num_classes=62).eval()
    strides: dict[str, tuple[int, ...]] = {}

    def record(name: str):
        def hook(module, args, output) -> None:
            strides.setdefault(name, output.stride())

        return hook

    for name in ("conv1", "pool"):
        getattr(network, name).register_forward_hook(record(name))
    with torch.no_grad(), channels_last_on_cpu(network):
        network(torch.rand(4, 1, 28, 28))
    assert strides["conv1"][1] == 1 and strides["pool"][1] == 1  # the channels are the innermost dimension
