"""What a client's local work sends to the server, entry by entry, so that every round extension (DP, FedBuff, ...)
decides what it can do with it from the message itself, never from an algorithm's word about the extension.

A client's message is its trained model (the `Updates` row every extension already sees), its training loss and
logs, and the entries its local work returns beside them (`Trained.state`). An entry returned under the name of a
client-state store (`server.state.declare`) is the client's own: the engine writes it into the client's row (Ditto's
personal model, APFL's alpha) and it goes no further. Every other entry leaves the client, and the algorithm's `setup`
says what it is (`server.message.sends(name, kind)`), one of:

- `MODEL`: a model on the parameter space beside the trained one, or a part of it (StoCFL's trained copy of the global
  model, FedEM's copies of every component, how many of a centroid model's centers are real); it is combined through
  the run's cluster aggregator, like the trained model, and, when the algorithm says which server models it was
  trained from (`trained_from`), an update attack tampers with it as with the trained model;
- `SUMMED`: a statistic the server sums over clients (label counts, prototypes, feature moments);
- `PER_CLIENT`: a value the server reads client by client (a query gradient, a loss for an assignment);
- `ROUTING`: which of the server's models the update is for, as the server chose it when it sent the client out
  (FedEM's component a client started from, FedSoft's centers that drew it): nothing of the client's data, and it
  travels with the update so that one arriving rounds later is still routed as it was sent.

A store's entry the server also reads as sent is declared as well (FedRC's label mass: kept per client and summed).
An entry that is neither a store nor declared stops the run at the first client that returns it, in one line naming
it (`check_returned`), so nothing leaves a client unseen by the extensions. Extensions read the schema once the
algorithm is set up (`RoundExtension.check_message`) and refuse in one line what they cannot handle.

A round may also need every client's message at once (SR-FCA's one-shot round clusters every client's model; FL+HC's
clustering round): `needs_every_client` records it (`ServerContext.cohort.needs_every_client` does), so that an
asynchronous server, which aggregates the first arrivals, can refuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import Tensor

from fedlight.plugin.choices import unknown_choice

MODEL, SUMMED, PER_CLIENT, ROUTING = "model", "summed", "per_client", "routing"
#: each kind, as a refusal names it
KINDS = {
    MODEL: "a model beside the trained one",
    SUMMED: "a statistic summed over clients",
    PER_CLIENT: "a value the server reads client by client",
    ROUTING: "the server's own routing of the update",
}


class MessageSchema:
    """The entries a client's message carries beside its trained model, by name and kind, and the rounds that need
    every client's message.

    Args:
        stores: the run's client-state stores by name (`ClientStates.stores`): an entry returned under one of these
            names is the client's own, kept in its row.
    """

    def __init__(self, stores: Mapping[str, Any]) -> None:
        self.stores = stores
        self.entries: dict[str, str] = {}
        self.trained_from: dict[str, Callable[[list[int]], Tensor]] = {}  # a model entry's starts, by name
        self.every_client: list[str] = []  # when a round needs every client's message ("in its one-shot round ...")

    def sends(self, name: str, kind: str, trained_from: Callable[[list[int]], Tensor] | None = None) -> None:
        """Say, in an algorithm's `setup`, that its clients send `name` (a key of `Trained.state`) of `kind`
        (`MODEL`, `SUMMED`, `PER_CLIENT` or `ROUTING`). A `MODEL` entry trained from server models gives
        `trained_from(clients)`: the models each row was trained from, shaped as the entry's rows (StoCFL: the
        global model for each client), so that an update attack acts on it as on the trained model."""
        if kind not in KINDS:
            raise unknown_choice("the kind of a message entry", kind, tuple(KINDS))
        if trained_from is not None and kind != MODEL:
            raise ValueError(
                f"message entry {name!r}: only a model entry is trained from server models, not one of kind {kind!r}"
            )
        self.entries[name] = kind
        if trained_from is not None:
            self.trained_from[name] = trained_from

    def needs_every_client(self, when: str) -> None:
        """Say that a round's aggregation needs every client's message at once, `when` (e.g. "in its one-shot
        round (round 1)")."""
        self.every_client.append(when)

    def of_kind(self, *kinds: str) -> list[str]:
        """The declared entries of `kinds`, sorted."""
        return sorted(name for name, kind in self.entries.items() if kind in kinds)

    def check_returned(self, algorithm: str, names: Iterable[str]) -> None:
        """Stop, in one line, at an entry a client returned that is neither a client-state store nor declared."""
        for name in names:
            if name not in self.stores and name not in self.entries:
                raise ValueError(
                    f"{algorithm}'s clients return {name!r} beside their models, which is neither a "
                    "client-state store nor declared: say what it is in setup, "
                    f"server.message.sends({name!r}, kind) with kind one of {', '.join(KINDS)} "
                    "(fedlight.plugin.message), or store it with server.state.declare"
                )

    def describe(self, name: str) -> str:
        """An entry as a refusal names it: "'global_copy' (a model beside the trained one)"."""
        return f"{name!r} ({KINDS[self.entries[name]]})"
