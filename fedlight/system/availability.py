"""When clients are online (`system.availability`): each pattern answers `online(round, time_s)`, every client's
state at the start of a round, from the round's number or the virtual clock (`fedlight.system.clock`), and
`online_left_s(round, time_s)`, how long each stays online from then (a client whose online period ends before it
finishes its work and transfers goes offline mid-round: `fedlight.system.stragglers`). Only online clients can be
selected. Every draw is reproducible: per (seed, round) for "share", per (seed, client) for the
phases and time zones."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from fedlight.plugin.cohort import share_count
from fedlight.plugin.server import stream_seed
from fedlight.system.config import SystemConfig
from fedlight.system.speeds import client_uniforms
from fedlight.system.traces import online_intervals

DAY_S = 86_400.0
ZONES = 24  # hourly time zones, UTC-11 .. UTC+12


class Availability(Protocol):
    def online(self, round: int, time_s: float) -> np.ndarray:
        """(clients,) bool: who is online at virtual time `time_s`, the start of round `round`."""
        ...

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """(clients,) the virtual seconds each client stays online from `time_s` (inf: to the round's end and
        beyond; 0: offline now)."""
        ...


class Always:
    """Every client, always."""

    def __init__(self, count: int) -> None:
        self.count = count

    def online(self, round: int, time_s: float) -> np.ndarray:
        """Every client online."""
        return np.ones(self.count, dtype=bool)

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """(clients,) inf: no client ever goes offline."""
        return np.full(self.count, np.inf)


class FixedShare:
    """Each round a random `share` of the clients (rounded up to a count), drawn from a (seed, round) stream."""

    def __init__(self, share: float, count: int, seed: int) -> None:
        self.size, self.count, self.seed = share_count(share, count), count, seed

    def online(self, round: int, time_s: float) -> np.ndarray:
        """The round's `share` of the clients, drawn from the (seed, round) stream."""
        rng = np.random.default_rng(stream_seed(self.seed, round, "system.online"))
        mask = np.zeros(self.count, dtype=bool)
        mask[rng.choice(self.count, size=self.size, replace=False)] = True
        return mask

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """A round's online clients stay for the whole round (the share is drawn a round at a time)."""
        return np.where(self.online(round, time_s), np.inf, 0.0)


class Periods:
    """Each client online for `online_s`, then offline for `offline_s`, over and over, from a random phase of its
    own: online a share online_s / (online_s + offline_s) of the time, and of the clients at any time."""

    def __init__(self, online_s: float, offline_s: float, count: int, seed: int) -> None:
        self.online_s, self.cycle_s = online_s, online_s + offline_s
        self.phase_s = client_uniforms(seed, "phase", count) * self.cycle_s

    def online(self, round: int, time_s: float) -> np.ndarray:
        """The clients within the online part of their cycle at `time_s`."""
        return (time_s + self.phase_s) % self.cycle_s < self.online_s

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """What is left of each online client's online part of its cycle (0 for the offline)."""
        at = (time_s + self.phase_s) % self.cycle_s
        return np.where(at < self.online_s, self.online_s - at, 0.0)


class Diurnal:
    """Each client in an hourly time zone of its own (uniform over the 24), online while its local hour is within
    [from, to) (wrapping midnight when from > to): online a share (window hours) / 24 of a day, and of the clients
    at any time."""

    def __init__(self, hours: tuple[float, float], start_hour: float, count: int, seed: int) -> None:
        self.begin, self.end = (h % 24 for h in hours)
        self.start_hour = start_hour
        self.zone = np.floor(client_uniforms(seed, "zone", count) * ZONES) - 11

    def online(self, round: int, time_s: float) -> np.ndarray:
        """The clients whose local hour at `time_s` is within the window (every client when from == to)."""
        local = self.local_hours(time_s)
        if self.begin < self.end:
            return (self.begin <= local) & (local < self.end)
        return (local >= self.begin) | (local < self.end)

    def local_hours(self, time_s: float) -> np.ndarray:
        """(clients,) each client's local hour of the day at virtual time `time_s`."""
        return (self.start_hour + time_s / 3600.0 + self.zone) % 24

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """Until the window's end, `to` (a window from == to is the whole day: never offline)."""
        if self.begin == self.end:
            return np.full(len(self.zone), np.inf)
        left_s = (self.end - self.local_hours(time_s)) % 24 * 3600.0
        return np.where(self.online(round, time_s), left_s, 0.0)


class Trace:
    """Each client's online intervals from a trace (FedScale's behaviour trace: [active, inactive] intervals within
    a period that repeats), ends included as FedScale's `is_active` has them."""

    def __init__(self, path: str, count: int) -> None:
        self.intervals = online_intervals(path, count)

    def online(self, round: int, time_s: float) -> np.ndarray:
        """The clients with an online interval that holds `time_s` (modulo their trace's period), ends included."""
        mask = np.empty(len(self.intervals), dtype=bool)
        for client, (starts, ends, period) in enumerate(self.intervals):
            at = time_s % period
            mask[client] = bool(((starts <= at) & (at <= ends)).any())
        return mask

    def online_left_s(self, round: int, time_s: float) -> np.ndarray:
        """Until the end of the interval it is in (an interval that runs into the next period's first one counts
        as ending with the period)."""
        left = np.zeros(len(self.intervals))
        for client, (starts, ends, period) in enumerate(self.intervals):
            at = time_s % period
            inside = (starts <= at) & (at <= ends)
            if inside.any():
                left[client] = float((ends[inside] - at).max())
        return left


def make_availability(config: SystemConfig, count: int, seed: int) -> Availability:
    """The pattern `config.availability` names, for `count` clients."""
    kind = config.availability
    if kind == "share":
        return FixedShare(config.online_share, count, seed)
    if kind == "periods":
        return Periods(config.online_s, config.offline_s, count, seed)
    if kind == "diurnal":
        return Diurnal(config.online_hours, config.start_hour, count, seed)
    if kind == "trace":
        assert config.availability_trace is not None  # SystemConfig requires the file for "trace"
        return Trace(config.availability_trace, count)
    return Always(count)
