"""`python -m fedlight fit --config run.yaml` and `python -m fedlight list`, on jsonargparse in LightningCLI's
conventions: `--print_config`, dotted overrides (`--algorithm.init_args.mu 0.01`), type-checked configs
that stop on an unknown key or a wrong type before any work starts."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_loader
from rich.console import Console

from fedlight import registry
from fedlight.algorithm import Algorithm
from fedlight.federation import Federation, FederationConfig
from fedlight.recorder import LoggerConfig
from fedlight.runner import fit

PARSER_MODE = "fedlight_yaml"
set_loader(PARSER_MODE, lambda text: registry.resolve_class_paths(registry.check_dotted_keys(yaml.safe_load(text))),
           (yaml.YAMLError,))


def fit_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Run one federated training.", parser_mode=PARSER_MODE)
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML run config")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, the model and every round")
    parser.add_argument("--output_dir", type=str, default="runs", help="folder holding the run folders")
    parser.add_argument("--run_name", type=str | None, default=None, help="run folder name (default: made up)")
    parser.add_argument("--resume", type=str | None, default=None, help="a run folder to continue")
    parser.add_argument("--checkpoint_every", type=int, default=1, help="rounds between checkpoints")
    parser.add_subclass_arguments(L.LightningDataModule, "data", required=True)
    parser.add_subclass_arguments(L.LightningModule, "model", required=True)
    parser.add_subclass_arguments(Algorithm, "algorithm", default={"class_path": "fedlight.algorithm.Algorithm"})
    parser.add_class_arguments(FederationConfig, "federation")
    parser.add_class_arguments(LoggerConfig, "logger")
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fedlight", description="Clustered and personalized federated learning.",
                            parser_mode=PARSER_MODE)
    commands = parser.add_subcommands(dest="command")
    parser.fit_parser = fit_parser()  # kept for dumping and instantiating the `fit` section
    commands.add_subcommand("fit", parser.fit_parser, help="run one federated training")
    commands.add_subcommand("list", ArgumentParser(description="List algorithms, data and models."),
                            help="list algorithms, data modules and models, entry points included")
    return parser


def expand_short_names(argv: list[str]) -> list[str]:
    """`--algorithm fedprox` -> the entry point's class path (YAML files get the same via the loader)."""
    names = registry.short_names()
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("--algorithm", "--algorithm.class_path") and i + 1 < len(out):
            out[i + 1] = names.get(out[i + 1], out[i + 1])
        elif arg.startswith(("--algorithm=", "--algorithm.class_path=")):
            key, value = arg.split("=", 1)
            out[i] = f"{key}={names.get(value, value)}"
    return out


def run_fit(parser: ArgumentParser, cfg: Namespace, console: Console | None = None) -> dict[str, Any]:
    """Instantiate the config's classes (after seeding, so the model's initial weights follow the seed) and
    run; the resolved config is saved in the run folder."""
    console = console or Console()
    torch.manual_seed(cfg.seed)
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"--resume {run_dir}: no such run folder")
    else:
        name = cfg.run_name or f"{cfg.algorithm.class_path.rsplit('.', 1)[-1].lower()}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.output_dir) / name
        run_dir.mkdir(parents=True, exist_ok=cfg.run_name is not None)
    config_text = parser.dump(cfg, skip_none=False)
    (run_dir / "config.yaml").write_text(config_text)
    init = parser.instantiate_classes(cfg)
    federation = Federation(init.data, init.model, init.algorithm, init.federation, seed=cfg.seed)
    return fit(federation, run_dir, yaml.safe_load(config_text), init.logger, run_dir.name,
               cfg.checkpoint_every, resume=bool(cfg.resume), console=console)


def print_components(console: Console) -> None:
    for kind, found in registry.components().items():
        console.print(f"[bold]{kind}[/bold]")
        for name, path in sorted(found.items()):
            console.print(f"  {name:<28} {path}")


def main(argv: list[str] | None = None) -> int:
    registry.short_names.cache_clear()
    argv = expand_short_names(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    console = Console()
    try:
        cfg = parser.parse_args(argv)
    except ValueError as error:  # raised by the config loader (jsonargparse reports its own errors itself)
        console.print(f"[red]fedlight: error:[/red] {error}")
        return 2
    if cfg.command == "list":
        print_components(console)
        return 0
    try:
        run_fit(parser.fit_parser, cfg.fit, console)
    except (FileNotFoundError, ValueError) as error:
        if os.environ.get("FEDLIGHT_DEBUG"):
            raise
        console.print(f"[red]fedlight: error:[/red] {error}")
        return 2
    return 0
