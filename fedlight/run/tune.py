"""`python -m fedlight tune --config run.yaml --space space.yaml --trials N`: hyperparameter search on validation
data with Optuna (TPE and the median pruner by default), then the best configuration on `--final_seeds` seeds
evaluated on the test split, against the default settings.

Every trial is an ordinary run (config.yaml, metrics.csv, a W&B run grouped by study) in
`<output_dir>/tune-<study>/trial-NNNN`, evaluated on the validation split; the objective is `--metric` averaged over
the last `--last_rounds` evaluated rounds, and every evaluated round is reported to Optuna so the pruner can stop
a hopeless trial. The study lives in `<output_dir>/tune-<study>/study.db` (SQLite) unless `--storage` names a
database, which several processes on several machines may share (Optuna's own distributed mode). `--trials` is the
study's total, so the same command run again continues the study, and with a larger `--trials` grows it; a trial
interrupted by Ctrl-C is queued again and resumes from its last round checkpoint. Optuna is imported only when
this command runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace
from rich.console import Console

from fedlight.engine.threads import PARALLEL_RUNS_VARIABLE, sharing_environment
from fedlight.plugin.evaluation import higher_is_better
from fedlight.run import termination, tune_space, tune_study
from fedlight.run.callbacks import RunInterrupted
from fedlight.run.config_errors import explain
from fedlight.run.trial_reporter import TrialReporter

#: the tune command's own options (the rest are `fit`'s)
OPTIONS = (
    "space",
    "trials",
    "storage",
    "study",
    "metric",
    "last_rounds",
    "final_seeds",
    "sampler",
    "sampler_seed",
    "pruner",
    "pruner_startup_trials",
    "pruner_warmup_rounds",
    "jobs",
    "search_only",
)
RunFit = Callable[..., dict[str, Any]]


class TuneInterrupted(Exception):
    """Ctrl-C or SIGTERM during a tuning run; the message says how to continue, `exit_code` is 130 or 143."""

    def __init__(self, message: str, stop: BaseException) -> None:
        super().__init__(message)
        self.exit_code = termination.exit_code(stop)


class TrialFailed(Exception):
    """A trial whose objective is not a finite number."""


def add_arguments(parser: ArgumentParser) -> ArgumentParser:
    """Add tune's options to a `fit` parser (every `fit` option and override stays valid)."""
    parser.description = "Search hyperparameters on validation data with Optuna, then run the best on test seeds."
    parser.add_argument("--space", type=str, required=True, help="a search-space YAML (see configs/tune/)")
    parser.add_argument(
        "--trials",
        type=int,
        required=True,
        help="the study's total of trials: run until this many have an outcome (an existing study continues)",
    )
    parser.add_argument(
        "--storage",
        type=str | None,
        default=None,
        help="an Optuna storage URL (sqlite:///S.db, postgresql://..., mysql://...) shared by every "
        "process of the study (default: study.db in the study folder)",
    )
    parser.add_argument("--study", type=str | None, default=None, help="the study's name (default: the space file's)")
    parser.add_argument(
        "--metric", type=str, default="val/acc_mean", help="the objective: a metrics.csv column on the validation split"
    )
    parser.add_argument(
        "--last_rounds",
        type=int,
        default=3,
        help="the objective is the metric's mean over this many last evaluated rounds",
    )
    parser.add_argument(
        "--final_seeds",
        type=int,
        default=0,
        help="when the search ends, run the best and the default settings on this many seeds, on test",
    )
    parser.add_argument("--sampler", type=str, default="tpe", help=f"one of {', '.join(tune_study.SAMPLERS)}")
    parser.add_argument("--sampler_seed", type=int | None, default=None, help="the sampler's seed (None: random)")
    parser.add_argument("--pruner", type=str, default="median", help=f"one of {', '.join(tune_study.PRUNERS)}")
    parser.add_argument(
        "--pruner_startup_trials",
        type=int,
        default=5,
        help="the median pruner prunes nothing until this many trials have completed",
    )
    parser.add_argument(
        "--pruner_warmup_rounds", type=int, default=0, help="the median pruner prunes no trial before this round"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="trials at once: this process and jobs - 1 more share the study and the cores",
    )
    parser.add_argument(
        "--search_only",
        type=bool,
        default=False,
        help="run trials only, no final seeds or report (what each --jobs process does)",
    )
    return parser


