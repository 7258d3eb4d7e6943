"""The cross-device configs (configs/cross_device/femnist/: LEAF FEMNIST at its size, 10 of 3,400 writers a round,
one config per method that accepts `federation.clients_per_round`).

Each config parses, keeps the benchmark's setting, and runs one round through `python -m fedlight fit`'s own entry
point on small FEMNIST files in LEAF's exact format, with overrides that make the run tiny (5 writers, 2 a round, a
narrow network). The configs are exactly the registered methods that accept a cohort: a method without a config
fails here by name unless the compatibility table found it refusing a cohort (REFUSES, derived by running it), and
each such method is shown to refuse a cohort of LEAF's writers too."""

from __future__ import annotations

import functools
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from fedlight import Federation, FederationConfig
from fedlight.run.cli import fit_parser, main
from fedlight.run.compatibility_table import ROWS, SETTING
from fedlight.run.registry import short_names

from helpers.data_files import WRITERS, write_leaf

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "configs" / "cross_device" / "femnist"
CONFIGS = sorted(FOLDER.glob("*.yaml"))  # the run configs; common/ holds the pieces they include
README_SECTION = "# Cross-device runs (FEMNIST at LEAF's size)"
#: registered methods that refuse a cohort with their default settings (the compatibility table's `cohort` column,
#: made by running each); those with a setting that accepts one (pFedMe's, FedDBE's) have a config that sets it
REFUSES = sorted(name for name, cells in ROWS.items() if cells["cohort"][0] == "refused")
LEFT_OUT = sorted(set(REFUSES) - {path.stem for path in CONFIGS})
#: registered methods on LoRA adapters of a pretrained network (the table's derived setting): LEAF's CNN has none, so
#: they refuse it in one line; their configs are under configs/pretrained/
ADAPTERS = sorted(name for name, setting in SETTING.items() if setting == "adapters")
#: the tiny run: every writer of the small files, 2 a round, one round evaluated, a narrow network, no W&B
TINY_NETWORK = {
    "class_path": "fedlight.models.SmallCNN",
    "init_args": {"in_channels": 1, "num_classes": 62, "image_size": 28, "width": 4},
}
PUBLIC = 4  # public images held out of the small files' 38 training images


@pytest.fixture(scope="module")
def leaf_root(tmp_path_factory) -> Path:
    """Small FEMNIST files in LEAF's layout (train/ and test/, two JSON files each, 5 writers), shared by the module:
    the first load caches the parsed writers beside them, as with LEAF's own files."""
    root = tmp_path_factory.mktemp("femnist")
    write_leaf(root)
    return root


@functools.lru_cache(maxsize=None)
def parsed(path: Path):
    """The values a config sets, read by `fit`'s parser (unknown keys, wrong types, missing files: SystemExit)."""
    return fit_parser().parse_args(["--config", str(path)], defaults=False)


def common(name: str) -> dict:
    return yaml.safe_load((FOLDER / "common" / f"{name}.yaml").read_text())


# -- the set of configs ---------------------------------------------------------------------------------------------
def test_every_method_that_accepts_a_cohort_has_a_config_and_no_other_does():
    registered, shipped = set(short_names()), {path.stem for path in CONFIGS}
    missing = sorted(registered - shipped - set(REFUSES) - set(ADAPTERS))
    assert not missing, (
        f"no config under configs/cross_device/femnist/ for {', '.join(missing)}: add one (a method "
        "that refuses federation.clients_per_round is found by the compatibility table's cohort "
        "column: python -m fedlight.run.compatibility --write)"
    )
    for name in sorted(shipped & set(REFUSES)):  # the refusal names the setting that accepts a cohort: set there
        setting = ROWS[name]["cohort"][1].rpartition("set algorithm.init_args.")[2].partition(":")[0]
        assert setting and f"{setting}: false" in (FOLDER / f"{name}.yaml").read_text(), name
    assert not shipped - registered, f"configs named after no registered method: {sorted(shipped - registered)}"


def test_the_guide_points_to_the_derived_list_of_methods_left_out():
    section = (REPO / "docs" / "guides" / "cross_device.md").read_text()
    assert section.startswith(README_SECTION) and "`cohort` column of the compatibility table" in section
    assert {"flhc", "fesem", "flis_hc", "srfca", "pfclus", "fedsoft"} <= set(REFUSES)  # known cases, by their papers


def algorithm_class(name: str) -> type:
    module, cls = short_names()[name].rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


