"""Round checkpoints: written atomically, the last two kept, read without running any code.

`save` writes the new checkpoint beside the old ones and renames it into place, so a crash at any moment leaves
an intact checkpoint: `last.ckpt`, or `previous.ckpt` when the crash fell between the two renames. `load` reads
with `torch.load(weights_only=True)`, which refuses anything but tensors and plain containers, and a file that
cannot be read stops the resume with one line naming it and the previous good checkpoint.

Every checkpoint carries `format_version` (`FORMAT_VERSION`; one without it is version 1). `load` refuses a
version newer than this code reads, and `upgrade` brings an older one to the current format, one step a version
(`UPGRADES`), before the run takes its state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from fedlight.engine.client_states import memory_rows_state
from fedlight.plugin.personal_part import store_name
from fedlight.run.callback_keys import key_class, state_keys, v1_keys

LAST, PREVIOUS = "last.ckpt", "previous.ckpt"
#: the format `save` writes: 1 kept the callbacks' states by class name and position, 2 by class and arguments, 3
#: keeps each round extension's state under its name (DP's under `privacy`, not `aggregation`), 4 per-client rows
#: in the federation's `client_state`, 5 the base class's personal part there too, 6 the runner's evaluated rounds
FORMAT_VERSION = 6
TOTALS = "fedlight.run.runner.Totals"  # the class of the runner's callback whose state version 6 changed


class CheckpointError(ValueError):
    """A checkpoint that is missing or cannot be read; the message says which file and what to do."""


def save(state: dict[str, Any], folder: Path) -> Path:
    """Write `state` as `folder/last.ckpt`, keeping the one it replaces as `folder/previous.ckpt`."""
    folder.mkdir(parents=True, exist_ok=True)
    last, tmp = folder / LAST, folder / (LAST + ".tmp")
    torch.save({**state, "format_version": FORMAT_VERSION}, tmp)
    if last.exists():
        os.replace(last, folder / PREVIOUS)
    os.replace(tmp, last)
    return last


def exists(folder: Path) -> bool:
    """Whether a run folder's checkpoint folder holds any checkpoint."""
    return (folder / LAST).is_file() or (folder / PREVIOUS).is_file()


