"""Trace files of the system model: every client's device speeds (`system.device_trace`) and online intervals
(`system.availability_trace`), in fedlight's fields or FedScale's (docs/architecture.md, "System model").

A file is JSON or YAML (`.json`, `.yaml`, `.yml`), or a pickle (`.pkl`, `.pickle`: FedScale ships its traces so; a
pickle runs code when read, so read only your own). It holds one record per client: a list in client order, or a
mapping from integer keys (numbers or strings of digits) to records, where client c reads the key (smallest key + c):
keys 0..n-1 as fedlight numbers clients, or FedScale's 1..n. Extra records are ignored; a missing client or field is
refused in one line.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: FedScale's `computation` is a sample's inference latency; a training step costs about three (forward and a
#: backward of twice its cost), as its `getCompletionTime` multiplies it
FEDSCALE_TRAINING_FACTOR = 3.0


def read_records(path: str, setting: str, count: int) -> list[dict[str, Any]]:
    """The first `count` clients' records of the trace file `path` (the config's `setting`), in client order."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(
            f'{setting}: no file {path}: give the path of a trace file (docs/architecture.md, "System model")'
        )
    if file.suffix in (".pkl", ".pickle"):
        with file.open("rb") as f:
            loaded = pickle.load(f)
    else:
        loaded = yaml.safe_load(file.read_text())
    if isinstance(loaded, Sequence) and not isinstance(loaded, str):
        records = dict(enumerate(loaded))
    elif isinstance(loaded, dict):
        try:
            records = {int(key): value for key, value in loaded.items()}
        except (TypeError, ValueError):
            raise ValueError(
                f"{setting}: {path} is keyed by {next(iter(loaded))!r}: key each client's record by its "
                "number (0..n-1, or FedScale's 1..n)"
            ) from None
    else:
        raise ValueError(
            f"{setting}: {path} holds a {type(loaded).__name__}: give a list of records in client order "
            "or a mapping from client numbers to records"
        )
    first = min(records, default=0)
    missing = [c for c in range(count) if first + c not in records]
    if missing:
        raise ValueError(
            f"{setting}: {path} has {len(records)} records, none for client {missing[0]} (key "
            f"{first + missing[0]}) of the {count} clients: give one record per client, keyed "
            f"{first}..{first + count - 1}"
        )
    return [records[first + c] for c in range(count)]


def record_field(record: Any, client: int, setting: str, names: tuple[str, ...]) -> Any:
    """The first of `names` that `record` (client `client`'s) has, or a one-line refusal naming them."""
    if isinstance(record, dict):
        for name in names:
            if name in record:
                return record[name]
    alternatives = " or ".join(repr(n) for n in names)
    raise ValueError(f"{setting}: the record of client {client} has no {alternatives}: give it to every client")


def positive(value: Any, client: int, setting: str, name: str) -> float:
    """`value` as a positive float, or a one-line refusal."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or not np.isfinite(number):
        raise ValueError(f"{setting}: client {client}'s {name} is {value!r}: give a positive number")
    return number


def speed(
    record: Any, client: int, setting: str, own: str, fedscale: str, from_fedscale: Callable[[float], float]
) -> float:
    """One speed of a client's record: fedlight's field `own`, else FedScale's field `fedscale` converted."""
    value = positive(record_field(record, client, setting, (own, fedscale)), client, setting, f"{own} / {fedscale}")
    return value if own in record else from_fedscale(value)


def device_speeds(path: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(training samples per second, link Mbit/s) of every client, from `system.device_trace`: fedlight's
    `samples_per_s` and `link_mbps`, or FedScale's `computation` (ms of inference per sample, a training sample
    costing `FEDSCALE_TRAINING_FACTOR` of them) and `communication` (kbit/s)."""
    setting = "system.device_trace"
    records = read_records(path, setting, count)
    compute = [
        speed(r, c, setting, "samples_per_s", "computation", lambda ms: 1000.0 / (FEDSCALE_TRAINING_FACTOR * ms))
        for c, r in enumerate(records)
    ]
    link = [
        speed(r, c, setting, "link_mbps", "communication", lambda kbps: kbps / 1000.0) for c, r in enumerate(records)
    ]
    return np.array(compute), np.array(link)


def online_intervals(path: str, count: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Every client's (starts, ends, period) from `system.availability_trace`, FedScale's behaviour trace fields:
    `active` and `inactive` (the virtual seconds each online interval begins and ends) and `finish_time` (the
    period after which the trace repeats)."""
    setting = "system.availability_trace"
    intervals = []
    for client, record in enumerate(read_records(path, setting, count)):
        starts = np.asarray(record_field(record, client, setting, ("active",)), dtype=float).reshape(-1)
        ends = np.asarray(record_field(record, client, setting, ("inactive",)), dtype=float).reshape(-1)
        period = positive(record_field(record, client, setting, ("finish_time",)), client, setting, "finish_time")
        if len(starts) != len(ends) or bool((ends < starts).any()):
            raise ValueError(
                f"{setting}: client {client} has {len(starts)} 'active' and {len(ends)} 'inactive' "
                "times: give one end at or after each start"
            )
        intervals.append((starts, ends, period))
    return intervals
