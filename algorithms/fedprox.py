"""FedProx (Li et al., 2020): FedAvg with a proximal term mu/2 ||w - w_start||^2 in the local objective."""

from torch import Tensor

from fedlight.plugin import Algorithm, Plan


class FedProx(Algorithm):
    """Adds the proximal term's gradient, mu (w - w_start), to the flat gradient after every backward pass
    (one fused operation over the whole model). With mu = 0 it is FedAvg.

    Args:
        mu: weight of the proximal term.
        participation: share of clients selected each round.
    """

    plan = Plan(corrects_gradient=True)

    def __init__(self, mu: float = 0.01, participation: float = 1.0) -> None:
        super().__init__(participation)
        if mu < 0:
            raise ValueError(f"mu must be non-negative, got {mu}")
        self.mu = mu

    def local_gradient(self, client: int, params: Tensor, grad: Tensor, start: Tensor) -> None:
        if self.mu:
            grad.add_(params - start, alpha=self.mu)
