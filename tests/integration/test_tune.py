"""`fedlight tune`: a study on validation data with real Optuna (SQLite in tmp_path) and small runs. Studies grow
and resume, the validation-best trial is chosen, the pruner stops a trial at chance, failures and Ctrl-C leave a
study that goes on, and bad spaces or a test metric are refused in one line before any trial."""

from __future__ import annotations

import ast
import json
import math
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from fedlight.run import cli, tune, tune_space, tune_study
from fedlight.run.config_errors import explain
from fedlight.run.trial_reporter import TrialReporter

REPO = Path(__file__).resolve().parents[2]
LR_SPACE = {"params": {"model.init_args.lr": {"type": "float", "low": 0.02, "high": 0.2, "log": True}}}


def write_space(folder: Path, space: dict, name: str = "space.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(space))
    return path


def tune_args(tiny_run_args: list[str], space: Path, trials: int, *extra: str) -> list[str]:
    """A tune command over the tiny digits run of conftest (3 rounds unless `extra` says otherwise)."""
    return [
        "tune",
        *tiny_run_args[1:],
        "--space",
        str(space),
        "--trials",
        str(trials),
        "--study",
        "s",
        "--sampler_seed",
        "0",
        *extra,
    ]


def load(tmp_path: Path, study: str = "s") -> optuna.Study:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{tmp_path / f'tune-{study}' / 'study.db'}")


def states(study: optuna.Study) -> list[str]:
    return [t.state.name for t in sorted(study.get_trials(), key=lambda t: t.number)]


# -- a real study ------------------------------------------------------------------------------------------
def test_a_3_trial_study_writes_its_database_and_rerunning_it_with_5_continues_to_5(tmp_path, tiny_run_args, capsys):
    space = write_space(tmp_path, LR_SPACE)
    args = tune_args(tiny_run_args, space, 3, "--federation.rounds", "2", "--pruner", "none")
    assert cli.main(args) == 0
    assert (tmp_path / "tune-s" / "study.db").is_file()
    assert states(load(tmp_path)) == ["COMPLETE"] * 3
    first = capsys.readouterr().out
    best = load(tmp_path).best_trial
    assert f"best trial {best.number}: val/acc_mean {best.value:.4f}" in first
    assert f"model.init_args.lr: {best.params['model.init_args.lr']}" in first

    assert (
        cli.main([*args[: args.index("--trials") + 1], "5", *args[args.index("--trials") + 2 :], "--final_seeds", "1"])
        == 0
    )
    study = load(tmp_path)
    assert states(study) == ["COMPLETE"] * 5 and [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    for trial in study.trials:  # each trial an ordinary run folder, on validation data, in the study's W&B group
        folder = Path(trial.user_attrs["run_dir"])
        config = yaml.safe_load((folder / "config.yaml").read_text())
        assert folder.name == f"trial-{trial.number:04d}" and (folder / "metrics.csv").is_file()
        assert config["federation"]["eval_split"] == "val" and config["logger"]["group"] == "s"
        assert config["model"]["init_args"]["lr"] == trial.params["model.init_args.lr"]
        assert config["algorithm"]["class_path"] in ("fedlight.Algorithm", "fedlight.plugin.algorithm.Algorithm")
        summary = json.loads((folder / "summary.json").read_text())
        assert "val/acc_mean" in summary and "test/acc_mean" not in summary
    for name, lr in (("best-s0", study.best_params["model.init_args.lr"]), ("default-s0", 0.1)):  # the final seeds
        config = yaml.safe_load((tmp_path / "tune-s" / name / "config.yaml").read_text())
        assert config["federation"]["eval_split"] == "test" and config["model"]["init_args"]["lr"] == lr
        assert "test/acc_mean" in json.loads((tmp_path / "tune-s" / name / "summary.json").read_text())
    page = (tmp_path / "tune-s" / "report.html").read_text()
    assert "<h2>Search</h2>" in page and "tuned: " in page and "default: " in page and "fig-importance" in page
    out = capsys.readouterr().out
    assert "tuned: test/acc_mean" in out and "default: test/acc_mean" in out


def test_the_pruner_stops_a_trial_whose_validation_accuracy_stays_at_chance(tmp_path, tiny_run_args):
    storage = f"sqlite:///{tmp_path / 'p.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for lr in (0.2, 0.2, 1e-7):  # two that learn, then one whose weights barely move: chance accuracy throughout
        study.enqueue_trial({"model.init_args.lr": lr})
    space = write_space(
        tmp_path, {"params": {"model.init_args.lr": {"type": "float", "low": 1e-7, "high": 0.2, "log": True}}}
    )
    assert (
        cli.main(
            tune_args(
                tiny_run_args,
                space,
                3,
                "--storage",
                storage,
                "--federation.rounds",
                "4",
                "--pruner_startup_trials",
                "2",
            )
        )
        == 0
    )
    trials = sorted(optuna.load_study(study_name="s", storage=storage).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    stalled = trials[2]
    assert max(stalled.intermediate_values.values()) < 0.2  # 10 classes: it stayed near chance
    rows = (Path(stalled.user_attrs["run_dir"]) / "metrics.csv").read_text().splitlines()
    assert len(rows) - 1 < 4  # stopped before the last round
    summary = json.loads((Path(stalled.user_attrs["run_dir"]) / "summary.json").read_text())
    assert "pruned" in summary["stopped"]


# -- the objective, with a run that stands in for fit ----------------------------------------------------
class FakeRuns:
    """Stands in for `cli.run_fit`: each round reports val and test accuracies that depend on the learning rate
    (`table[lr] = (val, test)`), so that which trial is best on which split is known in advance."""

    def __init__(
        self,
        table: dict[float, tuple[float, float]],
        interrupt_at: int | None = None,
        fail: float | None = None,
        interrupt: BaseException | None = None,
    ) -> None:
        self.table, self.interrupt_at, self.fail = table, interrupt_at, fail
        self.interrupt = interrupt or KeyboardInterrupt()  # what stops the run `interrupt_at` (Ctrl-C by default)
        self.calls: list[SimpleNamespace] = []

    def __call__(self, parser, cfg, console=None, callbacks=()) -> dict:
        self.calls.append(cfg)
        lr = cfg.model.init_args.lr
        if lr == self.fail:
            raise ValueError("the configuration cannot run")
        run = SimpleNamespace(should_stop=False, stop_reason=None)
        for callback in callbacks:
            callback.on_fit_start(run)
        for round in range(1, 4):
            if len(self.calls) == self.interrupt_at and round == 2:
                raise self.interrupt
            val, test = self.table[lr]
            result = SimpleNamespace(round=round, evaluated=True, scalars={"val/acc_mean": val, "test/acc_mean": test})
            for callback in callbacks:
                callback.on_round_end(run, result)
        return {}


def fake_tune(tmp_path: Path, runs: FakeRuns, lrs: list[float], trials: int, enqueue: bool = True) -> Path:
    """Run `tune.run` with `runs` for fit, the learning rates enqueued in this order."""
    storage = f"sqlite:///{tmp_path / 'f.db'}"
    study = optuna.create_study(study_name="f", storage=storage, direction="maximize", load_if_exists=True)
    for lr in lrs if enqueue else ():
        study.enqueue_trial({"model.init_args.lr": lr})
    space = write_space(tmp_path, {"params": {"model.init_args.lr": {"type": "categorical", "choices": lrs}}})
    parser = cli.build_parser()
    cfg = parser.parse_args(
        [
            "tune",
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            "--space",
            str(space),
            "--trials",
            str(trials),
            "--storage",
            storage,
            "--study",
            "f",
            "--output_dir",
            str(tmp_path),
            "--pruner",
            "none",
        ]
    )
    return tune.run(cfg.tune, parser.fit_parser, runs, cli.make_console(quiet=True))


def test_the_validation_best_trial_is_chosen_when_another_is_best_on_test(tmp_path):
    table = {0.01: (0.5, 0.9), 0.03: (0.7, 0.4), 0.1: (0.6, 0.5)}  # best on val: 0.03; best on test: 0.01
    runs = FakeRuns(table)
    fake_tune(tmp_path, runs, [0.01, 0.03, 0.1], 3)
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert study.best_params == {"model.init_args.lr": 0.03}
    assert study.best_value == pytest.approx(0.7)
    assert {cfg.federation.eval_split for cfg in runs.calls} == {"val"}


def test_a_failing_trial_and_a_nan_trial_are_recorded_as_failed_and_the_study_goes_on(tmp_path):
    table = {0.01: (0.5, 0.5), 0.02: (math.nan, 0.5), 0.03: (0.6, 0.6)}
    fake_tune(tmp_path, FakeRuns(table, fail=0.01), [0.01, 0.02, 0.03], 3)
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert states(study) == ["FAIL", "FAIL", "COMPLETE"]
    assert study.best_params == {"model.init_args.lr": 0.03}


def test_ctrl_c_leaves_a_study_whose_interrupted_trial_runs_again_when_the_command_is_rerun(tmp_path):
    table = {0.01: (0.5, 0.5), 0.03: (0.7, 0.4), 0.1: (0.6, 0.5)}
    with pytest.raises(tune.TuneInterrupted, match="rerunning the same command continues it"):
        fake_tune(tmp_path, FakeRuns(table, interrupt_at=2), [0.01, 0.03, 0.1], 3)
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert states(study) == ["COMPLETE", "FAIL", "WAITING", "WAITING"]  # the retry of trial 1 queued last
    assert study.trials[3].user_attrs["retry_of"] == 1
    runs = FakeRuns(table)
    fake_tune(tmp_path, runs, [0.01, 0.03, 0.1], 3, enqueue=False)
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert states(study) == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # 3 counted: the interrupted one is not
    assert study.trials[3].params == study.trials[1].params and study.trials[3].user_attrs["run_dir"].endswith(
        "trial-0001"
    )  # the retry continues the interrupted trial's run folder
    assert len(runs.calls) == 2


def test_sigterm_in_a_trial_queues_it_again_as_ctrl_c_does_and_tuning_exits_143(tmp_path):
    from fedlight.run.callbacks import RunInterrupted

    table = {0.01: (0.5, 0.5), 0.03: (0.7, 0.4), 0.1: (0.6, 0.5)}
    terminated = RunInterrupted(tmp_path / "trial-0001", 1, terminated=True)  # what fit raises after SIGTERM
    with pytest.raises(tune.TuneInterrupted) as stop:
        fake_tune(tmp_path, FakeRuns(table, interrupt_at=2, interrupt=terminated), [0.01, 0.03, 0.1], 3)
    assert stop.value.exit_code == 143
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert states(study) == ["COMPLETE", "FAIL", "WAITING", "WAITING"] and study.trials[3].user_attrs["retry_of"] == 1


def test_the_objective_is_the_mean_over_the_last_evaluated_rounds_and_survives_a_resume():
    reported = []
    trial = SimpleNamespace(report=lambda value, step: reported.append((step, value)), should_prune=lambda: False)
    reporter = TrialReporter(trial, "val/acc_mean", last_rounds=3)
    run = SimpleNamespace(should_stop=False, stop_reason=None)
    for round, value in enumerate([0.1, 0.2, 0.4, 0.6], 1):
        reporter.on_round_end(run, SimpleNamespace(round=round, evaluated=True, scalars={"val/acc_mean": value}))
    reporter.on_round_end(run, SimpleNamespace(round=5, evaluated=False, scalars={}))
    assert reporter.objective() == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    again = TrialReporter(trial, "val/acc_mean", last_rounds=3)
    again.load_state_dict(reporter.state_dict())
    reported.clear()
    again.on_fit_start(run)  # a resumed trial reports its earlier rounds to the new trial
    assert reported == [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.6)] and again.objective() == reporter.objective()


# -- refusals ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "space, expected",
    [
        ({"params": {"algorithm.init_args.muu": {"type": "float", "low": 0.1, "high": 1}}}, "has no option 'muu'"),
        ({"params": {"federaton.rounds": {"type": "int", "low": 1, "high": 3}}}, "did you mean --federation.rounds"),
        ({"params": {"model.init_args.lr": {"type": "float", "low": 0.5, "high": 0.1}}}, "invalid distribution"),
        (
            {"params": {"model.init_args.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}},
            "invalid distribution",
        ),
        (
            {"params": {"model.init_args.lr": {"type": "normal", "low": 0.0, "high": 0.1}}},
            "type float, int or categorical",
        ),
        ({"params": {"model.init_args.lr": {"type": "float", "low": 0.01, "hihg": 0.1}}}, "no field 'hihg'"),
        (
            {"params": {"federation.eval_split": {"type": "categorical", "choices": ["val", "test"]}}},
            "cannot be searched",
        ),
        (
            {
                "fixed": {"algorithm": "fedavg"},
                "params": {"algorithm.init_args.mu": {"type": "float", "low": 0.1, "high": 1}},
            },
            "FedAvg has no option 'mu'",
        ),
    ],
)
def test_a_bad_space_is_one_line_before_any_trial(tmp_path, tiny_run_args, capsys, space, expected):
    path = write_space(tmp_path, {"fixed": {"algorithm": "fedprox"}, **space})
    assert cli.main(tune_args(tiny_run_args, path, 2)) == 2
    err = capsys.readouterr().err
    assert expected in err and str(path) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "tune-s").exists()


def test_selecting_on_the_test_split_is_refused_in_one_line(tmp_path, tiny_run_args, capsys):
    space = write_space(tmp_path, LR_SPACE)
    assert cli.main(tune_args(tiny_run_args, space, 2, "--metric", "test/acc_mean")) == 2
    err = capsys.readouterr().err.strip()
    assert "selecting on the test split is refused" in err and "val/acc_mean" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "tune-s").exists()


@pytest.mark.parametrize(
    "storage, expected",
    [("nodb://where", "cannot open it"), ("postgresql://user@localhost/optuna", "driver is not installed")],
)
def test_a_storage_that_cannot_be_opened_is_one_line(tmp_path, tiny_run_args, capsys, storage, expected):
    assert cli.main(tune_args(tiny_run_args, write_space(tmp_path, LR_SPACE), 2, "--storage", storage)) == 2
    err = capsys.readouterr().err.strip()
    assert f"--storage {storage}" in err and expected in err and len(err.splitlines()) == 1
    assert not (tmp_path / "tune-s").exists()


def test_a_study_made_for_another_metric_is_refused_rather_than_mixed(tmp_path, tiny_run_args, capsys):
    storage = f"sqlite:///{tmp_path / 'm.db'}"
    optuna.create_study(study_name="s", storage=storage, direction="maximize").set_user_attr("metric", "val/f1_mean")
    assert cli.main(tune_args(tiny_run_args, write_space(tmp_path, LR_SPACE), 2, "--storage", storage)) == 2
    assert "selects on val/f1_mean, not val/acc_mean" in capsys.readouterr().err


def test_a_searched_key_that_only_some_categorical_choices_have_needs_when(tmp_path, tiny_run_args, capsys):
    mu = {"type": "float", "low": 0.001, "high": 1.0, "log": True}
    space = {
        "params": {"algorithm": {"type": "categorical", "choices": ["fedavg", "fedprox"]}, "algorithm.init_args.mu": mu}
    }
    assert cli.main(tune_args(tiny_run_args, write_space(tmp_path, space), 2)) == 2
    assert "with algorithm=fedavg" in capsys.readouterr().err
    space["params"]["algorithm.init_args.mu"] = {**mu, "when": {"algorithm": "fedprox"}}
    loaded = tune_space.load(write_space(tmp_path, space))
    parser = cli.fit_parser()
    tune_space.check_keys(
        loaded,
        lambda a: parser.parse_args(["--config", str(REPO / "configs/quickstart.yaml"), *a]),
        lambda e: explain(str(e), parser._option_string_actions),
    )
    assert [sorted(c) for c in loaded.combinations()] == [["algorithm"]] * 2 + [
        ["algorithm", "algorithm.init_args.mu"]
    ] * 2


# -- shipped spaces and start-up -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((REPO / "configs" / "tune").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_space_is_valid_against_its_base_config_and_names_its_paper(path):
    space = tune_space.load(path)
    assert space.base is not None and space.base.is_file()
    parser = cli.fit_parser()
    tune_space.check_keys(
        space,
        lambda args: parser.parse_args(["--config", str(space.base), *args]),
        lambda error: explain(str(error), parser._option_string_actions),
    )
    comments = " ".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert comments.count('"') >= 2 and "section" in comments  # a paper's title in quotes, and where in it


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "tune").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_space_gives_most_clients_ten_validation_samples_or_more(path):
    """The tuning examples show a trade-off, not noise: a median client with fewer than 10 validation samples has
    an accuracy of tenths, and every trial would warn so."""
    space = tune_space.load(path)
    parser = cli.fit_parser()
    data_args = [a for key, value in space.fixed.items() if key.startswith("data.") for a in (f"--{key}", str(value))]
    data = parser.instantiate(parser.parse_args(["--config", str(space.base), *data_args])).data.build()
    assert statistics.median(data.val.size(k) for k in range(data.val.num_clients)) >= 10


