"""`SystemModel`: the `system:` section as a round extension (`fedlight.plugin.extension.RoundExtension`). It keeps
the virtual clock, answers the base class's draw of a round's clients from those online (`select`), decides what the
selected clients get done (`work`: offline, dropped out, past the deadline, cut short), with `system.buffer_size`
runs asynchronous rounds (`arrivals`: FedBuff's buffer, `fedlight.system.buffered`) and logs the round's `system/*`
scalars when it ends; the federation never names it (docs/architecture.md, "System model")."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedlight.plugin.client_work import WorkDone
from fedlight.plugin.cohort import Sampling
from fedlight.plugin.extension import ExtensionContext, RoundExtension
from fedlight.plugin.message import MODEL, PER_CLIENT, MessageSchema
from fedlight.plugin.round_work import Arrivals, RoundWork
from fedlight.plugin.server import stream_seed
from fedlight.plugin.updates import Updates
from fedlight.system.availability import DAY_S, make_availability
from fedlight.system.buffered import Arrived, InFlight, take_arrivals
from fedlight.system.clock import DeviceProfiles, VirtualClock
from fedlight.system.config import SystemConfig
from fedlight.system.losses import loss_statistics
from fedlight.system.selection import SelectionContext
from fedlight.system.selectors import make_selector
from fedlight.system.stragglers import DECIMALS, round_deadline, run_round
from fedlight.system.work_cost import WorkCost

WAIT_DAYS = 7  # with no client online, the server looks again every `wait_s` for this long before giving up


@dataclass
class RoundRecord:
    """What a round did on the virtual clock, logged when it ends."""

    start_s: float
    online: int
    offline: int
    dropped_out: int
    deadline_dropped: int
    partial: int
    duration_s: float
    deadline_s: float | None
    waited_for_first: bool
    went_offline: int = 0
    kept: np.ndarray | None = None  # the clients that sent an update
    whole: np.ndarray | None = None  # of those, the ones that ran all of their local work (not cut short)
    deadline_bound: bool = False  # the deadline cut a client, so the round lasts at least until it


class SystemModel(RoundExtension):
    """The clients' devices, availability, deadline, dropouts and the server's selection, on a virtual clock.

    Args:
        config: the `system:` section.
        num_clients: the training clients.
        seed: the run's seed (every draw is a stream of it).
    """

    name = "system"
    suspect = False  # it changes who trains and how long, never what an update holds

    def __init__(self, config: SystemConfig, num_clients: int, seed: int) -> None:
        self.config, self.num_clients, self.seed = config, num_clients, seed
        self.devices = DeviceProfiles.of(config, num_clients, seed)
        self.availability = make_availability(config, num_clients, seed)
        self.clock = VirtualClock()
        self._start: tuple[int, float, np.ndarray] | None = None  # (round, start time, who is online)
        self._drawn: tuple[int, int, list[int]] | None = None  # (round, count, clients): the round's one draw
        self._record: RoundRecord | None = None
        self._short_said = False
        self.in_flight: InFlight | None = None  # FedBuff's clients training now (`system.buffer_size`), else None
        self.trained_from: dict[str, Callable[[list[int]], Any]] = {}  # model entries re-based with the model
        self._arrived: tuple[float, Arrived] | None = None  # the round's dispatch time and arrivals
        self._in_flight_state: dict | None = None  # a resumed buffer, made whole once the model's device is known
        self._selection_s = 0.0  # the round's selection phase (the candidates' loss passes)
        self.last_selection: WorkDone | None = None  # what that phase ran
        self.charges: dict[str, float] = {}  # what the last measured client's whole work was charged (`charged_s`)

    # -- set-up ----------------------------------------------------------------------------------------------
    def setup(self, context: ExtensionContext) -> None:
        """Each client's local steps and its time for them and for the model's transfers; the deadline checked
        against the fastest client; the selector."""
        server, algorithm, config = context.server, context.algorithm, self.config
        if config.partial_work and algorithm.plan.own_training:
            raise ValueError(
                f"system.partial_work: {type(algorithm).__name__} trains its clients its own way "
                "(train_client), which has no local steps to cut short: leave partial_work out (clients "
                "past the deadline are then dropped)"
            )
        self.steps = np.array([server.clients.local_steps(c) for c in range(self.num_clients)], dtype=np.int64)
        # each client's time for its work and transfers as last measured: its nominal local steps and one model
        # each way until its work was counted (`fedlight.system.work_cost`), which the deadline and Oort read
        self.compute_s = self.devices.compute_s(self.steps, context.config.batch_size)
        model_bits = context.model.numel() * context.model.element_size() * 8
        self.transfer_s = self.devices.transfer_s(model_bits)
        self.cost = WorkCost(self.devices, context.config.batch_size, model_bits, self.compute_s.copy())
        self.work_log = server.clients.work
        self.check_deadline()
        selection = SelectionContext(
            server.random.rng,
            server.clients.train_sizes.cpu().numpy(),
            self.compute_s + self.transfer_s,
            lambda clients: loss_statistics(server, algorithm, clients),
            lambda: algorithm.assignment.cpu().numpy(),
        )
        self.selector = make_selector(config, selection)
        if config.selection == "data_size" and not config.size_weighted_mean:  # sampled by size: averaged plainly
            server.clients.aggregation_weights = torch.ones_like(server.clients.train_sizes)
        if config.buffer_size is not None:
            self.setup_buffer(context)

    def setup_buffer(self, context: ExtensionContext) -> None:
        """FedBuff's clients in flight (`fedlight.system.buffered`); refused in one line over several processes, or
        with more clients in flight than the run has."""
        config, n = self.config, self.num_clients
        assert config.buffer_size is not None  # set up only for asynchronous rounds
        self.concurrency = config.concurrency if config.concurrency is not None else context.cohort_size
        if self.concurrency > n or config.buffer_size > self.concurrency:
            raise ValueError(
                f"system.concurrency is {self.concurrency} and system.buffer_size {config.buffer_size}, "
                f"but the run has {n} clients: give buffer_size <= concurrency <= {n}"
            )
        if context.processes > 1:
            raise ValueError(
                "system.buffer_size: asynchronous rounds keep their clients in flight on one process; "
                "run on one device (or leave buffer_size out)"
            )
        self.algorithm = context.algorithm
        self.sizes, self.like = context.server.clients.aggregation_weights, context.model
        self.in_flight = (
            InFlight.empty(self.like)
            if self._in_flight_state is None
            else InFlight.from_state(self._in_flight_state, self.like.device)
        )

    def sampling(self) -> Sampling | None:
        """How the clients whose updates a round aggregates are chosen, when it is not a uniform draw independent of
        their data (`fedlight.plugin.cohort.Sampling`, for DP's accounting). Availability "always" or "share" (a
        uniform share online each round) with uniform selection keeps the draw uniform; deadlines and dropouts only
        leave out some of a uniform draw's clients."""
        c = self.config
        if c.selection in ("power_of_choice", "oort"):
            return Sampling(
                False,
                f"system.selection {c.selection} picks clients by their training losses",
                reads_data="the candidates' training losses",
            )
        if c.buffer_size is not None:
            return Sampling(False, "FedBuff: who arrives follows the devices' speeds and the clients in flight")
        if c.selection != "uniform":
            how = {
                "data_size": "in proportion to their training-set sizes",
                "cluster_stratified": "from each of the algorithm's clusters, which follow the clients' data",
            }
            return Sampling(False, f"system.selection {c.selection} draws clients {how.get(c.selection, 'unevenly')}")
        if c.availability not in ("always", "share"):
            return Sampling(
                False, f"system.availability {c.availability}: who is online follows a pattern, not a uniform draw"
            )
        return None

    def check_message(self, schema: MessageSchema, algorithm: str) -> None:
        """Under FedBuff, keep the model entries it re-bases as the trained model (those whose origin the algorithm
        gives, `trained_from`: StoCFL's global copy, FedEM's copies), and refuse a message it cannot take rounds after
        it was sent: another model beside the trained one (it would not know which server models to re-base it on),
        a value the server reads client by client (read as of the round it arrives in), or a round that needs every
        client's message when fewer arrive an update."""
        if self.config.buffer_size is None:
            return
        self.trained_from = schema.trained_from  # model entries re-based as the trained model is
        stale = [name for name in schema.of_kind(MODEL, PER_CLIENT) if name not in schema.trained_from]
        if stale:
            raise ValueError(
                f"system.buffer_size: {algorithm}'s clients send {schema.describe(stale[0])} beside the "
                "model they trained, which FedBuff cannot re-base on the models the server holds when it "
                f"arrives: leave buffer_size out for {algorithm}"
            )
        if schema.every_client and self.config.buffer_size < self.num_clients:
            raise ValueError(
                f"system.buffer_size: {algorithm} needs every client's update {schema.every_client[0]}, "
                f"but FedBuff aggregates the first {self.config.buffer_size} arrivals of "
                f"{self.num_clients} clients: leave buffer_size out for {algorithm}"
            )

    def check_deadline(self) -> None:
        """Refuse in one line a fixed deadline no client can meet (its whole work, or with partial work one step,
        beside its transfers)."""
        deadline, partial = self.config.deadline_s, self.config.partial_work
        if deadline is None:
            return
        work_s = (
            np.divide(self.compute_s, self.steps, out=np.zeros_like(self.compute_s), where=self.steps > 0)
            if partial
            else self.compute_s
        )
        need = float(np.round(work_s + self.transfer_s, DECIMALS).min())
        if need > deadline:
            what = "one local step" if partial else "its local work"
            other = "" if partial else ", or let stragglers send the steps they finished (system.partial_work: true)"
            raise ValueError(
                f"system.deadline_s is {deadline:g} s, but the fastest client needs {need:.4g} s for "
                f"{what} and its transfers: raise it above {need:.4g} s{other}"
            )

    def describe(self) -> str:
        c = self.config
        devices = (
            f"devices from {c.device_trace}"
            if c.device_trace
            else f"compute {c.compute.describe('samples/s')}, link {c.link.describe('Mbit/s')}"
        )
        parts = [
            devices,
            f"availability {c.availability}",
            c.deadline,
            f"dropout {c.dropout:.0%}" if c.dropout else None,
            f"selection {c.selection}"
            + (", averaged plainly" if c.selection == "data_size" and not c.size_weighted_mean else ""),
            f"FedBuff: {c.buffer_size} arrivals an update, {c.concurrency or 'the cohort'} in flight, "
            f"{c.staleness} staleness weight"
            if c.buffer_size is not None
            else None,
        ]
        return "system: " + ", ".join(p for p in parts if p)

    # -- a round ---------------------------------------------------------------------------------------------
    def online(self, round: int) -> tuple[float, np.ndarray]:
        """(the round's start on the virtual clock, (clients,) who is online then): now, or, when no client is,
        the first later look (every `wait_s`) that finds one."""
        if self._start is not None and self._start[0] == round:
            return self._start[1], self._start[2]
        time_s, looks = self.clock.now_s, int(WAIT_DAYS * DAY_S / self.config.wait_s)
        online = self.availability.online(round, time_s)
        for _ in range(looks):
            if online.any():
                break
            time_s += self.config.wait_s
            online = self.availability.online(round, time_s)
        if not online.any():
            raise ValueError(
                f"system.availability {self.config.availability!r}: no client came online in the "
                f"{WAIT_DAYS} virtual days after {self.clock.now_s:.0f} s: give a pattern (or a trace) "
                "under which clients are online"
            )
        self._start = (round, time_s, online)
        return time_s, online

    def select(self, round: int, count: int) -> list[int]:
        """`count` of the clients online at the round's start by `system.selection`, or all of them when fewer are
        online; the same answer to every call of the round."""
        if self.in_flight is not None:  # asynchronous: new clients for the slots the arrivals freed
            count = self.concurrency - len(self.in_flight)
        if self._drawn is not None and self._drawn[:2] == (round, count):
            return list(self._drawn[2])
        online = self.online(round)[1]
        if self.in_flight is not None:
            online = online.copy()
            online[self.in_flight.clients] = False  # a client training now is not dispatched again
        available = np.flatnonzero(online)
        if len(available) > count:
            chosen = self.selected(round, available, count) if count else []
        else:
            chosen = available.tolist()
            if len(available) < count and not self._short_said:
                self._short_said = True
                warnings.warn(
                    f"round {round}: {len(available)} clients online, fewer than the {count} a round takes: "
                    "all of them train (system/online logs every round's count)",
                    stacklevel=2,
                )
        self._drawn = (round, count, chosen)
        return list(chosen)

    def begin_round(self, round: int) -> None:
        """Forget the work counted since the last round ended (the evaluation's, which the clock does not charge;
        what a round's aggregation hooks run on its clients, as IFCA's choice of a cluster by loss, counts)."""
        self.work_log.take()
        self._selection_s = 0.0

    def selected(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """`count` of the `available` clients by `system.selection`, and the seconds its work took (the candidates'
        loss passes of power-of-choice and Oort: a phase before the round's training, measured apart from it)."""
        before = self.work_log.take()
        chosen = self.selector.select(round, available, count)
        self.last_selection = self.work_log.take()
        self._selection_s = self.cost.phase_s(self.last_selection)
        self.work_log.add(before)
        return chosen

    def work(self, round: int, clients: list[int]) -> RoundWork:
        """The selected clients that are offline (an algorithm's own selection can pick them), drop out, miss the
        deadline or go offline before they finish send nothing; the ones the deadline, or with partial work their
        leaving, cuts short send the share of their steps they finished."""
        start_s, online = self.online(round)
        selected = np.asarray(clients, dtype=np.int64)
        present, offline = selected[online[selected]], selected[~online[selected]]
        out = np.zeros(len(present), dtype=bool)
        leaving = int(np.floor(np.round(self.config.dropout * len(present), DECIMALS)))  # never one more by float error
        if leaving:
            rng = np.random.default_rng(stream_seed(self.seed, round, "system.dropout"))
            out[rng.choice(len(present), size=leaving, replace=False)] = True
        compute_s, transfer_s, steps = self.compute_s[present], self.transfer_s[present], self.steps[present]
        deadline = round_deadline(compute_s + transfer_s, self.config.deadline_s, self.config.deadline_percentile)
        times = run_round(
            steps,
            compute_s,
            transfer_s,
            out,
            deadline,
            self.config.partial_work,
            self.availability.online_left_s(round, start_s)[present],
        )
        partial = times.kept & times.cut
        self._record = RoundRecord(
            start_s,
            int(online.sum()),
            len(offline),
            int(out.sum()),
            int((times.cut & ~times.kept).sum()),
            int(partial.sum()),
            times.duration_s,
            deadline,
            times.waited,
            int(times.went_offline.sum()),
            present[times.kept],
            present[times.kept & ~times.cut],
            times.deadline_bound,
        )
        dropped = offline.tolist() + present[~times.kept].tolist()
        return RoundWork(
            tuple(sorted(dropped)),
            {int(c): float(d / s) for c, d, s in zip(present[partial], times.done[partial], steps[partial])},
        )

    def arrivals(
        self, round: int, dispatched: list[int], train: Callable[[list[int]], list[Updates]]
    ) -> Arrivals | None:
        """Asynchronous rounds: the dispatched clients (less any still in flight, which an algorithm's own
        selection may pick) train now and join those in flight; the round aggregates the `buffer_size` earliest
        arrivals (`fedlight.system.buffered`). Synchronous: None."""
        if self.in_flight is None:
            return None
        start_s = self.online(round)[0]
        busy = set(self.in_flight.clients.tolist())
        new = [c for c in dispatched if c not in busy]
        fresh = None
        if new:
            parts = train(new)

            def joined(name: str) -> torch.Tensor:
                return torch.cat([getattr(p, name) for p in parts])

            fresh = Updates(
                joined("clients"),
                joined("params"),
                joined("starts"),
                joined("num_samples"),
                joined("train_loss"),
                {k: torch.cat([p.logs[k] for p in parts]) for k in parts[0].logs},
                {k: torch.cat([p.state[k] for p in parts]) for k in parts[0].state},
            )
        fresh_clients = np.asarray([] if fresh is None else fresh.clients.tolist(), dtype=np.int64)
        arrivals_s = start_s + self._selection_s + self.charged_s(self.work_log.take(), fresh_clients, fresh_clients)
        assert self.config.buffer_size is not None  # clients in flight: asynchronous rounds
        arrived, self.in_flight = take_arrivals(
            self.in_flight,
            fresh,
            arrivals_s,
            round - 1,
            self.config.buffer_size,
            self.config.staleness,
            self.algorithm.client_model,
            self.sizes,
            self.trained_from,
        )
        self._arrived = (start_s, arrived)
        return Arrivals(arrived.updates.clients.tolist(), arrived.group)

    def end_round_buffered(self, round: int) -> dict[str, float]:
        """The clock moves to the round's last arrival; the asynchronous round's `system/*` scalars."""
        assert self.in_flight is not None  # asynchronous rounds
        start_s, arrived = self._arrived if self._arrived is not None else (self.online(round)[0], None)
        self._arrived = None
        waited_s = start_s - self.clock.now_s
        end_s = start_s if arrived is None or not len(arrived.staleness) else max(arrived.last_s, start_s)
        duration_s = end_s - self.clock.now_s
        self.clock.advance(duration_s)
        staleness = arrived.staleness if arrived is not None else np.zeros(0)
        record, self._record = self._record, None  # the dispatched clients' work: who went offline before finishing
        return {
            "system/round_virtual_s": duration_s,
            "system/virtual_time_s": self.clock.now_s,
            "system/waited_s": waited_s,
            "system/online": int(self.online(round)[1].sum()),
            "system/arrived": len(staleness),
            "system/in_flight": len(self.in_flight),
            "system/staleness_mean": float(staleness.mean()) if len(staleness) else 0.0,
            "system/staleness_max": float(staleness.max()) if len(staleness) else 0.0,
            "system/went_offline": record.went_offline if record is not None else 0,
        }

    def end_round(self, round: int, selected: int) -> tuple[dict[str, float], str | None]:
        """The clock moves to the round's end; the round's `system/*` scalars."""
        if self.in_flight is not None:
            return self.end_round_buffered(round), None
        record, self._record = self._record, None
        if record is None:  # no client was asked to work (a round selecting nobody)
            start_s, online = self.online(round)
            record = RoundRecord(start_s, int(online.sum()), 0, 0, 0, 0, 0.0, None, False)
        waited_s = record.start_s - self.clock.now_s
        duration_s, late = self.measured_duration(record)
        self.clock.advance(waited_s + duration_s)
        scalars = {
            "system/round_virtual_s": waited_s + duration_s,
            "system/virtual_time_s": self.clock.now_s,
            "system/waited_s": waited_s,
            "system/online": record.online,
            "system/dropped_offline": record.offline,
            "system/dropped_out": record.dropped_out,
            "system/dropped_deadline": record.deadline_dropped,
            "system/partial": record.partial,
            "system/waited_for_first": float(record.waited_for_first),
            "system/went_offline": record.went_offline,
        }
        if record.deadline_s is not None:
            scalars["system/deadline_s"] = record.deadline_s
            scalars["system/late"] = late
        return scalars, None

    def charged_s(self, done: WorkDone, clients: np.ndarray, whole: np.ndarray) -> np.ndarray:
        """(len(clients),) seconds of the clients' counted work and transfers (`fedlight.system.work_cost`); the
        clients in `whole` ran all of their local work, so their times become the ones the next deadlines and Oort
        read for them."""
        compute_s, transfer_s = self.cost.compute_s(done, clients), self.cost.transfer_s(done, clients)
        ran_all = np.isin(clients, whole)
        self.compute_s[clients[ran_all]] = compute_s[ran_all]
        self.transfer_s[clients[ran_all]] = transfer_s[ran_all]
        if ran_all.any():  # what a client's whole work was charged, for the compatibility table and the summary
            measured = clients[ran_all]
            self.charges = {
                "work_x_local_steps": float(np.median(compute_s[ran_all] / self.cost.nominal_compute_s[measured])),
                "models_received": int(max(done.models_used[measured].max(), 1)),
                "bytes_sent_beside_model": float(done.sent_bytes[measured].max()),
            }
        return compute_s + transfer_s

    def measured_duration(self, record: RoundRecord) -> tuple[float, int]:
        """(the round's length: its selection phase, then until the last kept client's counted work and transfers
        arrive, at least until a deadline that cut a client; the kept clients whose counted time passed the deadline,
        which their time as last measured had met; none when no client could meet it and the server waited for the
        first)."""
        done = self.work_log.take()
        if record.kept is None or not len(record.kept):
            return self._selection_s + record.duration_s, 0
        assert record.whole is not None  # recorded with `kept`
        seconds = self.charged_s(done, record.kept, record.whole)
        duration = float(seconds.max())
        if record.deadline_bound and record.deadline_s is not None:
            duration = max(duration, record.deadline_s)
        late = (
            0
            if record.deadline_s is None or record.waited_for_first
            else int((np.round(seconds, DECIMALS) > record.deadline_s).sum())
        )
        return self._selection_s + duration, late

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The clock, and FedBuff's clients in flight when rounds are asynchronous."""
        state: dict[str, Any] = self.clock.state_dict()
        if self.in_flight is not None:
            state["in_flight"] = self.in_flight.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.clock.load_state_dict(state)
            self._in_flight_state = state.get("in_flight")
            if self._in_flight_state is not None and self.in_flight is not None:  # loaded after set-up
                self.in_flight = InFlight.from_state(self._in_flight_state, self.like.device)
