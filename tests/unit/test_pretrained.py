"""Pretrained networks under LoRA (`fedlight.models.PretrainedClassifier`), the text data they read
(`fedlight.datamodules.TextFederated`, `Groups`) and what the engine federates of them: the trainable tensors only.

Checked against independent computations: the flat vector's size and the bytes a client sends against LoRA's shapes
worked by hand, the model's 4-D attention mask against the model's own mask from a 2-D padding mask, a partition's
coverage of every sample, the frozen base bit for bit before and after training."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch import nn

from fedlight.algorithms.fedit import FedIT
from fedlight.datamodules import Groups, TextFederated
from fedlight.models import PretrainedClassifier
from fedlight.models.tiny_pretrained import make_tiny
from fedlight.training.flat import FlatModel

from helpers.tiny_pretrained import frozen_state, text_federation, write_tiny_text

HIDDEN, RANK, LAYERS, CLASSES = 32, 8, 2, 4


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_tiny_text(tmp_path_factory.mktemp("tiny"))


def adapter_entries_by_hand(kind: str) -> int:
    """Entries that train: per layer A (r x in) and B (out x r) of each adapted projection, and the head (no bias in
    GPT-2's score, a bias in BERT's classifier)."""
    if kind == "gpt2":  # c_attn: 32 -> 96
        per_layer = RANK * HIDDEN + 3 * HIDDEN * RANK
        return LAYERS * per_layer + HIDDEN * CLASSES
    per_layer = 2 * (RANK * HIDDEN + HIDDEN * RANK)  # query and value: 32 -> 32 each
    return LAYERS * per_layer + HIDDEN * CLASSES + CLASSES


def test_the_flat_vector_holds_the_trainable_tensors_only():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net[0].requires_grad_(False)
    flat = FlatModel(net)
    assert flat.numel == 4 * 2 + 2 and [e.name for e in flat.entries] == ["2.weight", "2.bias"]
    assert net[0].weight.requires_grad is False and net[0].weight.data_ptr() != flat.vector.data_ptr()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_only_the_adapters_and_the_head_are_federated(root, kind):
    model = PretrainedClassifier(str(root / kind), num_classes=CLASSES)
    flat = FlatModel(model)
    assert flat.numel == adapter_entries_by_hand(kind)
    assert all("lora_" in e.name or model.head_name in e.name for e in flat.entries)
    assert flat.layers() == model.layer_names() and model.layer_names()[-1].endswith(model.head_name)


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_the_4d_mask_gives_the_models_own_outputs(root, kind):
    """The model's outputs under its own mask from a 2-D padding mask equal those under the 4-D mask built here."""
    model = PretrainedClassifier(str(root / kind), num_classes=CLASSES).eval()
    ids = torch.randint(3, 60, (5, 12))
    ids[1, 7:], ids[3, 4:] = 0, 0
    with torch.no_grad():
        own = model.network(input_ids=ids, attention_mask=(ids != 0).long()).logits
        ours = model(ids)
    torch.testing.assert_close(ours, own, rtol=0, atol=1e-6)
    assert model.causal == (kind == "gpt2")


def test_eager_attention_takes_an_additive_mask(root):
    model = PretrainedClassifier(str(root / "bert"), num_classes=CLASSES, attention="eager").eval()
    ids = torch.randint(3, 60, (3, 10))
    ids[0, 5:] = 0
    with torch.no_grad():
        own = model.network(input_ids=ids, attention_mask=(ids != 0).long()).logits
        torch.testing.assert_close(model(ids), own, rtol=0, atol=1e-6)


def test_gradient_checkpointing_gives_the_same_gradients_and_trains_clients_one_at_a_time(root):
    ids, y = torch.randint(3, 60, (6, 12)), torch.randint(0, CLASSES, (6,))
    grads = []
    for checkpointing in (False, True):
        model = PretrainedClassifier(str(root / "gpt2"), num_classes=CLASSES, gradient_checkpointing=checkpointing)
        model.train()
        torch.manual_seed(1)  # the same dropout masks (checkpointing replays the random state it recomputes with)
        model.training_step((ids, y), 0).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain)
    federation = text_federation(root, FedIT(), rounds=1, num_clients=4, vectorize=4)
    federation.module.network.base_model.model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    with pytest.warns(UserWarning, match="vectorized training is off"):
        federation.run_round(1)


def test_a_missing_model_folder_is_named_with_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pretrained model folder .*nowhere not found.*tiny_pretrained"):
        PretrainedClassifier(str(tmp_path / "nowhere"), num_classes=2)


@pytest.mark.parametrize("kind,library", [("vit", "transformers"), ("timm-vit", "timm")])
def test_image_models_adapt_their_attention(tmp_path, kind, library):
    make_tiny(kind, tmp_path / kind, num_classes=10, image_size=8, channels=1, patch_size=2)
    model = PretrainedClassifier(str(tmp_path / kind), num_classes=3, library=library)
    assert model(torch.rand(2, 1, 8, 8)).shape == (2, 3)
    adapted = model.layer_names()[:-1]
    assert adapted and all(name.rsplit(".", 1)[-1] in ("q_proj", "v_proj", "qkv") for name in adapted)