@pytest.mark.filterwarnings("ignore:most clients have fewer than 10")  # the small files' writers are tiny
@pytest.mark.parametrize("name", LEFT_OUT)
def test_a_method_left_out_refuses_a_cohort(name, leaf_root):
    from fedlight.algorithms.centroid_base import CentroidAlgorithm
    from fedlight.datamodules import FEMNISTFederated
    from fedlight.models import CentroidModel, Classifier, SmallCNN

    cls = algorithm_class(name)
    model = (
        CentroidModel(num_centers=2, dim=784)
        if issubclass(cls, CentroidAlgorithm)
        else Classifier(SmallCNN(1, 62, 28, width=4))
    )
    data = FEMNISTFederated(str(leaf_root), val_fraction=0.0, public_size=PUBLIC)
    settings = FederationConfig(rounds=1, clients_per_round=2, accelerator="cpu", vectorize=0)
    with pytest.raises(
        ValueError,
        match=r"trains every client .*federation\.clients_per_round allows 2 of 5|"
        r"draws its own clients .*leave federation\.clients_per_round out",
    ):
        Federation(data, model, cls(), settings, seed=0)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_an_adapter_method_refuses_leafs_cnn(name, leaf_root):
    from fedlight.datamodules import FEMNISTFederated
    from fedlight.models import Classifier, SmallCNN

    data = FEMNISTFederated(str(leaf_root), val_fraction=0.0)
    settings = FederationConfig(rounds=1, clients_per_round=2, accelerator="cpu", vectorize=0)
    with pytest.raises(ValueError, match="trains LoRA adapters, and Classifier has none"):
        Federation(data, Classifier(SmallCNN(1, 62, 28, width=4)), algorithm_class(name)(), settings, seed=0)


# -- each config ------------------------------------------------------------------------------------------------------
def ids(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("path", CONFIGS, ids=ids)
def test_the_config_keeps_the_benchmark_setting(path):
    text = path.read_text()
    assert text.startswith("# "), "a config starts with a comment naming the method and its hyperparameters' source"
    assert f"python -m fedlight fit --config {path.relative_to(REPO).as_posix()}" in text
    cfg = parsed(path)
    assert cfg.algorithm.class_path == short_names()[path.stem]
    federation = {k: v for k, v in cfg.federation.as_dict().items() if not k.startswith("__")}
    finetune = federation.pop("finetune_epochs", 0)
    assert federation == common("federation")  # FedBABU writes the section out: it must not drift
    assert federation == {
        "rounds": 1500,
        "clients_per_round": 10,
        "local_epochs": 1,
        "batch_size": 20,
        "eval_every": 50,
        "eval_split": "test",
        "client_state_memory": 0.5,
    }
    assert finetune == (5 if path.stem == "fedbabu" else 0)
    model = cfg.model.init_args
    assert cfg.model.class_path == "fedlight.models.Classifier"
    assert model.network.class_path == "fedlight.models.LeafCNN"
    assert (model.optimizer, model.lr, model.momentum, model.weight_decay) == ("sgd", 0.1, 0.0, 0.0)
    data = cfg.data.init_args
    assert cfg.data.class_path == "fedlight.datamodules.FEMNISTFederated"
    assert (data.root, data.num_writers, data.official_splits, data.val_fraction) == ("data/femnist", 3400, True, 0.0)


def test_leafs_cnn_takes_femnist_images():
    """The shared network, built on the meta device: 62 outputs for 28 x 28 x 1, and the parameter count of LEAF's CNN
    worked by hand (two 5x5 convs of 32 and 64 channels, 'same' padding, two 2x2 pools, FC 2048, FC 62)."""
    network = common("model")["init_args"]["network"]
    module, name = network["class_path"].rsplit(".", 1)
    with torch.device("meta"):
        net = getattr(importlib.import_module(module), name)(**network["init_args"])
        out = net(torch.zeros(2, 1, 28, 28))
    assert out.shape == (2, 62)
    by_hand = (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (64 * 7 * 7 * 2048 + 2048) + (2048 * 62 + 62)
    assert sum(p.numel() for p in net.parameters()) == by_hand == 6_603_710


@pytest.mark.parametrize("path", CONFIGS, ids=ids)
def test_the_config_runs_a_round_with_a_cohort(path, leaf_root, tmp_path, capsys):
    args = [
        "fit",
        "--config",
        str(path),
        "--data.init_args.root",
        str(leaf_root),
        "--data.init_args.num_writers",
        str(len(WRITERS)),
        "--data.init_args.public_size",
        str(PUBLIC),
        "--model.init_args.network",
        json.dumps(TINY_NETWORK),
        "--federation.clients_per_round",
        "2",
        "--federation.rounds",
        "1",
        "--federation.eval_every",
        "1",
        "--federation.accelerator",
        "cpu",
        "--federation.vectorize",
        "0",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(tmp_path),
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert re.search(r"\b2 of 5 clients a round\b", capsys.readouterr().out)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 1 and 0 <= summary["test/acc_mean"] <= 1
