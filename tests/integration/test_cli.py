"""The command line: runs, artefacts, config errors, listing and entry-point plugins."""

import json
import textwrap

import numpy as np
import pytest

from fedlight.run.cli import main


def run_dir(tmp_path):
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return folder


def test_fit_leaves_every_artefact_in_the_run_folder(tmp_path, tiny_run_args, capsys):
    args = [a if a != "false" else "true" for a in tiny_run_args]  # W&B on (offline in tests)
    assert main(args) == 0
    folder = run_dir(tmp_path)
    for name in ("metrics.csv", "clients.csv", "summary.json", "config.yaml", "checkpoints/last.ckpt"):
        assert (folder / name).is_file(), name
    assert list((folder / "wandb").glob("offline-run-*")), "no offline W&B run folder"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 3 and 0 <= summary["test/acc_worst"] <= summary["test/acc_mean"] <= 1
    out = capsys.readouterr().out
    assert "round    3" in out and "worst client" in out


def test_same_seed_same_numbers(tmp_path, tiny_run_args):
    sums = []
    for name in ("a", "b"):
        main(tiny_run_args + ["--run_name", name])
        sums.append(json.loads((tmp_path / name / "summary.json").read_text()))
        sums[-1].pop("wall_time_s"), sums[-1].pop("run")
    assert sums[0] == sums[1]


def test_a_different_seed_gives_other_numbers(tmp_path, tiny_run_args):
    for name, seed in (("a", "0"), ("b", "1")):
        main(tiny_run_args + ["--run_name", name, "--seed", seed])
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("a", "b"))
    assert a["test/acc_mean"] != b["test/acc_mean"] or a["test/loss_mean"] != b["test/loss_mean"]


