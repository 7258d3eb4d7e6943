"""Methods on LoRA adapters: FedIT, FFA-LoRA, FedSA-LoRA (one defining property each, computed by hand from the
clients' trained rows), the personalized methods acting on the adapter space with their masks unchanged, the
clustered methods with a cluster's adapter as its model, and the shipped configs under configs/pretrained/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedit import FedIT
from fedlight.algorithms.fedsalora import FedSALoRA
from fedlight.algorithms.ffalora import FFALoRA
from fedlight.plugin import Plan
from fedlight.run.cli import main
from fedlight.run.registry import short_names

from helpers.tiny_pretrained import frozen_state, text_federation, write_tiny_text

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "pretrained").glob("*.yaml"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_tiny_text(tmp_path_factory.mktemp("tiny"), kinds=("gpt2",))


def recording(cls):
    """`cls` holding every update of a round and keeping the last round's trained rows and training-set sizes."""

    class Recording(cls):
        plan = Plan(holds_updates=True)

        def aggregate(self, round, updates):
            trained = updates.all()
            self.rows, self.sizes = trained.params.clone(), trained.num_samples.clone().float()
            super().aggregate(round, updates)

    return Recording


def factor(federation, params: torch.Tensor, name: str) -> torch.Tensor:
    """The tensor `name` of flat rows `params` ((k, d) -> (k, *shape))."""
    return federation.flat.views(params)[name]


def adapted_product(federation, params: torch.Tensor, layer: str) -> torch.Tensor:
    """B A of one adapted layer for each row of `params`, A taken from the module when it is frozen (FFA-LoRA)."""
    module = dict(federation.module.named_parameters())
    a_name, b_name = f"{layer}.lora_A.default.weight", f"{layer}.lora_B.default.weight"
    a = (
        factor(federation, params, a_name)
        if a_name in federation.flat.views(params)
        else module[a_name].detach().expand(len(params), *module[a_name].shape)
    )
    return factor(federation, params, b_name) @ a


def test_fedit_averages_each_factor_so_the_product_is_not_the_mean_update(root):
    """FedIT's server A is the size-weighted mean of the clients' A, and B of their B: B A is then not the mean of
    the clients' B_i A_i (the inexactness FFA-LoRA removes)."""
    federation = text_federation(root, recording(FedIT)(), rounds=1, num_clients=6)
    federation.run_round(1)
    alg = federation.algorithm
    w = alg.sizes / alg.sizes.sum()
    torch.testing.assert_close(alg.models[0], (w[:, None] * alg.rows).sum(0))
    layer = federation.module.layer_names()[0]
    server = adapted_product(federation, alg.models, layer)[0]
    mean_of_products = (w[:, None, None] * adapted_product(federation, alg.rows, layer)).sum(0)
    assert (server - mean_of_products).abs().max() > 1e-4


def test_ffa_lora_keeps_a_at_its_start_and_averages_the_update_exactly(root):
    federation = text_federation(root, recording(FFALoRA)(), rounds=1, num_clients=6)
    a_names = [n for n, _ in federation.module.named_parameters() if ".lora_A." in n]
    a_start = {n: p.detach().clone() for n, p in federation.module.named_parameters() if n in a_names}
    assert not set(a_names) & {e.name for e in federation.flat.entries}  # A is outside what travels
    federation.run_round(1)
    alg = federation.algorithm
    assert all(torch.equal(p, a_start[n]) for n, p in federation.module.named_parameters() if n in a_names)
    w = alg.sizes / alg.sizes.sum()
    layer = federation.module.layer_names()[0]
    mean_of_products = (w[:, None, None] * adapted_product(federation, alg.rows, layer)).sum(0)
    torch.testing.assert_close(adapted_product(federation, alg.models, layer)[0], mean_of_products)


