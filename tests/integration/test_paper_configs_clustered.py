"""The clustered-FL papers' run configs (configs/papers/ocfl: OCFL, "One-Shot Clustering for Federated Learning Under
Clustering-Agnostic Assumption"; configs/papers/flis: FLIS, "FLIS: Clustered Federated Learning via Inference
Similarity for Non-IID Data Distribution") parse with fedlight's CLI parser, hold the papers' settings (and the
authors' code's where a paper is silent), and the algorithm swaps their header comments document work.

Every run config goes through the parser of `python -m fedlight fit` without filling in defaults (the same checks of
keys, types, referenced files and class paths, at a third of the cost); a sample of them, one per data set and paper,
and the documented swaps go through the full command line (`build_parser`, defaults included) exactly as `fit` parses
them. Parsing only: no data file is read (data modules, partitions and algorithms are constructed, which
reads nothing; each distinct network is built on the meta device and shape-checked on the data set's image size).
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from jsonargparse import Namespace, get_loader, set_loader

from fedlight.run import registry
from fedlight.run.cli import PARSER_MODE, build_parser, expand_short_names, fit_parser
from fedlight.datamodules.partition import OCFL_CLASS_SETS

REPO = Path(__file__).resolve().parents[2]
PAPERS = REPO / "configs" / "papers"


def run_configs(paper: str) -> list[Path]:
    """The run configs of one paper: every YAML file outside its `common/` folder of shared pieces."""
    root = PAPERS / paper
    return sorted(p for p in root.rglob("*.yaml") if "common" not in p.relative_to(root).parts)


OCFL_RUNS, FLIS_RUNS = run_configs("ocfl"), run_configs("flis")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.fixture(scope="module", autouse=True)
def fast_loading():
    """Speed only, same results: registry.short_names scans the installed entry points each time fedlight's YAML
    loader reads a text (tens of ms, and one config here makes dozens of such reads), and the shared files under
    common/ are read again for every config; scan once and parse each distinct text once (handing out copies)."""
    original = get_loader(PARSER_MODE)
    load = functools.lru_cache(maxsize=None)(original)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "short_names", functools.lru_cache(maxsize=None)(registry.short_names))
        set_loader(PARSER_MODE, lambda text: copy.deepcopy(load(text)), (yaml.YAMLError,))
        try:
            yield
        finally:
            set_loader(PARSER_MODE, original, (yaml.YAMLError,))


@functools.lru_cache(maxsize=1)
def parser():
    return fit_parser()  # the parser of `python -m fedlight fit` (build_parser's "fit" subcommand)


@functools.lru_cache(maxsize=None)
def parsed(path: str) -> Namespace:
    """The values a config sets (unknown keys, wrong types and missing files raise SystemExit)."""
    return parser().parse_args(["--config", path], defaults=False)


def parse_like_fit(args: list[str]) -> Namespace:
    """What `python -m fedlight fit ...` parses, defaults filled in."""
    return cli().parse_args(expand_short_names(["fit", *args])).fit


@functools.lru_cache(maxsize=1)
def cli():
    return build_parser()


def build(value):
    """Instantiate a parsed {class_path, init_args} tree (what `fit` does to data and algorithm before any data is
    read), so that the constructors' own checks run too."""
    if isinstance(value, Namespace) and "class_path" in value:
        module, name = value.class_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        args = value.get("init_args") or Namespace()
        return cls(**{k: build(v) for k, v in vars(args).items() if not k.startswith("__")})
    if isinstance(value, list):
        return [build(v) for v in value]
    return value


def short(class_path: str) -> str:
    return class_path.rsplit(".", 1)[-1]


# -- every run config ---------------------------------------------------------------------------------------------
def test_the_papers_tasks_are_all_there():
    assert len(OCFL_RUNS) == 65 and len(FLIS_RUNS) == 46
    for ds in ("mnist", "fmnist", "cifar10", "pathmnist", "bloodmnist"):
        for task in (f"n{n}_{o}_{b}" for n in (15, 30) for o in ("no", "o") for b in ("balanced", "imbalanced")):
            assert (PAPERS / "ocfl" / ds / f"{task}.yaml").is_file(), (ds, task)
        for alg in ("km", "aff", "ms", "bnc", "scl"):
            assert (PAPERS / "ocfl" / ds / f"n15_no_balanced_{alg}.yaml").is_file(), (ds, alg)
    for ds, tasks in {"fmnist": 3, "cifar10": 3, "cifar100": 3, "svhn": 2}.items():
        for task in ("ls20", "ls30", "dir0.1")[:tasks]:
            for variant in ("dc", "hc"):
                assert (PAPERS / "flis" / ds / f"{task}_flis_{variant}.yaml").is_file(), (ds, task, variant)
        for alg in ("fedavg", "fedprox", "local", "ifca", "cfl", "lgfedavg"):
            assert (PAPERS / "flis" / ds / f"ls20_{alg}.yaml").is_file(), (ds, alg)


