"""FedDF (Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated Learning", NeurIPS
2020), Algorithm 1 with the AVGLOGITS ensemble.

Clients train as in FedAvg. The server starts a student from the average of the round's models, then distills the
ensemble of those models into it on unlabelled data it holds: for each step a batch d of that data, and

    student <- student - eta grad KL( softmax(mean_k f(y_k, d) / T) || softmax(f(student, d) / T) ),

the teacher being the mean of the clients' logits. The student is the next global model.

How it maps onto fedlight:
- the unlabelled data is the data module's public set (`data.public_size`), which fedlight holds out of every client;
  a run without one is refused at set-up;
- each client's logits on the public set are computed from the model it trained and sent beside it (`feddf_logits`, a
  statistic the server sums; the server could compute them from the received model, as the paper's does, but as an
  entry of the message every extension sees what the distillation reads): DP refuses the run in one line, since the
  teachers are the raw client models, which no clipping or noise covers; under FedBuff a stale client's logits are
  those of the model it trained. The clock charges the bytes of the logits (public rows x classes x 4) but not the
  forward passes, which are the server's work in the paper;
- the student's start is the run's cluster aggregate of the trained models, every client counted once (the authors'
  code averages uniformly), so a robust rule or a server optimizer shapes it;
- the distillation runs on the server's copy of the network in evaluation mode (dropout off, BatchNorm with its
  running statistics, which do not train), through `functional_call` on the flat student, with Adam, a cosine-annealed
  rate over `steps` and the gradient's norm clipped at 5, as the authors' code.

Defaults, from the authors' code (the repository's FedDF configuration): Adam at 1e-3, up to 10^4 steps of 64 public
samples, T = 1, the student checked every 100 steps and the best one kept, stopping after `patience` = 1,000 steps
without improvement. Deviation: the authors check the student's top-1 accuracy on a labelled validation split of the
training data, which fedlight's server does not hold; here the check is the KL divergence to the ensemble on a held-out
fifth of the public set (unlabelled, never distilled on). `patience: null` runs every step and keeps the last student.
The digits configs take far fewer steps (the public set has a few hundred images).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fedlight.plugin import SUMMED, Algorithm, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

LOGITS = "feddf_logits"
CLIP_NORM = 5.0  # the authors' code clips the student's gradient norm at 5


class FedDF(Algorithm):
    """FedAvg's clients; the server distills the ensemble of the round's models into their average on its unlabelled
    public data (see the module docstring).

    Args:
        steps: distillation steps a round (at most; fewer when the check stops it).
        lr: Adam's learning rate, annealed to 0 over `steps` by a cosine.
        batch_size: public samples a step.
        temperature: T of the softmaxes (> 0).
        check_every: steps between two checks of the student on the held-out public rows.
        patience: steps without improvement after which the distillation stops (None: never; the last student is
            kept and nothing is held out).
        participation: share of clients selected each round.
    """

    def __init__(
        self,
        steps: int = 10_000,
        lr: float = 1e-3,
        batch_size: int = 64,
        temperature: float = 1.0,
        check_every: int = 100,
        patience: int | None = 1_000,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        for name, value in (("steps", steps), ("batch_size", batch_size), ("check_every", check_every)):
            if value < 1:
                raise ValueError(f"FedDF's {name} must be >= 1, got {value}")
        if not (lr > 0 and temperature > 0):
            raise ValueError(f"FedDF's lr and temperature must be > 0, got lr {lr} and temperature {temperature}")
        if patience is not None and patience < check_every:
            raise ValueError(f"FedDF's patience ({patience}) must be at least check_every ({check_every}), or null")
        self.steps, self.lr, self.batch_size, self.temperature = steps, lr, batch_size, temperature
        self.check_every, self.patience = check_every, patience

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        public = server.data.public_x
        if public is None or len(public) < (2 if self.patience is not None else 1):
            raise ValueError(
                "FedDF distills on the server's unlabelled public data, and the data module holds "
                f"{0 if public is None else len(public)} samples out: set data.public_size (e.g. 300)"
            )
        self.public = server.data.inputs(public)
        order = torch.from_numpy(server.random.rng(0, "feddf-holdout").permutation(len(public)))
        held = math.ceil(len(public) / 5) if self.patience is not None else 0
        self.held_out, self.distilled = order[:held].to(server.device), order[held:].to(server.device)
        self.parameter_entries = server.model.parameter_mask().to(server.device)
        server.message.sends(LOGITS, SUMMED)  # each client's logits on the public data: the teachers, averaged

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """FedAvg's local work; each client also sends its trained model's logits on the public data."""
        trained = super().train_group(round, clients, starts)
        public = self.server.data.public_x
        assert public is not None  # `setup` refuses a run without public data
        logits = torch.stack([self.server.model.predict(params, public) for params in trained.params])
        return Trained(trained.params, trained.loss, trained.logs, {**trained.state, LOGITS: logits})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The uniform aggregate of the trained models, then distilled towards the mean of the clients' logits."""
        models = self.models
        average = self.server.aggregation.new(len(models), models.shape[1], models.dtype, models.device, None)
        teacher = torch.zeros(len(self.public), self.server.data.num_classes, dtype=torch.float64, device=models.device)
        received = torch.zeros(1, dtype=torch.float64, device=models.device)
        for group in updates.groups():
            ones = torch.ones(len(group), dtype=models.dtype, device=models.device)
            average.add(self.assignment[group.clients], ones, group.params, group.starts)
            teacher += group.state[LOGITS].sum(0, dtype=torch.float64)
            received += len(group)
            del group
        average.reduce(updates)
        updates.sum_over_processes_(teacher, received)
        active, means = average.means()
        if not len(active):
            return
        self.models[0] = self.distill(round, means[0], (teacher / received).to(models.dtype))

    def distill(self, round: int, start: Tensor, teacher_logits: Tensor) -> Tensor:
        """The student from `start` after the distillation steps towards `teacher_logits` ((public rows, classes)):
        the best on the held-out rows, or the last when nothing is held out."""
        module = self.server.model.module
        module.eval()
        target = F.softmax(teacher_logits / self.temperature, dim=1)
        student = start.detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([student], lr=self.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.steps)
        rng = self.server.random.rng(round, "feddf")
        rows = self.distilled
        best, best_divergence, since_best = start.clone(), self._divergence(student, target), 0
        for step in range(1, self.steps + 1):
            batch = rows[
                torch.from_numpy(rng.choice(len(rows), size=min(self.batch_size, len(rows)), replace=False)).to(
                    rows.device
                )
            ]
            loss = self._kl(student, batch, target)
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            assert student.grad is not None  # set by the backward pass
            with torch.no_grad():
                student.grad.masked_fill_(~self.parameter_entries, 0)  # buffers (BatchNorm statistics) do not train
            torch.nn.utils.clip_grad_norm_([student], CLIP_NORM)
            optimizer.step()
            schedule.step()
            if self.patience is None or step % self.check_every:
                continue
            divergence = self._divergence(student, target)
            if divergence < best_divergence:
                best, best_divergence, since_best = student.detach().clone(), divergence, 0
            else:
                since_best += self.check_every
                if since_best >= self.patience:
                    break
        self.log("feddf/steps", step)
        if self.patience is None:
            return student.detach()
        self.log("feddf/heldout_kl", best_divergence)
        return best

    def _kl(self, student: Tensor, rows: Tensor, target: Tensor) -> Tensor:
        """KL(target || softmax(student / T)) on the public `rows`, the batch mean."""
        logits = functional_call(
            self.server.model.module, self.server.model.named_tensors(student), (self.public[rows],)
        )
        return F.kl_div(F.log_softmax(logits.float() / self.temperature, dim=1), target[rows], reduction="batchmean")

    @torch.no_grad()
    def _divergence(self, student: Tensor, target: Tensor) -> float:
        """The student's KL divergence to the ensemble on the held-out public rows (inf when none are held out)."""
        if not len(self.held_out):
            return math.inf
        return float(self._kl(student, self.held_out, target))
