"""Per-FedAvg: "Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach"
(Fallah, Mokhtari and Ozdaglar, NeurIPS 2020), Algorithm 1 with its first-order (FO) and Hessian-free (HF) versions
(section 5).

The federation learns an initial model w that each client adapts with one gradient step of size alpha on its own
data. Each local step of a client, on three batches D1, D2, D3 from independent streams:

    temp = w - alpha grad f(w; D1)
    FO:  w <- w - beta grad f(temp; D2)
    HF:  w <- w - beta (I - alpha H(w; D3)) grad f(temp; D2),   with H(w; D3) g approximated by the central
         difference [grad f(w + delta g; D3) - grad f(w - delta g; D3)] / (2 delta), g = grad f(temp; D2)

(`meta_step`). The server averages the clients' w (the engine's FedAvg). Every client is evaluated after one
adaptation step from the global model, w - alpha grad f(w; B), on one batch B of its own training data: the first
batch of its "adapt" stream of round 0 (no training round is numbered 0), the same batch at every evaluation, so the
evaluation is deterministic and does not depend on the number of rounds configured.

`federation.finetune_epochs: N` works beside it: the engine then fine-tunes each client's evaluation model (already
adapted by this one step) for N more epochs with the module's optimizer and reports it under `<split>_ft/`, while
`<split>/` stays the paper's one-step evaluation.

Defaults are those of a reference implementation, PFLlib (Zhang et al., the personalized-FL library), not of the
paper, whose experiments section was not at hand to check:
- alpha = beta = 0.005. PFLlib's Per-FedAvg client (`clientperavg.py`, `clientPerAvg`) takes the adaptation step
  with its optimizer's lr, the local learning rate, and the meta step with `self.beta = self.learning_rate`; that
  learning rate defaults to 0.005 (its `main.py`, `--local_learning_rate`).
- variant = "fo". PFLlib's client takes the meta step as the gradient at the adapted point applied at w, the
  first-order version; it has no Hessian-free one.
- delta = 0.001, used by "hf" only. No reference sets it (PFLlib has no HF): it is the central difference's step,
  exact for any size when the loss is quadratic and otherwise off by O(delta^2).
These step sizes suit many rounds; with few rounds raise them in the config (configs/digits/skew/perfedavg.yaml).

Deviations from the paper, and why:
- beta replaces the module's learning rate: the module's optimizer (momentum, weight decay, schedulers) is not used.
- the local steps tau are the client's optimizer steps of a round (its batches times `federation.local_epochs`), the
  same local work as FedAvg, and every batch has the federation's batch size (the paper sizes D, D' and D''
  separately);
- the server's average is weighted by training-set size (the engine's FedAvg); the paper averages uniformly over the
  selected clients (the same when clients are equally large);
- the two gradients of HF's finite difference are taken with the same dropout masks (the random state is replayed),
  or the difference would measure the masks rather than the curvature;
- buffers (BatchNorm running statistics) are not trained by these gradient steps: they keep the values received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Newcomers, Trained

#: (loss, flat gradient) of the local loss on one batch at a flat model
LossAndGrad = Callable[[Tensor], tuple[Tensor, Tensor]]
#: the round whose "adapt" stream gives the evaluation's adaptation batch (training rounds are numbered from 1)
ADAPT_ROUND = 0


def meta_step(
    w: Tensor,
    inner: LossAndGrad,
    outer: LossAndGrad,
    alpha: float,
    beta: float,
    hessian: LossAndGrad | None = None,
    delta: float = 1e-3,
) -> tuple[Tensor, Tensor]:
    """One Per-FedAvg local step from `w`, with the gradients of f on D1 (`inner`), D2 (`outer`) and, for HF, D3
    (`hessian`; None: FO). Returns (the new w, f(temp; D2), the meta-objective at w)."""
    _, grad = inner(w)
    temp = w - alpha * grad
    loss, grad = outer(temp)
    if hessian is not None:
        curvature = (hessian(w + delta * grad)[1] - hessian(w - delta * grad)[1]) / (2 * delta)  # ~ H(w; D3) grad
        grad = grad - alpha * curvature
    return w - beta * grad, loss


def replayed(loss_and_grad: LossAndGrad, device: torch.device) -> LossAndGrad:
    """`loss_and_grad` with every call drawing the same random numbers (dropout masks): each starts from the random
    state of the moment, which is restored afterwards."""
    devices = [device] if device.type == "cuda" else []

    def call(params: Tensor) -> tuple[Tensor, Tensor]:
        with torch.random.fork_rng(devices=devices):
            return loss_and_grad(params)

    return call


class PerFedAvg(Algorithm):
    """Per-FedAvg: FedAvg of model-agnostic meta-learning steps, so that one local gradient step from the global
    model fits each client; every client is evaluated after that one step.

    Args:
        alpha: step size of the adaptation step, in training and at evaluation (> 0; PFLlib's 0.005).
        beta: step size of the meta update (> 0; PFLlib's 0.005).
        variant: "fo" (first order: the Hessian term dropped; PFLlib's) or "hf" (Hessian-free: a finite-difference
            Hessian-vector product).
        delta: the finite difference's step for "hf" (> 0).
        participation: share of clients selected each round.
    """

    def __init__(
        self,
        alpha: float = 0.005,
        beta: float = 0.005,
        variant: Literal["fo", "hf"] = "fo",
        delta: float = 0.001,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if variant not in ("fo", "hf"):
            raise ValueError(f"variant must be 'fo' or 'hf', got {variant!r}")
        if delta <= 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        self.alpha, self.beta, self.variant, self.delta = alpha, beta, variant, delta

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Algorithm 1's client for a group at once: (w's after the round's meta steps, mean of f(temp; D2) over each
        client's last epoch). D1 is the stream `server.clients.train_many` would take, D2 and D3 independent ones
        ("meta", "hessian"), each a `server.clients.group_batches` stream; every gradient of a step is one
        `group_loss_and_grad`."""
        server = self.server
        purposes = ("train", "meta", "hessian") if self.variant == "hf" else ("train", "meta")
        streams = [server.clients.group_batches(round, clients, purpose=p) for p in purposes]
        w = starts.clone()
        losses: list[list[Tensor]] = [[] for _ in clients]
        for groups in zip(*streams):
            rows, step = groups[0].rows, groups[0].step
            if step == 0:
                for row in rows:
                    losses[row] = []  # the mean loss of the last epoch, as the module's SGD reports
            grads = [partial(server.model.group_loss_and_grad, batch=group.batch, step=step) for group in groups]
            hessian = replayed(grads[2], w.device) if len(grads) == 3 else None
            w[rows], loss = meta_step(w[rows], grads[0], grads[1], self.alpha, self.beta, hessian, self.delta)
            for i, row in enumerate(rows):
                losses[row].append(loss[i])
        loss = torch.stack([torch.stack(kept).mean() if kept else starts.new_full((), float("nan")) for kept in losses])
        return Trained(w, loss)

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client's model after one adaptation step from the global model, built when evaluated."""
        n = self.server.num_clients
        return ClientModels(self.adapted_model, n), torch.arange(n, device=self.server.device)

    def adapted_model(self, client: int) -> Tensor:
        """w - alpha grad f(w; B): the global model after one step on the first batch B of the client's "adapt"
        stream of round 0 (the global model itself for a client without training data)."""
        return self.adapted(
            self.client_model(client), self.server.clients.batches(ADAPT_ROUND, client, epochs=1, purpose="adapt")
        )

    def adapted(self, w: Tensor, batches: Iterator[tuple[int, int, Any]]) -> Tensor:
        """w after one step of size alpha on the first of `batches` (w itself when there is none)."""
        first = next(batches, None)
        if first is None:
            return w
        _, grad = self.server.model.loss_and_grad(w, first[2])
        return w - self.alpha * grad

    def newcomer_models(self, newcomers: Newcomers) -> tuple[ClientModels, Tensor, None]:
        """A newcomer adapts the global model as a training client does: one step on the first batch of its own
        "adapt" stream."""
        w = self.models[0]
        models = ClientModels(
            lambda j: self.adapted(w, newcomers.batches(j, epochs=1, purpose="adapt")), newcomers.count
        )
        return models, torch.arange(newcomers.count, device=w.device), None
