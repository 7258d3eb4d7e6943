"""The papers' networks: output shapes, parameter counts and layer_names.

The papers: LEAF ("LEAF: A Benchmark for Federated Settings"), FLIS ("FLIS: Clustered Federated Learning via
Inference Similarity for Non-IID Data Distribution"), OCFL ("One-Shot Clustering for Federated Learning Under
Clustering-Agnostic Assumption") and FedTSDP ("Federated Two Stage Decoupling With Adaptive Personalization
Layers"). Expected parameter counts are hand arithmetic from the layer shapes, never the code's own output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlight.models.cnn import FedAvgCNN, FedTSDPCNN, LeafCNN, OCFLCNN, SmallCNN
from fedlight.models.conv1d import Conv1DNet
from fedlight.models.layers import default_layer_names
from fedlight.training.layer_masks import layer_halves
from fedlight.models.lenet import LeNet5
from fedlight.models.mlp import MLP
from fedlight.models.resnet import ResNet9, ResNet18, ResNet34


def conv(c_in: int, c_out: int, k: int, bias: bool = True) -> int:
    return k * k * c_in * c_out + (c_out if bias else 0)


def fc(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def basic_block(c_in: int, c_out: int) -> int:
    """Two bias-free 3x3 convs, two norms (2*c each), and a 1x1 conv + norm if the shape changes."""
    shortcut = c_in * c_out + 2 * c_out if c_in != c_out else 0
    return 9 * c_in * c_out + 2 * c_out + 9 * c_out * c_out + 2 * c_out + shortcut


def cifar_resnet(blocks: list[int], num_classes: int) -> int:
    total, c_in = 27 * 64 + 2 * 64, 64  # 3x3 stem on 3 channels + norm
    for n, c_out in zip(blocks, (64, 128, 256, 512)):
        total += basic_block(c_in, c_out) + (n - 1) * basic_block(c_out, c_out)
        c_in = c_out
    return total + fc(512, num_classes)


# (id, constructor, input shape without batch, num_classes, expected parameter count)
CASES = [
    # FLIS's LeNet-5 (section 3.1) on CIFAR-10/SVHN: 456 + 2,416 + 48,120 + 10,164 + 850 = 62,006 parameters.
    ("lenet5-32", lambda: LeNet5(3, 10, 32), (3, 32, 32), 10, 62_006),
    # On FMNIST (flatten 256): 156 + 2,416 + 30,840 + 10,164 + 850 = 44,426 parameters.
    ("lenet5-28", lambda: LeNet5(1, 10, 28), (1, 28, 28), 10, 44_426),
    # OCFL's MNIST/FMNIST CNN (section 4.2), about 25.4 M; exact count from the layer shapes.
    (
        "ocflcnn",
        lambda: OCFLCNN(1, 10, 28),
        (1, 28, 28),
        10,
        conv(1, 16, 5)
        + conv(16, 32, 5)
        + conv(32, 32, 5)
        + fc(32 * 28 * 28, 1000)
        + fc(1000, 250)
        + fc(250, 100)
        + fc(100, 10),
    ),  # = 25,404,240
    # FedTSDP's CNN (section 4.1.2), about 6.45 M; exact count from the layer shapes.
    (
        "fedtsdpcnn",
        lambda: FedTSDPCNN(3, 10, 32),
        (3, 32, 32),
        10,
        conv(3, 32, 3) + conv(32, 64, 3) + fc(64 * 14 * 14, 512) + fc(512, 10),
    ),  # = 6,447,562
    (
        "fedtsdpcnn-100",
        lambda: FedTSDPCNN(3, 100, 32),
        (3, 32, 32),
        100,
        conv(3, 32, 3) + conv(32, 64, 3) + fc(64 * 14 * 14, 512) + fc(512, 100),
    ),
    # FLIS's ResNet-9 (section 3.1), about 6.62 M; FLIS's code keeps the conv biases; GroupNorm has 2*C.
    (
        "resnet9",
        lambda: ResNet9(3, 100),
        (3, 32, 32),
        100,
        conv(3, 64, 3)
        + 2 * 64
        + conv(64, 128, 3)
        + 2 * 128
        + 2 * (conv(128, 128, 3) + 2 * 128)
        + conv(128, 256, 3)
        + 2 * 256
        + conv(256, 512, 3)
        + 2 * 512
        + 2 * (conv(512, 512, 3) + 2 * 512)
        + fc(512, 100),
    ),  # = 6,621,540
    # CIFAR ResNet-18/34: the well-known 11,173,962 and 21,282,122 for 10 classes.
    ("resnet18", lambda: ResNet18(3, 10), (3, 32, 32), 10, cifar_resnet([2, 2, 2, 2], 10)),
    ("resnet18-group", lambda: ResNet18(3, 10, norm="group"), (3, 32, 32), 10, cifar_resnet([2, 2, 2, 2], 10)),
    ("resnet34", lambda: ResNet34(3, 10), (3, 32, 32), 10, cifar_resnet([3, 4, 6, 3], 10)),
    ("mlp", lambda: MLP(64, [128, 64], 10, dropout=0.1), (1, 8, 8), 10, fc(64, 128) + fc(128, 64) + fc(64, 10)),
    ("mlp-linear", lambda: MLP(14, [], 2), (14,), 2, fc(14, 2)),
    # FedAvg's CNN without padding (PFLlib, FL-bench): 28 -> 24 -> 12 -> 8 -> 4, so fc1 sees 64*4*4 = 1,024 inputs.
    (
        "fedavgcnn",
        lambda: FedAvgCNN(),
        (1, 28, 28),
        10,
        conv(1, 32, 5) + conv(32, 64, 5) + fc(64 * 4 * 4, 512) + fc(512, 10),
    ),  # = 582,026
    # LEAF's FEMNIST CNN: 5x5 'same' convs keep 28x28, two 2x2 pools leave 7x7x64 = 3,136 inputs to the dense layer:
    # (25*1*32 + 32) + (25*32*64 + 64) + (3,136*2,048 + 2,048) + (2,048*62 + 62)
    # = 832 + 51,264 + 6,424,576 + 127,038 = 6,603,710 (the count usually cited for it).
    (
        "leafcnn",
        lambda: LeafCNN(),
        (1, 28, 28),
        62,
        conv(1, 32, 5) + conv(32, 64, 5) + fc(64 * 7 * 7, 2048) + fc(2048, 62),
    ),
    ("smallcnn", lambda: SmallCNN(), (1, 8, 8), 10, conv(1, 32, 3) + conv(32, 64, 3) + fc(64 * 4 * 4, 10)),  # = 29,066
    (
        "conv1dnet",
        lambda: Conv1DNet(),
        (3, 200),
        6,
        5 * 3 * 32 + 32 + 5 * 32 * 64 + 64 + fc(64 * 50, 100) + fc(100, 6),
    ),  # = 331,522
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request):
    name, make, shape, num_classes, count = request.param
    torch.manual_seed(0)
    return make(), shape, num_classes, count


def test_known_totals() -> None:
    """The arithmetic above reproduces the published totals."""
    assert conv(1, 32, 5) + conv(32, 64, 5) + fc(64 * 7 * 7, 2048) + fc(2048, 62) == 6_603_710  # LEAF's FEMNIST CNN
    assert cifar_resnet([2, 2, 2, 2], 10) == 11_173_962
    assert cifar_resnet([3, 4, 6, 3], 10) == 21_282_122


def test_forward_shape(case) -> None:
    model, shape, num_classes, _ = case
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    assert out.shape == (2, num_classes)


def test_parameter_count(case) -> None:
    model, _, _, count = case
    assert sum(p.numel() for p in model.parameters()) == count


def test_layer_names_cover_every_parameter_once(case) -> None:
    model = case[0]
    names = model.layer_names()
    assert len(set(names)) == len(names)
    owner = {}
    for pname, _ in model.named_parameters():
        owners = [n for n in names if pname.startswith(n + ".")]
        assert len(owners) == 1, f"{pname} belongs to {owners}"
        owner[pname] = owners[0]
    assert set(owner.values()) == set(names), "every layer owns at least one parameter"


def test_layer_names_in_forward_order(case) -> None:
    model, shape, _, _ = case
    names = model.layer_names()
    seen: list[str] = []
    hooks = [model.get_submodule(n).register_forward_pre_hook(lambda m, a, n=n: seen.append(n)) for n in names]
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, *shape))
    for h in hooks:
        h.remove()
    first_calls = list(dict.fromkeys(seen))
    assert first_calls == names


def test_specific_layer_names() -> None:
    assert LeNet5().layer_names() == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert FedTSDPCNN().layer_names() == ["conv1", "conv2", "fc1", "fc2"]  # L_total = 4
    assert LeafCNN().layer_names() == ["conv1", "conv2", "fc1", "fc"]
    assert MLP(4, [8, 8], 3).layer_names() == ["hidden.0", "hidden.1", "out"]
    # ResNet-18 has 10 FedTSDP layer units (stem, 8 BasicBlocks, fc; the paper does not define them).
    names = ResNet18().layer_names()
    assert names == ["stem"] + [f"layer{s}.{j}" for s in range(1, 5) for j in range(2)] + ["fc"]
    assert len(ResNet9().layer_names()) == 9


def test_default_layer_names_lists_parameter_owning_modules() -> None:
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 1))
    assert default_layer_names(net) == ["0", "2", "4"]


def test_layer_halves_follow_fedtsdp_half_layers() -> None:
    # A [weight, bias] layer: weight shared (first half), bias personal (our reading of FedTSDP's half layers,
    # section 4.5: "from 4 to 3.5").
    assert layer_halves(FedTSDPCNN(), "fc2") == (["fc2.weight"], ["fc2.bias"])
    # A BasicBlock: conv1+bn1 | conv2+bn2+shortcut; BN buffers go with their module.
    model = ResNet18()
    first, second = layer_halves(model, "layer2.0")
    assert {k.split(".")[2] for k in first} == {"conv1", "bn1"}
    assert {k.split(".")[2] for k in second} == {"conv2", "bn2", "shortcut"}
    assert "layer2.0.bn1.running_mean" in first
    block_keys = [k for k in model.state_dict() if k.startswith("layer2.0.")]
    assert sorted(first + second) == sorted(block_keys)
    # A leaf BatchNorm: weight | bias, statistics with the weight.
    bn = nn.Sequential(nn.BatchNorm2d(3))
    assert layer_halves(bn, "0") == (
        ["0.weight", "0.running_mean", "0.running_var", "0.num_batches_tracked"],
        ["0.bias"],
    )


def test_group_norm_option_has_no_batchnorm() -> None:
    model = ResNet18(norm="group")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert not any(k.endswith("running_mean") for k in model.state_dict())
    with pytest.raises(ValueError, match="norm"):
        ResNet18(norm="layer")  # type: ignore[arg-type]


def test_28x28_inputs_for_resnets() -> None:
    """OCFL runs ResNet-34 on MedMNIST (section 4.2; 28x28 is our choice); ResNet-9's global pool is adaptive too."""
    x = torch.randn(2, 3, 28, 28)
    assert ResNet18(3, 9).eval()(x).shape == (2, 9)
    assert ResNet9(3, 8).eval()(x).shape == (2, 8)
    assert LeNet5(3, 10, 28)(x).shape == (2, 10)


