"""`python -m fedlight fit --config run.yaml`, `fit --resume RUN`, `list`, `report RUN [RUN ...]`,
`sweep --config sweep.yaml` and `tune --config run.yaml --space space.yaml --trials N`, on jsonargparse in
LightningCLI's conventions: `--print_config`, dotted overrides (`--algorithm.init_args.mu 0.01`), type-checked
configs that stop on an unknown key or a wrong type before any work starts.

Every refusal is one line on stderr, cause first, and leaves no run folder behind: the folder is made only once
the data, the model and the algorithm are set up.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, Namespace, set_loader
from rich.console import Console

from fedlight.aggregators.config import AggregatorConfig, AttackConfig, PrivacyConfig, ServerOptimizerConfig
from fedlight.run.config_upgrade import upgraded
from fedlight.engine.config import FederationConfig
from fedlight.engine.run_errors import ClientStateDiskFull, RoundDiverged
from fedlight.system.config import SystemConfig
from fedlight.run import catalog, failures, registry, termination, tune
from fedlight.run.callbacks import Callback, RunInterrupted
from fedlight.run.config_errors import explain
from fedlight.run.console import make_console
from fedlight.run.early_checks import check_fit_arguments
from fedlight.run.lazy_types import FederatedAlgorithm, LightningDataModule, LightningModule
from fedlight.run.wandb_logger import LoggerConfig

PARSER_MODE = "fedlight_yaml"
set_loader(
    PARSER_MODE,
    lambda text: registry.resolve_class_paths(registry.check_dotted_keys(yaml.safe_load(text))),
    (yaml.YAMLError,),
)
STRICT: dict[str, Any] = {"parser_mode": PARSER_MODE, "exit_on_error": False, "allow_abbrev": False}
#: settings a resumed run may change: how long it runs, where it logs and over how many processes (the last moves
#: numbers by float rounding at most), not what it computes
RESUMABLE = (
    "federation.rounds",
    "checkpoint_every",
    "logger.",
    "federation.devices",
    "federation.num_nodes",
    "federation.strategy",
)
#: settings that name the run rather than configure it
UNCOMPARED = ("config", "resume", "run_name", "output_dir")


def fit_parser() -> ArgumentParser:
    """The parser of `fedlight fit`: the run's options and the data, model, algorithm, federation, aggregator, attack,
    privacy, server optimizer, system, logger and callbacks sections."""
    parser = ArgumentParser(description="Run one federated training.", **STRICT)
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML run config")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, the model and every round")
    parser.add_argument("--output_dir", type=str, default="runs", help="folder holding the run folders")
    parser.add_argument("--run_name", type=str | None, default=None, help="run folder name (default: made up)")
    parser.add_argument(
        "--resume",
        type=str | None,
        default=None,
        help="a run folder to continue with its own config (only --federation.rounds may change)",
    )
    parser.add_argument("--checkpoint_every", type=int, default=1, help="rounds between checkpoints")
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    parser.add_subclass_arguments(LightningModule, "model", required=True)
    parser.add_subclass_arguments(FederatedAlgorithm, "algorithm", required=False)  # default: `with_base_algorithm`
    parser.add_class_arguments(FederationConfig, "federation")
    parser.add_class_arguments(AggregatorConfig, "aggregator")
    parser.add_argument(
        "--attack",
        type=AttackConfig | None,
        default=None,
        help="malicious clients: attack.kind, attack.fraction, ... (fedlight.aggregators.attacks)",
    )
    parser.add_argument(
        "--privacy",
        type=PrivacyConfig | None,
        default=None,
        help="client-level DP: privacy.noise_multiplier, privacy.clip, privacy.delta, ... "
        "(fedlight.aggregators.privacy)",
    )
    parser.add_argument(
        "--server_optimizer",
        type=ServerOptimizerConfig | None,
        default=None,
        help="a server optimizer for any method: server_optimizer.kind (sgd, momentum, adam, yogi, "
        "adagrad), server_optimizer.lr, ... (fedlight.aggregators.server_optimizer)",
    )
    parser.add_argument(
        "--system",
        type=SystemConfig | None,
        default=None,
        help="the clients' devices: system.compute, system.availability, system.deadline_s, "
        "system.selection, ... (fedlight.system.config)",
    )
    parser.add_class_arguments(LoggerConfig, "logger")
    parser.add_argument(
        "--callbacks",
        type=list[Callback] | None,
        default=None,
        help="your own run callbacks by class path, e.g. fedlight.EarlyStopping (docs/architecture.md)",
    )
    return parser


#: the algorithm of a run that names none: the base class, FedAvg
BASE_ALGORITHM = {"class_path": "fedlight.plugin.algorithm.Algorithm"}


def with_base_algorithm(parser: ArgumentParser) -> None:
    """Make FedAvg (the base class) the algorithm of a run that names none. Set only once a run's config is parsed:
    jsonargparse imports a default class to resolve it, and the base class loads torch and scikit-learn, which
    `--help`, `list` and a one-line config error do not need."""
    parser.set_defaults(algorithm=BASE_ALGORITHM)


class CommandParser(ArgumentParser):
    """The command line's parser, which keeps its `fit` and `tune` sections' parsers."""

    fit_parser: ArgumentParser  # kept for dumping and instantiating the `fit` section
    tune_parser: ArgumentParser


def build_parser() -> CommandParser:
    """The command line's parser: the subcommands `fit`, `list`, `report`, `sweep` and `tune`, keeping the `fit` and
    `tune` parsers on it."""
    parser = CommandParser(prog="fedlight", description="Clustered and personalized federated learning.", **STRICT)
    commands = parser.add_subcommands(dest="command")
    parser.fit_parser = fit_parser()
    commands.add_subcommand("fit", parser.fit_parser, help="run one federated training")
    list_parser = ArgumentParser(description="List algorithms, data and models.", **STRICT)
    list_parser.add_argument(
        "--compatibility",
        action="store_true",
        help="each algorithm against privacy, FedBuff, robust rules and attacks, deadlines and "
        "newcomers: runs (and what each does) or refused (and why)",
    )
    commands.add_subcommand("list", list_parser, help="list algorithms, data modules and models, entry points included")
    commands.add_subcommand("report", report_parser(), help="one HTML page comparing runs (figures and a table)")
    sweep_parser = ArgumentParser(
        description="Run every algorithm x grid point x seed of a sweep file, then its report.", **STRICT
    )
    sweep_parser.add_argument("--config", type=str, required=True, help="a sweep YAML (see configs/sweeps/)")
    sweep_parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once, each share of them in a process of its own, the cores shared "
        "among them (default 1: one after another in this process)",
    )
    sweep_parser.add_argument(
        "--part",
        type=str,
        default=None,
        help="I/N: only runs I, I+N, I+2N, ... and no report (what each --jobs process runs)",
    )
    commands.add_subcommand(
        "sweep", sweep_parser, help="run a grid of algorithms x settings x seeds and write the report"
    )
    parser.tune_parser = tune.add_arguments(fit_parser())
    commands.add_subcommand(
        "tune", parser.tune_parser, help="search hyperparameters on validation data with Optuna (configs/tune/)"
    )
    return parser


def report_parser() -> ArgumentParser:
    """The parser of `fedlight report`: the run folders, `--output`, `--overwrite`, `--title` and `--wandb`."""
    parser = ArgumentParser(
        description="One self-contained HTML page comparing runs; the runs of a configuration "
        "(its seeds) are shown as mean ± std.",
        **STRICT,
    )
    parser.add_argument(
        "runs", nargs="+", type=str, help="run folders written by `fedlight fit`, or folders holding them at any depth"
    )
    parser.add_argument(
        "--output",
        type=str | None,
        default=None,
        help="the HTML file to write (default: report.html in the folder that holds the runs)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the output file if it exists")
    parser.add_argument("--title", type=str, default="fedlight report", help="the page's title")
    parser.add_argument(
        "--wandb",
        type=str | None,
        default=None,
        help="ENTITY/PROJECT: also build a W&B Report of these runs there (online only; needs the wandb-report extra)",
    )
    return parser


def expand_short_names(argv: list[str]) -> list[str]:
    """`--algorithm fedprox` (and `--algorithm.help fedprox`) -> the entry point's class path (YAML files get the
    same via the loader)."""
    options = ("--algorithm", "--algorithm.class_path", "--algorithm.help")  # the options naming an algorithm
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in options and i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = registry.algorithm_path(out[i + 1])
        elif arg.startswith(tuple(f"{option}=" for option in options)):
            key, value = arg.split("=", 1)
            out[i] = f"{key}={registry.algorithm_path(value)}"
    return out


def option_value(argv: list[str], option: str) -> str | None:
    """The value given to `option` (as `--option value` or `--option=value`), or None."""
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def with_saved_config(argv: list[str]) -> list[str]:
    """`fit --resume RUN ...` reads RUN's own config.yaml first; what follows on the command line is checked
    against it once parsed (`check_resume`)."""
    run = option_value(argv, "--resume")
    if not argv or argv[0] != "fit" or run is None:
        return argv
    saved = Path(run) / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(
            f"--resume {run}: not a run folder (no {saved}); give the folder a run wrote, e.g. runs/<name>"
        )
    config = yaml.safe_load(saved.read_text())
    current = upgraded(config)  # a run written before a setting moved: its config in the current format
    return ["fit", "--config", str(saved) if current is config else yaml.safe_dump(current), *argv[1:]]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of a nested dict by dotted key ({'a': {'b': 1}} -> {'a.b': 1}), to compare two configs setting by
    setting."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def check_resume(saved: dict[str, Any], given: dict[str, Any], defaults: dict[str, Any] | None = None) -> None:
    """Refuse a resumed run whose settings differ from the run's own in anything but the number of rounds and
    where it logs: it would continue a different experiment from the checkpoint of this one. A setting the run's
    config does not have (it was written before the setting existed) is accepted at its default (`defaults`)."""
    before, after = flatten(saved), flatten(given)
    known = flatten(defaults or {})
    before.update({key: known[key] for key in after if key not in before and key in known})
    changed = [
        key
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key) and not key.startswith(RESUMABLE + UNCOMPARED)
    ]
    replaced = tuple(key[: -len("class_path")] for key in changed if key.endswith("class_path"))
    changed = [key for key in changed if key.endswith("class_path") or not key.startswith(replaced)]
    if changed:
        details = "; ".join(f"{key} is {before.get(key)!r} in the run, {after.get(key)!r} given" for key in changed[:3])
        raise ValueError(
            f"--resume continues the run with its own settings, and {details}: only federation.rounds "
            "may change (to run more rounds); start a new run for other settings"
        )


def new_run_dir(cfg: Namespace) -> Path:
    """The folder of a new run (not made yet): --run_name, or a made-up name that no folder has yet."""
    output = Path(cfg.output_dir)
    if cfg.run_name:
        run_dir = output / cfg.run_name
        if run_dir.exists():
            raise ValueError(
                f"{run_dir} exists already: continue that run with --resume {run_dir}, or choose another --run_name"
            )
        return run_dir
    base = f"{cfg.algorithm.class_path.rsplit('.', 1)[-1].lower()}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir, n = output / base, 1
    while run_dir.exists():
        n += 1
        run_dir = output / f"{base}-{n}"
    return run_dir


def run_fit(
    parser: ArgumentParser, cfg: Namespace, console: Console | None = None, callbacks: list[Callback] | None = None
) -> dict[str, Any]:
    """Set everything up (after seeding, so the model's initial weights follow the seed), then run: the run folder
    and its config.yaml are written only once the run is accepted (`fedlight.run.runner.fit`). `callbacks` join the
    config's own (tune's trial reporter)."""
    import torch  # the heavy modules load only once a run is accepted by the parser

    from fedlight.engine.federation import Federation
    from fedlight.run.runner import fit

    console = console or make_console()
    torch.manual_seed(cfg.seed)
    resume = cfg.resume is not None
    if resume:
        run_dir = Path(cfg.resume)
        saved = upgraded(yaml.safe_load((run_dir / "config.yaml").read_text()))
        defaults = yaml.safe_load(parser.dump(parser.get_defaults(), skip_none=False, skip_check=True))
        check_resume(saved, yaml.safe_load(parser.dump(cfg, skip_none=False)), defaults)
    else:
        run_dir = new_run_dir(cfg)
    cfg.run_name, cfg.resume = run_dir.name, None  # the saved config names its run and starts it afresh
    config_text = parser.dump(cfg, skip_none=False)
    showing = (
        console.status(f"setting up {run_dir.name}: data, model, algorithm")
        if console.is_terminal
        else contextlib.nullcontext()
    )  # a terminal sees the set-up happen; piped output stays one line per round
    with showing:
        init = parser.instantiate_classes(cfg)
        federation = Federation(
            init.data,
            init.model,
            init.algorithm,
            init.federation,
            seed=cfg.seed,
            attack=init.attack,
            privacy=init.privacy,
            system=init.system,
            aggregator=init.aggregator,
            server_optimizer=init.server_optimizer,
        )
    # spread over processes, every one runs this function: the first names the run (a made-up name holds the
    # time) and alone writes its folder
    run_dir, config_text = federation.collective.broadcast((run_dir, config_text))
    return fit(
        federation,
        run_dir,
        config_text,
        init.logger,
        run_dir.name,
        cfg.checkpoint_every,
        resume=resume,
        console=console,
        callbacks=[*(init.callbacks or []), *(callbacks or [])],
    )


def print_components(console: Console) -> None:
    """`fedlight list`: under each kind, one line per class a config can name: its name (an algorithm's short
    name), its class path and the first sentence of its docstring."""
    for kind, found in catalog.components().items():
        console.print(f"[bold]{kind}[/bold]")
        for name, path in sorted(found.items()):
            console.print(f"  {name:<24} {path:<50} {catalog.describe(path)}".rstrip(), markup=False, highlight=False)


def print_compatibility(console: Console) -> None:
    """`fedlight list --compatibility`: the table `fedlight.run.compatibility` made by running every algorithm with
    each extension, one block per algorithm."""
    from fedlight.run.compatibility_table import COLUMNS, ROWS

    for name, cells in ROWS.items():
        console.print(f"[bold]{name}[/bold]")
        for column in COLUMNS:
            status, note = cells[column]
            console.print(f"  {column:<16} {status:<8} {note}", markup=False, highlight=False)


@contextlib.contextmanager
def one_line_warnings(errors: Console) -> Iterator[None]:
    """Warnings as 'fedlight: warning: ...' lines instead of Python's file:line form."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        errors.print(f"fedlight: warning: {message}")

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None, on_parsed: Callable[[], Any] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv); `on_parsed` is called once the arguments are read (and the
    config's classes loaded), before anything runs (`python -m fedlight` restores Ctrl-C's handling there)."""
    registry.short_names.cache_clear()
    console, errors = make_console(), Console(stderr=True, soft_wrap=True, highlight=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        argv = with_saved_config(expand_short_names(argv))
        if argv[:1] == ["fit"]:  # before the parser imports the config's classes
            check_fit_arguments(argv[1:], parser.fit_parser._option_string_actions)
        if argv[:1] in (["fit"], ["tune"]) and not {"-h", "--help"} & set(argv):
            with_base_algorithm(parser.fit_parser if argv[0] == "fit" else parser.tune_parser)
        with (
            console.status("reading the config")
            if console.is_terminal and argv[:1] == ["fit"]
            else contextlib.nullcontext()
        ):  # the config's classes load here (Lightning: seconds)
            cfg = parser.parse_args(argv)
    except ArgumentError as error:
        options = parser.fit_parser._option_string_actions
        errors.print(f"fedlight: error: {explain(str(error), options)}")
        return 2
    except (FileNotFoundError, ValueError) as error:  # from the config loader and the checks above
        errors.print(f"fedlight: error: {str(error).splitlines()[0]}")
        return 2
    if on_parsed is not None:
        on_parsed()
    if cfg.command == "list":
        print_compatibility(console) if cfg.list.compatibility else print_components(console)
        return 0
    try:
        with termination.sigterm_as_interrupt(), one_line_warnings(errors):  # SIGTERM stops a run as Ctrl-C does
            if cfg.command == "report":
                run_report(cfg.report, console)
            elif cfg.command == "sweep":
                return run_sweep(cfg.sweep.config, console, errors, cfg.sweep.jobs, cfg.sweep.part)
            elif cfg.command == "tune":
                return run_tune(cfg.tune, parser.fit_parser, console, errors, argv)
            else:
                run_fit(parser.fit_parser, cfg.fit, console)
    except RunInterrupted as stop:
        if not stop.main_process:  # the first process reports; the others end quietly, so a launcher watching
            return 0  # them (Fabric's) does not kill the first before it has reported
        saved = f"rounds 1-{stop.saved_round} are saved" if stop.saved_round else "no round had finished"
        errors.print(
            f"fedlight: {stopped(stop)}; {saved}. Continue with: python -m fedlight fit --resume {stop.run_dir}"
        )
        return termination.exit_code(stop)
    except KeyboardInterrupt as interrupt:
        errors.print(f"fedlight: {stopped(interrupt)} before the first round; nothing was saved")
        return termination.exit_code(interrupt)
    except (RoundDiverged, ClientStateDiskFull) as error:  # one line: what stopped the run, the checkpoint kept
        if os.environ.get("FEDLIGHT_DEBUG"):
            raise
        if not failures.from_follower(error):  # the first of several processes reports it
            errors.print(f"fedlight: error: {'; '.join([str(error), *failures.notes(error)])}")
        return 1
    except (FileNotFoundError, ValueError) as error:  # CheckpointError is a ValueError
        if os.environ.get("FEDLIGHT_DEBUG"):
            raise
        if failures.from_follower(error):  # the first of several processes reports it
            return 2
        message = str(error)  # a section's own check, reached through a union (attack, privacy), comes nested
        errors.print(f"fedlight: error: {explain(message) if chr(10) in message else message}")
        for note in getattr(error, "__notes__", []):  # a run that failed after its first checkpoint: how to go on
            errors.print(note)
        return 2
    return 0


def stopped(stop: BaseException) -> str:
    """'interrupted' (Ctrl-C) or 'terminated (SIGTERM)', for the line that says how to continue."""
    return "terminated (SIGTERM)" if termination.terminated(stop) else "interrupted"


def run_tune(
    cfg: Namespace, fit_parser: ArgumentParser, console: Console, errors: Console, argv: list[str] | None = None
) -> int:
    """Search on validation data with Optuna (`fedlight.run.tune`); Ctrl-C or SIGTERM leaves a study that resumes.
    `argv`: the command line, which the other `--jobs` processes repeat."""
    try:
        tune.run(cfg, fit_parser, run_fit, console, argv)
    except tune.TuneInterrupted as stop:
        errors.print(f"fedlight: {stop}")
        return stop.exit_code
    return 0


def run_sweep(config: str, console: Console, errors: Console, jobs: int = 1, part: str | None = None) -> int:
    """Run a sweep file's runs (`jobs` at once), then its report; Ctrl-C or SIGTERM says how to continue."""
    from fedlight.run import sweep

    if jobs < 1:
        raise ValueError(f"--jobs must be 1 or more (runs at once), got {jobs}")
    try:
        sweep.run(config, main, console, jobs, sweep.parse_part(part) if part else None)
    except sweep.SweepInterrupted as stop:
        errors.print(f"fedlight: {stop}")
        return stop.exit_code
    return 0


def run_report(cfg: Namespace, console: Console) -> None:
    """Write the HTML report (and the W&B Report when asked), saying where it went."""
    from fedlight.reports import report, wandb_report
    from fedlight.reports.runs import plural
    from fedlight.reports.tables import console_table

    started = time.perf_counter()
    output, groups = report.write(cfg.runs, cfg.output, cfg.title, overwrite=cfg.overwrite)
    runs = plural(sum(len(g.runs) for g in groups), "run")
    console.print(console_table(groups))
    console.print(
        f"report of {runs} in {plural(len(groups), 'configuration')}: {output} ({time.perf_counter() - started:.1f} s)"
    )
    if cfg.wandb:
        console.print(wandb_report.build(cfg.wandb, groups, cfg.title), soft_wrap=True, highlight=False)
