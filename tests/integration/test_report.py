"""Reports and sweeps: a sweep of FedAvg and OCFL x two seeds on the quickstart (made tiny), its HTML report checked
against the runs' own files, the W&B offline runs' client tables read back from their files, and one-line errors."""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedlight.run.cli import main
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.reports.run_groups import config_group
from fedlight.reports.runs import read_rows

from helpers.reports import fake_run, table

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "federation.rounds": 3,
    "federation.local_epochs": 1,
    "federation.accelerator": "cpu",
    "data.init_args.num_clients": 6,
    "model.init_args.network.init_args.width": 8,
}
FIGURES = {
    "fig-accuracy": "Client accuracy over rounds",
    "fig-spread": "Per-client accuracy at the end",
    "fig-ari": "Clustering quality over rounds",
    "fig-timeline": "Cluster assignment over rounds",
    "fig-matrix-update_cosine_distance": "Last update cosine distance matrix",
}
COLUMNS = ["mean acc", "std acc (clients)", "worst-client acc", "ARI", "clusters", "wall time (s)"]
SUMMARY_KEYS = ["test/acc_mean", "test/acc_std", "test/acc_worst", "cluster/ari", "cluster/count", "wall_time_s"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The sweep's output folder: fedavg-s0, fedavg-s1, ocfl-s0, ocfl-s1 (W&B offline) and report.html."""
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "sweep.yaml").write_text(
        yaml.safe_dump(
            {
                "base": str(REPO / "configs" / "quickstart.yaml"),
                "output_dir": str(folder / "runs"),
                "algorithms": ["fedavg", "ocfl"],
                "seeds": [0, 1],
                "overrides": TINY,
                "title": "Two algorithms",
            }
        )
    )
    assert main(["sweep", "--config", str(folder / "sweep.yaml")]) == 0
    return folder / "runs"


def figures(page: str) -> dict[str, str]:
    """Each <figure>'s id and its HTML."""
    return dict(re.findall(r"<figure id='([\w-]+)'>(.*?)</figure>", page, re.S))


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def runs_cells(page: str) -> dict[str, str]:
    """The comparison table: row label -> its runs cell (which seeds, how many runs)."""
    return dict(re.findall(r"<th scope='row'><span[^>]*></span>(.*?)</th><td>(.*?)</td>", page))


def test_the_report_has_every_figure_titled_and_is_self_contained(sweep):
    page = (sweep / "report.html").read_text()
    found = figures(page)
    assert list(found) == list(FIGURES)
    for number, (key, title) in enumerate(FIGURES.items(), 1):
        assert found[key].count("<svg") == 1, key
        assert f"<figcaption><strong>Figure {number}. {title}.</strong>" in found[key]
    # matplotlib keeps text as text: panel titles, axis labels, legends and the colour bar's label are in the SVG
    for text in ("Mean accuracy over clients", "Worst-client accuracy", "round", "FedAvg", "OCFL"):
        assert f">{text}<" in found["fig-accuracy"] or f"> {text}<" in found["fig-accuracy"], text
    assert ">true<" in found["fig-timeline"] and ">client<" in found["fig-timeline"]
    assert ">update cosine distance<" in found["fig-matrix-update_cosine_distance"]
    assert "<title>Two algorithms</title>" in page
    assert "<script" not in page and "<link" not in page and not re.search(r"(src|href)=['\"]https?:", page)


def test_the_table_is_mean_and_std_over_seeds_of_each_runs_summary(sweep):
    rows = table((sweep / "report.html").read_text())
    assert list(rows) == ["FedAvg", "OCFL"]
    for label, name in (("FedAvg", "fedavg"), ("OCFL", "ocfl")):
        summaries = [summary(sweep / f"{name}-s{seed}") for seed in (0, 1)]
        for column, key in zip(COLUMNS, SUMMARY_KEYS):
            values = [s[key] for s in summaries if key in s]
            if not values:
                assert rows[label][column] is None, (label, column)
                continue
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            assert rows[label][column] == (pytest.approx(mean, abs=1e-12), pytest.approx(std, abs=1e-12), 2)
    assert rows["FedAvg"]["ARI"] is None and rows["OCFL"]["ARI"] is not None


