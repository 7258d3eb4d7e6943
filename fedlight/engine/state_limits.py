"""Whether a run's per-client state (`fedlight.plugin.client_state`) fits where it must, checked before it runs out.

Memory. Rows beyond `federation.client_state_memory` spill to a file, so no number of clients overflows the budget
by itself; what cannot spill is the round's own rows. A round reads its clients' rows of every store onto the device
(Ditto's personal models to train from, SCAFFOLD's control variates, APFL's local models and alphas together), and
the rows they return are gathered whole over the processes before they are written: one round's rows are on the
device at once, wherever they are stored. A budget below that is a limit the run breaks every round, so it is
refused (`check_round_fits`): at set-up, once the algorithm has declared its stores, with the clients a round
(`federation.clients_per_round` or the share), and again in every round with the clients actually selected (a
store declared later, a round that selects every client). Where the stores keep their rows is no part of it.

Disk. The rows beyond the budget go to the spill files in the run folder's `client_state/`. A run writes rows only
for the clients it trains, at most min(clients, clients a round x rounds) of them, so at most that many rows times
the bytes a client takes over the stores, less the budget, per process (each keeps its own files), less what the
files already hold (a resumed run). A run that needs more than the folder's disk has free is refused at set-up
(`disk_shortfall`); a disk that fills up later (other writers, a store written for clients beyond the round's) is
`fedlight.engine.spill.ClientStateDiskFull` at the write that finds it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from fedlight.engine.client_states import ClientStates


def client_bytes(states: ClientStates) -> int:
    """Bytes one client's rows take over all of the run's stores."""
    return sum(store.row_bytes for store in states.stores.values())


def gigabytes_at_least(size: int) -> str:
    """`size` bytes as GB rounded up to whole MB, so a setting of at least this many GB holds them."""
    return f"{math.ceil(size / 1e6) / 1e3:g}"


def stores_of(states: ClientStates) -> str:
    """'personal 1,160' or 'local 1,160 + alpha 4': the bytes a client takes in each store."""
    return " + ".join(f"{name} {store.row_bytes:,}" for name, store in states.stores.items())


def check_round_fits(states: ClientStates, clients: int, round: int | None = None) -> None:
    """Refuse in one line a memory budget below the rows of `clients` clients over every store, which a round holds
    on the device at once (`round`: the round that selected them; None at set-up, with the clients a round)."""
    need, limit = client_bytes(states) * clients, states.budget.limit
    if need <= limit:
        return
    whose = f"round {round}'s {clients:,} clients" if round is not None else f"{clients:,} clients a round"
    raise ValueError(
        f"federation.client_state_memory is {limit / 1e9:.3g} GB ({limit:,} bytes), below the client "
        f"state one round holds on the device at once: {client_bytes(states):,} bytes a client "
        f"({stores_of(states)}) x {whose} = {need:,} bytes; raise federation.client_state_memory to "
        f"at least {gigabytes_at_least(need)} GB, or train fewer clients a round "
        "(federation.clients_per_round, the algorithm's participation)"
    )


def free_bytes(folder: Path) -> int:
    """Bytes free to this user on the disk `folder` is on (or will be: its nearest ancestor that exists, as a run
    folder not made yet is on its parent's disk)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def disk_shortfall(
    states: ClientStates, num_clients: int, per_round: int, rounds: int, processes: int = 1
) -> str | None:
    """The one-line reason why the rows a run may spill cannot fit on the disk of the spill files' folder, or None:
    min(num_clients, per_round x rounds) clients' rows over every store, less the memory budget, for each of
    `processes` processes, less what this process's files already hold (for each), against the free space."""
    if not states.stores:
        return None
    clients = min(num_clients, per_round * rounds)
    per_process = max(0, clients * client_bytes(states) - states.budget.limit)
    held = sum(path.stat().st_blocks * 512 for path in states.spill_files())
    need = processes * max(0, per_process - held)
    folder = states.spill_location
    free = free_bytes(folder)
    if need <= free:
        return None
    parts = [
        f"{client_bytes(states):,} bytes a client ({stores_of(states)}) x {clients:,} clients "
        f"({per_round:,} a round x {rounds:,} rounds, of {num_clients:,}) less federation.client_state_memory's "
        f"{states.budget.limit:,}"
    ]
    if held:
        parts.append(f"less {held:,} its files hold")
    if processes > 1:
        parts.append(f"x {processes} processes")
    return (
        f"the client state may spill {need / 1e9:.3g} GB ({need:,} bytes: {', '.join(parts)}) to {folder}, "
        f"whose disk has {free / 1e9:.3g} GB free: free {gigabytes_at_least(need - free)} GB there, keep the run "
        "folder on a larger disk, or raise federation.client_state_memory"
    )
