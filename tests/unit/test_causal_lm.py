"""Instruction tuning of a causal language model through its adapters: samples labelled on their response tokens
only, the loss and metrics checked against Hugging Face's own loss, data from jsonl and `datasets` folders, and the
methods that cannot read a language model's outputs refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.datamodules import Dirichlet, Groups, InstructionFederated, TextFederated
from fedlight.datamodules.instructions import sequences
from fedlight.datamodules.planted_text import write_planted
from fedlight.models import LoRA, PretrainedCausalLM
from fedlight.models.tiny_pretrained import make_tiny

IGNORE = -100
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """planted.jsonl (400 rows in two label-swapped categories) and a tiny random causal model `lm`."""
    root = tmp_path_factory.mktemp("lm")
    corpus = write_planted(root / "planted.jsonl", samples=400)
    make_tiny("gpt2-lm", root / "lm", corpus)
    config = json.loads((root / "lm" / "config.json").read_text())  # no dropout: trainers compared step for step
    (root / "lm" / "config.json").write_text(json.dumps({**config, **dict.fromkeys(DROPOUTS, 0.0)}))
    return root


def instruction_data(root, path=None, **options) -> InstructionFederated:
    settings = {
        "input_column": "text",
        "group_column": "category",
        "max_length": 32,
        "num_clients": 4,
        "partition": Groups(),
        **options,
    }
    return InstructionFederated(str(path or root / "planted.jsonl"), str(root / "lm"), **settings)


def language_model(root) -> PretrainedCausalLM:
    """The tiny model with adapters moved off their start (B starts at zero, where the adapters do nothing)."""
    model = PretrainedCausalLM(str(root / "lm"), lora=LoRA(rank=4, target_modules=["c_attn", "c_fc"]))
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.2)
    return model


def test_only_the_response_tokens_are_labelled():
    """Worked by hand: prompt [5, 6, 7] and response [8, 9] in 6 positions; a longer pair cut at 5 keeps the response's
    first token; a prompt that fills the length leaves nothing to learn and the row is not kept."""
    ids, labels, kept = sequences([[5, 6, 7], [5, 6, 7, 8], [1, 2, 3, 4, 5, 6]], [[8, 9], [9, 10, 11], [7]], 5 + 1, 0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 0], [5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6]]
    assert labels.tolist() == [[IGNORE, IGNORE, IGNORE, 8, 9, IGNORE], [IGNORE] * 4 + [9, 10], [IGNORE] * 6]
    assert kept.tolist() == [True, True, False]


def test_an_end_token_equal_to_the_pad_id_is_still_learned():
    """GPT-2-like tokenizers pad with their end-of-sequence id: labels are set by position, not by id."""
    ids, labels, _ = sequences([[5, 6]], [[7, 0]], 5, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 0, 0]] and labels.tolist() == [[IGNORE, IGNORE, 7, 0, IGNORE]]


def test_the_loss_is_hugging_faces_loss_on_the_response_tokens(root):
    """The module's training loss equals transformers' own causal-LM loss (shifted labels, -100 ignored, a mean over
    the counted tokens) on the same batch, and each sample's loss equals that loss on the sample alone."""
    model = language_model(root).eval()
    ids, labels = instruction_data(root).load_pool()
    ids, labels = ids[:6], labels[:6]
    reference = model.network(input_ids=ids, attention_mask=(ids != model.pad_id).long(), labels=labels).loss
    assert torch.allclose(model.training_step((ids, labels), 0), reference, atol=1e-5)
    alone = torch.stack([model.network(input_ids=ids[i : i + 1], labels=labels[i : i + 1]).loss for i in range(6)])
    with torch.no_grad():
        assert torch.allclose(model.sample_loss(model(ids), labels), alone, atol=1e-5)


def test_client_metrics_pool_every_response_token_of_a_client():
    """Client 0 has a sequence with 2 tokens, both right, and one with 1 token, wrong: 2 of 3 tokens right (not the
    mean of 1.0 and 0.0); its loss is the mean over those 3 tokens. Client 1: 3 tokens, 2 right."""
    labels = torch.full((3, 4), IGNORE)
    labels[0, 1:3], labels[1, 3], labels[2, 1:] = 1, 1, 1
    outputs = torch.zeros(3, 3, 2)
    outputs[0, :2] = torch.tensor([[0.5, 1.0], [1.5, 1.0]])
    outputs[1, 2] = torch.tensor([4.0, 0.0])
    outputs[2] = torch.tensor([[1.0, 1.0], [2.0, 0.0], [3.0, 1.0]])
    outputs[0, 2] = outputs[1, 0] = torch.tensor([9.0, 1.0])  # not response positions: never counted
    model = PretrainedCausalLM.client_metrics(None, outputs, labels, torch.tensor([0, 0, 1]), 2)
    assert torch.allclose(model["acc"], torch.tensor([2 / 3, 2 / 3]))
    assert torch.allclose(model["loss"], torch.tensor([(0.5 + 1.5 + 4.0) / 3, 2.0]))


