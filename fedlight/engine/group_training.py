"""Group training: the one place where clients' local SGD runs, for the round's default training and for every
call of `ServerContext.clients.train_many` an algorithm's own group work makes.

`GroupTraining.fit(round, clients, starts, work)` trains a group of clients from their starting models as one
`LocalWork` says (epochs, learning-rate factor, gradient hook, trainable entries, sample weights, batch stream):
through the vectorized trainer (`fedlight.training.vectorized`) in groups that fit in memory when the plan allows,
else one client after another (`fedlight.training.sequential`). Under `vectorize: -1` the first call times both
trainers on its own clients and keeps the faster (`fedlight.training.probe`), so nothing is trained twice.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.engine.devices import available_memory
from fedlight.engine.processes import Collective
from fedlight.training.local_work import LocalWork
from fedlight.training.probe import (
    AGREEMENT,
    CHECK_CLIENTS,
    COMPUTE_BOUND_S,
    ProbeResult,
    agreement,
    decide,
    device_name,
    faster_layout,
    probe_key,
    recall,
    remember,
    sequential_share,
    step_seconds,
    timed,
    without_dropout,
)
from fedlight.training.sequential import ClientTrainer, GradientHook, Trained
from fedlight.training.trainer_stand_in import TrainerAttributeError
from fedlight.training.vectorized import GroupHook, VectorizedTrainer, unsupported_reason

if TYPE_CHECKING:
    from fedlight.engine.config import FederationConfig
    from fedlight.plugin.data import ClientSplit

CPU_GROUP = 256  # most clients per group on a CPU: plenty for full-width vectorized steps


def client_hook(hook: GroupHook | None, row: int) -> GradientHook | None:
    """A group hook as the sequential trainer's hook of the client at position `row` (its flat vectors as rows of
    one, views, so the hook's in-place edits reach the trainer's gradient)."""
    if hook is None:
        return None
    return lambda params, grad, start: hook([row], params[None], grad[None], start[None])


@dataclass
class LentRow:
    """A (1, d) row of a round's trained models lent to the next group of one (`GroupTraining.writing_into`);
    `taken` once a training call wrote its model into it."""

    row: Tensor
    taken: bool = False


class GroupTraining:
    """Both trainers, the choice between them (kept in `choice`: "vectorized", "sequential" or "auto" until the
    probe decides, with `reason` when sequential), and group sizes by memory.

    Args:
        trainer: the sequential trainer (also the module, its optimizer and schedules).
        train: every client's training split.
        seed_of: (round, client, purpose) -> the client's seed (`ServerContext.random.client_seed`).
        config: the federation's settings (`vectorize`, `batch_size`, `local_epochs`).
        collective: the processes (the probe's decision is the first process's, for all).
        hook_flag: whether the run's default training has a gradient hook (part of the probe's memory key).
        forced_reason: why clients must train one after another whatever the settings (None: they need not).
        on_choice: called with (choice, reason) whenever they change (the plan printed and recorded follows them).
    """

    def __init__(
        self,
        trainer: ClientTrainer,
        train: "ClientSplit",
        seed_of: Callable[[int, int, str], int],
        config: "FederationConfig",
        collective: Collective,
        hook_flag: bool = False,
        forced_reason: str | None = None,
        on_choice: Callable[[str, str | None], None] = lambda choice, reason: None,
    ) -> None:
        self.trainer, self.train_split, self.seed_of = trainer, train, seed_of
        self.config, self.collective, self.hook_flag, self.on_choice = config, collective, hook_flag, on_choice
        self.device = trainer.fabric.device
        self.vectorized: VectorizedTrainer | None = None
        self.probe_result: ProbeResult | None = None  # what `vectorize: -1` measured and chose
        self._activation_bytes: int | None = None  # measured once, when a group size first needs it
        self._lent: LentRow | None = None  # where the next group of one trained alone is written
        self.choice, self.reason = self._choose(forced_reason)

    def _choose(self, forced_reason: str | None) -> tuple[str, str | None]:
        if forced_reason:
            return "sequential", forced_reason
        if not self.config.vectorize:
            return "sequential", "federation.vectorize is 0"
        trainer = self.trainer
        reason = unsupported_reason(trainer.module, trainer.raw_optimizer, trainer.scaler)
        if reason:
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=4)
            return "sequential", reason
        self.vectorized = VectorizedTrainer(
            trainer.fabric,
            trainer.module,
            trainer.flat,
            trainer.raw_optimizer,
            trainer.learning_rates,
            trainer.batch_transform,
            self.config.batch_size,
            self.config.local_epochs,
            trainer.stand_in,
        )
        return ("auto" if self.config.vectorize == -1 else "vectorized"), None

    def on(self, split: "ClientSplit", seed_of: Callable[[int, int, str], int]) -> "GroupTraining":
        """The same trainers and choice on other clients (the newcomers): a view that trains the clients of `split`,
        seeded by `seed_of`, vectorized unless the training clients train one after another (it never probes)."""
        view = copy.copy(self)
        view.train_split, view.seed_of, view.on_choice = split, seed_of, lambda choice, reason: None
        if view.choice == "auto":
            view.choice = "vectorized" if view.vectorized is not None else "sequential"
        return view

    def _sequential_from_now(self, reason: str) -> None:
        self.vectorized = None
        self.choice, self.reason = "sequential", reason
        self.on_choice(self.choice, reason)

    # -- training --------------------------------------------------------------------------------------------
    def fit(self, round: int, clients: list[int], starts: Tensor, work: LocalWork = LocalWork()) -> Trained:
        """`clients` trained from the rows of `starts` as `work` says; the frozen entries restored. `round` seeds the
        clients' batches; a set-up phase numbered 0 trains at round 1's learning rates. Clients the round cuts short
        (`fedlight.training.work_shares`) take their share of the steps, one after another (`_cut_short`)."""
        if self.trainer.work_shares.cuts(clients):
            return self._cut_short(round, clients, starts, work)
        with self._without_gradients(work), self._objective(work):
            trained = self._try_vectorized(round, clients, starts, work) if self.vectorized is not None else None
            if trained is None:
                trained = self._one_by_one(round, clients, starts, work)
        work.restore_frozen(trained.params, starts)
        return trained

    def _cut_short(self, round: int, clients: list[int], starts: Tensor, work: LocalWork) -> Trained:
        """A call some of whose clients finish only part of their steps: the others trained as any call (vectorized
        when the plan says so), the cut ones one after another with their step limits (the narrowest way: the
        vectorized trainer runs every client of a group to the end of its data), put back in the call's order."""
        shares = self.trainer.work_shares
        limits = [shares.steps(c, self.local_steps(c, work.epochs)) for c in clients]
        whole = [row for row, limit in enumerate(limits) if limit is None]
        cut = [row for row, limit in enumerate(limits) if limit is not None]
        parts = []
        if whole:
            parts.append(self.fit(round, [clients[r] for r in whole], starts[whole], work.for_rows(whole)))
        mine = work.for_rows(cut)
        with self._without_gradients(mine), self._objective(mine):
            trained = self._one_by_one(
                round, [clients[r] for r in cut], starts[cut], mine, limits=[limits[r] for r in cut]
            )
        mine.restore_frozen(trained.params, starts[cut])
        joined = Trained.cat(parts + [trained])
        back = torch.tensor(whole + cut, device=joined.params.device).argsort()
        return Trained(joined.params[back], joined.loss[back], {k: v[back] for k, v in joined.logs.items()})

    @contextlib.contextmanager
    def _without_gradients(self, work: LocalWork) -> Iterator[None]:
        """The parameter tensors `work` freezes whole take no gradient in either trainer (backward stops at them), and
        both trainers' optimizers skip them; the entries are restored as `LocalWork` says. The numbers are
        those of a full backward with masked gradients, except under weight decay, which no longer moves a frozen
        tensor within the call (it was restored at the end either way)."""
        names = self.trainer.flat.frozen_tensors(work.trainable)
        vectorized = contextlib.nullcontext() if self.vectorized is None else self.vectorized.without_gradients(names)
        with self.trainer.flat.without_gradients(names), vectorized:
            yield

    @contextlib.contextmanager
    def _objective(self, work: LocalWork) -> Iterator[None]:
        """Within: both trainers' steps minimize `work.objective` (when it gives one) instead of `training_step`."""
        if work.objective is None:
            yield
            return
        stepping = [self.trainer] + ([] if self.vectorized is None else [self.vectorized.step_module])
        for one in stepping:
            one.objective = work.objective
        try:
            yield
        finally:
            for one in stepping:
                one.objective = None

    def _unstepped(self, work: LocalWork) -> Tensor | None:
        """The entries neither trainer's optimizer steps within `fit`: buffers, and the parameter tensors `work`
        freezes whole (skipped by the optimizers under `_without_gradients`): their gradient need not be zeroed."""
        if work.trainable is None:
            return None
        flat = self.trainer.flat
        return ~flat.parameter_mask() | flat.tensors_mask(flat.frozen_tensors(work.trainable))

    def loss_and_grads(self, params: Tensor, x: Tensor, y: Tensor, step: int) -> tuple[Tensor, Tensor] | None:
        """(losses, flat gradients) of k models on their batches through the vectorized trainer, or None when
        clients train one after another (the caller then loops). Under auto, a group loop's first step is timed both
        ways (`_probe_group_step`) and the faster kept, as `train_many`'s first call is."""
        if self.vectorized is None:
            return None
        try:
            if self.choice == "auto" and self.probe_result is None:
                self._probe_group_step(params, x, y, step)
                if self.vectorized is None:
                    return None
            return self.vectorized.loss_and_grads(params, x, y, step)
        except TrainerAttributeError:  # the module read what a federated run has not: its one line, no fall-back
            raise
        except Exception as error:  # the module's step fails under torch.func: one model after another from now
            reason = f"training_step failed under torch.func ({error!r})"
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=2)
            self._sequential_from_now(reason)
            return None

    def _probe_group_step(self, params: Tensor, x: Tensor, y: Tensor, step: int) -> None:
        """A group loop's trainer choice (pFedMe, APFL, Per-FedAvg make no `train_many` call to time): its first
        step's gradients computed vectorized (once to warm up, once timed) and model by model (timed), dropout off
        and the random state put back, so the step itself then runs as if no probe had been; the decision is
        remembered like `train_many`'s, under a key of its own."""
        key = self._probe_key(len(params), group_loop=True)
        result = self._recall(key)
        if result is None:
            vectorized = self.vectorized
            assert vectorized is not None  # probed while clients train vectorized
            devices = [self.device] if self.device.type == "cuda" else []
            with without_dropout(self.trainer.module), torch.random.fork_rng(devices=devices):
                vectorized.loss_and_grads(params, x, y, step)
                (_, together), vectorized_s = timed(self.device, lambda: vectorized.loss_and_grads(params, x, y, step))
                alone, sequential_s = timed(
                    self.device,
                    lambda: torch.stack(
                        [self.trainer.loss_and_grad(p, (x[i], y[i]), step)[1] for i, p in enumerate(params)]
                    ),
                )
            k = len(params)
            difference = agreement(alone, together, torch.zeros_like(alone))
            result = self.collective.broadcast(decide(k, k, sequential_s / k, vectorized_s / k, difference))
            if self.collective.rank == 0:
                remember(key, result)
        self.keep_probe(result)

    @contextlib.contextmanager
    def writing_into(self, row: Tensor) -> Iterator[LentRow]:
        """Within: the first group of one client trained one after another (`_one_by_one`) writes its model into
        `row` ((1, d)) and returns it, instead of a new tensor the caller would copy into `row` again; later calls
        get copies of their own. Yields the `LentRow`, whose `taken` says whether a call wrote into it."""
        self._lent = lent = LentRow(row)
        try:
            yield lent
        finally:
            self._lent = None

    def _seeds(self, round: int, clients: list[int], work: LocalWork) -> list[int]:
        return [self.seed_of(round, c, work.purpose) for c in clients]

    def _one_by_one(
        self,
        round: int,
        clients: list[int],
        starts: Tensor,
        work: LocalWork,
        offset: int = 0,
        limits: list[int | None] | None = None,
    ) -> Trained:
        """Written in place, so the trained models are never held twice. `offset`: the position of `clients[0]` in
        the call's clients (what the gradient hook is told); `limits`: each client's most steps (None: all). A group
        of one is written into the rows `writing_into` lent, if any (taken by this call alone)."""
        lent = self._lent if len(clients) == 1 else None
        if lent is not None:
            self._lent, lent.taken = None, True
        params: Tensor | None = None  # a group of one keeps its trained copy, unless a row was lent
        if len(clients) != 1:
            params = torch.empty_like(starts)
        elif lent is not None:
            params = lent.row
        losses = torch.empty(len(clients), device=self.device)
        logs: dict[str, Tensor] = {}
        hook, seeds = work.hook(self._unstepped(work)), self._seeds(round, clients, work)
        for row, (client, start) in enumerate(zip(clients, starts)):
            x, y = self.train_split.client(client)
            weights = None if work.sample_weights is None else work.sample_weights[offset + row]
            inputs = self._inputs(work, offset + row, offset + row + 1)
            one = self.trainer.fit(
                start,
                x,
                y,
                seeds[row],
                client_hook(hook, offset + row),
                work.lr_scale,
                work.epochs,
                round=max(round, 1),
                sample_weights=weights,
                inputs=None if inputs is None else inputs[0],
                max_steps=None if limits is None else limits[row],
                out=None if params is None else params[row],  # written in place: no copy of its own
            )
            if params is None:
                params = one.params.unsqueeze(0)  # `fit` returns a copy of its own: no second one
            losses[row] = one.loss
            for name, value in one.logs.items():
                logs.setdefault(name, torch.full((len(clients),), float("nan"), device=self.device))[row] = value
        assert params is not None  # set for a group of one by its client
        return Trained(params, losses, logs)

    def _try_vectorized(self, round: int, clients: list[int], starts: Tensor, work: LocalWork) -> Trained | None:
        """Vectorized training (the first call under auto: the probe's split, `_fit_and_probe`), or None (and
        sequential training from then on) when the module's training step fails under torch.func, e.g. because it
        reads values back with .item()."""
        try:
            if self.choice == "auto" and self.probe_result is None:
                return self._fit_and_probe(round, clients, starts, work)
            return self._vectorized(round, clients, starts, work)
        except TrainerAttributeError:  # the module read what a federated run has not: its one line, no fall-back
            raise
        except Exception as error:  # any failure inside vmap: the module is not vectorizable
            reason = f"training_step failed under torch.func ({error!r})"
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=2)
            self._sequential_from_now(reason)
            return None

    def _vectorized(self, round: int, clients: list[int], starts: Tensor, work: LocalWork, offset: int = 0) -> Trained:
        vectorized = self.vectorized
        assert vectorized is not None  # called while clients train vectorized
        size = self.group_size(len(clients))
        hook, seeds = work.hook(self._unstepped(work)), self._seeds(round, clients, work)
        parts = []
        for begin in range(0, len(clients), size):
            end = min(begin + size, len(clients))
            shifted = (
                None
                if hook is None
                else (lambda at: lambda rows, p, g, s: hook([at + r for r in rows], p, g, s))(offset + begin)
            )
            weights = None if work.sample_weights is None else work.sample_weights[offset + begin : offset + end]
            parts.append(
                vectorized.fit_many(
                    starts[begin:end],
                    [self.train_split.client(c) for c in clients[begin:end]],
                    seeds[begin:end],
                    shifted,
                    lr_scale=work.lr_scale,
                    round=max(round, 1),
                    epochs=work.epochs,
                    sample_weights=weights,
                    client_inputs=self._inputs(work, offset + begin, offset + end),
                )
            )
        return Trained.cat(parts)

    def _inputs(self, work: LocalWork, begin: int, end: int) -> Tensor | None:
        """The objective's inputs of the clients at positions [begin, end) of the call (an empty row each without
        them), or None without an objective."""
        if work.objective is None:
            return None
        if work.client_inputs is None:
            return torch.zeros(end - begin, 0, device=self.device)
        return work.client_inputs[begin:end]

    def _fit_and_probe(self, round: int, clients: list[int], starts: Tensor, work: LocalWork) -> Trained:
        """The first group's training under auto, timed (`fedlight.training.probe`): its first `sequential_share`
        clients one after another, client by client; then, if the agreement check passes, the rest of the group
        vectorized. The faster per client step (or the decision this machine remembers) trains the rest of
        `clients` and every later call. The same clients train each way whatever the decision, so a remembered
        decision gives the numbers of a measured one."""
        group = clients[: self.group_size(len(clients))]
        key = self._probe_key(len(group), gradient_hook=self.hook_flag)
        remembered = self._recall(key)
        first = sequential_share(len(group))
        parts, seconds = [], []
        for row in range(first):
            one, spent = timed(
                self.device, lambda: self._one_by_one(round, clients[row : row + 1], starts[row : row + 1], work, row)
            )
            parts.append(one)
            seconds.append(spent)
        rest, rest_starts = clients[first : len(group)], starts[first : len(group)]
        sequential_s = step_seconds(seconds, [self.local_steps(c, work.epochs) for c in clients[:first]])
        compute_bound = remembered is None and bool(rest) and self.device.type == "cpu"
        if compute_bound and self.collective.broadcast(sequential_s >= COMPUTE_BOUND_S):
            parts.append(self._one_by_one(round, rest, rest_starts, work, first))
            result = self.collective.broadcast(
                ProbeResult(first, 0, sequential_s, math.nan, math.nan, "sequential", compute_bound=True)
            )
            return self._keep_and_finish(key, result, round, clients, starts, work, parts, len(group))
        difference, channels_last = (
            (remembered.difference, remembered.channels_last_inputs)
            if remembered
            else self.collective.broadcast(
                self._check_agreement(round, rest, rest_starts, work, first) if rest else (0.0, False)
            )
        )
        assert self.vectorized is not None  # probed while clients may train vectorized
        self.vectorized.channels_last_inputs = channels_last
        vectorizes = bool(rest) and difference <= AGREEMENT
        if vectorizes:
            trained, vectorized_s = timed(self.device, lambda: self._vectorized(round, rest, rest_starts, work, first))
            vectorized_s /= sum(self.local_steps(c, work.epochs) for c in rest)
        else:
            trained, vectorized_s = self._one_by_one(round, rest, rest_starts, work, first), math.nan
        parts.append(trained)
        result = remembered or self.collective.broadcast(
            decide(first, len(rest) if vectorizes else 0, sequential_s, vectorized_s, difference, channels_last)
        )
        return self._keep_and_finish(key, result, round, clients, starts, work, parts, len(group), remembered)

    def _keep_and_finish(
        self,
        key: str,
        result: ProbeResult,
        round: int,
        clients: list[int],
        starts: Tensor,
        work: LocalWork,
        parts: list[Trained],
        grouped: int,
        remembered: ProbeResult | None = None,
    ) -> Trained:
        """Take the probe's `result` (remembered on this machine unless it was recalled), train the clients beyond
        the first group (`grouped` of them trained) with the chosen trainer, and join every part in order."""
        if remembered is None and self.collective.rank == 0:
            remember(key, result)
        self.keep_probe(result)
        if len(clients) > grouped:
            later, later_starts = clients[grouped:], starts[grouped:]
            parts.append(
                self._vectorized(round, later, later_starts, work, grouped)
                if self.vectorized is not None
                else self._one_by_one(round, later, later_starts, work, grouped)
            )
        return Trained.cat(parts)

    def _probe_key(self, clients: int, **kind: bool) -> str:
        """The key a trainer decision is remembered under: this model, batch size, precision and device, `clients`
        in the timed group, and `kind` (a `train_many` call's gradient hook, or a group loop)."""
        return probe_key(
            model=type(self.trainer.module).__qualname__,
            params=self.trainer.flat.numel,
            batch_size=self.config.batch_size,
            clients=clients,
            precision=self._precision_name(),
            device=device_name(self.device),
            **kind,
        )

    def _recall(self, key: str) -> ProbeResult | None:
        """The decision this machine remembers under `key` (the first process's memory, for every process)."""
        remembered = recall(key) if self.collective.rank == 0 else None
        return self.collective.broadcast(remembered) if self.collective.broadcast(remembered is not None) else None

    def _check_agreement(
        self, round: int, clients: list[int], starts: Tensor, work: LocalWork, offset: int
    ) -> tuple[float, bool]:
        """One local step on each client's first batch, dropout off: `clients` vectorized (the warm-up of the
        trainer at the group size it is then timed at: a first call costs 20-30 % more per step) and the first
        `CHECK_CLIENTS` of them sequentially; how far the vectorized models are from the sequential ones, and
        whether the vectorized trainer takes its image batches channels-last from now on: where the layout matters (a
        CPU, a convolution) the vectorized step is timed in both (`faster_layout`) and the faster kept."""
        seeds = self._seeds(round, clients, work)
        batch = self.config.batch_size
        data = [(x[:batch], y[:batch]) for x, y in (self.train_split.client(c) for c in clients)]
        weights = (
            None
            if work.sample_weights is None
            else [w[:batch] for w in work.sample_weights[offset : offset + len(clients)]]
        )
        hook = work.hook(self._unstepped(work))
        shifted = None if hook is None else lambda rows, p, g, s: hook([offset + r for r in rows], p, g, s)
        inputs = self._inputs(work, offset, offset + len(clients))
        trainer = self.vectorized
        assert trainer is not None  # checked while clients train vectorized

        def one_step(channels_last: bool) -> Tensor:
            trainer.channels_last_inputs = channels_last
            return (
                trainer.fit_many(
                    starts,
                    data,
                    seeds,
                    shifted,
                    work.lr_scale,
                    max(round, 1),
                    epochs=1,
                    sample_weights=weights,
                    client_inputs=inputs,
                )
                .params[:CHECK_CLIENTS]
                .clone()
            )  # the rows compared, not the whole group's models in each layout

        with without_dropout(self.trainer.module):
            channels_last, vectorized = (
                faster_layout(self.device, one_step) if trainer.layouts_differ else (False, one_step(False))
            )
            sequential = torch.stack(
                [
                    self.trainer.fit(
                        starts[i],
                        *data[i],
                        seeds[i],
                        client_hook(hook, offset + i),
                        work.lr_scale,
                        epochs=1,
                        round=max(round, 1),
                        sample_weights=None if weights is None else weights[i],
                        inputs=None if inputs is None else inputs[i],
                    ).params
                    for i in range(min(CHECK_CLIENTS, len(clients)))
                ]
            )
        return agreement(sequential, vectorized, starts[: len(sequential)]), channels_last

    def _precision_name(self) -> str:
        plugin = self.trainer.fabric.strategy.precision
        return str(getattr(plugin, "precision", type(plugin).__name__))

    def keep_probe(self, result: ProbeResult) -> None:
        """Take the probe's choice: one client after another from now on (with its reason), or vectorized."""
        self.probe_result = result
        if self.vectorized is not None:
            self.vectorized.channels_last_inputs = result.channels_last_inputs
        if result.reason is not None:  # sequential: the probe says why
            self._sequential_from_now(result.reason)
        else:
            self.choice = "vectorized"
            self.on_choice(self.choice, None)

    # -- sizes -----------------------------------------------------------------------------------------------
    def local_steps(self, client: int, epochs: int | None = None) -> int:
        """Optimizer steps of one client's local training: its batches times `epochs` (default: the local epochs)."""
        return self.trainer.local_steps(len(self.train_split.client(client)[1]), epochs)

    def group_size(self, clients: int) -> int:
        """Clients trained (vectorized) or aggregated together: `vectorize` when it is a count; otherwise as
        many as half the free memory holds (on a CPU also at most `CPU_GROUP`), counting for each client its
        parameters, gradients, optimizer state and temporaries, and, when it may train vectorized, twice the
        activations its step keeps (`activation_bytes`: the saved tensors, then their gradients)."""
        if self.config.vectorize > 0:
            return self.config.vectorize
        flat = self.trainer.flat
        per_client = flat.numel * flat.vector.element_size() * 8 + 2 * self.activation_bytes()
        free = available_memory(self.device)
        fits = clients if free is None else max(1, int(0.5 * free // per_client))
        return min(clients, fits) if self.device.type == "cuda" else min(clients, fits, CPU_GROUP)

    def activation_bytes(self) -> int:
        """What one client's vectorized step keeps for backward, measured once on a full batch of the training
        data (`VectorizedTrainer.activation_bytes`); 0 when clients cannot train vectorized."""
        if self.vectorized is None:
            return 0
        if self._activation_bytes is None:
            batch = self.config.batch_size
            try:
                self._activation_bytes = self.vectorized.activation_bytes(
                    self.train_split.x[:batch], self.train_split.y[:batch]
                )
            except Exception:  # a step that cannot run here cannot run vectorized either: that path says why
                self._activation_bytes = 0
        return self._activation_bytes

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The probe's result as a dict, or None when no probe ran."""
        return None if self.probe_result is None else self.probe_result.as_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Keep a checkpoint's probe result while the choice is still "auto", so the resumed run trains as it chose."""
        if state is not None and self.choice == "auto":  # the resumed run keeps its choice
            self.keep_probe(ProbeResult(**state))
