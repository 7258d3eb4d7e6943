"""Pretrained networks fine-tuned through LoRA adapters: a Hugging Face `transformers` model (text or image
classification) or a timm model, loaded from a local folder, with `peft` adapters on its attention projections.

Only the adapters and the classification head require a gradient, so they alone are federated: the engine's flat
vector, every client's row, the messages, the aggregation and the checkpoints cover them, and the frozen base is held
once by this module (`fedlight.training.flat`). Nothing is downloaded at run time: the folder is one a model was saved
into with `save_pretrained` (transformers) or `timm.models.save_for_hf` (timm); `python -m
fedlight.models.tiny_pretrained` writes small random ones to try the configs with.

Text inputs are token ids, (N, L) integers padded with the model's pad id. The attention mask is built here as a 4-D
mask (padding, and causality for a decoder such as GPT-2, found once by probing the base), not left to the model: a
model's own mask builder asks the data whether any token is padded, which `torch.func.vmap` (the vectorized clients)
cannot answer, and the 4-D mask gives the same outputs (tests/unit/test_pretrained.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.models.classifier import build_optimizer

#: the default LoRA targets, the first set whose every name ends a module name of the network: the attention's query
#: and value projections (LoRA's section 7.1 choice) as BERT, transformers' ViT and Llama-like models name them, GPT-2's
#: fused c_attn and timm's fused qkv
DEFAULT_TARGETS = (("query", "value"), ("q_proj", "v_proj"), ("c_attn",), ("qkv",))


def default_targets(network: nn.Module) -> list[str]:
    """The network's attention projections to adapt (`DEFAULT_TARGETS`), or a one-line refusal naming the fix."""
    leaves = {name.rpartition(".")[2] for name, _ in network.named_modules()}
    for names in DEFAULT_TARGETS:
        if set(names) <= leaves:
            return list(names)
    raise ValueError(
        f"{type(network).__name__}: no attention projection named as {DEFAULT_TARGETS}; set "
        "lora.target_modules to the names of the linear layers to adapt"
    )


@dataclass(frozen=True)
class LoRA:
    """A LoRA adapter's settings (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", section 4).

    Args:
        rank: r, the rank of B A.
        alpha: the scale's numerator: the update is (alpha / r) B A x.
        dropout: dropout on the adapter's input.
        target_modules: the modules adapted, by name suffix; None takes the attention's query and value projections
            (`DEFAULT_TARGETS`: query/value for BERT, q_proj/v_proj for ViT, c_attn for GPT-2, qkv for timm).
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank must be at least 1, got {self.rank}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")


def missing_folder(path: Path) -> FileNotFoundError:
    """The one-line refusal of a pretrained model folder that is not there."""
    return FileNotFoundError(
        f"pretrained model folder {path} not found: fedlight downloads nothing at run time; save a model there with "
        f"`save_pretrained` (transformers) or `timm.models.save_for_hf` (timm), or make a tiny one with `python -m "
        f"fedlight.models.tiny_pretrained --kind bert --out {path}`"
    )


def load_network(path: Path, library: str, num_classes: int, attention: str) -> nn.Module:
    """The pretrained network in `path`, with a `num_classes`-way head (re-initialized when the saved one differs)."""
    if not (path / "config.json").is_file():
        raise missing_folder(path)
    if library == "timm":
        import timm

        return timm.create_model(f"local-dir:{path}", pretrained=True, num_classes=num_classes)
    from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification
    from transformers.utils import logging

    logging.set_verbosity_error()  # "some weights were newly initialized" is the point of a new head
    logging.disable_progress_bar()  # a bar per load would interleave with the run's own progress
    config = AutoConfig.from_pretrained(path)
    kind = AutoModelForImageClassification if hasattr(config, "image_size") else AutoModelForSequenceClassification
    return kind.from_pretrained(
        path, num_labels=num_classes, ignore_mismatched_sizes=True, attn_implementation=attention
    )


def checkpoint(network: Any, library: str) -> None:
    """Turn on the network's own gradient checkpointing (non-reentrant: the frozen inputs need no gradient)."""
    if library == "timm":
        network.set_grad_checkpointing(True)
    else:
        network.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def head_module_name(network: nn.Module, num_classes: int) -> str:
    """The classification head: the last linear layer with `num_classes` outputs."""
    heads = [name for name, m in network.named_modules() if isinstance(m, nn.Linear) and m.out_features == num_classes]
    if not heads:
        raise ValueError(f"{type(network).__name__} has no linear layer with {num_classes} outputs to use as its head")
    return heads[-1]


def is_causal(network: nn.Module) -> bool:
    """Whether a text model's attention is causal (a decoder): changing the second token leaves the first one's
    output unchanged. Found by probing, since configurations do not say it alike."""
    with torch.no_grad():
        first = [
            network(
                input_ids=torch.tensor([[1, token]], device=_device(network)), output_hidden_states=True
            ).hidden_states[-1][0, 0]
            for token in (2, 3)
        ]
    return bool(torch.allclose(first[0], first[1]))


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