def test_fedsa_lora_shares_a_and_keeps_b_personal(root):
    federation = text_federation(root, recording(FedSALoRA)(), rounds=1, num_clients=6)
    flat = federation.flat
    b_entries = sum(e.numel for e in flat.entries if ".lora_B." in e.name)
    assert int(federation.algorithm.personal_mask.sum()) == b_entries
    result = federation.run_round(1)
    alg = federation.algorithm
    w = alg.sizes / alg.sizes.sum()
    shared = ~alg.personal_mask
    torch.testing.assert_close(alg.models[0][shared], (w[:, None] * alg.rows[:, shared]).sum(0))
    b_name = next(e.name for e in flat.entries if ".lora_B." in e.name)
    personal = torch.stack([factor(federation, alg.client_model(c), b_name) for c in range(6)])
    assert torch.equal(personal, factor(federation, alg.rows, b_name))  # each client keeps its own B
    assert result.scalars["comm/sent_bytes"] == (flat.numel - b_entries) * 4  # A and the head only


def test_a_network_without_adapters_is_refused_in_one_line():
    from fedlight.datamodules import DigitsFederated
    from fedlight.models import Classifier, SmallCNN

    for cls in (FedIT, FFALoRA, FedSALoRA):
        with pytest.raises(ValueError, match=r"trains LoRA adapters, and Classifier has none"):
            Federation(
                DigitsFederated(num_clients=2),
                Classifier(SmallCNN(1, 10, 8, width=4)),
                cls(),
                FederationConfig(rounds=1, accelerator="cpu"),
                seed=0,
            )


def algorithm_class_of(name: str) -> type:
    import importlib

    module, cls = short_names()[name].rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


PERSONALIZED = {"fedper": {"personal_layers": 1}, "fedrep": {}, "lgfedavg": {}, "ditto": {}, "apfl": {}}
CLUSTERED = {"ocfl": {}, "flis_dc": {}, "fedrc": {}}


def algorithm(name: str, **options):
    return algorithm_class_of(name)(**options)


@pytest.mark.parametrize("name", sorted(PERSONALIZED) + sorted(CLUSTERED))
def test_existing_methods_act_on_the_adapter_space_only(root, name):
    """Each method runs on the adapters with its masks unchanged: every tensor that moves is an adapter or the head,
    the base is bit for bit the same, and FedPer's one personal layer is the head."""
    federation = text_federation(
        root,
        algorithm(name, **{**PERSONALIZED, **CLUSTERED}[name]),
        rounds=2,
        num_clients=4,
        public_size=40 if name == "flis_dc" else 0,
        local_epochs=1,
    )
    base = frozen_state(federation.module)
    start = federation.algorithm.models.clone()
    for r in (1, 2):
        federation.run_round(r)
    assert all(torch.equal(p, base[n]) for n, p in frozen_state(federation.module).items())
    moved = {
        e.name
        for e in federation.flat.entries
        if not torch.equal(
            federation.algorithm.models[:, e.start : e.stop],
            start[:1, e.start : e.stop].expand(len(federation.algorithm.models), -1),
        )
    }
    head = federation.module.head_name
    assert moved and all(".lora_" in n or head in n for n in moved)
    if name == "fedper":
        mask = federation.algorithm.personal_mask
        assert {e.name for e in federation.flat.entries if mask[e.start]} == {
            e.name for e in federation.flat.entries if head in e.name
        }


# -- the shipped configs ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory, root):
    """A folder laid out as the configs expect: data/planted_text.jsonl and pretrained/tiny-{gpt2,vit,gpt2-lm}."""
    from fedlight.models.tiny_pretrained import make_tiny

    folder = tmp_path_factory.mktemp("work")
    (folder / "data").mkdir()
    (folder / "data" / "planted_text.jsonl").write_bytes((root / "planted.jsonl").read_bytes())
    make_tiny("gpt2", folder / "pretrained" / "tiny-gpt2", folder / "data" / "planted_text.jsonl", num_classes=4)
    make_tiny("vit", folder / "pretrained" / "tiny-vit", num_classes=10)
    make_tiny("gpt2-lm", folder / "pretrained" / "tiny-gpt2-lm", folder / "data" / "planted_text.jsonl")
    return folder


