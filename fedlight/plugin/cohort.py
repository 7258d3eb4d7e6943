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
            raise ValueError(f"federation.clients_per_round is {count}, more than the {self.num_clients:,} clients: "
                             f"give at most {self.num_clients}")
        if self.participation != 1.0:
            raise ValueError(f"federation.clients_per_round ({count}) and algorithm.init_args.participation "
                             f"({self.participation}) both set the clients of a round: give one of the two")

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
            raise ValueError(f"{algorithm}.select_clients chose {selected} clients in round {round}, but "
                             f"federation.clients_per_round is {count}: select through the base class "
                             f"(super().select_clients) or leave clients_per_round out")


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