class PretrainedClassifier(L.LightningModule):
    """Fine-tunes a pretrained classifier from `path` through LoRA adapters and its head, with cross-entropy.

    Args:
        path: the local folder of the pretrained model (config.json and its weights).
        num_classes: the classes of the data; a saved head of another size is re-initialized.
        library: "transformers" (AutoModelForSequenceClassification, or AutoModelForImageClassification when the
            configuration has an image size) or "timm" (`timm.create_model("local-dir:<path>")`).
        lora: the adapters' settings; None trains the head alone (a linear probe).
        train_head: the head trains and is federated (False: frozen at its initialization, as the base).
        optimizer: "sgd", "adam" or "adamw".
        lr, momentum, weight_decay: the optimizer's settings.
        attention: transformers' attention implementation ("sdpa" or "eager").
        gradient_checkpointing: recompute the base's activations in the backward pass instead of keeping them (less
            memory a client, about a third more compute). torch.func cannot run it, so the engine then trains the
            clients one after another (it says so in a warning).
        seed: the seed of the adapters' and the new head's initialization (one start for every run of a config).
    """

    def __init__(
        self,
        path: str,
        num_classes: int,
        library: Literal["transformers", "timm"] = "transformers",
        lora: LoRA | None = LoRA(),
        train_head: bool = True,
        optimizer: Literal["sgd", "adam", "adamw"] = "adamw",
        lr: float = 1e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        attention: Literal["sdpa", "eager"] = "sdpa",
        gradient_checkpointing: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.path, self.library, self.lora_settings = Path(path), library, lora
        self.optimizer_name, self.lr, self.momentum, self.weight_decay = optimizer, lr, momentum, weight_decay
        self.attention = attention
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = self._load(num_classes)
            self.head_name = self._head_name(network, num_classes)
            network.requires_grad_(False)
            if gradient_checkpointing:
                checkpoint(network, library)
            if lora is not None:
                network = self._adapted(network, lora)
        self.network = network
        self.head.requires_grad_(train_head)
        self.text = library == "transformers" and not hasattr(self._config(), "image_size")
        self.pad_id = self._pad_id() if self.text else None
        self.causal = self.text and is_causal(self.network)

    # -- building -----------------------------------------------------------------------------------------------
    def _load(self, num_classes: int) -> nn.Module:
        """The pretrained network, with a `num_classes`-way head."""
        return load_network(self.path, self.library, num_classes, self.attention)

    def _head_name(self, network: nn.Module, num_classes: int) -> str:
        return head_module_name(network, num_classes)

    def _adapted(self, network: nn.Module, lora: LoRA) -> nn.Module:
        """`network` with LoRA adapters (peft), every other tensor frozen."""
        from peft import LoraConfig, get_peft_model

        targets = lora.target_modules or default_targets(network)
        # GPT-2's projections are transformers' Conv1D, whose weight is stored transposed (peft's fan_in_fan_out)
        transposed = any(
            type(m).__name__ == "Conv1D" for name, m in network.named_modules() if name.rpartition(".")[2] in targets
        )
        # peft types lora_alpha as int, but scales by alpha / r in floating point: it computes with a float alpha
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,  # type: ignore[arg-type]
            lora_dropout=lora.dropout,
            target_modules=targets,
            fan_in_fan_out=transposed,
        )
        with warnings.catch_warnings():  # peft asks transformers a deprecated question; nothing for a user to do
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            return get_peft_model(network, config)

    def _inner(self, name: str) -> str:
        """A name of the unwrapped network as a name under `self.network` (peft wraps it in two modules)."""
        if self.lora_settings is None:
            return name
        return f"base_model.model.{name}"

    @property
    def head(self) -> nn.Module:
        """The classification head (a property, not a second registration of the module)."""
        return self.network.get_submodule(self._inner(self.head_name))

    def _config(self) -> Any:
        return getattr(self.network, "config", None)

    def _pad_id(self) -> int:
        pad = getattr(self._config(), "pad_token_id", None)
        if pad is None:
            raise ValueError(
                f"the model in {self.path} has no pad_token_id in its config.json: text batches are "
                "padded, so set it to the tokenizer's pad id"
            )
        return int(pad)

    # -- what the engine reads ----------------------------------------------------------------------------------
    def layer_names(self) -> list[str]:
        """The federated layers in model order: each adapted module (its A and B together), then the head."""
        adapted = [name for name, m in self.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)]
        return adapted + [f"network.{self._inner(self.head_name)}"]

    def adapter_parameters(self, part: str = "") -> list[str]:
        """Names of the adapters' parameters (`part`: "lora_A" or "lora_B" for one factor only)."""
        return [name for name, p in self.named_parameters() if "lora_" in name and part in name]

    def attention_mask(self, ids: Tensor) -> Tensor:
        """The 4-D mask (batch, 1, query, key) of token ids: keys that are not padding, and not later than the query
        for a causal model; boolean for SDPA, additive for eager attention."""
        assert self.pad_id is not None  # text models have one (`_pad_id`)
        keep = ids.ne(self.pad_id)[..., None, None, :]
        if self.causal:
            length = ids.shape[-1]
            keep = keep & torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        if self.attention == "eager":
            dtype = (
                torch.get_autocast_dtype(ids.device.type)
                if torch.is_autocast_enabled(ids.device.type)
                else next(self.head.parameters()).dtype
            )
            return torch.zeros(keep.shape, dtype=dtype, device=ids.device).masked_fill(~keep, torch.finfo(dtype).min)
        return keep

    def forward(self, x: Tensor) -> Tensor:
        if self.text:
            return self.network(input_ids=x, attention_mask=self.attention_mask(x)).logits
        if self.library == "timm":
            return self.network(x)
        return self.network(pixel_values=x).logits

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trainable = [p for p in self.parameters() if p.requires_grad]
        return build_optimizer(self.optimizer_name, trainable, self.lr, self.momentum, self.weight_decay)

    def trainable_bytes(self) -> int:
        """Bytes of what trains and travels (adapters and head)."""
        return sum(p.numel() * p.element_size() for p in self.parameters() if p.requires_grad)

    def base_bytes(self) -> int:
        """Bytes of the frozen base, held once."""
        return sum(p.numel() * p.element_size() for p in self.parameters() if not p.requires_grad)
