"""FedSA-LoRA (Guo et al., "Selective Aggregation for Low-Rank Adaptation in Federated Learning", ICLR 2025,
section 4): the LoRA A matrices are shared and averaged, the B matrices stay personal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlight.algorithms.lora_base import factor_names, require_adapters
from fedlight.plugin import Algorithm, ModelParts

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedSALoRA(Algorithm):
    """Federated Share-A LoRA. The paper finds that A learns what is general across clients and B what is specific to
    each (section 3, Lemma 1), so the server averages every A (and the head, when the model trains one and
    `personal_head` is False) and every client keeps its own B: B's entries are the personal mask, kept in the
    client-state store and never sent (so `comm/sent_bytes` counts A and the head only). A client never trained
    starts from B's initial value (zero, LoRA's), and is evaluated with it.

    Our choice, which the paper leaves open for a classification head: the head is shared by default (it sits on the
    base's features, as A does), personal with `personal_head`.

    Args:
        personal_head: keep the classification head personal as well.
        participation: share of clients selected each round.
    """

    def __init__(self, personal_head: bool = False, participation: float = 1.0) -> None:
        super().__init__(participation)
        self.personal_head = personal_head

    def extend_model(self, parts: ModelParts) -> None:
        require_adapters(parts.module, "FedSA-LoRA")
        self.b_names = factor_names(parts.module, "lora_B")

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        mask = server.model.tensors_mask(self.b_names)
        if self.personal_head:
            mask |= server.model.head_mask(1, "algorithm.init_args.personal_head")
        self.set_personal_mask(mask)