@pytest.mark.parametrize("path", OCFL_RUNS + FLIS_RUNS, ids=lambda p: rel(p).removeprefix("configs/papers/"))
def test_run_config_parses_and_builds(path):
    text = path.read_text()
    assert text.startswith("# "), "a run config starts with a comment naming the paper's table and setting"
    assert f"python -m fedlight fit --config {rel(path)}" in text, "the header gives the command that runs it"
    cfg = parsed(str(path))  # SystemExit on an unknown key, a wrong type or a missing file
    assert cfg.federation.eval_split == "test" and "model" in cfg
    data, algorithm = build(cfg.data), build(cfg.algorithm)
    assert data.num_clients == cfg.data.init_args.num_clients
    labels = data.partition.cluster_labels(data.num_clients)  # checks cluster_sizes against num_clients
    if labels is not None:
        assert len(labels) == data.num_clients
    assert algorithm is not None


SAMPLE = [
    f"configs/papers/ocfl/{ds}/n15_no_balanced.yaml" for ds in ("mnist", "fmnist", "cifar10", "pathmnist", "bloodmnist")
]
SAMPLE += [f"configs/papers/flis/{ds}/ls20_flis_dc.yaml" for ds in ("fmnist", "cifar10", "cifar100", "svhn")]


@pytest.mark.parametrize("path", SAMPLE)
def test_the_fit_command_line_resolves_the_config(path, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = parse_like_fit(["--config", path])
    given = parsed(str(REPO / path))
    assert cfg.algorithm.class_path == given.algorithm.class_path
    assert cfg.algorithm.class_path.startswith("fedlight.algorithms.")  # the short name was resolved
    for section in ("data", "model", "algorithm", "federation"):  # defaults only add to what the file sets
        full = flat(cfg[section].as_dict())
        for key, value in flat(given[section].as_dict()).items():
            assert full[key] == value, (section, key)
    assert (cfg.federation.accelerator, cfg.federation.eval_every, cfg.seed) == ("auto", 1, 0)


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if key.startswith("__"):
            continue
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


NETWORK_INPUT = {
    "MNISTFederated": (1, 28),
    "FashionMNISTFederated": (1, 28),
    "CIFAR10Federated": (3, 32),
    "CIFAR100Federated": (3, 32),
    "SVHNFederated": (3, 32),
}


def test_every_network_fits_its_data_set():
    """Each distinct (data set, network) pair: the network takes the data set's images and gives one logit per
    class."""
    pairs = {}
    for path in OCFL_RUNS + FLIS_RUNS:
        cfg = parsed(str(path))
        data = build(cfg.data)
        shape = (
            (data.channels, data.size)
            if short(cfg.data.class_path) == "MedMNISTFederated"
            else NETWORK_INPUT[short(cfg.data.class_path)]
        )
        network = cfg.model.init_args.network
        key = (shape, data.num_classes, network.class_path, repr(sorted(vars(network.init_args).items())))
        pairs.setdefault(key, network)
    assert len(pairs) == 7
    for (shape, num_classes, _, _), network in pairs.items():
        with torch.device("meta"):  # shapes only: no memory, no initialization cost
            out = build(network).eval()(torch.zeros(2, shape[0], shape[1], shape[1]))
        assert out.shape == (2, num_classes), (network.class_path, shape)


# -- OCFL (sections 4.1-4.2, Appendix A) ----------------------------------------------------------------------------
OCFL_DATA = {  # rounds, batch, optimizer, lr, classes (Table 3 / section 4.1)
    "mnist": (50, 32, "sgd", 1e-2, 10),
    "fmnist": (50, 32, "sgd", 1e-2, 10),
    "cifar10": (80, 64, "sgd", 1e-2, 10),
    "pathmnist": (75, 128, "adam", 1e-7, 9),
    "bloodmnist": (75, 128, "adam", 1e-6, 8),
}
SIZES = {(15, "balanced"): None, (30, "balanced"): None, (15, "imbalanced"): [3, 7, 5], (30, "imbalanced"): [7, 14, 9]}


@pytest.mark.parametrize("ds", list(OCFL_DATA))
def test_ocfl_tasks_follow_the_paper(ds):
    rounds, batch, optimizer, lr, classes = OCFL_DATA[ds]
    for path in (p for p in OCFL_RUNS if p.parent.name == ds):
        cfg = parsed(str(path))
        n, overlap, balance = re.match(r"n(\d+)_(no|o)_(balanced|imbalanced)", path.stem).groups()
        fed, model, data = cfg.federation, cfg.model.init_args, cfg.data.init_args
        assert (fed.rounds, fed.local_epochs, fed.batch_size) == (rounds, 3, batch), path
        assert (model.optimizer, model.lr) == (optimizer, lr), path
        assert model.network.class_path.endswith("OCFLCNN" if classes == 10 and ds != "cifar10" else "ResNet34")
        assert model.network.init_args.num_classes == classes
        assert data.num_clients == int(n) and data.official_splits and data.public_size == 0
        part = data.partition
        assert short(part.class_path) == "MissingClasses" and part.init_args.num_clusters == 3
        assert part.init_args.cluster_sizes == SIZES[(int(n), balance)], path
        sets = part.init_args.class_sets
        if classes == 10:
            assert sets == OCFL_CLASS_SETS[overlap.upper()], path
        assert sorted(set().union(*map(set, sets))) == list(range(classes))
        assert bool(set(sets[0]) & set(sets[1])) == (overlap == "o"), path
        algorithm = cfg.algorithm
        if path.stem == f"n{n}_{overlap}_{balance}":  # the default algorithm: OCFL-HDB
            assert short(algorithm.class_path) == "OCFL"
            assert short(algorithm.init_args.clusterer.class_path) == "HDBSCAN"
            assert algorithm.init_args.clusterer.init_args.min_cluster_size == 0.2
            assert algorithm.init_args.weighted is False and algorithm.init_args.participation == 1.0


def test_ocfl_baselines_follow_the_paper():
    def alg(ds, name):
        return parsed(str(PAPERS / "ocfl" / ds / f"n15_no_balanced_{name}.yaml")).algorithm

    for ds in OCFL_DATA:
        km, aff, ms = alg(ds, "km"), alg(ds, "aff"), alg(ds, "ms")
        assert [short(a.init_args.clusterer.class_path) for a in (km, aff, ms)] == [
            "KMeans",
            "AffinityPropagation",
            "MeanShift",
        ]
        assert all(short(a.class_path) == "OCFL" for a in (km, aff, ms))
        assert km.init_args.clusterer.init_args.n_clusters == 3
        assert short(alg(ds, "bnc").class_path) == "FedAvg"
    table4 = {
        "mnist": (0.35, 1.0, 30),
        "fmnist": (0.35, 1.0, 40),
        "cifar10": (185, 925, 20),
        "pathmnist": (12, 60, 40),
        "bloodmnist": (38, 188, 40),
    }
    for ds, (eps1, eps2, cooldown) in table4.items():
        scl = alg(ds, "scl")
        assert short(scl.class_path) == "CFL"
        args = scl.init_args
        # the code's `iteration > c` on 0-indexed rounds is fedlight's round > c + 1 on 1-indexed rounds
        assert (args.eps1, args.eps2, args.warmup_rounds) == (eps1, eps2, cooldown + 1)
        assert args.weighted is False and args.min_cluster_size == 2 and args.gamma_max is None


# -- FLIS (section 3, and the authors' code where the paper is silent) ----------------------------------------------
FLIS_BETA = {"fmnist": 0.5, "cifar10": 0.3, "svhn": 0.3, "cifar100": 0.3}


def test_flis_runs_follow_the_paper():
    for path in FLIS_RUNS:
        cfg = parsed(str(path))
        ds, (task, alg) = path.parent.name, path.stem.split("_", 1)
        fed, model, data, algorithm = cfg.federation, cfg.model.init_args, cfg.data.init_args, cfg.algorithm
        assert data.num_clients == 100 and data.public_size == 2500, path
        if task.startswith("ls"):
            assert short(data.partition.class_path) == "ClassesPerClient"
            assert data.partition.init_args.fraction == int(task[2:]) / 100
        else:
            assert short(data.partition.class_path) == "Dirichlet"
            assert (data.partition.init_args.alpha, data.partition.init_args.min_size) == (0.1, 10)
        assert short(model.network.class_path) == ("ResNet9" if ds == "cifar100" else "LeNet5")
        assert (model.optimizer, model.lr, model.weight_decay) == ("sgd", 0.01, 0.0)
        assert model.momentum == (0.9 if alg in ("fedavg", "fedprox") else 0.5), path
        assert fed.batch_size == 10
        if alg == "local":
            assert (fed.rounds, fed.local_epochs) == (50, 1)
        else:
            assert (fed.rounds, fed.local_epochs, algorithm.init_args.participation) == (200, 10, 0.1), path
        args = algorithm.init_args
        expected = {
            "flis_dc": "FlisDC",
            "flis_hc": "FlisHC",
            "fedavg": "FedAvg",
            "fedprox": "FedProx",
            "local": "Local",
            "ifca": "IFCA",
            "cfl": "CFL",
            "lgfedavg": "LGFedAvg",
        }[alg]
        assert short(algorithm.class_path) == expected
        if alg.startswith("flis"):
            assert args.beta == FLIS_BETA[ds], path
        if alg == "flis_hc":
            assert args.linkage == "complete" and args.phase_zero_epochs == 10 and args.get("tau") is None
        if alg == "fedprox":
            assert args.mu == 0.001
        if alg == "ifca":
            assert args.num_clusters == 2
        if alg == "cfl":
            assert (args.eps1, args.eps2, args.warmup_rounds, args.weighted) == (0.4, 1.6, 20, False)
        if alg == "lgfedavg":
            assert args.global_layers == (1 if ds == "cifar100" else 2)


# -- the swaps the headers document, through the full CLI ---------------------------------------------------------
def documented_swaps(path: Path) -> list[tuple[str, list[str]]]:
    """(label, extra arguments) for each `--algorithm ...` line in a config's header."""
    swaps = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("# ")
        match = re.match(r"(?:(\w[\w-]*):\s+)?(--algorithm .*?)(?:\s+\((.*)\))?$", body)
        if match:
            args = shlex.split(match.group(2).replace("$C", "configs/papers/flis/common"))
            swaps.append((match.group(1) or match.group(3), args))
    return swaps


@pytest.mark.parametrize(
    "path, expected",
    [
        (
            "configs/papers/ocfl/cifar10/n30_o_imbalanced.yaml",
            {
                "OCFL-KM": ("OCFL", "KMeans"),
                "OCFL-AFF": ("OCFL", "AffinityPropagation"),
                "OCFL-MS": ("OCFL", "MeanShift"),
                "BNC": ("FedAvg", None),
                "SCL": ("CFL", None),
            },
        ),
        (
            "configs/papers/flis/cifar100/dir0.1_flis_dc.yaml",
            {
                "FedAvg": ("FedAvg", 0.9),
                "FedProx": ("FedProx", 0.9),
                "SOLO": ("Local", 0.5),
                "IFCA": ("IFCA", 0.5),
                "CFL": ("CFL", 0.5),
                "LG": ("LGFedAvg", 0.5),
            },
        ),
    ],
)
def test_documented_algorithm_swaps_parse_through_the_cli(path, expected, monkeypatch):
    monkeypatch.chdir(REPO)  # the header commands are relative to the repository root
    swaps = dict((label.split(" ")[0].rstrip(","), args) for label, args in documented_swaps(REPO / path))
    assert set(swaps) == set(expected)
    for label, (algorithm, extra) in expected.items():
        cfg = parse_like_fit(["--config", path, *swaps[label]])
        assert short(cfg.algorithm.class_path) == algorithm, label
        if path.startswith("configs/papers/ocfl"):
            if extra:  # the OCFL variants differ by their clustering component
                assert short(cfg.algorithm.init_args.clusterer.class_path) == extra, label
            assert cfg.federation.rounds == 80 and cfg.data.init_args.num_clients == 30, label
        else:
            assert cfg.model.init_args.momentum == extra, label
            assert cfg.federation.rounds == (50 if algorithm == "Local" else 200), label
