"""The `system:` section of a run config: the clients' devices (how fast they compute and send), when they are
online, the round's deadline and dropouts, and how the server picks its clients (docs/architecture.md, "System
model"). Leave the section out for none: every client always online, finishing its work, picked uniformly."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedlight.plugin.choices import unknown_choice

SPEED_KINDS = ("constant", "lognormal", "slow_share")
AVAILABILITY = ("always", "share", "periods", "diurnal", "trace")
SELECTIONS = ("uniform", "data_size", "power_of_choice", "oort", "cluster_stratified")
STALENESS = ("polynomial", "constant")


@dataclass
class SpeedDistribution:
    """How one speed of every client is drawn, each client's from a stream of (seed, client) of its own.

    Args:
        median: a typical client's speed (every client's under "constant").
        kind: "constant"; "lognormal": median x exp(sigma z), z standard normal (FedScale's and Papaya's model of
            device speed); "slow_share": a `slow_share` of the clients, drawn at random, `slow_factor` times slower
            than the median, the others at the median (PFLlib's slow clients, FL-bench's straggler ratio).
        sigma: the standard deviation of the log speed ("lognormal").
        slow_share: the share of slow clients, rounded to the nearest count ("slow_share").
        slow_factor: how many times slower a slow client is ("slow_share").
    """

    median: float = 1.0
    kind: str = "constant"
    sigma: float = 0.5
    slow_share: float = 0.0
    slow_factor: float = 1.0

    def check(self, setting: str) -> None:
        """Refuse, in one line naming `setting`, a speed that is not a positive number of clients' kind."""
        if self.kind not in SPEED_KINDS:
            raise unknown_choice(f"{setting}.kind", self.kind, SPEED_KINDS)
        if not self.median > 0:
            raise ValueError(f"{setting}.median must be above 0, got {self.median}")
        if self.sigma < 0:
            raise ValueError(f"{setting}.sigma must be 0 or more, got {self.sigma}")
        if not 0 <= self.slow_share <= 1 or self.slow_factor < 1:
            raise ValueError(
                f"{setting}.slow_share must be in [0, 1] and {setting}.slow_factor at least 1, got "
                f"{self.slow_share} and {self.slow_factor}"
            )

    def describe(self, unit: str) -> str:
        """The start line's note of this speed in `unit`: its median, and the spread or the slow share it has."""
        if self.kind == "lognormal":
            return f"lognormal median {self.median:g} {unit} (sigma {self.sigma:g})"
        if self.kind == "slow_share" and self.slow_share:
            return f"{self.median:g} {unit}, {self.slow_share:.0%} of clients {self.slow_factor:g}x slower"
        return f"{self.median:g} {unit}"


