"""The plugin boundary as docs/architecture.md describes it: the tutorial algorithm runs as printed, the hooks table
names every public hook, every hook is used by a shipped algorithm, queries change nothing, and the engine imports no
plugin."""

from __future__ import annotations

import ast
import copy
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from fedlight import Algorithm, Federation, FederationConfig, ServerContext
from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated, LabelPermutations, Rotations, SyntheticGaussians
from fedlight.models import CentroidModel, Classifier, SmallCNN
from fedlight.run.compatibility_table import SETTING

from helpers.federations import small_federation
from helpers.shipped import shipped

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()
SERVICES = {"client_model", "cluster_means", "set_shared", "set_personal_mask", "log", "log_matrix"}


def section(title: str) -> str:
    """The text of one `## title` section of the architecture page."""
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def overrides(cls: type[Algorithm], hook: str) -> bool:
    return any(hook in vars(k) for k in cls.__mro__[: cls.__mro__.index(Algorithm)])


# -- the tutorial --------------------------------------------------------------------------------------------
def tutorial_source() -> str:
    return re.search(r"```python\n(.*?)```", section("Adding an algorithm"), re.S).group(1)


def test_the_tutorial_algorithm_is_short_and_recovers_label_permutation_clusters():
    source = tutorial_source()
    assert len([line for line in source.splitlines() if line.strip()]) < 25
    namespace: dict = {}
    exec(compile(source, "docs/architecture.md", "exec"), namespace)
    settings = dict(num_clients=8, partition=LabelPermutations(2), rounds=6, lr=0.1, momentum=0.9)
    clustered = small_federation(namespace["LastLayerKMeans"](k=2), **settings)
    plain = small_federation(FedAvg(), **settings)
    for round in range(1, 7):
        ours, theirs = clustered.run_round(round), plain.run_round(round)
        assert adjusted_rand_score(clustered.data.cluster_labels, ours.per_client["cluster"]) == 1.0
    # one model per permutation beats one model for two contradicting labelings (about 0.8 against 0.5 here)
    assert ours.scalars["test/acc_mean"] > theirs.scalars["test/acc_mean"] + 0.15


def test_the_tutorial_algorithm_runs_from_the_command_line_by_class_path(tmp_path, monkeypatch, tiny_run_args):
    from fedlight.run.cli import main

    package = tmp_path / "tutorial_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(tutorial_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    args = tiny_run_args + [
        "--algorithm",
        "tutorial_plugin.LastLayerKMeans",
        "--algorithm.init_args.k",
        "2",
        "--data.partition",
        "fedlight.datamodules.LabelPermutations",
        "--data.partition.init_args.num_clusters",
        "2",
        "--run_name",
        "tutorial",
    ]
    assert main(args) == 0
    header = (tmp_path / "tutorial" / "metrics.csv").read_text().splitlines()[0]
    assert "cluster/count" in header and "cluster/ari" in header


def test_the_guides_example_keeps_the_last_layer_personal():
    readme = (REPO / "docs" / "guides" / "writing_an_algorithm.md").read_text()
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", readme, re.S).group(1), namespace)
    fed = small_federation(namespace["LastLayersPersonal"](count=1), num_clients=3, rounds=1)
    fed.run_round(1)
    alg, last = fed.algorithm, fed.server.model.layer_mask(fed.server.model.layers()[-1:])
    assert torch.equal(alg.personal_mask, last)
    assert not torch.equal(alg.client_model(0)[last], alg.client_model(1)[last])  # each client's own head
    assert torch.equal(alg.client_model(0)[~last], alg.client_model(1)[~last])  # one shared body


# -- the hooks ---------------------------------------------------------------------------------------------
def documented_hooks() -> set[str]:
    """The hooks the table names (hook, kind, default); which algorithm overrides each is read from the code."""
    hooks = set()
    for line in section("Hooks").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            hooks.update(re.findall(r"`(\w+)\(", cells[0]))
    return hooks


def test_every_public_method_is_a_documented_hook_or_one_of_four_services():
    public = {n for n, _ in inspect.getmembers(Algorithm, inspect.isfunction) if not n.startswith("_")}
    hooks = set(documented_hooks())
    assert public == hooks | SERVICES, public ^ (hooks | SERVICES)
    # train_group joined train_client (group work and non-SGD local work); extend_model adds a method's own modules
    assert len(hooks) <= 17


def test_every_hook_is_overridden_by_a_shipped_algorithm():
    classes = shipped()
    for hook in documented_hooks():
        actual = {name for name, cls in classes.items() if overrides(cls, hook)}
        assert actual, f"no shipped algorithm uses the hook {hook}"


# -- queries change nothing ----------------------------------------------------------------------------------
def snapshot(algorithm: Algorithm):
    state = copy.deepcopy(algorithm.state_dict())
    extra = {k: copy.deepcopy(v) for k, v in vars(algorithm).items() if k != "server"}
    return state, extra


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    if hasattr(a, "__dict__") and type(a).__eq__ is object.__eq__:
        return type(a) is type(b) and same(vars(a), vars(b))
    return a == b


def queries(algorithm: Algorithm) -> list:
    models, groups = algorithm.evaluation_models()
    models = [m.clone() if isinstance(m, torch.Tensor) else m for m in models]  # or a predictor (FedEM's mixture)
    return [
        algorithm.select_clients(3),
        models,
        groups.clone(),
        algorithm.cluster_labels(),
        algorithm.round_metrics(),
        algorithm.learning_rate_scale(3),
        [algorithm.client_model(c).clone() for c in range(algorithm.server.num_clients)],
    ]


