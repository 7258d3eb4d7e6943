"""FFA-LoRA (Sun, Qin, Li, Ding: "Improving LoRA in Privacy-preserving Federated Learning", ICLR 2024, section 4):
LoRA's A frozen at its random initialization, only B trained and averaged."""

from __future__ import annotations

from fedlight.algorithms.lora_base import factor_names, require_adapters
from fedlight.plugin import Algorithm, ModelParts


class FFALoRA(Algorithm):
    """Federated Freeze-A LoRA. A is drawn once (the same for every client: the run's one model) and frozen, so it is
    outside the federated parameters: clients train B (zero at the start, as LoRA's) and the head, and the server
    averages them. With A fixed the adapted update B A is linear in B, so the mean of the clients' B gives exactly the
    mean of their updates B_i A, which FedIT's separate averages of A and B do not (section 4.1); it also halves what
    travels, and under DP the noise is added to B alone (section 4.2).

    Not taken: the paper's larger scaling factor alpha for the frozen A (section 4.3) is the model's `lora.alpha`, a
    setting of the config, not of the method.

    Args:
        participation: share of clients selected each round.
    """

    def extend_model(self, parts: ModelParts) -> None:
        """Freeze every A before the federated parameters are laid out: they leave the flat vector."""
        require_adapters(parts.module, "FFA-LoRA")
        frozen = set(factor_names(parts.module, "lora_A"))
        for name, parameter in parts.module.named_parameters():
            if name in frozen:
                parameter.requires_grad_(False)
