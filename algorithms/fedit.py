"""FedIT (Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024, section 3):
FedAvg on LoRA adapters, the base frozen."""

from __future__ import annotations

from fedlight.algorithms.lora_base import require_adapters
from fedlight.plugin import Algorithm, ModelParts


class FedIT(Algorithm):
    """Every client trains the LoRA adapters (and the head, when the model trains one) of the frozen pretrained
    network; the server averages them weighted by data size, each factor on its own: the new A is the mean of the
    clients' A and the new B the mean of their B, as FedIT's code averages the adapters' state dicts. The adapted
    update B A is then not the mean of the clients' B_i A_i (the product of means is not the mean of products), the
    inexactness FFA-LoRA and FedSA-LoRA address; tests/algorithms/test_lora_methods.py shows it on a worked case.

    Only the adapters and the head travel: the frozen base is outside the federated parameters
    (`fedlight.training.flat`), so `comm/sent_bytes` is the adapters' size. A model without LoRA adapters is
    refused in one line.

    Args:
        participation: share of clients selected each round.
    """

    def extend_model(self, parts: ModelParts) -> None:
        require_adapters(parts.module, "FedIT")