def digits_federation(algorithm: Algorithm) -> Federation:
    return small_federation(algorithm, num_clients=6, rounds=3, public_size=60)


def adapter_federation(algorithm: Algorithm) -> Federation:
    """Digits through a tiny random ViT's LoRA adapters (the compatibility table's adapters setting)."""
    from fedlight.models import PretrainedClassifier
    from fedlight.run.compatibility import tiny_vit_folder

    torch.manual_seed(0)
    data = DigitsFederated(num_clients=6, partition=Rotations(2))
    config = FederationConfig(rounds=3, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0)
    return Federation(data, PretrainedClassifier(tiny_vit_folder(), num_classes=10), algorithm, config)


def centroid_federation(algorithm: Algorithm) -> Federation:
    config = FederationConfig(
        rounds=1 if getattr(algorithm, "one_shot", False) else 3, eval_split="train", accelerator="cpu"
    )
    return Federation(SyntheticGaussians("NO", 2, 6, 30), CentroidModel(10, 2), algorithm, config)


ALGORITHM_SETTINGS = {
    "ifca": {"num_clusters": 2, "participation": 0.5},
    "flis_dc": {"participation": 0.5},
    "flis_hc": {"phase_zero_epochs": 1},
    "cfl": {"warmup_rounds": 0},
    "ocfl": {"participation": 0.7},
    "fedtsdp": {"hopkins_threshold": 0.0},
    "fesem": {"num_clusters": 2},
    "flhc": {"cluster_round": 1, "num_clusters": 2},
    "pacfl": {"num_clusters": 2},
    "fedem": {"num_components": 2},
    "fedrc": {"num_components": 2},
    "fedsoft": {"num_clusters": 2, "selection_size": 2},
    "fedgmm": {"num_components": 2, "num_gaussians": 2, "embedding_dim": 8},
    "srfca": {"refine_rounds": 1, "init_epochs": 1},
    "stocfl": {"observe_epochs": 1, "participation": 0.5},
    "icfl": {"epsilon_1": 20.0},
}


def run_commands(fed: Federation, round: int) -> None:
    """One round's commands, as `Federation.run_round` calls them, and none of its queries after them."""
    alg = fed.algorithm
    alg.begin_round(round)
    updates = fed.execution.round_updates(round, alg.select_clients(round))
    alg.pre_aggregation(round, updates)
    alg.aggregate(round, updates)
    alg.post_aggregation(round, updates)
    updates.finish()


@pytest.mark.parametrize("name", sorted(shipped()))
def test_queries_change_no_state_and_give_the_same_answer_twice(name):
    cls = shipped()[name]
    algorithm = cls(**ALGORITHM_SETTINGS.get(name, {}))
    centroid, adapters = SETTING[name] == "points", SETTING[name] == "adapters"  # derived: the compatibility table
    fed = (
        centroid_federation(algorithm)
        if centroid
        else adapter_federation(algorithm)
        if adapters
        else digits_federation(algorithm)
    )
    for round in range(1, min(fed.config.rounds, 2) + 1):
        run_commands(fed, round)
        before = snapshot(algorithm)
        first, second = queries(algorithm), queries(algorithm)
        assert same(first, second), f"{name}: a query answered differently the second time"
        assert same(before, snapshot(algorithm)), f"{name}: a query changed the algorithm's state"


def test_the_server_context_holds_no_reference_to_the_federation():
    fed = small_federation(FedAvg(), num_clients=2)
    assert isinstance(fed.algorithm.server, ServerContext)
    assert not hasattr(fed.algorithm, "fed")
    assert all(not isinstance(value, Federation) for value in vars(fed.algorithm.server).values())


def test_the_server_context_is_a_few_namespaces():
    """An algorithm meets at most 12 names on `server` (the rest sit in namespaces), and each namespace exposes only
    the services the module docstring's table lists, with no binding of the engine's among them but the marked."""
    server = small_federation(FedAvg(), num_clients=2).algorithm.server
    public = sorted(name for name in {*vars(server), *dir(type(server))} if not name.startswith("_"))
    assert public == [
        "aggregation",
        "clients",
        "cohort",
        "data",
        "device",
        "log",
        "message",
        "model",
        "num_clients",
        "random",
        "run",
        "state",
    ]
    table = inspect.getmodule(ServerContext).__doc__
    for name in public:
        if name not in ("device", "num_clients"):
            assert f"| `{name}` |" in table, f"server.{name} is not in fedlight/plugin/server.py's table"


# -- import direction ----------------------------------------------------------------------------------------
def test_the_engine_imports_no_algorithm_data_module_or_network():
    plugins = ("fedlight.algorithms", "fedlight.datamodules", "fedlight.models")
    for path in (REPO / "fedlight").rglob("*.py"):
        if path.name == "registry.py":  # lists what is installed, by design
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith(plugins), f"{path.relative_to(REPO)} imports {name}"


def test_the_engine_works_with_any_data_module_that_keeps_the_contract():
    class NotFederated(torch.nn.Module):
        pass

    model = Classifier(SmallCNN(1, 10, 8, width=8))
    with pytest.raises(ValueError, match="not a federated data module"):
        Federation(NotFederated(), model, FedAvg(), FederationConfig(accelerator="cpu"))
    fed = Federation(DigitsFederated(num_clients=3), model, FedAvg(), FederationConfig(rounds=1, accelerator="cpu"))
    assert fed.run_round(1).scalars["clients_trained"] == 3