@dataclass
class SystemConfig:
    """The clients' devices and the server's picks (the `system:` section; leave it out for none).

    Args:
        compute: training samples a client processes per second (forward and backward), drawn per client.
        link: a client's link speed in Mbit/s, both ways, drawn per client.
        device_trace: a file of every client's speeds instead of `compute` and `link` (docs/architecture.md,
            "System model": fedlight's `samples_per_s` and `link_mbps`, or FedScale's device profiles,
            `computation` in ms per sample and `communication` in kbit/s).
        availability: when clients are online: "always"; "share" (each round a random `online_share` of them);
            "periods" (each client `online_s` on, `offline_s` off, from a random phase, on the virtual clock);
            "diurnal" (each client in a random time zone, online while its local hour is within `online_hours`);
            "trace" (`availability_trace`: each client's online intervals, FedScale's behaviour trace).
        online_share: the share of clients online in each round ("share"), rounded up to a count.
        online_s, offline_s: a client's online and offline periods in virtual seconds ("periods").
        online_hours: [from, to): the local hours a client is online ("diurnal"; from > to wraps midnight: the
            default is 22:00 to 06:00, idle and charging, as deployed federations schedule training).
        start_hour: the UTC hour at virtual time 0 ("diurnal").
        availability_trace: the file of "trace".
        deadline_s: a round's deadline in virtual seconds: a client whose local work and transfers take longer is
            dropped, or with `partial_work` sends the local steps it finished.
        deadline_percentile: instead, the deadline is this percentile (0, 100] of the selected clients' times.
        partial_work: a client past the deadline sends the steps it finished (FedProx's partial work) instead of
            being dropped; one that finishes no step is dropped.
        dropout: the share of each round's selected clients, rounded down to a count, that drop out mid-round
            at random and send nothing.
        selection: how the server picks a round's clients among the available ones: "uniform", "data_size"
            (proportional to training-set size), "power_of_choice" (Cho et al.), "oort" (Lai et al.'s utility),
            "cluster_stratified" (each cluster of the algorithm's assignment its share of the cohort).
        size_weighted_mean: with "data_size" selection, keep weighting the selected clients' updates by their
            training-set sizes. False (the default): they are averaged plainly, as Li et al.'s analysis of FedProx
            (scheme I) and Cho et al. average after sampling by size: sampling by size and weighting by size again
            would count a large client twice (its expected weight grows with the square of its size).
        candidates: d, the candidates "power_of_choice" and "oort" score (None: twice the cohort).
        oort_alpha: alpha, the exponent of Oort's penalty (T / t)^alpha on a client slower than T.
        preferred_round_s: Oort's T, the preferred round duration (None: `deadline_s`, else the candidates' median
            time).
        wait_s: when no client is online, the server looks again after this many virtual seconds.
        buffer_size: K, asynchronous buffered aggregation (FedBuff, `fedlight.system.buffered`): the server updates
            every K arrivals (a round is one update) and then dispatches new clients; None: synchronous rounds.
        concurrency: C, the clients training at once under `buffer_size` (None: the cohort, clients_per_round).
        staleness: the weight of an update trained from a model tau updates old: "polynomial", 1 / sqrt(1 + tau)
            (FedBuff's choice), or "constant", 1.
    """

    compute: SpeedDistribution = field(default_factory=lambda: SpeedDistribution(median=100.0))
    link: SpeedDistribution = field(default_factory=lambda: SpeedDistribution(median=10.0))
    device_trace: str | None = None
    availability: str = "always"
    online_share: float = 1.0
    online_s: float = 3600.0
    offline_s: float = 3600.0
    online_hours: tuple[float, float] = (22.0, 6.0)
    start_hour: float = 0.0
    availability_trace: str | None = None
    deadline_s: float | None = None
    deadline_percentile: float | None = None
    partial_work: bool = False
    dropout: float = 0.0
    selection: str = "uniform"
    size_weighted_mean: bool = False
    candidates: int | None = None
    oort_alpha: float = 2.0
    preferred_round_s: float | None = None
    wait_s: float = 60.0
    buffer_size: int | None = None
    concurrency: int | None = None
    staleness: str = "polynomial"

    def __post_init__(self) -> None:
        self.compute.check("system.compute")
        self.link.check("system.link")
        if self.availability not in AVAILABILITY:
            raise unknown_choice("system.availability", self.availability, AVAILABILITY)
        if self.selection not in SELECTIONS:
            raise unknown_choice("system.selection", self.selection, SELECTIONS)
        if self.availability == "share" and not 0 < self.online_share <= 1:
            raise ValueError(
                f"system.online_share is {self.online_share}: no client would ever be online; give a share in (0, 1]"
            )
        if self.availability == "periods" and not (self.online_s > 0 and self.offline_s >= 0):
            raise ValueError(
                f"system.online_s is {self.online_s} and system.offline_s {self.offline_s}: give an "
                "online period above 0 s and an offline one of 0 s or more"
            )
        start, end = self.online_hours
        if self.availability == "diurnal" and (start % 24 == end % 24 or not (0 <= start <= 24 and 0 <= end <= 24)):
            raise ValueError(
                f"system.online_hours is [{start}, {end}], an empty window: give two different hours in "
                "[0, 24] ([22, 6] wraps midnight)"
            )
        if self.availability == "trace" and not self.availability_trace:
            raise ValueError("system.availability is 'trace' without a file: give system.availability_trace")
        if self.deadline_s is not None and self.deadline_percentile is not None:
            raise ValueError("system.deadline_s and system.deadline_percentile both set the deadline: give one")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"system.deadline_s must be above 0 virtual seconds, got {self.deadline_s}")
        if self.deadline_percentile is not None and not 0 < self.deadline_percentile <= 100:
            raise ValueError(f"system.deadline_percentile must be in (0, 100], got {self.deadline_percentile}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"system.dropout must be in [0, 1) (a share of each round's clients), got {self.dropout}")
        if self.candidates is not None and self.candidates < 1:
            raise ValueError(f"system.candidates must be at least 1 (or null: twice the cohort), got {self.candidates}")
        if self.oort_alpha < 0 or (self.preferred_round_s is not None and not self.preferred_round_s > 0):
            raise ValueError(
                f"system.oort_alpha must be 0 or more and system.preferred_round_s above 0, got "
                f"{self.oort_alpha} and {self.preferred_round_s}"
            )
        if not self.wait_s > 0:
            raise ValueError(f"system.wait_s must be above 0 virtual seconds, got {self.wait_s}")
        self.check_buffer()

    def check_buffer(self) -> None:
        """Refuse in one line a buffer (FedBuff) of no clients, larger than the clients in flight, or beside a
        synchronous round's deadline or dropouts."""
        if self.staleness not in STALENESS:
            raise unknown_choice("system.staleness", self.staleness, STALENESS)
        if self.buffer_size is None:
            if self.concurrency is not None:
                raise ValueError(
                    "system.concurrency is for asynchronous rounds: give system.buffer_size too (or "
                    "leave concurrency out)"
                )
            return
        if self.buffer_size < 1 or (self.concurrency is not None and self.concurrency < 1):
            raise ValueError(
                f"system.buffer_size and system.concurrency must be at least 1, got {self.buffer_size} "
                f"and {self.concurrency}"
            )
        if self.concurrency is not None and self.buffer_size > self.concurrency:
            raise ValueError(
                f"system.buffer_size ({self.buffer_size}) is above system.concurrency "
                f"({self.concurrency}): the server would wait for more arrivals than clients train; give "
                "a buffer of at most the concurrency"
            )
        synchronous = [
            name
            for name, on in (
                ("deadline_s", self.deadline_s is not None),
                ("deadline_percentile", self.deadline_percentile is not None),
                ("partial_work", self.partial_work),
                ("dropout", self.dropout > 0),
            )
            if on
        ]
        if synchronous:
            raise ValueError(
                f"system.{synchronous[0]} shapes a synchronous round, which system.buffer_size "
                "(asynchronous rounds) has none of: leave one of the two out"
            )

    @property
    def deadline(self) -> str | None:
        """The deadline as the start line says it, or None."""
        if self.deadline_s is None and self.deadline_percentile is None:
            return None
        at = f"{self.deadline_s:g} s" if self.deadline_s is not None else f"p{self.deadline_percentile:g} of the times"
        return f"deadline {at} ({'partial work' if self.partial_work else 'stragglers dropped'})"