def test_a_federation_trains_the_adapters_and_never_touches_the_base(root):
    """Two rounds of FedIT, vectorized and one client at a time: the base is bit for bit the same, every client sends
    the adapters' and the head's bytes (worked by hand), and the checkpoint holds no frozen tensor."""
    for vectorize in (0, 20):
        federation = text_federation(root, FedIT(), rounds=2, vectorize=vectorize)
        base = frozen_state(federation.module)
        start = federation.algorithm.models.clone()
        results = [federation.run_round(r) for r in (1, 2)]
        assert all(torch.equal(p, base[n]) for n, p in frozen_state(federation.module).items())
        assert not torch.equal(federation.algorithm.models, start)
        scalars = results[-1].scalars
        assert scalars["comm/sent_bytes"] == scalars["comm/sent_bytes_max"] == adapter_entries_by_hand("gpt2") * 4
        buffer = io.BytesIO()
        torch.save(federation.state_dict(), buffer)
        assert buffer.tell() < federation.module.base_bytes() / 2
        assert federation.state_dict()["frozen_base"]["tensors"] == len(base)
        entries = adapter_entries_by_hand("gpt2")
        frozen = sum(t.numel() for t in base.values())
        assert federation.describe_frozen_base() == (
            f"; {entries:,} entries federated ({entries * 4 / 1e3:,.1f} kB), a frozen base of {frozen:,} held once"
        )


def test_a_resume_over_another_base_is_refused(root, tmp_path):
    first = text_federation(root, FedIT(), rounds=1)
    first.run_round(1)
    make_tiny("gpt2", tmp_path / "other", root / "planted.jsonl", num_classes=CLASSES, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "other" / name).write_bytes((root / "gpt2" / name).read_bytes())
    other_root = tmp_path
    (other_root / "planted.jsonl").write_bytes((root / "planted.jsonl").read_bytes())
    second = text_federation(other_root, FedIT(), kind="other", rounds=1)
    with pytest.raises(ValueError, match="another frozen base"):
        second.load_state_dict(first.state_dict())


def test_a_fresh_initialization_redraws_the_adapters_not_the_base(root):
    federation = text_federation(root, FedIT(), rounds=1, num_clients=4)
    base = frozen_state(federation.module)
    fresh = federation.server.model.random_params(7)
    assert all(torch.equal(p, base[n]) for n, p in frozen_state(federation.module).items())
    start = federation.algorithm.models[0]
    assert fresh.shape == start.shape and not torch.equal(fresh, start)


# -- text data --------------------------------------------------------------------------------------------------------
def test_text_rows_are_tokenized_once_and_read_back_from_the_cache(root, tmp_path, monkeypatch):
    rows = [
        {"text": "w1 t0_1 w2", "label": "sport"},
        {"text": "t1_2 w3", "label": "art"},
        {"text": "w4 w4 w4", "label": "sport"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = TextFederated(str(path), str(root / "gpt2"), max_length=6, num_clients=1)
    x, y = data.load_pool()
    assert y.tolist() == [1, 0, 1] and data.label_names == ["art", "sport"]  # strings numbered in sorted order
    vocab = json.loads((root / "gpt2" / "tokenizer.json").read_text())["model"]["vocab"]
    assert x[1].tolist() == [vocab["[CLS]"], vocab["t1_2"], vocab["w3"], 0, 0, 0]
    assert list(tmp_path.glob("rows.jsonl.tokens-*.pt"))

    import transformers

    monkeypatch.setattr(
        transformers.AutoTokenizer,
        "from_pretrained",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("tokenized again")),
    )
    again, _ = TextFederated(str(path), str(root / "gpt2"), max_length=6, num_clients=1).load_pool()
    assert torch.equal(again, x)
    csv = tmp_path / "rows.csv"
    csv.write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in rows))
    monkeypatch.undo()
    from_csv, y_csv = TextFederated(str(csv), str(root / "gpt2"), max_length=6, num_clients=1).load_pool()
    assert torch.equal(from_csv, x) and torch.equal(y_csv, y)


def test_text_data_errors_name_the_problem(root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"text data file .*missing.jsonl not found.*planted_text"):
        TextFederated(str(tmp_path / "missing.jsonl"), str(root / "gpt2")).load_pool()
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"sentence": "a", "label": 0}) + "\n")
    with pytest.raises(ValueError, match=r"no column 'text'; its columns are \['label', 'sentence'\]"):
        TextFederated(str(path), str(root / "gpt2")).load_pool()


def test_groups_make_each_group_a_cluster_and_cover_every_sample_once():
    import numpy as np

    owners = np.array(["b"] * 10 + ["a"] * 30)
    rng = np.random.default_rng(0)
    scheme = Groups()
    parts = scheme.assign(np.zeros(40, dtype=int), 8, rng, owners)
    assert sorted(np.concatenate(parts).tolist()) == list(range(40))  # every sample exactly once
    assert scheme.cluster_labels(8).tolist() == [0] * 6 + [1] * 2  # 30:10 of 8 clients is 6:2 ("a" sorts first)
    assert all(set(owners[p]) == {"a"} for p in parts[:6]) and all(set(owners[p]) == {"b"} for p in parts[6:])
    with pytest.raises(ValueError, match="cannot fill the data's 2 groups"):
        Groups().assign(np.zeros(40, dtype=int), 1, rng, owners)


def test_planted_text_partitioned_by_category_has_two_true_clusters(root):
    data = TextFederated(
        str(root / "planted.jsonl"),
        str(root / "gpt2"),
        group_column="category",
        max_length=16,
        num_clients=20,
        partition=Groups(),
    )
    data.setup()
    clusters = data.federated.cluster_labels
    assert sorted(set(clusters.tolist())) == [0, 1] and 8 <= int((clusters == 0).sum()) <= 12
