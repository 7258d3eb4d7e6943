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
    config.write_text(textwrap.dedent("""\
        data: {class_path: fedlight.datamodules.DigitsFederated, init_args: {num_clients: 4, num_clientz: 3}}
        model: {class_path: fedlight.models.Classifier, init_args: {network: fedlight.models.SmallCNN}}
        """))
    assert main(["fit", "--config", str(config), "--output_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "data.init_args.num_clientz" in err and "num_clients" in err and len(err.strip().splitlines()) == 1


def test_wrong_type_is_named(tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.rounds", "many"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fedlight: error: federation.rounds: expected an integer, got 'many'"


def test_missing_data_file_names_the_path_and_the_fix(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "data.npz"
    code = main(["fit", "--data", "fedlight.datamodules.NpzFederated", "--data.path", str(missing),
                 "--model", "fedlight.models.Classifier", "--model.network", "fedlight.models.MLP",
                 "--model.network.init_args.input_dim", "4", "--model.network.init_args.hidden", "[8]",
                 "--model.network.init_args.num_classes", "2", "--logger.wandb", "false",
                 "--output_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.replace("\n", "")
    assert code == 2 and str(missing) in err and "numpy.savez" in err


def test_npz_data_runs(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(120, 4)).astype("float32"), y=rng.integers(0, 2, 120))
    assert main(["fit", "--data", "fedlight.datamodules.NpzFederated", "--data.path", str(tmp_path / "d.npz"),
                 "--data.num_clients", "3", "--model", "fedlight.models.Classifier",
                 "--model.network", "fedlight.models.MLP", "--model.network.init_args.input_dim", "4",
                 "--model.network.init_args.hidden", "[8]", "--model.network.init_args.num_classes", "2",
                 "--federation.rounds", "1", "--logger.wandb", "false", "--output_dir", str(tmp_path / "r")]) == 0


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
from fedlight.engine.algorithm import Algorithm


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


def test_an_installed_plugin_is_found_by_its_entry_point_and_runs(tmp_path, tiny_run_args, monkeypatch, capsys):
    """A separate package, installed the way pip installs one (a module plus a dist-info folder with its
    entry points), adds an algorithm that the CLI lists and runs by its short name."""
    site = tmp_path / "site"
    (site / "halfstep_plugin").mkdir(parents=True)
    (site / "halfstep_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "halfstep_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: halfstep-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fedlight.algorithms]\nhalfstep = halfstep_plugin:HalfStep\n")
    monkeypatch.syspath_prepend(str(site))
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
    (tmp_path / "data.yaml").write_text("class_path: fedlight.datamodules.DigitsFederated\n"
                                        "init_args: {num_clients: 7, public_size: 50}\n")
    (tmp_path / "run.yaml").write_text(textwrap.dedent("""\
        data: data.yaml
        data.init_args.num_clients: 30
        model: {class_path: fedlight.models.Classifier, init_args: {network: fedlight.models.SmallCNN}}
        """))
    assert main(["fit", "--config", str(tmp_path / "run.yaml"), "--output_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "data.init_args.num_clients" in err and "--data.init_args.num_clients" in err
    assert not (tmp_path / "runs").exists()