def test_a_summary_agrees_with_the_clients_it_summarizes(sweep):
    """The numbers the table takes from summary.json are those of clients.csv's last round."""
    for run in sorted(p for p in sweep.iterdir() if p.is_dir()):
        last = [r for r in read_rows(run / "clients.csv") if r["round"] == 3]
        acc = np.array([r["acc"] for r in last], dtype=np.float32)
        assert len(last) == 6
        assert summary(run)["test/acc_worst"] == pytest.approx(float(acc.min()))
        assert summary(run)["test/acc_mean"] == pytest.approx(float(acc.mean()), abs=1e-6)


def test_a_runs_three_numbers_are_its_last_round_and_the_rounds_chosen_on_val_and_test_in_metrics_csv(sweep):
    """Each run measured val beside test in every round; picked here by hand over metrics.csv: the last round, the
    round with the best val mean (on a tie the lower loss there, then the later round) and the one with the best test
    mean, each with its worst client; Table 1 shows the means over seeds of the runs' chosen rounds."""
    page = table((sweep / "report.html").read_text())
    for label, name in (("FedAvg", "fedavg"), ("OCFL", "ocfl")):
        chosen = {"val": [], "test": []}
        for seed in (0, 1):
            rows = read_rows(sweep / f"{name}-s{seed}" / "metrics.csv")
            s = summary(sweep / f"{name}-s{seed}")
            assert len(rows) == 3 and all("val/acc_mean" in r and "test/acc_mean" in r for r in rows)
            assert (s["test/acc_mean"], s["test/acc_worst"]) == (rows[-1]["test/acc_mean"], rows[-1]["test/acc_worst"])
            for on in ("val", "test"):
                best = max(rows, key=lambda r: (r[f"{on}/acc_mean"], -r.get(f"{on}/loss_mean", math.inf), r["round"]))
                assert s[f"{on}_selected/round"] == best["round"]
                assert s[f"{on}_selected/test/acc_mean"] == best["test/acc_mean"]
                assert s[f"{on}_selected/test/acc_worst"] == best["test/acc_worst"]
                chosen[on].append(best["test/acc_mean"])
            assert "no_val_selection" not in s
        for on, values in chosen.items():
            mean, std = np.mean(values), np.std(values)
            assert page[label][f"{on}-selected acc"] == (
                pytest.approx(mean, abs=1e-12),
                pytest.approx(std, abs=1e-12),
                2,
            )


def test_two_runs_from_the_command_line_give_single_values(sweep, tmp_path, capsys):
    output = tmp_path / "r.html"
    assert main(["report", str(sweep / "fedavg-s0"), str(sweep / "ocfl-s0"), "--output", str(output)]) == 0
    assert "report of 2 runs in 2 configurations" in capsys.readouterr().out
    page = output.read_text()
    rows = table(page)
    for label, name in (("FedAvg", "fedavg"), ("OCFL", "ocfl")):
        s = summary(sweep / f"{name}-s0")
        for column, key in zip(COLUMNS, SUMMARY_KEYS):
            assert rows[label][column] == (None if key not in s else (s[key], 0.0, 1)), (label, column)
    assert "±" not in re.search(r"<tbody>(.*?)</tbody>", page, re.S).group(1)
    assert list(figures(page)) == list(FIGURES)


def test_clients_csv_has_each_clients_true_cluster_and_training_size(sweep):
    data = DigitsFederated(num_clients=6, partition=Rotations(num_clusters=4))
    data.seed = 0
    data.prepare_data()
    data.setup("fit")
    rows = read_rows(sweep / "ocfl-s0" / "clients.csv")
    header = (sweep / "ocfl-s0" / "clients.csv").read_text().splitlines()[0].split(",")
    assert header[:8] == ["round", "client", "true_cluster", "cluster", "acc", "f1", "loss", "samples"]
    assert header[8:] == ["train/loss"]  # what each client's local training reported
    for r in rows:
        assert r["true_cluster"] == data.federated.cluster_labels[int(r["client"])]
        assert r["samples"] == data.federated.train.size(int(r["client"]))


