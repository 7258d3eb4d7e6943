"""A round after which the run cannot go on: the server model is not finite, or every client of the round that sent
an update was left out (its trained model, loss or returned state was not finite). Going on would only leave out
every client of every later round, so the run stops in that round, before anything records or checkpoints it
(`watched_round`, around the round's aggregation hooks: a hook that fails on a round with no update left is reported
as this, not as its own error).

The check reads the server state in its general form (`Algorithm.models`), so it names no algorithm; the likely
cause it gives is read from the run's aggregation and round extensions' notes. The clients' personal rows
(`Algorithm.personal`, a client state) need no check: they are written from the round's finite updates only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import Tensor

from fedlight.plugin.round_updates import RoundUpdates, finite_rows
from fedlight.engine.run_errors import RoundDiverged

ROBUST_RULES = "median, trimmed_mean, krum, ..."  # what the hint offers (fedlight.aggregators.robust has them all)


def server_model_finite(algorithm: Any) -> bool:
    """Whether every entry of the cluster models is finite (the shared part of the models the clients of the next
    round start from; their personal rows come from finite updates)."""
    models = getattr(algorithm, "models", None)
    return not isinstance(models, Tensor) or not models.numel() or bool(finite_rows(models).all())


def likely_cause(notes: list[str], plain_mean: bool) -> str:
    """What most likely made the training diverge, and the fix: with round extensions at work (`notes`, an attack's
    'attack sign_flip by 4 clients') under the plain mean, the attackers' updates; otherwise the learning rate."""
    if notes and plain_mean:
        return (
            f"likely {', '.join(notes)} averaged by the plain mean: configure a robust aggregator.rule "
            f"({ROBUST_RULES}) or lower the learning rate"
        )
    return "likely a learning rate too high for the model: lower it (or look for huge values in the data)"


def all_left_out(selected: int, notes: list[str], plain_mean: bool) -> str:
    """What went wrong in a round whose `selected` clients were all left out, and its likely cause."""
    return (
        f"all {selected} clients of the round were left out (their trained models or losses are not finite), "
        f"{likely_cause(notes, plain_mean)}"
    )


def check_round(
    round: int, selected: int, left_out: list[int], algorithm: Any, notes: list[str], plain_mean: bool
) -> None:
    """Raise `RoundDiverged` when the server model is not finite after the round's aggregation, or when all
    `selected` clients were `left_out`; `notes` and `plain_mean` describe the run for the likely cause."""
    if not server_model_finite(algorithm):
        raise RoundDiverged(
            round, f"the server model is not finite after aggregation, {likely_cause(notes, plain_mean)}"
        )
    if selected and len(left_out) >= selected:
        raise RoundDiverged(round, all_left_out(selected, notes, plain_mean))


@contextlib.contextmanager
def watched_round(
    round: int, updates: RoundUpdates, algorithm: Any, notes: list[str], plain_mean: bool
) -> Iterator[None]:
    """Around a round's aggregation hooks and `updates.finish()`: `check_round` once they are done, and
    `RoundDiverged` when a hook fails on a held round that left every client out (it had no update to work on:
    the cause, not the hook's error, is reported)."""
    try:
        yield
    except Exception as error:
        if updates.nothing_received:
            sent = len(updates.clients) - len(updates.dropped)
            raise RoundDiverged(round, all_left_out(sent, notes, plain_mean)) from error
        raise
    # a client that sent nothing (offline, dropped out, past a deadline) is no sign of divergence
    dropped = set(updates.dropped)
    failed = [c for c in updates.left_out if c not in dropped]
    check_round(round, len(updates.clients) - len(dropped), failed, algorithm, notes, plain_mean)
