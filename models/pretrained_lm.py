"""A pretrained causal language model fine-tuned through LoRA adapters on instructions: the loss is on the response
tokens alone (instruction tuning, as FedIT's "Towards Building the Federated GPT", section 3, and Alpaca train).

A batch is (token ids, labels), both (N, L): the ids of prompt and response padded with the pad id, and the labels
HF's way, the id to predict at each position where it is a response token and -100 elsewhere (prompt and padding),
as `fedlight.datamodules.InstructionFederated` makes them. Since the targets of a causal model are its own next
inputs, `forward` scores a sequence rather than returning the (N, L, vocabulary) logits: per position t, the negative
log-likelihood of token t + 1 and whether it was the most likely one, (N, L - 1, 2). The loss, every per-sample loss
an algorithm asks for (IFCA's cluster choice) and the metrics then need only the labels' mask, and evaluation keeps
two numbers a token instead of the vocabulary's logits. Metrics per client: `acc`, the response tokens predicted
right (teacher forcing), and `loss`, their mean negative log-likelihood (its exponential is the perplexity).

Algorithms that read class probabilities (`server.model.predict`) or a linear head's features cannot run on such
outputs: they stop at their first read with a line that says so.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.models.pretrained import LoRA, PretrainedClassifier, missing_folder

IGNORE = -100  # the label of a position that is not predicted (prompt, padding), as Hugging Face's losses read it


def response_mask(labels: Tensor) -> Tensor:
    """(N, L - 1) whether position t's next token (t + 1) is a response token the loss counts."""
    return labels[..., 1:] != IGNORE


class PretrainedCausalLM(PretrainedClassifier):
    """Instruction-tunes a pretrained causal language model from `path` (AutoModelForCausalLM) through LoRA adapters.

    Args:
        path: the local folder of the pretrained model (config.json and its weights; its config needs a
            pad_token_id, the one the data is padded with).
        lora: the adapters' settings (required: the base, output embeddings included, stays frozen).
        optimizer, lr, momentum, weight_decay, attention, gradient_checkpointing, seed: as in PretrainedClassifier.
    """

    def __init__(
        self,
        path: str,
        lora: LoRA = LoRA(),
        optimizer: Literal["sgd", "adam", "adamw"] = "adamw",
        lr: float = 1e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        attention: Literal["sdpa", "eager"] = "sdpa",
        gradient_checkpointing: bool = False,
        seed: int = 0,
    ) -> None:
        if lora is None:
            raise ValueError(
                "PretrainedCausalLM trains LoRA adapters; give lora settings (its output layer is the "
                "vocabulary's, too large to federate)"
            )
        super().__init__(
            path,
            num_classes=0,
            library="transformers",
            lora=lora,
            train_head=False,
            optimizer=optimizer,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            attention=attention,
            gradient_checkpointing=gradient_checkpointing,
            seed=seed,
        )

    def _load(self, num_classes: int) -> nn.Module:
        if not (self.path / "config.json").is_file():
            raise missing_folder(self.path)
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        return AutoModelForCausalLM.from_pretrained(self.path, attn_implementation=self.attention)

    def _head_name(self, network: nn.Module, num_classes: int) -> str:
        output = cast(Any, network).get_output_embeddings()  # a transformers model's method, untyped through nn.Module
        return next(name for name, module in network.named_modules() if module is output)

    def layer_names(self) -> list[str]:
        """The federated layers in model order: each adapted module (its A and B together)."""
        return [name for name, m in self.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)]

    def forward(self, x: Tensor) -> Tensor:
        """(N, L - 1, 2): per position, the negative log-likelihood of the next token and whether it was predicted."""
        logits = self.network(input_ids=x, attention_mask=self.attention_mask(x)).logits[..., :-1, :]
        targets = x[..., 1:]
        nll = F.cross_entropy(logits.transpose(-1, -2).float(), targets, reduction="none")
        correct = (logits.argmax(dim=-1) == targets).to(nll.dtype)
        return torch.stack([nll, correct], dim=-1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The mean negative log-likelihood of the batch's response tokens."""
        x, labels = batch
        mask = response_mask(labels)
        return (self(x)[..., 0] * mask).sum() / mask.sum().clamp(min=1)

    def sample_loss(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """(N,) each sequence's mean negative log-likelihood over its response tokens."""
        mask = response_mask(labels)
        return (outputs[..., 0] * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)

    def client_metrics(self, outputs: Tensor, labels: Tensor, client: Tensor, num_clients: int) -> dict[str, Tensor]:
        """Each client's `acc` (response tokens predicted right) and `loss` (their mean negative log-likelihood),
        over all its response tokens (not a mean of sequences)."""
        mask = response_mask(labels).to(outputs.dtype)
        tokens = torch.bincount(client, weights=mask.sum(dim=-1), minlength=num_clients).clamp(min=1)
        nll = torch.bincount(client, weights=(outputs[..., 0] * mask).sum(dim=-1), minlength=num_clients)
        right = torch.bincount(client, weights=(outputs[..., 1] * mask).sum(dim=-1), minlength=num_clients)
        return {"acc": right / tokens, "loss": nll / tokens}