def read(path: Path) -> dict[str, Any]:
    """One checkpoint file, tensors on the CPU; never unpickles code."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load(folder: Path) -> dict[str, Any]:
    """The newest intact checkpoint of a run: `last.ckpt`, or `previous.ckpt` when a crash fell between renaming
    the two. A file that exists but cannot be read is an error naming it and the previous checkpoint."""
    last, previous = folder / LAST, folder / PREVIOUS
    if not last.is_file():
        if previous.is_file():
            return _readable(read(previous), previous)
        raise CheckpointError(
            f"no checkpoint at {last}: --resume needs a run folder whose checkpoints/ holds "
            f"{LAST} (written after each round)"
        )
    try:
        state = read(last)
    except Exception as error:  # truncated, corrupt, or holding code: all mean "do not trust this file"
        fallback = _describe(previous)
        raise CheckpointError(
            f"checkpoint {last} cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:120]}); {fallback}"
        ) from None
    return _readable(state, last)


def format_version(state: dict[str, Any]) -> Any:
    """The format a checkpoint was written in (1 for one written before checkpoints carried it)."""
    return state.get("format_version", 1)


def upgrade(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """`state` in the current format: every step from its version on applied in turn. `callbacks` are the run's
    (a step may need them: version 1 named their states by position)."""
    while (version := format_version(state)) < FORMAT_VERSION:
        state = {**UPGRADES[version](state, callbacks), "format_version": version + 1}
    return state


def _callback_keys_by_class_and_arguments(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """Version 1 -> 2: a callback's state under its class and arguments instead of its class name and place among
    the callbacks of that name; taken as format 1 took it, from the callback in that place in this run (a state
    whose callback the run no longer has is dropped, as format 1 dropped it)."""
    new_key = dict(zip(v1_keys(callbacks), state_keys(callbacks)))
    return {**state, "callbacks": {new_key[key]: value for key, value in state["callbacks"].items() if key in new_key}}


def _privacy_state_under_its_name(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """Version 2 -> 3: the DP accountant's history and clip, which version 2 kept under the federation's
    `aggregation` (None without DP), under `privacy`, the name of the round extension that holds them now."""
    federation = dict(state["federation"])
    privacy = federation.pop("aggregation", None)
    return {**state, "federation": {**federation, **({"privacy": privacy} if privacy is not None else {})}}


def _client_state_kept_by_the_engine(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """Version 3 -> 4: per-client rows (personal models, control variates) moved from the algorithm's state to the
    federation's `client_state` (`fedlight.plugin.client_state`). A version-3 checkpoint has none: it resumes an
    algorithm that declares no client state, and one that declares some is refused in one line."""
    return state


def _personal_part_kept_by_the_engine(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """Version 4 -> 5: the base class's personal part, which version 4 kept in the algorithm's state as a dense
    (clients x p) `personal`, is the client state `personal_part.1` (`fedlight.plugin.personal_part`), every
    client's row stored; the algorithm keeps the mask and, for clients never written, start rows (none is one:
    every client has a row)."""
    federation = state.get("federation", {})
    algorithm = federation.get("algorithm")
    if not isinstance(algorithm, dict) or "personal" not in algorithm:
        return state
    algorithm = dict(algorithm)
    personal = algorithm.pop("personal")
    algorithm.update(personal_start=None, personal_start_group=None, personal_generation=torch.tensor(0))
    if personal is None:
        return {**state, "federation": {**federation, "algorithm": algorithm}}
    clients = len(personal)
    algorithm.update(
        personal_start=personal.new_zeros(1, personal.shape[1]),
        personal_start_group=torch.zeros(clients, dtype=torch.long),
        personal_generation=torch.tensor(1),
    )
    client_state = {
        **(federation.get("client_state") or {}),
        store_name(1): memory_rows_state(torch.arange(clients), personal),
    }
    return {**state, "federation": {**federation, "algorithm": algorithm, "client_state": client_state}}


def _evaluated_rounds_kept(state: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """Version 5 -> 6: the runner's `Totals` keep what choosing a round needs of every evaluated round
    (`evaluated`, `fedlight.reports.selection`) instead of the best round alone (`best`); rebuilt from the two rounds
    version 5 kept, the best and the last, so the last and the best-over-rounds numbers stay right (the best
    round's worst client is not known). Version 5 measured no validation split beside the evaluated one, so the
    resumed run has no validation-selected round."""
    states = dict(state.get("callbacks") or {})
    for key, totals in states.items():
        if key_class(key) == TOTALS and "evaluated" not in totals:
            totals = dict(totals)
            best, last = totals.pop("best", {}), totals.get("last_eval", {})
            rows = {int(row["round"]): row for row in (best, last) if "round" in row}
            totals["evaluated"] = [rows[r] for r in sorted(rows)]
            states[key] = totals
    return {**state, "callbacks": states}


#: version -> the step that upgrades a checkpoint of that version to the next one
UPGRADES: dict[int, Callable[[dict[str, Any], list[Any]], dict[str, Any]]] = {
    1: _callback_keys_by_class_and_arguments,
    2: _privacy_state_under_its_name,
    3: _client_state_kept_by_the_engine,
    4: _personal_part_kept_by_the_engine,
    5: _evaluated_rounds_kept,
}


def _readable(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """`state` when this code reads its format; else one line naming both versions and what to do."""
    version = format_version(state)
    whole = isinstance(version, int) and not isinstance(version, bool)
    if whole and version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version}, newer than this fedlight reads "
            f"(up to {FORMAT_VERSION}): upgrade fedlight to resume the run"
        )
    if not whole or (version != FORMAT_VERSION and version not in UPGRADES):
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}, which this fedlight (format "
            f"{FORMAT_VERSION}) cannot read: resume it with the fedlight that wrote it, or start "
            "the run again"
        )
    return state


def _describe(previous: Path) -> str:
    if not previous.is_file():
        return "there is no previous checkpoint to fall back to: start the run again"
    try:
        round = read(previous)["federation"]["round"]
    except Exception:
        return f"the previous checkpoint {previous} cannot be read either: start the run again"
    return (
        f"the previous checkpoint {previous} (round {round}) is intact: move it to {previous.parent / LAST} "
        "and resume again"
    )