def test_seeds_of_one_config_share_a_wandb_group_tagged_with_the_algorithm(sweep):
    configs = {
        name: yaml.safe_load((sweep / name / "config.yaml").read_text())
        for name in ("fedavg-s0", "fedavg-s1", "ocfl-s0")
    }
    groups = {name: config_group(c, summary(sweep / name)["algorithm"]) for name, c in configs.items()}
    assert groups["fedavg-s0"] == groups["fedavg-s1"] != groups["ocfl-s0"]
    assert groups["ocfl-s0"].startswith("OCFL-")
    for name in ("fedavg-s1", "ocfl-s0"):
        (record,) = (sweep / name / "wandb").glob("offline-run-*/run-*.wandb")
        data = record.read_bytes()  # the run record's protobuf strings are stored as they are
        assert groups[name].encode() in data and summary(sweep / name)["algorithm"].encode() in data


def test_the_wandb_client_tables_hold_the_rows_of_clients_csv(sweep):
    run = sweep / "ocfl-s0"
    (files,) = (run / "wandb").glob("offline-run-*/files")
    tables = [json.loads(p.read_text()) for p in sorted((files / "media" / "table" / "clients").glob("*.table.json"))]
    assert len(tables) == 3  # one per evaluated round
    logged = [dict(zip(t["columns"], row)) for t in tables for row in t["data"]]
    assert tables[0]["columns"] == [
        "round",
        "client",
        "true_cluster",
        "cluster",
        "acc",
        "f1",
        "loss",
        "samples",
        "train/loss",
    ]
    key = lambda r: (r["round"], r["client"])  # noqa: E731
    assert sorted(logged, key=key) == sorted(read_rows(run / "clients.csv"), key=key)
    heatmaps = list((files / "media" / "images" / "matrices").glob("update_cosine_distance_*.png"))
    assert heatmaps, "no heatmap logged"


