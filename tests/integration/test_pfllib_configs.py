"""The PFLlib benchmark configs (configs/papers/pfllib/: PFLlib's leaderboard setting on CIFAR-100, Dirichlet 0.1 and
pathological, one config per method fedlight shares with PFLlib; and on FMNIST, the same two splits, for the five
methods of FMNIST_PUBLISHED).

Each config keeps PFLlib's setting, stated here independently of the configs: 20 clients, every one every round, train
and test pooled and split 75/25 per client, the 4-layer CNN, plain SGD at 0.005, batch 10, 1 local epoch, 2000 rounds,
and each method's hyperparameters as PFLlib's command-line defaults (or the deviation its config explains); its
algorithm and federation settings are built from it, and `python -m fedlight fit`'s parser reads one config a split
(the others have the same form: parsing all of them would cost seconds). The published numbers in the comments are
checked against the leaderboard's Cifar100 and FMNIST columns. No data file is read: the data modules are constructed,
the partitions run on made labels, the network on the meta device; tests/unit/test_data_vision.py reads made CIFAR-100
files."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedlight import FederationConfig
from fedlight.datamodules import CIFAR100Federated, ClassesPerClient, Dirichlet, FashionMNISTFederated
from fedlight.models import FedAvgCNN
from fedlight.run import registry
from fedlight.run.cli import fit_parser

from helpers.pfllib import FMNIST_PUBLISHED, PUBLISHED, SPLITS

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "configs" / "papers" / "pfllib"
CONFIGS = sorted(path for split in SPLITS for path in (FOLDER / split).glob("*.yaml"))

#: each method's init_args: PFLlib's defaults (system/main.py and the client files), participation 1 (join ratio 1)
PFLLIB_ARGS = {
    "fedavg": {},
    "fedprox": {"mu": 0.0},
    "local": {},
    "fedper": {"personal_layers": 1},
    "lgfedavg": {"global_layers": 1},
    "fedbn": {},
    "ditto": {"lam": 0.0, "personal_epochs": 1},
    "fedrep": {"head_layers": 1, "head_epochs": 1, "body_epochs": 1},
    "fedbabu": {"head_layers": 1},
    "apfl": {"alpha": 1.0, "adaptive": True, "alpha_lr": None},
    "pfedme": {"lam": 1.0, "K": 5, "personal_lr": 0.01, "beta": 1.0, "train_every_client": True},
    "perfedavg": {"alpha": 0.005, "beta": 0.005, "variant": "fo"},
    "scaffold": {"server_lr": 1.0},
    "fedamp": {"alpha_k": 1.0, "lam": 1.0, "sigma": None},
    "fedrod": {},
    "fedproto": {"lam": 1.0},
    "feddbe": {"momentum": 0.1, "kappa": 0.0},
    "fedpac": {"lam": 1.0, "head_epochs": 1, "body_epochs": 1},
    "fedcp": {"lam": 1.0},
    "gpfl": {"lam": 1.0, "mu": 0.0},
    # PFLlib's -et 1.0, -s 80, -p 2 (fc's two tensors), and its evaluation after an ALA step learned afresh
    "fedala": {"eta": 1.0, "rand_percent": 80, "layers": 1, "evaluate_after_ala": True},
    # not PFLlib's defaults, which would turn the method off or weigh another term (the configs say why)
    "moon": {"mu": 1.0, "temperature": 0.5},
    "feddyn": {"alpha": 0.01},
}
FEDERATION = {"rounds": 2000, "local_epochs": 1, "batch_size": 10, "eval_split": "test", "precision": "32-true"}


@functools.lru_cache(maxsize=None)
def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def resolved(path: Path) -> dict:
    """A run config with its data, model and federation files read in, as `fit`'s parser reads them (relative to the
    config's folder)."""
    config = dict(load(path))
    for key in ("data", "model", "federation"):
        if isinstance(config[key], str):
            config[key] = load((path.parent / config[key]).resolve())
    return config


def fmnist(path: Path) -> bool:
    return path.parent.name.startswith("fmnist_")


def methods(split: str) -> list[str]:
    """The methods a split has a config for: every one on CIFAR-100, FMNIST_PUBLISHED's on FMNIST."""
    return sorted(FMNIST_PUBLISHED if split.startswith("fmnist_") else set(PFLLIB_ARGS) - {"fedala"})


def common(name: str) -> dict:
    return load(FOLDER / "common" / f"{name}.yaml")


