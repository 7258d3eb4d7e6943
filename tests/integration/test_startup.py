"""What the command line answers before anything heavy loads: importing it, `list`, `--help`, `fit --help`, `tune
--help`, `sweep --help`, an unknown algorithm and typos outside the class sections import none of torch, Lightning,
scikit-learn, SciPy, W&B or Optuna (checked in a fresh interpreter), and `list` read from the source files names
exactly the classes that importing the packages finds."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

from fedlight.run import catalog
from fedlight.run.early_checks import check_fit_arguments

PROBE = """
import sys
from fedlight.run.cli import main
codes = []
for argv in {commands!r}:
    try:
        codes.append(main(argv))
    except SystemExit as stop:  # --help
        codes.append(stop.code)
heavy = [m for m in ("torch", "lightning", "sklearn", "scipy", "wandb", "optuna") if m in sys.modules]
print(",".join(heavy) or "NOTHING_HEAVY", *codes)
"""


def test_list_help_and_typos_outside_class_sections_load_nothing_heavy(tmp_path):
    """Every command a user types before a run, one after another in one fresh interpreter: none imports torch (nor
    Lightning, scikit-learn, ...), and each answers as it should (0, or 2 for a refused typo)."""
    config, typo = tmp_path / "run.yaml", tmp_path / "typo.yaml"
    config.write_text(
        "data:\n  class_path: fedlight.datamodules.DigitsFederated\nmodel:\n  class_path: fedlight.models.Classifier\n"
    )
    typo.write_text("federation:\n  roundz: 2\n")
    commands = [
        ["list"],
        ["--help"],
        ["fit", "--help"],
        ["fit", "--federaton.rounds", "3", "--config", str(config)],
        ["fit", "--config", str(config), "--config", str(typo)],
        ["fit", "--algorithm", "fedprxo"],
        ["tune", "--help"],
        ["sweep", "--help"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(commands=commands)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    marker, *codes = done.stdout.strip().splitlines()[-1].split()
    assert marker == "NOTHING_HEAVY", done.stdout + done.stderr
    assert [int(c) for c in codes] == [0, 0, 0, 2, 2, 2, 0, 0], done.stdout + done.stderr
    assert "did you mean --federation.rounds?" in done.stderr and "did you mean federation.rounds?" in done.stderr
    assert "unknown algorithm 'fedprxo' (did you mean 'fedprox'?)" in done.stderr


def test_importing_the_command_line_loads_nothing_heavy():
    probe = "import sys, fedlight.run.cli\nprint([m for m in ('torch', 'lightning', 'sklearn') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_run_that_names_no_algorithm_is_fedavg(tmp_path, tiny_run_args):
    """The base class is the default algorithm, set once a run is parsed (not when the parser is built)."""
    import yaml

    from fedlight.run.cli import main

    assert main(tiny_run_args + ["--federation.rounds", "1", "--run_name", "plain"]) == 0
    saved = yaml.safe_load((tmp_path / "plain" / "config.yaml").read_text())
    assert saved["algorithm"]["class_path"] in ("fedlight.Algorithm", "fedlight.plugin.algorithm.Algorithm")


# -- the catalog against importing the packages --------------------------------------------------------------
def imported_classes(package: str, base: type) -> dict[str, str]:
    """The concrete classes `package` exports that derive from `base` (not `base` itself), found by importing."""
    pkg = importlib.import_module(package)
    found = {}
    for name in [n for n in vars(pkg) if not n.startswith("_")]:
        obj = getattr(pkg, name)
        if inspect.isclass(obj) and issubclass(obj, base) and obj is not base and not inspect.isabstract(obj):
            found[name] = f"{obj.__module__}.{obj.__qualname__}"
    return found


def test_the_catalog_read_from_source_matches_importing_the_packages():
    import lightning as L
    from torch import nn

    from fedlight.datamodules.base import FederatedDataModule
    from fedlight.datamodules.partition import PartitionScheme

    listed = catalog.components()
    modules = imported_classes("fedlight.models", L.LightningModule)
    assert listed["models"] == modules
    assert listed["networks"] == {
        k: v for k, v in imported_classes("fedlight.models", nn.Module).items() if k not in modules
    }
    assert listed["data modules"] == imported_classes("fedlight.datamodules", FederatedDataModule)
    assert listed["partition schemes"] == imported_classes("fedlight.datamodules", PartitionScheme)
    for found in listed.values():
        for path in found.values():
            module, _, name = path.rpartition(".")
            own = (
                inspect.getdoc(getattr(importlib.import_module(module), name))
                if getattr(importlib.import_module(module), name).__doc__
                else None
            )
            shown = catalog.describe(path)
            assert (shown == "") == (own is None), path
            if own:
                assert " ".join(own.split("\n\n")[0].split()).startswith(shown.rstrip(" .").removesuffix(" ...")), path


def test_abstract_classes_and_bases_are_left_out():
    listed = catalog.components()
    names = {name for found in listed.values() for name in found}
    assert {"TorchvisionFederated", "UCITableFederated", "FederatedDataModule", "PartitionScheme"}.isdisjoint(names)


# -- early checks --------------------------------------------------------------------------------------------
OPTIONS = [
    "--config",
    "--seed",
    "--federation",
    "--federation.rounds",
    "--logger.wandb",
    "--data",
    "--model",
    "--algorithm",
]


def test_a_plugin_hidden_by_a_folder_of_its_name_in_the_current_directory_is_named_with_the_fix(tmp_path, monkeypatch):
    """`pip install -e ./mypkg`, then `python -m fedlight list` beside `mypkg/`: Python finds the project folder (a
    namespace package) before the installed package, and the class cannot be read. The line says which folder hid
    it; a class missing from a package found elsewhere gets no such guess."""
    (tmp_path / "mypkg" / "mypkg").mkdir(parents=True)
    (tmp_path / "mypkg" / "pyproject.toml").write_text("[project]\nname = 'mypkg'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # what `python -m` puts first: the current directory
    shown = catalog.describe("mypkg.algorithms.MyAlgorithm")
    assert shown.startswith("(cannot read: no class MyAlgorithm in mypkg.algorithms")
    assert f"{tmp_path / 'mypkg'} in the current directory hides any installed package named 'mypkg'" in shown
    assert "hides" not in catalog.describe("fedlight.algorithms.NoSuchAlgorithm")


def test_an_unknown_option_outside_the_class_sections_is_refused_with_the_one_meant():
    with pytest.raises(ValueError, match=r"^unknown option --federation.roundz \(did you mean --federation.rounds\?\)"):
        check_fit_arguments(["--federation.roundz=3"], OPTIONS)
    with pytest.raises(ValueError, match=r"unknown option --sed \(did you mean --seed\?\)"):
        check_fit_arguments(["--sed", "1"], OPTIONS)


def test_options_of_the_class_sections_are_left_to_the_parser():
    check_fit_arguments(
        [
            "--data.init_args.anything",
            "1",
            "--model.whatever",
            "2",
            "--algorithm.init_args.x",
            "3",
            "--seed",
            "4",
            "--",
            "--not-an-option",
        ],
        OPTIONS,
    )


def test_config_file_keys_are_checked_top_level_and_in_plain_sections(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("seed: 1\nfederation:\n  rounds: 2\ndata:\n  init_args: {whatever: 1}\n")
    check_fit_arguments(["--config", str(config)], OPTIONS)
    config.write_text("federation:\n  rouns: 2\n")
    with pytest.raises(ValueError, match=r"unknown config key federation.rouns \(did you mean federation.rounds\?\)"):
        check_fit_arguments([f"--config={config}"], OPTIONS)