def run_config(path: Path, folder: Path, *overrides: str) -> dict:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(
            [
                "fit",
                "--config",
                str(path),
                "--logger.wandb",
                "false",
                "--output_dir",
                str(folder / "runs"),
                "--run_name",
                path.stem,
                *overrides,
            ]
        )
    finally:
        os.chdir(cwd)
    assert code == 0
    return json.loads((folder / "runs" / path.stem / "summary.json").read_text())


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem != "text_ifca"], ids=lambda p: p.stem)
def test_each_shipped_config_runs_and_sends_the_adapters_only(path, workdir):
    summary = run_config(path, workdir, "--federation.rounds", "1", "--federation.local_epochs", "1")
    rows = (workdir / "runs" / path.stem / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    sent, model_bytes = (float(last[header.index(k)]) for k in ("comm/sent_bytes", "comm/model_bytes"))
    base_bytes = summary["frozen_base"]["entries"] * 4
    assert sent == model_bytes and model_bytes < base_bytes / 3  # the adapters (and the head), not the model
    assert summary["rounds"] == 1 and summary["frozen_base"]["tensors"] > 0
    if path.stem.split("_", 1)[1] not in ("fedsalora", "fedper"):  # nothing kept back: every federated entry travels
        assert summary["federated_entries"] * 4 == model_bytes


def test_ifca_over_adapters_separates_the_two_planted_groups(workdir):
    """The shipped tiny setting: IFCA, a cluster's adapter its model, finds the two label-swapped groups."""
    run_config(REPO / "configs" / "pretrained" / "text_ifca.yaml", workdir)
    rows = (workdir / "runs" / "text_ifca" / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    assert float(last[header.index("cluster/ari")]) >= 0.9


def test_a_method_reading_the_features_refuses_a_head_on_every_position(root):
    """GPT-2's head scores every position and the model pools its outputs after it, so there is no feature row a
    sample: FedProto (features at the head) is refused in one line rather than averaging over positions."""
    federation = text_federation(root, algorithm("fedproto"), rounds=1, num_clients=4, local_epochs=1)
    with pytest.raises(ValueError, match="not one feature row a sample"):
        federation.run_round(1)


@pytest.mark.parametrize("name", ["fedproto", "fedrod", "moon", "fedcp", "gpfl", "feddbe", "fedpac"])
def test_methods_reading_the_features_run_on_a_vits_adapters(name):
    """A ViT's head reads its class token's features, one row a sample: the methods that read features at the head
    (prototypes, personal heads, contrastive terms, a conditional policy) train two rounds on its adapters (the
    compatibility table's adapters setting). FedCP's global body is the adapters' part only: the frozen base stands
    in for itself."""
    from fedlight.run import compatibility

    federation, error = compatibility.run_cell(algorithm_class_of(name), "adapters", {})
    assert error is None, error
    head = federation.module.head_name  # the network's entries are adapters or the head; a method's own modules
    assert all(
        ".lora_" in e.name or f".{head}." in e.name  # (a personal head, a policy) sit outside `network`
        for e in federation.flat.entries
        if e.name.startswith("network.")
    )


@pytest.mark.parametrize("name", ["text_fedsalora", "text_ifca"])
def test_a_crashed_adapter_run_resumes_to_the_same_numbers(name, workdir, monkeypatch):
    """A run over a frozen base, crashed in round 3 and resumed from its checkpoint (adapters, personal B rows or
    cluster models, the base's fingerprint), ends with exactly an uninterrupted run's numbers."""
    from helpers.resume import crash_and_resume

    out = workdir / f"resume-{name}"
    args = [
        "fit",
        "--config",
        str(REPO / "configs" / "pretrained" / f"{name}.yaml"),
        "--logger.wandb",
        "false",
        "--output_dir",
        str(out),
        "--federation.rounds",
        "4",
        "--federation.local_epochs",
        "1",
        "--federation.vectorize",
        "5",
    ]
    monkeypatch.chdir(workdir)
    assert main(args + ["--run_name", "whole"]) == 0
    crash_and_resume(args, out / "crashed", monkeypatch)
    for file in ("metrics.csv", "clients.csv"):
        whole, crashed = (untimed((out / run / file).read_text()) for run in ("whole", "crashed"))
        assert crashed == whole, file


def untimed(csv_text: str) -> list[list[str]]:
    """A CSV file's cells without its wall-time column."""
    rows = [row.split(",") for row in csv_text.splitlines()]
    keep = [i for i, column in enumerate(rows[0]) if column != "time/round_s"]
    return [[row[i] for i in keep] for row in rows]