def test_optuna_is_imported_only_when_tune_runs():
    for module in ("cli", "tune", "tune_space", "tune_study", "trial_reporter"):
        tree = ast.parse((REPO / "fedlight" / "run" / f"{module}.py").read_text())
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not any(name.startswith("optuna") for name in names), module


class StartedSearcher:
    """What `subprocess.Popen` gives `start_searchers` here: the other searcher's command, run to its end in this
    process with its environment as soon as it is started (the two processes of a real `--jobs 2` share the trials
    in some order; here this one runs them all). tests/integration/test_tune_processes.py shares a study between real
    ones."""

    started: list["StartedSearcher"] = []

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        StartedSearcher.started.append(self)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("os.environ", env)
            self.code = cli.main(command[command.index("tune") :])

    def wait(self) -> int:
        return self.code


def test_jobs_start_other_searchers_on_the_study_that_share_the_cores(tmp_path, tiny_run_args, monkeypatch, capsys):
    """`--jobs 2`: one other searcher (`--search_only`, its own sampler seed, told that two runs share the machine);
    every trial takes half of the usable cores; the study ends at the total and the final seeds run once, here."""
    from fedlight.engine.threads import usable_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(tune.subprocess, "Popen", StartedSearcher)
    StartedSearcher.started = []
    space = write_space(tmp_path, LR_SPACE)
    args = tune_args(
        tiny_run_args,
        space,
        2,
        "--federation.rounds",
        "1",
        "--last_rounds",
        "1",
        "--pruner",
        "none",
        "--jobs",
        "2",
        "--final_seeds",
        "1",
    )
    assert cli.main(args) == 0
    (other,) = StartedSearcher.started
    assert other.command[other.command.index("--sampler_seed") + 1] == "1"  # this one's seed is 0
    assert other.command[-4:] == ["--jobs", "1", "--search_only", "true"] and other.env["FEDLIGHT_PARALLEL_RUNS"] == "2"
    counted = tune_study.occupying(load(tmp_path).get_trials())
    assert len(counted) == 2 and all(t.state.name == "COMPLETE" for t in counted)
    for trial in counted:
        plan = json.loads((Path(trial.user_attrs["run_dir"]) / "summary.json").read_text())["plan"]
        assert plan["threads_from"] == f"{usable_cores()} usable cores shared by 2 processes"
    assert (tmp_path / "tune-s" / "best-s0" / "summary.json").is_file()
    assert "FEDLIGHT_PARALLEL_RUNS" not in os.environ  # this process's own setting put back


def test_each_other_searcher_runs_one_job_with_its_own_sampler_seed():
    argv = ["tune", "--config", "c.yaml", "--jobs", "3", "--sampler_seed", "7", "--trials", "9"]
    assert tune.searcher_arguments(argv, 2) == [
        "tune",
        "--config",
        "c.yaml",
        "--sampler_seed",
        "9",
        "--trials",
        "9",
        "--jobs",
        "1",
    ]
    assert tune.searcher_arguments(["tune", "--jobs=2", "--sampler_seed=null"], 1) == ["tune", "--jobs", "1"]
