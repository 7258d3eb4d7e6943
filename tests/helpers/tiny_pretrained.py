"""Tiny random pretrained-model folders and planted text, written once per test module (no download): what
`python -m fedlight.models.tiny_pretrained` and `python -m fedlight.datamodules.planted_text` make for a user."""

from __future__ import annotations

from pathlib import Path

import torch

from fedlight import Federation, FederationConfig
from fedlight.datamodules import Groups, TextFederated
from fedlight.datamodules.planted_text import write_planted
from fedlight.models import PretrainedClassifier
from fedlight.models.tiny_pretrained import make_tiny


def write_tiny_text(root: Path, kinds: tuple[str, ...] = ("gpt2", "bert")) -> Path:
    """`root` with planted.jsonl (2,000 rows, 4 topics, 2 categories) and a tiny model folder per kind."""
    corpus = write_planted(root / "planted.jsonl")
    for kind in kinds:
        make_tiny(kind, root / kind, corpus, num_classes=4)
    return root


def text_federation(
    root: Path,
    algorithm=None,
    kind: str = "gpt2",
    num_clients: int = 20,
    rounds: int = 3,
    lr: float = 0.01,
    lora=None,
    public_size: int = 0,
    **config,
) -> Federation:
    """A federation of `algorithm` on the planted text in `root`, grouped by category (two true clusters)."""
    from fedlight.models import LoRA

    torch.manual_seed(0)
    data = TextFederated(
        str(root / "planted.jsonl"),
        str(root / kind),
        group_column="category",
        max_length=16,
        num_clients=num_clients,
        partition=Groups(),
        public_size=public_size,
    )
    model = PretrainedClassifier(str(root / kind), num_classes=4, lr=lr, lora=lora or LoRA())
    settings = {"rounds": rounds, "local_epochs": 2, "batch_size": 16, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(data, model, algorithm, FederationConfig(**settings), seed=0)


def frozen_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every frozen parameter (the pretrained base)."""
    return {name: p.detach().clone() for name, p in module.named_parameters() if not p.requires_grad}