def test_rerunning_a_sweep_skips_the_finished_runs(sweep, capsys):
    before = {p: p.stat().st_mtime_ns for p in sweep.glob("*/summary.json")}
    assert main(["sweep", "--config", str(sweep.parent / "sweep.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.count("done already, skipped") == 4
    assert {p: p.stat().st_mtime_ns for p in sweep.glob("*/summary.json")} == before
    # the report's Table 1 on the console: a row per algorithm with its mean accuracy over the two seeds
    page = table((sweep / "report.html").read_text())
    for algorithm in ("FedAvg", "OCFL"):
        mean, std, _ = page[algorithm]["mean acc"]
        row = next(
            line for line in out.splitlines() if line.split("│")[1:2] and line.split("│")[1].strip() == algorithm
        )
        half = 12.706204736174698 * std  # two seeds: t_{0.975, 1} x the sample sd / sqrt(2) = t x the population std
        assert f"{mean:.3f} ± {half:.3f}" in row and "seeds 0, 1" in row


def test_an_unknown_algorithm_stops_the_sweep_before_any_run(tmp_path, capsys):
    (tmp_path / "sweep.yaml").write_text(
        textwrap.dedent(f"""\
        base: {REPO / "configs" / "quickstart.yaml"}
        output_dir: {tmp_path / "runs"}
        algorithms: [fedavg, fedavgg]
        """)
    )
    assert main(["sweep", "--config", str(tmp_path / "sweep.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'fedavgg'" in err and "ocfl" in err and "class path" in err
    assert not (tmp_path / "runs").exists()


def test_an_unknown_key_in_a_sweep_file_is_named(tmp_path, capsys):
    (tmp_path / "sweep.yaml").write_text("base: x.yaml\nalgorithms: [fedavg]\nseed: [0]\n")
    assert main(["sweep", "--config", str(tmp_path / "sweep.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'seed'" in err and "seeds" in err


def test_a_folder_without_metrics_is_refused_in_one_line_naming_the_fix(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.yaml").write_text("seed: 0\n")
    assert main(["report", str(tmp_path / "half"), "--output", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(tmp_path / "half") in err and "metrics.csv" in err and "fedlight fit" in err
    assert not (tmp_path / "r.html").exists()


def test_a_folder_argument_finds_runs_at_any_depth(tmp_path, capsys):
    runs = tmp_path / "runs"
    fake_run(runs / "sweep-digits" / "fedavg-s0", 0, 0.5)
    fake_run(runs / "sweep-digits" / "fedavg-s1", 1, 0.7)
    fake_run(runs / "old" / "deeper" / "ocfl-s0", 0, 0.9, algorithm="OCFL")
    (runs / "notes").mkdir()  # a folder without runs is passed over
    assert main(["report", str(runs), "--output", str(tmp_path / "r.html")]) == 0
    assert "report of 3 runs in 2 configurations" in capsys.readouterr().out
    rows = table((tmp_path / "r.html").read_text())
    assert rows["FedAvg"]["mean acc"] == (pytest.approx(0.6), pytest.approx(0.1), 2)
    assert rows["OCFL"]["mean acc"] == (0.9, 0.0, 1)


def test_a_folder_holding_no_run_at_any_depth_is_refused_naming_it(tmp_path, capsys):
    fake_run(tmp_path / "runs" / "sweep" / "fedavg-s0", 0, 0.5)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "config.yaml").write_text("seed: 0\n")
    assert main(["report", str(tmp_path / "runs"), str(tmp_path / "empty"), "--output", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'empty'} holds no run" in err and str(tmp_path / "runs") not in err and "metrics.csv" in err
    assert not (tmp_path / "r.html").exists()


def test_runs_of_one_seed_are_counted_as_runs_not_seeds(tmp_path):
    accs = {(0.1, 0): [0.5, 0.7], (0.1, 1): [0.9], (0.2, 0): [0.2, 0.4], (0.3, 0): [0.3], (0.3, 1): [0.6]}
    for (lr, seed), values in accs.items():
        for i, acc in enumerate(values):
            fake_run(tmp_path / "runs" / f"lr{lr}-s{seed}-{i}", seed, acc, lr)
    assert main(["report", str(tmp_path / "runs"), "--output", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert runs_cells(page) == {
        "FedAvg (lr=0.1)": "seeds 0, 1 (3 runs)",
        "FedAvg (lr=0.2)": "seed 0 (2 runs)",
        "FedAvg (lr=0.3)": "seeds 0, 1",
    }
    for lr, values in ((0.1, [0.5, 0.7, 0.9]), (0.2, [0.2, 0.4]), (0.3, [0.3, 0.6])):  # mean and std over runs
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        assert table(page)[f"FedAvg (lr={lr})"]["mean acc"] == (pytest.approx(mean), pytest.approx(std), len(values))
    assert "95 % Student-t interval over its runs" in page and "mean over runs, band ± std over runs" in page
    assert "over its seeds" not in page and "over seeds" not in page


def test_distinct_seeds_are_still_called_seeds(tmp_path):
    fake_run(tmp_path / "runs" / "s0", 0, 0.5)
    fake_run(tmp_path / "runs" / "s1", 1, 0.7)
    assert main(["report", str(tmp_path / "runs"), "--output", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert runs_cells(page) == {"FedAvg": "seeds 0, 1"}
    assert "95 % Student-t interval over its seeds" in page and "mean over seeds, band ± std over seeds" in page


def test_fine_tuned_accuracy_and_epsilon_get_columns_only_where_a_run_has_them(tmp_path):
    for seed, (tuned, epsilon) in enumerate([(0.8, 2.0), (0.6, 4.0)]):
        run = fake_run(tmp_path / "private" / f"s{seed}", seed, 0.5)
        summary_file = run / "summary.json"
        summary_file.write_text(
            json.dumps(
                {
                    **json.loads(summary_file.read_text()),
                    "test_ft/acc_mean": tuned,
                    "test_ft/acc_worst": tuned / 2,
                    "privacy/epsilon": epsilon,
                }
            )
        )
    fake_run(tmp_path / "plain" / "s0", 0, 0.5)
    assert main(["report", str(tmp_path / "private"), "--output", str(tmp_path / "p.html")]) == 0
    row = table((tmp_path / "p.html").read_text())["FedAvg"]
    assert row["fine-tuned acc"] == (pytest.approx(0.7), pytest.approx(0.1), 2)
    assert row["worst fine-tuned acc"] == (pytest.approx(0.35), pytest.approx(0.05), 2)
    assert row["epsilon"] == (pytest.approx(3.0), pytest.approx(1.0), 2)
    assert main(["report", str(tmp_path / "plain"), "--output", str(tmp_path / "q.html")]) == 0
    assert not {"fine-tuned acc", "epsilon"} & set(table((tmp_path / "q.html").read_text())["FedAvg"])


def test_runs_on_different_splits_are_refused_naming_where_each_split_lies(tmp_path, capsys):
    """After `fedlight tune`, the trials (validation split) sit beside the final runs (test split)."""
    fake_run(tmp_path / "runs" / "final" / "s0", 0, 0.5)
    for trial in range(2):
        run = fake_run(tmp_path / "runs" / "tune" / f"t{trial}", trial, 0.5)
        (run / "config.yaml").write_text(yaml.safe_dump({"seed": trial, "federation": {"eval_split": "val"}}))
    assert main(["report", str(tmp_path / "runs"), "--output", str(tmp_path / "r.html")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert (
        f"1 run on test under {tmp_path / 'runs' / 'final' / 's0'}; 2 runs on val under {tmp_path / 'runs' / 'tune'}"
    ) in error
    assert error.endswith(f"report one split at a time, e.g. `fedlight report {tmp_path / 'runs' / 'final' / 's0'}`")
    assert main(["report", str(tmp_path / "runs" / "final"), "--output", str(tmp_path / "r.html")]) == 0


def test_the_report_goes_next_to_the_runs_and_never_over_an_existing_file(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "runs" / "sweep"
    fake_run(sweep / "fedavg-s0", 0, 0.5)
    fake_run(sweep / "fedavg-s1", 1, 0.7)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(sweep)]) == 0
    assert f": {sweep / 'report.html'} (" in capsys.readouterr().out
    assert not (tmp_path / "report.html").exists()
    written = (sweep / "report.html").read_text()
    assert "<table class='results' id='comparison'>" in written

    (sweep / "report.html").write_text("my notes")  # the user's own file is never replaced without being told
    assert main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(sweep / "report.html") in err and "--overwrite" in err and "--output" in err
    assert (sweep / "report.html").read_text() == "my notes"
    assert main(["report", str(sweep), "--output", str(sweep / "report.html")]) == 2
    assert (sweep / "report.html").read_text() == "my notes"
    assert main(["report", str(sweep), "--overwrite"]) == 0
    assert (sweep / "report.html").read_text() == written


def test_the_default_output_is_the_folder_holding_every_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "runs" / "a" / "fedavg-s0", 0, 0.5)
    fake_run(tmp_path / "runs" / "b" / "deeper" / "ocfl-s0", 0, 0.5, algorithm="OCFL")
    assert (
        main(
            ["report", str(tmp_path / "runs" / "a" / "fedavg-s0"), str(tmp_path / "runs" / "b" / "deeper" / "ocfl-s0")]
        )
        == 0
    )
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*.html")] == [Path("runs/report.html")]


def test_counts_of_runs_and_configurations_are_singular_for_one(tmp_path, capsys):
    fake_run(tmp_path / "runs" / "s0", 0, 0.5)
    assert main(["report", str(tmp_path / "runs" / "s0"), "--output", str(tmp_path / "one.html")]) == 0
    assert "report of 1 run in 1 configuration: " in capsys.readouterr().out
    assert '<p class="lead">1 run in 1 configuration, ' in (tmp_path / "one.html").read_text()
    fake_run(tmp_path / "runs" / "s1", 1, 0.7)
    assert main(["report", str(tmp_path / "runs"), "--output", str(tmp_path / "two.html")]) == 0
    assert "report of 2 runs in 1 configuration: " in capsys.readouterr().out
    assert '<p class="lead">2 runs in 1 configuration, ' in (tmp_path / "two.html").read_text()


def test_a_wandb_report_offline_is_skipped_in_one_line(sweep, tmp_path, capsys):
    assert main(["report", str(sweep), "--output", str(tmp_path / "r.html"), "--wandb", "team/project"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "W&B" in line]
    assert len(lines) == 1 and "offline" in lines[0]


def test_the_wandb_report_selects_the_groups_of_the_runs(sweep):
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.expr import expr_to_filters

    from fedlight.reports import wandb_report
    from fedlight.reports.runs import find_runs, group_runs, load_run

    groups = group_runs([load_run(p) for p in find_runs([sweep])])
    built = wandb_report.report_blocks(wr, "team", "project", groups, "Two algorithms")
    runset = built.blocks[1].runsets[0]
    assert expr_to_filters(runset.filters).value == [g.key for g in groups]
    assert [p.title for p in built.blocks[1].panels[:3]] == [
        "Mean client accuracy",
        "Worst-client accuracy",
        "ARI against the true clusters",
    ]


def test_the_shipped_sweep_checks_out_and_passes_init_args_to_fit(tmp_path, capsys):
    from fedlight.run import sweep

    path = REPO / "configs" / "sweeps" / "digits.yaml"
    config, base = sweep.load(path)
    grid = sweep.combinations(config, path)
    assert base.is_file() and len(grid) == len(config.algorithms) * len(config.seeds)
    (ifca,) = [c for c in grid if c.name == "ifca-s0"]
    config.output_dir = str(tmp_path)
    args = sweep.fit_args(ifca, base, config)
    assert "--resume" not in args
    with pytest.raises(SystemExit):
        main(args + ["--print_config"])
    out = capsys.readouterr().out
    assert "fedlight.algorithms.ifca.IFCA" in out and "num_clusters: 4" in out and "rounds: 10" in out
    (tmp_path / "ifca-s0").mkdir()
    (tmp_path / "ifca-s0" / "config.yaml").write_text("seed: 0\n")  # an unfinished run continues with its config
    assert sweep.fit_args(ifca, base, config) == ["fit", "--resume", str(tmp_path / "ifca-s0")]


class StartedPart:
    """What `subprocess.Popen` gives `run_parts` here: the part's command and environment, run in this process."""

    started: list["StartedPart"] = []

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        StartedPart.started.append(self)

    def wait(self) -> int:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("os.environ", self.env)
            return main(self.command[self.command.index("sweep") :])


def test_a_sweep_with_jobs_runs_its_shares_at_once_each_on_its_share_of_the_cores(tmp_path, monkeypatch, capsys):
    """`--jobs 2`: two processes (`fedlight sweep --part i/2`, run in this process here), each told that two runs
    share the machine, so each run takes half the usable cores (at least one thread); the parent then writes the
    report of all runs."""
    from fedlight.engine.threads import usable_cores
    from fedlight.run import sweep as sweep_module

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(sweep_module.subprocess, "Popen", StartedPart)
    StartedPart.started = []
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump(
            {
                "base": str(REPO / "configs" / "quickstart.yaml"),
                "output_dir": str(tmp_path / "runs"),
                "algorithms": ["fedavg"],
                "seeds": [0, 1],
                "overrides": {**TINY, "federation.rounds": 1, "logger.wandb": False},
            }
        )
    )
    assert main(["sweep", "--config", str(tmp_path / "sweep.yaml"), "--jobs", "2"]) == 0
    assert [p.command[2:] for p in StartedPart.started] == [
        ["fedlight", "sweep", "--config", str(tmp_path / "sweep.yaml"), "--part", f"{i}/2"] for i in (0, 1)
    ]
    assert all(p.env["FEDLIGHT_PARALLEL_RUNS"] == "2" for p in StartedPart.started)
    for seed in (0, 1):
        plan = summary(tmp_path / "runs" / f"fedavg-s{seed}")["plan"]
        assert plan["threads"] == max(1, usable_cores() // 2)
        assert plan["threads_from"] == f"{usable_cores()} usable cores shared by 2 processes"
    assert (tmp_path / "runs" / "report.html").is_file() and "report: " in capsys.readouterr().out


def test_a_sweep_part_must_name_one_of_its_shares(tmp_path, capsys):
    assert main(["sweep", "--config", str(tmp_path / "none.yaml"), "--part", "2/2"]) == 2
    assert "--part '2/2': I must be 0 to N-1" in capsys.readouterr().err
    assert main(["sweep", "--config", str(tmp_path / "none.yaml"), "--jobs", "0"]) == 2
    assert "--jobs must be 1 or more (runs at once), got 0" in capsys.readouterr().err


def test_the_ranking_says_which_neighbours_the_seeds_resolve(tmp_path):
    """Three configurations over seeds 0-2: lr 0.1 beats lr 0.2 by 0.10, 0.11, 0.12 (paired differences' interval
    0.11 ± 0.025, excluding 0); lr 0.2 and lr 0.3 differ by +0.05, -0.04, +0.01 (an interval spanning 0)."""
    from fedlight.reports.runs import find_runs, group_runs, load_run
    from fedlight.reports.tables import ranking_text

    accs = {0.1: [0.80, 0.71, 0.62], 0.2: [0.70, 0.60, 0.50], 0.3: [0.65, 0.64, 0.49]}
    for lr, values in accs.items():
        for seed, acc in enumerate(values):
            fake_run(tmp_path / f"lr{lr}" / f"s{seed}", seed, acc, lr=lr)
    groups = group_runs([load_run(p) for p in find_runs([tmp_path])])
    text = ranking_text(groups, "test", "acc")
    assert text.endswith(
        " Resolved by the seeds (paired 95 % interval): FedAvg (lr=0.1) over FedAvg (lr=0.2). "
        "Not resolved by the seeds: FedAvg (lr=0.2) and FedAvg (lr=0.3)."
    )


def test_one_seeds_neighbours_are_compared_over_their_clients(tmp_path):
    """One seed a configuration: lr 0.1 beats lr 0.2 by 0.1 on each of 12 clients (a paired bootstrap interval far
    from 0), lr 0.2 and lr 0.3 differ by +0.05 and -0.05 on alternate clients (an interval spanning 0); each
    client's accuracy read from clients.csv at the compared round (the last evaluated)."""
    from fedlight.reports.runs import find_runs, group_runs, load_run
    from fedlight.reports.tables import ranking_text

    base = [0.5 + 0.03 * c for c in range(12)]
    per_client = {
        0.1: [a + 0.1 for a in base],
        0.2: base,
        0.3: [a + (0.05 if c % 2 else -0.05) for c, a in enumerate(base)],
    }
    for lr, accs in per_client.items():
        folder = fake_run(tmp_path / f"lr{lr}", 0, sum(accs) / len(accs) - (0.001 if lr == 0.3 else 0), lr=lr)
        rows = "".join(f"2,{c},{a}\n" for c, a in enumerate(accs))
        (folder / "clients.csv").write_text("round,client,acc\n" + rows)
    groups = group_runs([load_run(p) for p in find_runs([tmp_path])])
    text = ranking_text(groups, "test", "acc")
    assert text.endswith(
        " Resolved by the clients (one seed: paired bootstrap over its clients): FedAvg (lr=0.1) over FedAvg "
        "(lr=0.2). Not resolved by the clients: FedAvg (lr=0.2) and FedAvg (lr=0.3)."
    ), text
