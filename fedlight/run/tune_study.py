"""The Optuna study behind `fedlight tune`: its storage (an SQLite file by default, any database URL Optuna takes),
its sampler and pruner, and the count of trials that `--trials` totals, kept exact when several processes share
one study.

A trial counts once it has an outcome: complete, pruned, or failed (a configuration that crashes or goes NaN is
an outcome too, or a study of failing configurations would never end). Two kinds of trial do not count: one
interrupted by Ctrl-C or found dead by Optuna's heartbeat, because a retry of it is queued (`retry_of`, or the
`failed_trial` mark of Optuna's `RetryHeartbeatStaleTrialCallback`) and the retry counts; and a surplus trial, one that
another process's trials had already made one too many when it started (`surplus`), which ends at once.
Trial numbers come from the storage, in creation order, so which trial is surplus is the same in every process.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

#: seconds between a running trial's heartbeats, and after which a silent one is failed (and retried)
HEARTBEAT_S, GRACE_S = 30, 120
#: tries to open a storage (processes started together race to create a new database)
OPEN_ATTEMPTS = 5
SAMPLERS = ("tpe", "random", "gp")
PRUNERS = ("median", "hyperband", "none")
Direction = Literal["minimize", "maximize"]  # an objective's direction, in Optuna's words


class StudyError(ValueError):
    """A study that cannot be opened as asked; the message says why and what to do."""


def default_storage(study_dir: Path) -> str:
    """The URL of the study's default storage: study.db, an SQLite file in `study_dir`."""
    return f"sqlite:///{study_dir / 'study.db'}"


def storage(url: str) -> Any:
    """Optuna's RDB storage for `url` with heartbeats: a trial whose process died is failed after `GRACE_S` and
    queued again."""
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
    from sqlalchemy.exc import IntegrityError, OperationalError

    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(OPEN_ATTEMPTS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return RDBStorage(
                    url,
                    engine_kwargs=engine,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                )
            except (ImportError, ModuleNotFoundError) as error:
                raise StudyError(
                    f"--storage {url}: its database driver is not installed ({error}); install it into "
                    "the virtualenv (e.g. psycopg2-binary for postgresql, PyMySQL for "
                    "mysql+pymysql)"
                ) from None
            except Exception as error:  # a bad URL, an unreachable server, or another process creating the tables
                if attempt + 1 == OPEN_ATTEMPTS or not isinstance(error, (IntegrityError, OperationalError)):
                    raise StudyError(
                        f"--storage {url}: cannot open it ({' '.join(str(error).split())[:200]})"
                    ) from None
        time.sleep(0.5 * (attempt + 1))  # processes started together race to create a new database's tables
    raise AssertionError("unreachable")


def sampler(name: str, seed: int | None) -> Any:
    """Optuna's sampler named `name` (tpe, random or gp), seeded with `seed`."""
    import optuna

    return {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "random": lambda: optuna.samplers.RandomSampler(seed),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed),
    }[name]()


def pruner(name: str, startup_trials: int, warmup_rounds: int) -> Any:
    """Optuna's pruner named `name`: median (no pruning in the first `startup_trials` trials, nor before a trial has
    reported `warmup_rounds` rounds), hyperband (its minimum resource `warmup_rounds` rounds, at least 1) or none."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_rounds)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_rounds))
    return optuna.pruners.NopPruner()


def open_study(name: str, url: str, metric: str, direction: Direction, sampler_obj: Any, pruner_obj: Any) -> Any:
    """Create the study or load it (the same command run again continues it); a study made for another metric or
    direction is refused rather than mixed."""
    import optuna

    study = optuna.create_study(
        study_name=name,
        storage=storage(url),
        sampler=sampler_obj,
        pruner=pruner_obj,
        direction=direction,
        load_if_exists=True,
    )
    if study.direction.name.lower() != direction:
        raise StudyError(
            f"study {name!r} in {url} maximizes/minimizes the other way ({study.direction.name.lower()}); "
            "give another --study for this objective"
        )
    saved = study.user_attrs.get("metric")
    if saved is None:
        study.set_user_attr("metric", metric)
    elif saved != metric:
        raise StudyError(
            f"study {name!r} in {url} selects on {saved}, not {metric}: give --metric {saved}, or another --study"
        )
    return study


def retry_origin(trial: Any) -> int | None:
    """The number of the trial that `trial` (a frozen trial) retries: one interrupted by Ctrl-C (`retry_of`) or
    failed by Optuna's heartbeat check; None for a first attempt."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    origin = trial.user_attrs.get("retry_of")
    if origin is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            origin = RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)
    return None if origin is None else int(origin)


def retried(trials: Sequence[Any]) -> set[int]:
    """Numbers of the trials a later trial retries."""
    return {origin for trial in trials if (origin := retry_origin(trial)) is not None}


def occupying(trials: Sequence[Any], before: int | None = None) -> list[Any]:
    """The trials that count towards `--trials`, or will once they end (running ones), among those numbered below
    `before` (all when None)."""
    from optuna.trial import TrialState

    again = retried(trials)
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    return [
        t
        for t in trials
        if t.state in counted
        and t.number not in again
        and not t.user_attrs.get("surplus")
        and (before is None or t.number < before)
    ]


def finished(trials: Sequence[Any]) -> list[Any]:
    """The counted trials that have ended."""
    from optuna.trial import TrialState

    return [t for t in occupying(trials) if t.state != TrialState.RUNNING]
