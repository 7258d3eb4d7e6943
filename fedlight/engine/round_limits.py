"""Whether a round that holds every update fits in memory, checked at set-up rather than found out by a failed
allocation hours in.

A method that compares the round's updates (OCFL, CFL, FLIS, a Byzantine-robust rule) holds them all at once: the
clients' trained models and their starts, two (clients, parameters) matrices on the device. With the cohort of a
cross-device run that is small; with every client of a large federation each round it is not (3,400 clients of a
6.6M-parameter CNN: 180 GB). A round that cannot fit in what the device has free is refused in one line, with the
numbers and the settings that shrink it.
"""

from __future__ import annotations

from fedlight.engine.state_limits import gigabytes_at_least

HELD_MATRICES = 2  # the trained models and their starts, each (clients, parameters)


def check_held_round_fits(method: str, clients: int, parameters: int, element_bytes: int, free: int | None) -> None:
    """Refuse a held round of `clients` x `parameters` values (`element_bytes` each, `HELD_MATRICES` matrices) larger
    than `free` bytes (None: unknown, not checked)."""
    need = HELD_MATRICES * clients * parameters * element_bytes
    if free is None or need <= free:
        return
    raise ValueError(
        f"{method} holds every update of a round: {HELD_MATRICES} x {clients:,} clients x "
        f"{parameters:,} parameters x {element_bytes} bytes = {gigabytes_at_least(need)} GB, more than "
        f"the {free / 1e9:.3g} GB free on this device; train fewer clients a round "
        "(federation.clients_per_round, the algorithm's participation) or use a smaller model"
    )