def algorithm_class(name: str) -> type:
    module, cls = registry.short_names()[name].rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


def test_each_split_has_a_config_for_every_method_and_only_registered_ones():
    assert sorted({path.parent.name for path in CONFIGS}) == sorted(SPLITS)
    for split in SPLITS:
        assert sorted(p.stem for p in (FOLDER / split).glob("*.yaml")) == methods(split), split
    assert set(PFLLIB_ARGS) == set(methods("cifar100_pat")) | set(methods("fmnist_pat"))
    assert set(PFLLIB_ARGS) <= set(registry.short_names())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_config_keeps_pfllibs_setting(path):
    """What the config sets, and the algorithm and federation built from it (a wrong key or value raises)."""
    text, method, pathological = path.read_text(), path.stem, path.parent.name.endswith("_pat")
    assert text.startswith("# ") and f"python -m fedlight fit --config {path.relative_to(REPO).as_posix()}" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    published = FMNIST_PUBLISHED if fmnist(path) else PUBLISHED
    column = "FMNIST" if fmnist(path) else "Cifar100"
    if method in published:
        flat, number = text.replace("\n# ", " "), published[method][0 if pathological else 1]
        assert f"{column} column of the {'Pathological' if pathological else 'Practical'} Label Skew Setting" in flat
        assert f"{number} (best test accuracy over" in flat
    else:
        assert "number: not found" in text
    cfg = resolved(path)
    assert set(cfg) == {"seed", "data", "model", "federation", "algorithm"}
    assert cfg["algorithm"] == {"class_path": method, "init_args": {**PFLLIB_ARGS[method], "participation": 1.0}}
    algorithm_class(method)(**cfg["algorithm"]["init_args"])
    special = {"eval_every": 2000, "finetune_epochs": 10} if method == "fedbabu" else {"eval_every": 1}
    assert cfg["federation"] == {**FEDERATION, **special}
    FederationConfig(**cfg["federation"])
    assert cfg["model"] == common("model_fmnist" if fmnist(path) else "model")
    assert cfg["data"] == common(f"data_{path.parent.name}")


