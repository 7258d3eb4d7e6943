"""What the adapter methods (FedIT, FFA-LoRA, FedSA-LoRA) share: the LoRA factors of the run's model, found by the
names peft gives them (`<module>.lora_A.<adapter>.weight`, `<module>.lora_B.<adapter>.weight`), and the one-line
refusal of a model without adapters (these methods are defined on LoRA's factors; on a plain network they would be
FedAvg under another name)."""

from __future__ import annotations

from torch import nn

FACTORS = ("lora_A", "lora_B")


def factor_names(module: nn.Module, factor: str) -> list[str]:
    """Qualified names of the parameters of one LoRA factor ("lora_A" or "lora_B") of `module`."""
    return [name for name, _ in module.named_parameters() if f".{factor}." in name]


def require_adapters(module: nn.Module, method: str) -> None:
    """Refuse, in one line, a model without LoRA adapters."""
    if not factor_names(module, "lora_A") or not factor_names(module, "lora_B"):
        raise ValueError(
            f"{method} trains LoRA adapters, and {type(module).__name__} has none: use "
            "fedlight.models.PretrainedClassifier (its `lora` settings) or another network with peft "
            "LoRA adapters"
        )
