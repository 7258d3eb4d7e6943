"""How many clients train a round: the cohort.

Two ways to say it, one at a time: a share of the clients (`participation`, an argument of every algorithm, the
cross-silo habit: 0.1 of 100 clients) or an exact count (`federation.clients_per_round`, the cross-device habit:
10 of 3,400 writers a round, as LEAF's FEMNIST runs). The count is the federation's, not the algorithm's: it
describes the clients a round can reach, whatever method runs, so one `federation:` section serves a sweep over
algorithms, and every algorithm's `select_clients` honours it, a user's plugin included, without forwarding a new
argument through 27 constructors. The engine checks after every selection that the count was kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from fedlight.plugin.message import MessageSchema

#: a share times the clients is rounded to this many decimals before its ceiling is taken, so float error in a share
#: written as a decimal (0.07 x 100 = 7.000000000000001) never adds a client
SHARE_DECIMALS = 9


def share_count(participation: float, num_clients: int) -> int:
    """The clients a `participation` share of `num_clients` selects: the ceiling of the product, at least one."""
    return max(1, math.ceil(round(participation * num_clients, SHARE_DECIMALS)))


@dataclass(frozen=True)
class Cohort:
    """The clients of a round: `clients_per_round` of `num_clients` when the federation gives a count, else the
    algorithm's `participation` share. Built at set-up, where a count that cannot be kept is refused in one line (a
    count below 1 is refused earlier, by `FederationConfig`)."""

    num_clients: int
    participation: float = 1.0
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        count = self.clients_per_round
        if count is None:
            return
        if count > self.num_clients:
            raise ValueError(
                f"federation.clients_per_round is {count}, more than the {self.num_clients:,} clients: "
                f"give at most {self.num_clients}"
            )
        if self.participation != 1.0:
            raise ValueError(
                f"federation.clients_per_round ({count}) and algorithm.init_args.participation "
                f"({self.participation}) both set the clients of a round: give one of the two"
            )

    @property
    def size(self) -> int:
        """Clients selected every round."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        return share_count(self.participation, self.num_clients)

    def describe(self) -> str:
        """For the start line: '10 of 3,400 clients a round', or '3,400 clients' when every client trains."""
        if self.size == self.num_clients:
            return f"{self.num_clients:,} clients"
        return f"{self.size:,} of {self.num_clients:,} clients a round"

    def check_selected(self, algorithm: str, round: int, selected: int, drawn: list[int] | None = None) -> None:
        """Refuse a round whose selection broke a configured count (an override of `select_clients`); `drawn`: the
        clients the run's draw gave in the round (`ServerContext.drawn`), fewer when fewer were available."""
        count = self.clients_per_round
        if count is not None and selected != count and (drawn is None or selected != len(drawn)):
            raise ValueError(
                f"{algorithm}.select_clients chose {selected} clients in round {round}, but "
                f"federation.clients_per_round is {count}: select through the base class "
                f"(super().select_clients) or leave clients_per_round out"
            )


@dataclass(frozen=True)
class Sampling:
    """How a run chooses the clients whose updates a round aggregates, as client-level DP's accountant must know it
    (`fedlight.aggregators.privacy`): amplification by sampling holds only for a uniform sample of the clients drawn
    independently of their data.

    Attributes:
        uniform: each round's cohort is a uniform draw from every client (or every client), whatever their data.
        why: how the clients are chosen when they are not (the start line and summary.json say it).
        reads_data: the values of the clients' data the choice reads and so releases (a loss-driven selection's
            losses), which DP does not noise; None when it reads none.
    """

    uniform: bool = True
    why: str = ""
    reads_data: str | None = None


class CohortDraw:
    """How the run draws a round's clients, and what an algorithm declares it does on every client instead
    (`server.cohort`).

    Attributes:
        clients_per_round: the exact count of clients every round trains (`federation.clients_per_round`), or None:
            the algorithm's `participation` share.
        every_client_work: what the algorithm declared it does on every client rather than on the round's
            (`needs_every_client`, `declare_every_client_work`), for the run's start line and summary.json's plan.
    """

    def __init__(
        self,
        num_clients: int,
        clients_per_round: int | None,
        rng: Callable[[int, str], np.random.Generator],
        message: "MessageSchema",
    ) -> None:
        self.num_clients, self.clients_per_round = num_clients, clients_per_round
        self._rng, self._message = rng, message
        self.every_client_work: list[str] = []
        self._draw: Callable[[int, int], list[int] | None] = lambda round, count: None
        self._drawn: tuple[int, list[int]] | None = None  # (round, clients) of the last draw

    def bind(self, draw: Callable[[int, int], list[int] | None]) -> None:
        """The engine's draw of a round's clients (`draw(round, count)`: the round extensions' `select`, a system
        model's), which `draw` asks first (None: the uniform draw)."""
        self._draw = draw

    def draw(self, round: int, count: int) -> list[int]:
        """The round's `count` clients as the run draws them, sorted: uniformly without replacement from a (seed,
        round) stream, or, with a `system:` section, from the clients available in the round by `system.selection`
        (all of them when fewer than `count` are available). The base class's `select_clients` is this draw."""
        drawn = self._draw(round, count)
        if drawn is None:
            n = self.num_clients
            drawn = (
                list(range(n))
                if count == n
                else sorted(self._rng(round, "select").choice(n, size=count, replace=False).tolist())
            )
        self._drawn = (round, list(drawn))
        return drawn

    def drawn(self, round: int) -> list[int] | None:
        """The clients `draw` drew in `round` (fewer than asked when fewer were available), or None when it drew none
        in that round."""
        return list(self._drawn[1]) if self._drawn is not None and self._drawn[0] == round else None

    def needs_every_client(self, method: str, when: str, instead: str | None = None, in_a_round: bool = True) -> None:
        """Refuse, in an algorithm's `setup`, a `clients_per_round` below the clients for a method that trains every
        client `when` (FL+HC's clustering round, FeSEM's seeding round): that round would break the count. `instead`
        names the method's own setting that avoids the work, offered beside leaving the count out (pFedMe's
        `algorithm.init_args.train_every_client: false`). Otherwise the work is declared
        (`declare_every_client_work`), and, `in_a_round` (not before round 1), so is that a round's aggregation needs
        every client's message (`MessageSchema.needs_every_client`)."""
        count = self.clients_per_round
        if count is not None and count < self.num_clients:
            other = f", or set {instead}" if instead else ""
            raise ValueError(
                f"{method} trains every client {when}, but federation.clients_per_round allows "
                f"{count} of {self.num_clients:,}: leave clients_per_round out for {method}{other}"
            )
        self.declare_every_client_work(f"trains every client {when}")
        if in_a_round:
            self._message.needs_every_client(when)

    def declare_every_client_work(self, what: str) -> None:
        """Say, in an algorithm's `setup`, what it does on every client rather than on the round's cohort, because
        its paper does (`what`, e.g. "every client picks its cluster by loss in each evaluated round"): the run's
        start line and summary.json's plan name it, so the cost of a cross-device run (10 of 3,400 clients a round)
        that grows with all clients is announced, not found out."""
        self.every_client_work.append(what)