@pytest.mark.parametrize(
    "path",
    [
        FOLDER / "cifar100_pat" / "fedbabu.yaml",
        FOLDER / "cifar100_dir0.1" / "fedamp.yaml",
        FOLDER / "fmnist_pat" / "fedala.yaml",
        FOLDER / "fmnist_dir0.1" / "feddbe.yaml",
    ],
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_fits_parser_reads_what_the_config_says(path):
    """`python -m fedlight fit`'s parser (keys, types, referenced files, class paths) reads the same settings; one
    config a split, the others having the same form."""
    cfg = fit_parser().parse_args(["--config", str(path)], defaults=False)
    assert cfg.algorithm.class_path == registry.short_names()[path.stem]
    assert cfg.algorithm.init_args.as_dict() == resolved(path)["algorithm"]["init_args"]
    assert {k: v for k, v in cfg.federation.as_dict().items() if not k.startswith("__")} == resolved(path)["federation"]


#: each data set's model file, network settings, data module, data folder, channels and its two partitions
DATASETS = {
    "cifar100": (
        "model",
        {"in_channels": 3, "num_classes": 100, "image_size": 32},
        CIFAR100Federated,
        "data/cifar100",
        3,
        {"dir0.1": (Dirichlet, {"alpha": 0.1, "min_size": 40}), "pat": (ClassesPerClient, {"classes_per_client": 10})},
    ),
    # PFLlib's generate_FashionMNIST.py: class_per_client=2 for its pathological split
    "fmnist": (
        "model_fmnist",
        {"in_channels": 1, "num_classes": 10, "image_size": 28},
        FashionMNISTFederated,
        "data/fmnist",
        1,
        {"dir0.1": (Dirichlet, {"alpha": 0.1, "min_size": 40}), "pat": (ClassesPerClient, {"classes_per_client": 2})},
    ),
}


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_the_model_and_data_are_pfllibs(dataset):
    """Plain SGD at 0.005 on the 4-layer CNN; the data set pooled and split 75/25 over 20 clients, normalized by 0.5."""
    model_file, network, data_class, root, channels, partitions = DATASETS[dataset]
    model = common(model_file)["init_args"]
    assert (common(model_file)["class_path"], model["network"]["class_path"]) == (
        "fedlight.models.Classifier",
        "fedlight.models.FedAvgCNN",
    )
    assert model["network"]["init_args"] == network
    assert (model["optimizer"], model["lr"], model["momentum"], model["weight_decay"]) == ("sgd", 0.005, 0.0, 0.0)
    for split, (scheme, args) in partitions.items():
        name = f"data_{dataset}_{split}"
        data = dict(common(name)["init_args"])
        assert common(name)["class_path"] == f"fedlight.datamodules.{data_class.__name__}"
        assert data.pop("partition") == {"class_path": f"fedlight.datamodules.{scheme.__name__}", "init_args": args}
        assert data == {
            "root": root,
            "official_splits": False,
            "num_clients": 20,
            "val_fraction": 0.0,
            "test_fraction": 0.25,
            "split_seed": 1,
            "mean": [0.5] * channels,
            "std": [0.5] * channels,
        }
        data_class(partition=scheme(**args), **data)  # builds without reading a file


def test_the_network_is_pfllibs_4_layer_cnn_for_cifar():
    """PFLlib's FedAvgCNN(in_features=3, dim=1600): 3x32x32 images flatten to 64 x 5 x 5 = 1600 features after two
    unpadded 5x5 convs and 2x2 pools; its parameters counted by hand."""
    with torch.device("meta"):
        net = FedAvgCNN(**common("model")["init_args"]["network"]["init_args"])
        out = net(torch.zeros(2, 3, 32, 32))
    assert out.shape == (2, 100) and net.fc1.in_features == 1600 and net.fc1.out_features == 512
    by_hand = (3 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (1600 * 512 + 512) + (512 * 100 + 100)
    assert sum(p.numel() for p in net.parameters()) == by_hand == 924_708
    assert net.layer_names()[-1] == "fc"  # PFLlib's head: what FedPer, FedRep, FedBABU and LG-FedAvg split off


def test_the_network_is_pfllibs_4_layer_cnn_for_fmnist():
    """PFLlib's FedAvgCNN(in_features=1, dim=1024): 1x28x28 images flatten to 64 x 4 x 4 = 1024 features."""
    with torch.device("meta"):
        net = FedAvgCNN(**common("model_fmnist")["init_args"]["network"]["init_args"])
        out = net(torch.zeros(2, 1, 28, 28))
    assert out.shape == (2, 10) and net.fc1.in_features == 1024 and net.fc1.out_features == 512
    by_hand = (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (1024 * 512 + 512) + (512 * 10 + 10)
    assert sum(p.numel() for p in net.parameters()) == by_hand == 582_026
    assert net.layer_names()[-1] == "fc"  # the one layer of FedALA's layers 1 (PFLlib's layer_idx 2)


def partition_args(name: str) -> dict:
    return common(name)["init_args"]["partition"]["init_args"]


def test_the_pathological_partition_gives_every_client_10_of_100_classes():
    labels = np.repeat(np.arange(100), 30)  # 3,000 made labels, 30 of each class
    parts = ClassesPerClient(**partition_args("data_cifar100_pat")).assign(labels, 20, np.random.default_rng(0))
    assert [len(np.unique(labels[part])) for part in parts] == [10] * 20
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))  # disjoint, nothing left out


def test_the_fmnist_pathological_partition_gives_every_client_2_of_10_classes():
    labels = np.repeat(np.arange(10), 300)
    parts = ClassesPerClient(**partition_args("data_fmnist_pat")).assign(labels, 20, np.random.default_rng(0))
    assert [len(np.unique(labels[part])) for part in parts] == [2] * 20
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))


def test_the_fmnist_dirichlet_partition_keeps_pfllibs_least_samples():
    """PFLlib's least_samples = min(10 / (1 - 0.75), 70,000 / 20 / 2) = 40 for FMNIST too."""
    labels = np.repeat(np.arange(10), 300)
    parts = Dirichlet(**partition_args("data_fmnist_dir0.1")).assign(labels, 20, np.random.default_rng(0))
    assert min(len(part) for part in parts) >= min(10 / (1 - 0.75), 70_000 / 20 / 2) == 40
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))


def test_the_dirichlet_partition_keeps_pfllibs_least_samples():
    """PFLlib's least_samples = min(batch 10 / (1 - train ratio 0.75), samples / clients / 2) = 40 for CIFAR-100."""
    labels = np.repeat(np.arange(100), 30)
    parts = Dirichlet(**partition_args("data_cifar100_dir0.1")).assign(labels, 20, np.random.default_rng(0))
    assert min(len(part) for part in parts) >= min(10 / (1 - 0.75), 60_000 / 20 / 2) == 40
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