def check_options(cfg: Namespace) -> None:
    """One line for options tune cannot use, before anything runs."""
    split = cfg.metric.split("/", 1)[0]
    if split.startswith("test"):
        raise ValueError(
            f"--metric {cfg.metric}: selecting on the test split is refused (it would make the test "
            f"score optimistic); tune on {cfg.metric.replace(split, 'val', 1)}, the final seeds report "
            "test"
        )
    if not split.startswith("val") or "/" not in cfg.metric:
        raise ValueError(f"--metric {cfg.metric}: give a validation metric such as val/acc_mean or val/loss_mean")
    if cfg.study is not None and not re.fullmatch(r"[\w.-]+", cfg.study):
        raise ValueError(f"--study {cfg.study!r}: use letters, digits, '_', '-' and '.' (it names the study's folder)")
    if cfg.resume or cfg.run_name:
        raise ValueError("--resume/--run_name: tune names its trials' run folders; rerun the tune command to continue")
    if cfg.federation.devices != 1 or cfg.federation.num_nodes != 1:
        raise ValueError(
            "--federation.devices/num_nodes: tune runs each trial in one process; scale out with several "
            "tune processes sharing one --storage"
        )
    for name, low in (
        ("trials", 1),
        ("last_rounds", 1),
        ("final_seeds", 0),
        ("pruner_startup_trials", 0),
        ("pruner_warmup_rounds", 0),
        ("jobs", 1),
    ):
        if cfg[name] < low:
            raise ValueError(f"--{name} must be at least {low}, got {cfg[name]}")
    for name, known in (("sampler", tune_study.SAMPLERS), ("pruner", tune_study.PRUNERS)):
        if cfg[name] not in known:
            raise ValueError(f"--{name} {cfg[name]}: choose one of {', '.join(known)}")


