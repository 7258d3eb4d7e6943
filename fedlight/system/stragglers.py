"""A synchronous round on the virtual clock: who drops out, who a deadline cuts, who goes offline, and how long the
round lasts.

The server sends the model to the selected online clients and sets a deadline (a fixed number of virtual seconds,
or a percentile of their times). A random share drops out mid-round and sends nothing. A client whose local work and
transfers take longer than the deadline is dropped, or, with partial work, sends the whole local steps that fit
before it beside its transfers (FedProx's partial work; none fit: dropped). A client whose online period ends before
its work and transfers do goes offline mid-round: it is dropped likewise, or with partial work sends the steps that
fit before it leaves; the server, which sees it go, does not wait for it. The round lasts until the slowest kept
client's update arrives, and at least until the deadline when the deadline cut anyone (the server waits that long to
know). A round never ends empty: when the deadline would leave no client that did not drop out, the server waits for
the first of them to finish all of its work instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DECIMALS = 9  # times are compared and steps counted after rounding to this many decimals (float error never cuts)


def round_deadline(times_s: np.ndarray, deadline_s: float | None, percentile: float | None) -> float | None:
    """The round's deadline: `deadline_s`, or the `percentile` of the selected clients' times (`times_s`, numpy's
    linear interpolation), or None."""
    if deadline_s is not None:
        return float(deadline_s)
    if percentile is not None and len(times_s):
        return float(np.percentile(times_s, percentile))
    return None


def finished_steps(
    steps: np.ndarray,
    compute_s: np.ndarray,
    transfer_s: np.ndarray,
    deadline_s: float | np.ndarray | None,
    partial: bool,
) -> np.ndarray:
    """(clients,) the local steps each client finishes by `deadline_s` (one for all, or one each): all of them when
    its work and transfers fit; otherwise, with `partial`, the whole steps that fit beside its transfers, else
    none."""
    steps = np.asarray(steps, dtype=np.int64)
    if deadline_s is None:
        return steps.copy()
    fits = np.round(compute_s + transfer_s, DECIMALS) <= deadline_s
    if not partial:
        return np.where(fits, steps, 0)
    step_s = np.divide(compute_s, steps, out=np.zeros_like(compute_s), where=steps > 0)
    room = np.divide(deadline_s - transfer_s, step_s, out=np.zeros_like(compute_s), where=step_s > 0)
    some = np.floor(np.round(np.minimum(room, steps), DECIMALS)).clip(0, None).astype(np.int64)  # inf: all steps
    return np.where(fits, steps, some)


@dataclass
class RoundTimes:
    """What the clients of a round (in the order given) got done, and the round's length.

    Attributes:
        done: local steps each finished.
        dropped_out: True where it dropped out mid-round.
        cut: True where the deadline dropped it or cut it short, or it went offline before finishing.
        kept: True where it sent an update (all of its steps, or some with partial work).
        duration_s: the round's length on the virtual clock.
        deadline_s: the round's deadline, or None.
        waited: the deadline left no client, so the server waited for the first to finish.
        went_offline: True where its online period ended before it sent anything.
        deadline_bound: the deadline cut a client, so the round lasts at least until it.
    """

    done: np.ndarray
    dropped_out: np.ndarray
    cut: np.ndarray
    kept: np.ndarray
    duration_s: float
    deadline_s: float | None
    waited: bool
    went_offline: np.ndarray
    deadline_bound: bool = False


def run_round(
    steps: np.ndarray,
    compute_s: np.ndarray,
    transfer_s: np.ndarray,
    dropped_out: np.ndarray,
    deadline_s: float | None,
    partial: bool,
    online_left_s: np.ndarray | None = None,
) -> RoundTimes:
    """The round of clients with `steps` local steps taking `compute_s` and `transfer_s` (numpy arrays, one entry
    each), `dropped_out` (bool) of them dropping out, under `deadline_s` (already a number: `round_deadline`), each
    online for `online_left_s` more seconds (None: all of the round)."""
    steps = np.asarray(steps, dtype=np.int64)
    by_deadline = finished_steps(steps, compute_s, transfer_s, deadline_s, partial)
    by_leaving = (
        steps.copy()
        if online_left_s is None
        else finished_steps(steps, compute_s, transfer_s, np.asarray(online_left_s, dtype=float), partial)
    )
    leaving = by_leaving < steps
    went_offline = ~dropped_out & leaving & (by_leaving == 0)
    gone = dropped_out | went_offline  # sends nothing, and the server knows it
    done = np.where(gone, 0, np.minimum(by_deadline, by_leaving))
    whole_s = compute_s + transfer_s
    staying = ~gone
    waited = bool(staying.any()) and not bool(done[staying].any())
    can_finish = staying & ~leaving
    if waited and can_finish.any():  # the first of the clients still there to finish, all of its work
        first = np.flatnonzero(can_finish)[np.argmin(whole_s[can_finish])]
        done[first] = steps[first]
    cut = staying & (done < steps)
    step_s = np.divide(compute_s, steps, out=np.zeros_like(compute_s), where=steps > 0)
    kept_s = np.where(done == steps, whole_s, done * step_s + transfer_s)
    kept = staying & ~(cut & (done == 0))
    duration = float(kept_s[kept].max()) if kept.any() else 0.0
    bound = bool((staying & (by_deadline < steps)).any()) and deadline_s is not None and not waited
    if bound and deadline_s is not None:  # (bound only under a deadline)
        duration = max(duration, deadline_s)
    return RoundTimes(done, dropped_out.copy(), cut, kept, duration, deadline_s, waited, went_offline, bound)