def test_a_datasets_folder_reads_as_the_same_rows(root, tmp_path):
    """A folder `datasets` saved (save_to_disk) gives the same samples as the jsonl file it was made from, for both
    text data modules; a DatasetDict's folder is refused naming its splits."""
    from datasets import Dataset, DatasetDict

    rows = [json.loads(line) for line in (root / "planted.jsonl").read_text().splitlines()]
    folder = tmp_path / "planted"
    Dataset.from_list(rows).save_to_disk(str(folder))
    for made in (
        lambda path: instruction_data(root, path),
        lambda path: TextFederated(str(path), str(root / "lm"), max_length=16, num_clients=4),
    ):
        from_file, from_folder = made(root / "planted.jsonl").load_pool(), made(folder).load_pool()
        assert all(torch.equal(a, b) for a, b in zip(from_file, from_folder))
    DatasetDict({"train": Dataset.from_list(rows[:10]), "test": Dataset.from_list(rows[10:20])}).save_to_disk(
        str(tmp_path / "dict")
    )
    with pytest.raises(ValueError, match=r"splits \['test', 'train'\] of a DatasetDict: give one split's folder"):
        instruction_data(root, tmp_path / "dict").load_pool()


def test_partitions_by_class_label_and_prompts_too_long_are_refused(root):
    with pytest.raises(ValueError, match="cuts clients by class labels, which instruction rows do not have"):
        instruction_data(root, partition=Dirichlet(0.5))
    with pytest.raises(ValueError, match="max_length 8 cuts every row's response off"):
        instruction_data(root, max_length=8).load_pool()


def federation(root, algorithm: str = "fedit", vectorize: int = 0, rounds: int = 1, **data) -> Federation:
    from fedlight.run.registry import short_names
    import importlib

    module, cls = short_names()[algorithm].rsplit(".", 1)
    torch.manual_seed(0)
    model = PretrainedCausalLM(str(root / "lm"), lora=LoRA(rank=4, target_modules=["c_attn", "c_fc"]), lr=0.02)
    config = FederationConfig(rounds=rounds, local_epochs=1, batch_size=16, accelerator="cpu", vectorize=vectorize)
    return Federation(
        instruction_data(root, **data), model, getattr(importlib.import_module(module), cls)(), config, seed=0
    )


def test_vectorized_clients_train_as_one_after_another(root):
    """Labels a token each: the vectorized trainer's batches keep them whole, and its clients end where the
    sequential trainer's do."""
    rows = []
    for vectorize in (0, 4):
        run = federation(root, vectorize=vectorize)
        run.run_round(1)
        rows.append(run.evaluate()[1]["loss"])
    assert rows[0] == pytest.approx(rows[1], abs=1e-4)


def test_a_clients_loss_is_the_mean_of_its_samples_losses(root):
    """What IFCA and FLIS pick a model by: each client's mean over its samples of the per-sample response loss,
    computed here with transformers' loss one sample at a time."""
    run = federation(root)
    params = run.flat.read()
    losses = run.server.clients.losses(params[None])[0]
    network = run.module.network.eval()
    for client in range(2):
        x, y = run.server.clients.split("train").client(client)
        with torch.no_grad():
            alone = [network(input_ids=x[i : i + 1], labels=y[i : i + 1]).loss for i in range(len(x))]
        assert losses[client].item() == pytest.approx(torch.stack(alone).mean().item(), abs=1e-5)


def test_a_method_reading_class_probabilities_is_refused_in_one_line(root):
    """FLIS compares models by their class probabilities on the server's data: a language model's outputs have
    none, so the run stops at the first read with the reason."""
    run = federation(root, "flis_dc", public_size=20)
    with pytest.raises(ValueError, match="reads class probabilities, .* not class logits"):
        run.run_round(1)