class Tuner:
    """One `fedlight tune` invocation: the base config, the space, the study and how a trial runs."""

    def __init__(self, cfg: Namespace, parser: ArgumentParser, run_fit: RunFit, console: Console) -> None:
        check_options(cfg)
        self.cfg, self.parser, self.run_fit, self.console = cfg, parser, run_fit, console
        base = cfg.clone()
        for name in OPTIONS:
            del base[name]
        self.base_text = parser.dump(base)
        self.space = tune_space.load(cfg.space)
        tune_space.check_keys(self.space, self.parse, lambda error: explain(str(error), parser._option_string_actions))
        self.name = cfg.study or self.space.path.stem
        self.folder = Path(cfg.output_dir) / f"tune-{self.name}"
        metric = cfg.metric.rsplit("/", 1)[-1].removesuffix("_mean")
        self.direction: tune_study.Direction = "maximize" if higher_is_better(metric) else "minimize"

    def parse(self, args: list[str]) -> Namespace:
        """The `fit` config of the base with `args` applied."""
        return self.parser.parse_args(["--config", self.base_text, *args])

    def open(self) -> Any:
        """Create or load the study (`--storage`, default an SQLite file in the study folder) with the configured
        sampler and pruner, make the study folder, and return the study."""
        import optuna

        optuna.logging.set_verbosity(logging.ERROR)  # each trial gets its own line below
        if not self.cfg.storage:  # the default SQLite file lives in the study folder
            self.folder.mkdir(parents=True, exist_ok=True)
        url = self.cfg.storage or tune_study.default_storage(self.folder)
        sampler = tune_study.sampler(self.cfg.sampler, self.cfg.sampler_seed)
        pruner = tune_study.pruner(self.cfg.pruner, self.cfg.pruner_startup_trials, self.cfg.pruner_warmup_rounds)
        self.study = tune_study.open_study(self.name, url, self.cfg.metric, self.direction, sampler, pruner)
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.study

    # -- one trial ------------------------------------------------------------------------------------------
    def run_args(self, values: dict[str, Any], name: str, split: str) -> list[str]:
        """The `fit` arguments of one run: the space's fixed options and `values`, evaluated on `split`, in the study
        folder as `name`, logged in the study's group."""
        return [
            *tune_space.arguments({**self.space.fixed, **values}),
            "--federation.eval_split",
            split,
            "--output_dir",
            str(self.folder),
            "--run_name",
            name,
            "--logger.group",
            self.name,
        ]

    def objective(self, trial: Any) -> float:
        """Optuna's objective: skip a surplus trial, run the trial, and queue it again when Ctrl-C stops it."""
        import optuna

        trials = self.study.get_trials(deepcopy=False)
        if len(tune_study.occupying(trials, before=trial.number)) >= self.cfg.trials:
            trial.set_user_attr("surplus", True)  # other processes' trials reached the total first
            self.study.stop()
            raise TrialFailed("surplus")
        origin = tune_study.retry_origin(next(t for t in trials if t.number == trial.number))
        try:
            return self.run_trial(trial, origin)
        except (KeyboardInterrupt, RunInterrupted) as stop:
            self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number if origin is None else origin})
            raise termination.same_interrupt(stop) from None
        except optuna.TrialPruned:
            raise
        except Exception as error:  # recorded as failed by Optuna; the study goes on
            self.console.print(f"trial {trial.number} failed: {' '.join(str(error).split())}", markup=False)
            raise

    def run_trial(self, trial: Any, origin: int | None) -> float:
        """Run one trial's configuration on the validation split (or continue the run of the trial it retries)
        and return its objective; a pruned trial raises Optuna's TrialPruned, a NaN objective TrialFailed."""
        import optuna

        values = self.space.suggest(trial)
        name = f"trial-{trial.number if origin is None else origin:04d}"
        run_dir = self.folder / name
        trial.set_user_attr("run_dir", str(run_dir))
        again = "" if origin is None else f", continuing trial {origin}"
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        self.console.print(f"[bold]trial {trial.number} of study {self.name}{again}:[/bold] {shown}", highlight=False)
        if (run_dir / "config.yaml").is_file():
            cfg = self.parser.parse_args(["--config", str(run_dir / "config.yaml"), "--resume", str(run_dir)])
        else:
            cfg = self.parse(self.run_args(values, name, "val"))
        reporter = TrialReporter(trial, self.cfg.metric, self.cfg.last_rounds)
        self.run_fit(self.parser, cfg, self.console, callbacks=[reporter])
        if reporter.pruned_round is not None:
            self.console.print(f"trial {trial.number} pruned in round {reporter.pruned_round}")
            raise optuna.TrialPruned(f"round {reporter.pruned_round}")
        value = reporter.objective()
        if not math.isfinite(value):
            never = all(not math.isfinite(v) for _, v in reporter.values)
            hint = " in every evaluated round: does the data have a validation split (data.init_args.val_fraction)?"
            raise TrialFailed(f"{self.cfg.metric} is {value}{hint if never else ''}")
        self.console.print(
            f"trial {trial.number}: {self.cfg.metric} {value:.4f} (mean of the last "
            f"{min(self.cfg.last_rounds, len(reporter.values))} evaluated rounds)"
        )
        return value

    def stop_at_total(self, study: Any, trial: Any) -> None:
        """After each trial (an Optuna callback): stop the study once the trials that count reach `--trials`, every
        process's included."""
        if len(tune_study.occupying(study.get_trials(deepcopy=False))) >= self.cfg.trials:
            study.stop()

    def search(self) -> None:
        """Run trials until the study's total reaches --trials (counting every process's)."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # trials of a process that died, queued again
        if len(tune_study.occupying(self.study.get_trials(deepcopy=False))) >= self.cfg.trials:
            return
        try:
            self.study.optimize(self.objective, callbacks=[self.stop_at_total], catch=(Exception,))
        except KeyboardInterrupt as stop:
            raise TuneInterrupted(
                f"tuning interrupted; the study {self.name} is saved, and rerunning the same command "
                "continues it (the interrupted trial resumes from its last round)",
                stop,
            ) from None

    # -- after the search ---------------------------------------------------------------------------------
    def final_runs(self, params: dict[str, Any]) -> list[Path]:
        """The best settings (`params`) and the default ones (the base config with the space's fixed options) on
        --final_seeds seeds each, evaluated on the test split; a finished run is kept, an unfinished one resumed."""
        folders = []
        for label, values in (("best", params), ("default", {})):
            for seed in range(self.cfg.seed, self.cfg.seed + self.cfg.final_seeds):
                folder = self.folder / f"{label}-s{seed}"
                folders.append(folder)
                if (folder / "summary.json").is_file():
                    continue
                self.console.print(f"[bold]final run {folder.name} of study {self.name} (test split)[/bold]")
                if (folder / "config.yaml").is_file():
                    cfg = self.parser.parse_args(["--config", str(folder / "config.yaml"), "--resume", str(folder)])
                else:
                    cfg = self.parse([*self.run_args(values, folder.name, "test"), "--seed", str(seed)])
                try:
                    self.run_fit(self.parser, cfg, self.console)
                except (KeyboardInterrupt, RunInterrupted) as stop:
                    raise TuneInterrupted(
                        f"interrupted in the final run {folder.name}; rerun the same command to "
                        "finish the final runs (the search is done)",
                        stop,
                    ) from None
        return folders

    def finish(self) -> Path:
        """Print the outcome and the best parameters, run the final seeds, and write the study's report."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        done = tune_study.finished(trials)
        states = [t.state for t in done]
        running = sum(t.state == TrialState.RUNNING for t in tune_study.occupying(trials))
        counts = ", ".join(
            f"{states.count(s)} {s.name.lower()}" for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        )
        elsewhere = f"; {running} still running in other processes" if running else ""
        self.console.print(
            f"study {self.name}: {len(done)} of {self.cfg.trials} trials have an outcome ({counts}){elsewhere}"
        )
        if TrialState.COMPLETE not in states:
            raise tune_study.StudyError(
                f"no trial of study {self.name} completed, so there is no best configuration; "
                "the trials' errors are above"
            )
        best = self.study.best_trial
        self.console.print(f"best trial {best.number}: {self.cfg.metric} {best.value:.4f}, parameters:")
        for key, value in best.params.items():
            self.console.print(f"  {key}: {value}", markup=False, highlight=False)
        folders: list[Path] = []
        if self.cfg.final_seeds and running:
            self.console.print("final seeds wait for the running trials: rerun this command once they end")
        elif self.cfg.final_seeds:
            folders = self.final_runs(best.params)
            self.print_final(folders)
        from fedlight.reports import tune_report

        output = tune_report.write(
            self.folder / "report.html",
            f"fedlight tune: study {self.name}",
            study_records(trials),
            parameter_importances(self.study),
            self.cfg.metric,
            self.direction,
            folders,
        )
        self.console.print(f"report: {output}")
        return output

    def print_final(self, folders: list[Path]) -> None:
        """Tuned against default settings on the test split: the mean ± std over the final seeds."""
        import json

        from fedlight.reports.runs import plural  # the reports load matplotlib: only when printed

        metric = "test/" + self.cfg.metric.split("/", 1)[1]
        for label in ("best", "default"):
            values = [
                json.loads((f / "summary.json").read_text()).get(metric, math.nan)
                for f in folders
                if f.name.startswith(f"{label}-")
            ]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            shown = "tuned" if label == "best" else "default"
            self.console.print(f"{shown:>8}: {metric} {mean:.4f} ± {std:.4f} over {plural(len(values), 'seed')}")


def study_records(trials: list[Any]) -> list[Any]:
    """The study's trials as plain records for the report (retried and surplus trials left out)."""
    from fedlight.reports.tune_report import TrialRecord

    records = []
    for t in tune_study.finished(trials):
        steps = sorted(t.intermediate_values)
        value = t.value if t.value is not None else (t.intermediate_values[steps[-1]] if steps else None)
        records.append(
            TrialRecord(
                t.number,
                t.state.name.lower(),
                value,
                dict(t.params),
                t.user_attrs.get("run_dir"),
                steps[-1] if steps else None,
            )
        )
    return records


def parameter_importances(study: Any) -> dict[str, float]:
    """Optuna's fANOVA importance of each parameter over the completed trials ({} when it cannot be computed: fewer
    than two completed trials, or no parameter that varied)."""
    import optuna

    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
        )
        return {name: float(value) for name, value in found.items()}
    except (RuntimeError, ValueError):
        return {}