def test_smallcnn_learns_digits() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    train, test = perm[:1400], perm[1400:]
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(2):
        for i in range(0, len(train), 32):
            b = train[i : i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    assert acc > 0.9


def papers_order(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The networks' forward written in the papers' order, ReLU before max-pooling (the reference for the models'
    pool-then-ReLU), from their own layers."""
    relu_pool = lambda t: net.pool(torch.relu(t))  # noqa: E731
    if isinstance(net, (LeafCNN, FedAvgCNN)):
        x = relu_pool(net.conv2(relu_pool(net.conv1(x))))
        return net.fc(torch.relu(net.fc1(torch.flatten(x, 1))))
    if isinstance(net, LeNet5):
        x = relu_pool(net.bn2(net.conv2(relu_pool(net.bn1(net.conv1(x))))))
        x = torch.relu(net.fc2(torch.relu(net.fc1(torch.flatten(x, 1)))))
        return net.fc3(x)
    if isinstance(net, SmallCNN):
        return net.fc(torch.flatten(relu_pool(net.conv2(torch.relu(net.conv1(x)))), 1))
    if isinstance(net, FedTSDPCNN):
        x = torch.flatten(relu_pool(net.conv2(torch.relu(net.conv1(x)))), 1)
        return net.fc2(torch.relu(net.fc1(x)))
    assert isinstance(net, Conv1DNet)
    x = relu_pool(net.conv2(relu_pool(net.conv1(x))))
    return net.fc2(torch.relu(net.fc1(torch.flatten(x, 1))))


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: LeafCNN(), (6, 1, 28, 28)),
        (lambda: FedAvgCNN(), (6, 1, 28, 28)),
        (lambda: LeNet5(), (6, 3, 32, 32)),
        (lambda: LeNet5(batch_norm=True), (6, 3, 32, 32)),
        (lambda: SmallCNN(), (6, 1, 8, 8)),
        (lambda: FedTSDPCNN(), (6, 3, 32, 32)),
        (lambda: Conv1DNet(window=40), (6, 3, 40)),
    ],
)
def test_pooling_before_relu_changes_no_bit(make, shape) -> None:
    """The models max-pool before ReLU (a quarter of the ReLUs); outputs and every gradient equal the papers' order
    bit for bit. The inputs are shifted down so that some pooling windows hold no positive value (no gradient in
    either order)."""
    torch.manual_seed(0)
    net = make().eval()  # eval: dropout off, so both passes see the same network
    x = torch.randn(shape) - 0.5
    grads = []
    for forward in (net, lambda t: papers_order(net, t)):
        net.zero_grad()
        out = forward(x)
        out.square().sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in net.parameters()]))
    (ours, our_grads), (papers, papers_grads) = grads
    assert torch.equal(ours, papers)
    assert all(torch.equal(a, b) for a, b in zip(our_grads, papers_grads))