def test_unknown_key_stops_before_any_work_naming_the_key(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.roundz", "3"]) == 2
    err = capsys.readouterr().err
    assert "--federation.roundz" in err and "did you mean --federation.rounds?" in err
    assert len(err.strip().splitlines()) == 1 and "usage" not in err
    assert not any(tmp_path.iterdir())


def test_unknown_key_in_a_config_file_is_named(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(
        textwrap.dedent("""\
        data: {class_path: fedlight.datamodules.DigitsFederated, init_args: {num_clients: 4, num_clientz: 3}}
        model: {class_path: fedlight.models.Classifier, init_args: {network: fedlight.models.SmallCNN}}
        """)
    )
    assert main(["fit", "--config", str(config), "--output_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "data.init_args.num_clientz" in err and "num_clients" in err and len(err.strip().splitlines()) == 1


def test_wrong_type_is_named(tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.rounds", "many"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fedlight: error: federation.rounds: expected an integer, got 'many'"


def test_missing_data_file_names_the_path_and_the_fix(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "data.npz"
    code = main(
        [
            "fit",
            "--data",
            "fedlight.datamodules.NpzFederated",
            "--data.path",
            str(missing),
            "--model",
            "fedlight.models.Classifier",
            "--model.network",
            "fedlight.models.MLP",
            "--model.network.init_args.input_dim",
            "4",
            "--model.network.init_args.hidden",
            "[8]",
            "--model.network.init_args.num_classes",
            "2",
            "--logger.wandb",
            "false",
            "--output_dir",
            str(tmp_path / "runs"),
        ]
    )
    err = capsys.readouterr().err.replace("\n", "")
    assert code == 2 and str(missing) in err and "numpy.savez" in err


def test_npz_data_runs(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(120, 4)).astype("float32"), y=rng.integers(0, 2, 120))
    assert (
        main(
            [
                "fit",
                "--data",
                "fedlight.datamodules.NpzFederated",
                "--data.path",
                str(tmp_path / "d.npz"),
                "--data.num_clients",
                "3",
                "--model",
                "fedlight.models.Classifier",
                "--model.network",
                "fedlight.models.MLP",
                "--model.network.init_args.input_dim",
                "4",
                "--model.network.init_args.hidden",
                "[8]",
                "--model.network.init_args.num_classes",
                "2",
                "--federation.rounds",
                "1",
                "--logger.wandb",
                "false",
                "--output_dir",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )


def test_print_config_shows_resolved_defaults(tiny_run_args, capsys):
    with pytest.raises(SystemExit):
        main(tiny_run_args + ["--algorithm", "fedprox", "--algorithm.init_args.mu", "0.25", "--print_config"])
    out = capsys.readouterr().out
    assert "fedlight.algorithms.fedprox.FedProx" in out and "mu: 0.25" in out and "local_epochs: 1" in out


def test_list_shows_algorithms_data_and_models(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("fedavg", "fedprox", "local", "DigitsFederated", "Rotations", "Classifier", "SmallCNN"):
        assert name in out, name


PLUGIN = '''
from fedlight.plugin.algorithm import Algorithm


class HalfStep(Algorithm):
    """Moves the global model halfway to the clients' average."""

    def __init__(self, step: float = 0.5) -> None:
        super().__init__()
        self.step = step
        self.rounds_seen = 0

    def aggregate(self, round, updates):
        old = self.models.clone()
        super().aggregate(round, updates)
        self.models = old + self.step * (self.models - old)
        self.rounds_seen += 1
'''


def install_plugin(site, name: str):
    """`site` holding the PLUGIN module as `<name>_plugin`, installed the way pip installs one (a module plus a
    dist-info folder whose entry point names the algorithm `name`)."""
    (site / f"{name}_plugin").mkdir(parents=True)
    (site / f"{name}_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / f"{name}_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fedlight.algorithms]\n{name} = {name}_plugin:HalfStep\n")
    return site


def test_an_installed_plugin_is_found_by_its_entry_point_and_runs(tmp_path, tiny_run_args, monkeypatch, capsys):
    """A separate package, installed the way pip installs one (a module plus a dist-info folder with its
    entry points), adds an algorithm that the CLI lists and runs by its short name."""
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", "halfstep")))
    assert main(["list"]) == 0
    assert "halfstep" in capsys.readouterr().out
    args = [a for a in tiny_run_args if a != str(tmp_path)] + [str(tmp_path / "runs")]
    assert main(args + ["--algorithm", "halfstep", "--algorithm.init_args.step", "0.25", "--run_name", "p"]) == 0
    config = (tmp_path / "runs" / "p" / "config.yaml").read_text()
    assert "halfstep_plugin.HalfStep" in config and "step: 0.25" in config


def test_a_clustered_run_records_assignments_scores_and_matrices(tmp_path, tiny_run_args):
    args = [a if a != "false" else "true" for a in tiny_run_args]  # with W&B, so heatmaps are logged too
    data = ["--data.partition", "fedlight.datamodules.Rotations", "--data.partition.init_args.num_clusters", "2"]
    assert main(args + data + ["--algorithm", "ocfl", "--run_name", "o"]) == 0
    folder = tmp_path / "o"
    with (folder / "clients.csv").open() as f:
        header = f.readline().strip().split(",")
    assert {"round", "client", "acc", "f1", "loss", "cluster"} <= set(header)
    metrics_header = (folder / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"cluster/ari", "cluster/temperature", "cluster/count"} <= set(metrics_header)
    matrices = sorted((folder / "matrices").glob("update_cosine_distance_round*.npy"))
    assert matrices, "no similarity matrices saved"
    gamma = np.load(matrices[0])
    assert gamma.shape == (6, 6) and np.allclose(np.diag(gamma), 0) and np.allclose(gamma, gamma.T)


def test_a_dotted_key_beside_its_section_is_refused_instead_of_replacing_it(tmp_path, capsys):
    (tmp_path / "data.yaml").write_text(
        "class_path: fedlight.datamodules.DigitsFederated\ninit_args: {num_clients: 7, public_size: 50}\n"
    )
    (tmp_path / "run.yaml").write_text(
        textwrap.dedent("""\
        data: data.yaml
        data.init_args.num_clients: 30
        model: {class_path: fedlight.models.Classifier, init_args: {network: fedlight.models.SmallCNN}}
        """)
    )
    assert main(["fit", "--config", str(tmp_path / "run.yaml"), "--output_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "data.init_args.num_clients" in err and "--data.init_args.num_clients" in err
    assert not (tmp_path / "runs").exists()


# -- a new user's first commands: help by short name, typos, a missing config, the listing -----------------
SHIPPED = (
    "apfl",
    "centclus",
    "cfl",
    "cflgp",
    "ditto",
    "fedala",
    "fedamp",
    "fedavg",
    "fedbabu",
    "fedbn",
    "fedcp",
    "feddbe",
    "fedem",
    "fedfomo",
    "fedgmm",
    "fedpac",
    "fedper",
    "fedproto",
    "fedprox",
    "fedrc",
    "fedrep",
    "fedrod",
    "fedsoft",
    "fedtsdp",
    "fesem",
    "flhc",
    "flis_dc",
    "flis_hc",
    "gpfl",
    "icfl",
    "ifca",
    "kfed",
    "lgfedavg",
    "local",
    "mfc",
    "ocfl",
    "pacfl",
    "perfedavg",
    "pfclus",
    "pfedhn",
    "pfedme",
    "scaffold",
    "srfca",
    "stocfl",
)


@pytest.mark.parametrize(
    "arguments, shown",
    [
        (["--algorithm.help", "ocfl"], ("fedlight.algorithms.ocfl.OCFL", "--algorithm.clusterer")),
        (["--algorithm.help=fedprox"], ("fedlight.algorithms.fedprox.FedProx", "--algorithm.mu")),
    ],
)
def test_algorithm_help_takes_a_short_name_as_algorithm_does(capsys, arguments, shown):
    with pytest.raises(SystemExit) as stop:
        main(["fit", *arguments])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for text in shown:
        assert text in out, text


def test_algorithm_help_with_an_unknown_short_name_lists_the_installed_ones(capsys):
    assert main(["fit", "--algorithm.help", "ocfll"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("fedlight: error: unknown algorithm 'ocfll' (did you mean 'ocfl'?): choose one of ")
        and "ocfl," in err
    )
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "config, expected",
    [
        ("federaton:\n  rounds: 3\n", "unknown config key federaton.rounds (did you mean federation.rounds?)"),
        ("sed: 3\n", "unknown config key sed (did you mean seed?)"),
        ("federation:\n  roundz: 3\n", "unknown config key federation.roundz (did you mean federation.rounds?)"),
        (
            "modle:\n  class_path: fedlight.models.Classifier\n",
            "unknown config key modle.class_path (did you mean model.class_path?)",
        ),
    ],
)
def test_a_misspelt_key_in_a_config_file_gets_a_suggestion_top_level_or_nested(
    tmp_path, tiny_run_args, capsys, config, expected
):
    (tmp_path / "typo.yaml").write_text(config)
    assert main(tiny_run_args + ["--config", str(tmp_path / "typo.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"fedlight: error: {expected}"
    assert not [p for p in tmp_path.iterdir() if p.name != "typo.yaml"]  # no run folder


@pytest.mark.parametrize(
    "option, expected",
    [
        ("--federaton.rounds", "unknown option --federaton.rounds (did you mean --federation.rounds?)"),
        ("--federaton.rounds=3", "unknown option --federaton.rounds (did you mean --federation.rounds?)"),
        ("--modle.init_args.lr", "unknown option --modle.init_args.lr (did you mean --model.init_args.lr?)"),
        ("--sed", "unknown option --sed (did you mean --seed?)"),
    ],
)
def test_a_misspelt_top_level_option_gets_a_suggestion(tiny_run_args, capsys, option, expected):
    assert main(tiny_run_args + ([option] if "=" in option else [option, "3"])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedlight: error: {expected}") and len(err.strip().splitlines()) == 1, err


def test_closest_key_corrects_the_top_level_part_of_a_key():
    from fedlight.run.config_errors import closest_key

    options = [
        "--seed",
        "--model",
        "--model.help",
        "--federation",
        "--federation.rounds",
        "--federation.batch_size",
        "--data",
        "--logger.wandb",
    ]
    assert closest_key("federaton.rounds", options) == "federation.rounds"
    assert closest_key("federaton.roundz", options) == "federation.rounds"
    assert closest_key("federaton", options) == "federation"
    assert closest_key("modle.init_args.lr", options) == "model.init_args.lr"  # a subclass section's own keys
    assert closest_key("model.init_args.lr", options) is None  # the section is right: nothing to correct here
    assert closest_key("xyzzy", options) is None


def test_a_missing_config_file_is_one_line_naming_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", "configs/nope.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlight: error: --config configs/nope.yaml: no such file") and "Parser key" not in err
    assert str(tmp_path) in err and len(err.strip().splitlines()) == 1, err
    outside = tmp_path.parent / "elsewhere" / "nope.yaml"
    assert main(["fit", f"--config={outside}"]) == 2
    assert capsys.readouterr().err.strip() == f"fedlight: error: --config {outside}: no such file"


def test_list_shows_only_config_classes_each_with_its_description(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for hidden in (
        "_RedrawnScheme",
        "BasicBlock",
        "ClusterScheme",
        "PartitionScheme",
        "FederatedDataModule",
        "TorchvisionFederated",
        "UCITableFederated",
    ):
        assert hidden not in out, hidden
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    expected = {  # the first sentence of each docstring, as written in the source
        "fedavg": "The base class's behaviour, under its own name.",
        "ocfl": "One-shot clustering on the temperature of the update cosine distances.",
        "DigitsFederated": "The digits images as (N, 1, 8, 8) floats in [0, 1], cut into clients by any partition",
        "IID": "Uniformly random, equal-size (up to one sample) split.",
        "Natural": "The data set's own partition: one client per owner (FEMNIST writer, WISDM user).",
        "Classifier": "Trains `network` with cross-entropy.",
        "MLP": "Flatten -> [Linear -> ReLU -> Dropout] per hidden width -> Linear(num_classes).",
        "ResNet18": "CIFAR ResNet-18 (about 11.17 M parameters for 10 classes).",
    }
    for name, description in expected.items():
        assert description in rows[name], rows[name]
    for name in (
        *SHIPPED,
        "Dirichlet",
        "Rotations",
        "Heterogeneity",
        "MedMNISTFederated",
        "CentroidModel",
        "SmallCNN",
        "LeNet5",
        "ResNet9",
    ):
        assert name in rows, name
    described = [line for line in rows.values() if len(line.split()) >= 3]
    assert len(described) == len(rows)  # name, class path and a description on every line


def test_an_unknown_algorithm_lists_every_shipped_one_also_beside_an_installed_plugin(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    from fedlight.run import registry

    site = install_plugin(tmp_path / "site", "aardvark")
    try:
        for installed in ((), ("aardvark",)):
            if installed:
                monkeypatch.syspath_prepend(str(site))
            assert main(tiny_run_args + ["--algorithm", "fedavgg"]) == 2
            err = capsys.readouterr().err
            assert err.startswith(
                "fedlight: error: unknown algorithm 'fedavgg' (did you mean 'fedavg'?): choose one of "
            )
            listed = err.split("choose one of ", 1)[1].split(", or give", 1)[0].split(", ")
            assert set(SHIPPED) | set(installed) <= set(listed), listed
    finally:
        registry.short_names.cache_clear()


def test_a_terminal_sees_a_status_while_the_config_loads_and_the_run_is_set_up(tiny_run_args, monkeypatch):
    import io

    from rich.console import Console

    from fedlight.run import cli

    screen = io.StringIO()
    monkeypatch.setattr(cli, "make_console", lambda quiet=False: Console(file=screen, force_terminal=True, width=120))
    assert main(tiny_run_args + ["--run_name", "shown"]) == 0
    text = screen.getvalue()
    assert "reading the config" in text and "setting up shown: data, model, algorithm" in text
    assert text.index("reading the config") < text.index("setting up shown") < text.index("run folder:")