def run(
    cfg: Namespace, parser: ArgumentParser, run_fit: RunFit, console: Console, argv: list[str] | None = None
) -> Path | None:
    """`fedlight tune`: check everything, search (with `--jobs` - 1 more processes started from `argv`, the command
    line), then the final seeds and the report; returns the report's path (None with --search_only)."""
    tuner = Tuner(cfg, parser, run_fit, console)
    tuner.open()  # the study exists before other processes open it
    others = start_searchers(argv or [], cfg.jobs)
    try:
        with parallel_runs(cfg.jobs):
            tuner.search()
    finally:
        codes = [process.wait() for process in others]
    if any(codes):
        raise tune_study.StudyError(
            f"{sum(1 for c in codes if c)} of the {len(others)} other search processes "
            "failed (their errors are above); rerun the command to continue the study"
        )
    return None if cfg.search_only else tuner.finish()


def start_searchers(argv: list[str], jobs: int) -> list[subprocess.Popen]:
    """`jobs` - 1 processes running this command's search beside this one (`--search_only`), each told that `jobs`
    runs share the machine (`FEDLIGHT_PARALLEL_RUNS`), so every trial takes its share of the cores."""
    if jobs <= 1:
        return []
    env = sharing_environment(jobs)
    return [
        subprocess.Popen(
            [sys.executable, "-m", "fedlight", *searcher_arguments(argv, k), "--search_only", "true"], env=env
        )
        for k in range(1, jobs)
    ]


def searcher_arguments(argv: list[str], k: int) -> list[str]:
    """The command line of the k-th other searcher: `argv` with one job, and with the sampler's seed plus k where a
    seed is given (one seed would make every process propose the same settings)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name, _, inline = arg.partition("=")
        if name in ("--jobs", "--sampler_seed"):
            value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else "")
            skip = not inline
            if name == "--sampler_seed" and value.lstrip("-").isdigit():
                out += ["--sampler_seed", str(int(value) + k)]
            continue
        out.append(arg)
    return [*out, "--jobs", "1"]


@contextlib.contextmanager
def parallel_runs(jobs: int) -> Iterator[None]:
    """Within: this process's trials know that `jobs` runs share the machine (`FEDLIGHT_PARALLEL_RUNS`)."""
    before = os.environ.get(PARALLEL_RUNS_VARIABLE)
    if jobs > 1:
        os.environ[PARALLEL_RUNS_VARIABLE] = str(jobs)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARALLEL_RUNS_VARIABLE, None)
        else:
            os.environ[PARALLEL_RUNS_VARIABLE] = before
