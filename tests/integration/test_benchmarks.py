"""The benchmark scripts run end to end at tiny sizes and their equivalence checks hold (timings are not
checked here: speed is measured by running the benchmarks, see docs/results.md)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import cross_device  # noqa: E402
import femnist_load  # noqa: E402
import leaderboard  # noqa: E402
import lora_clients  # noqa: E402
import made_femnist  # noqa: E402
import overhead  # noqa: E402
import paper_configs  # noqa: E402
import processes  # noqa: E402
import round as round_benchmark  # noqa: E402
import shipped_configs  # noqa: E402
import similarity  # noqa: E402
import startup  # noqa: E402
import tune_overhead  # noqa: E402
import vectorized  # noqa: E402


def run_main(module, monkeypatch, tmp_path, *argv) -> dict | list:
    out = tmp_path / "result.json"
    monkeypatch.setattr(sys, "argv", [module.__file__, *argv, "--json", str(out)])
    module.main()
    return json.loads(out.read_text())


def test_overhead_benchmark_trains_exactly_like_the_plain_loop(monkeypatch, tmp_path):
    result = run_main(overhead, monkeypatch, tmp_path, "--clients", "3", "--rounds", "1", "--local_epochs", "1")
    assert result["max_param_diff_after_round_1"] < 1e-6  # the same training; averages round differently
    assert result["fedlight_round_s"] > 0 and result["plain_round_s"] > 0


def test_vectorized_benchmark_trains_every_way_like_the_plain_loop(monkeypatch, tmp_path):
    rows = run_main(
        vectorized,
        monkeypatch,
        tmp_path,
        "--clients",
        "3",
        "--pool",
        "300",
        "--repeats",
        "1",
        "--networks",
        "lenet5_bn",
        "mlp",
        "--batch_sizes",
        "10",
    )
    assert [r["network"] for r in rows] == ["lenet5_bn", "mlp"]
    # the same training four ways, to float rounding: the averages round differently, and the vectorized trainer's
    # channels-last convolutions round differently from one client's NCHW ones (a step's gradients by 8e-7 of 0.2
    # here), which LeNet-5's BatchNorm grows over the two rounds (1.4e-5 with one thread)
    for row in rows:
        assert all(d < 1e-4 for d in row["max_difference_vs_plain"].values()), row
        assert row["auto_choice"] in ("vectorized", "sequential") and row["probe"]["sequential_clients"] == 2  # of 3
        assert all(row[f"{name}_s"] > 0 for name in ("plain", "sequential", "vectorized", "auto"))


def test_structured_updates_have_four_cosine_clusters():
    U = similarity.structured_updates(8, 20_000, torch.float32, torch.device("cpu"))
    cos = torch.nn.functional.normalize(U, dim=1) @ torch.nn.functional.normalize(U, dim=1).T
    same = torch.arange(8)[:, None] % 4 == torch.arange(8)[None, :] % 4
    # a shared unit-variance direction plus as much noise: cosine about 1/2 within a cluster, about 0 across
    assert cos[same & ~torch.eye(8, dtype=torch.bool)].sub(0.5).abs().max() < 0.05
    assert cos[~same].abs().max() < 0.05


def test_similarity_benchmark_measures_bf16_error_and_skips_what_does_not_fit(monkeypatch, tmp_path):
    rows = run_main(
        similarity,
        monkeypatch,
        tmp_path,
        "--clients",
        "12",
        "--params",
        "5000",
        "400000",
        "--dtypes",
        "bf16",
        "--public",
        "--max_gb",
        "0.005",
    )
    by_size = {r["size"]: r for r in rows}
    assert by_size[5000]["max_diff_vs_fp32"] < 1e-3 and by_size[5000]["seconds"] > 0
    assert "skipped" in by_size[400000]  # 12 x 400,000 bf16 is 9.6 MB > 5 MB
    js = similarity.measure("js", 5, 7, "fp32", torch.device("cpu"))
    assert js["seconds"] > 0 and js["input_gb"] == pytest.approx(5 * 7 * 10 * 4 / 1e9)


def test_round_benchmark_reports_personal_parts(tmp_path):
    args = argparse.Namespace(pool=60, batch_size=8, norm="group", vectorize=-1, accelerator="cpu")
    fedper = round_benchmark.measure("lenet5", 6, "32-true", "fedper", args)
    fedavg = round_benchmark.measure("lenet5", 6, "32-true", "fedavg", args)
    assert fedper["personal_gb"] == pytest.approx(6 * (84 * 10 + 10) * 4 / 1e9)  # 6 clients' own fc3
    assert fedavg["personal_gb"] == 0.0 and fedavg["round_s"] > 0 and fedavg["samples_per_client"] == 10


@pytest.mark.slow
def test_processes_benchmark_times_two_processes_against_the_plain_loop(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    rows = run_main(
        processes,
        monkeypatch,
        tmp_path,
        "--clients",
        "4",
        "--pool",
        "400",
        "--rounds",
        "2",
        "--repeats",
        "1",
        "--plain",
        "--devices",
        "2",
    )
    assert [r["devices"] for r in rows] == ["plain", 2] and rows[0]["speedup"] == 1.0
    assert all(r["round_s"] > 0 and r["rounds_timed"] == 1 for r in rows)


@pytest.mark.slow
def test_startup_benchmark_times_every_command(monkeypatch, tmp_path):
    result = run_main(startup, monkeypatch, tmp_path, "--repeats", "1", "--commands", "list")
    assert set(result["median_s"]) == {"list"}  # every command is one fresh process: one shows the harness works
    assert all(t > 0 for t in result["median_s"].values())


def test_femnist_load_benchmark_writes_leaf_files_and_loads_them_twice_alike(monkeypatch, tmp_path):
    writers = femnist_load.leaf_writers(7, 70)
    assert sum(a + b for a, b in writers.values()) == 70 and all(a >= 1 and b >= 1 for a, b in writers.values())
    monkeypatch.setattr(femnist_load, "load_in_a_fresh_process", femnist_load.load)  # the same load, in this process
    result = run_main(
        femnist_load,
        monkeypatch,
        tmp_path,
        "--writers",
        "7",
        "--images",
        "70",
        "--writers_per_file",
        "3",
        "--folder",
        str(tmp_path / "leaf"),
    )
    assert len(list((tmp_path / "leaf" / "train").glob("*.json"))) == 3  # 7 writers, 3 a file
    assert result["images"] == 70 and result["writers"] == 7 and result["identical"]
    assert result["cache_mb"] > 70 * 784 / 2**20  # the pixels as bytes, and the rest


def test_cross_device_benchmark_runs_fedavg_like_the_plain_loop_and_names_a_refusal(monkeypatch, tmp_path):
    def in_this_process(method, args):
        return cross_device.run_one(
            method,
            args.root,
            args.rounds,
            args.per_round,
            args.folder,
            args.vectorize,
            cross_device.data_overrides(args),
        )

    monkeypatch.setattr(cross_device, "in_a_fresh_process", in_this_process)
    rows = run_main(
        cross_device,
        monkeypatch,
        tmp_path,
        "--root",
        str(tmp_path / "leaf"),
        "--writers",
        "6",
        "--num_writers",
        "6",
        "--public_size",
        "50",
        "--rounds",
        "1",
        "--per_round",
        "2",
        "--methods",
        "fedavg",
        "flhc",
        "--vectorize",
        "0",
        "--folder",
        str(tmp_path / "state"),
    )
    fedavg, flhc = rows
    assert fedavg["writers"] == 6 and len(fedavg["round_s"]) == len(fedavg["plain_round_s"]) == 1
    assert fedavg["max_param_diff"] < 1e-5  # the same two clients' steps; the averages round differently
    assert 0 <= fedavg["test_acc"] <= 1 and fedavg["eval_s"] > 0 and fedavg["state_file_gb"] == 0
    assert "clients_per_round" in flhc["refused"] and "round_s" not in flhc


def test_cross_device_takes_a_methods_init_args_from_its_shipped_config_when_asked():
    """FLIS-DC's class default picks by the empty val split of this setting; its shipped config picks by train."""
    assert cross_device.shipped_algorithm_args("flis_dc") == {"beta": 0.3, "selection_split": "train"}
    assert cross_device.shipped_algorithm_args("flis_hc") == {}  # no shipped config: it refuses a cohort


def forked_command(*args: str) -> float:
    """`tune_overhead.command` (a `python -m fedlight ARGS` and its wall time) as a process forked from the preloaded
    server (`tests/helpers/prestarted.py`): the benchmark's logic, without two interpreters' start-up."""
    import os
    import time

    from helpers.prestarted import fedlight_result

    env = {**os.environ, "WANDB_MODE": "offline", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    started = time.perf_counter()
    result = fedlight_result(list(args), tune_overhead.REPO, env)
    assert result.returncode == 0, result.stderr[-2000:]
    return time.perf_counter() - started


@pytest.mark.slow
def test_tune_overhead_benchmark_runs_the_trials_configurations_again_by_hand(monkeypatch, tmp_path):
    monkeypatch.setattr(tune_overhead, "command", forked_command)
    result = run_main(tune_overhead, monkeypatch, tmp_path, "--trials", "1", "--rounds", "1", "--repeats", "1")
    assert result["trials"] == 1 and result["tune_s"] > 0 and result["fit_s"] > 0
    assert 0 < result["tune_outside_runs_s"] < result["tune_s"]


def test_shipped_configs_benchmark_finds_run_configs_and_compares_auto_with_the_faster_trainer():
    found = shipped_configs.configs_under([BENCHMARKS.parent / "configs" / "digits"])
    names = {p.relative_to(BENCHMARKS.parent).as_posix() for p in found}
    assert "configs/digits/fedavg.yaml" in names and "configs/digits/skew/ditto.yaml" in names
    assert not any("/common/" in n for n in names)  # the shared pieces a config includes are not runs
    row = {
        "config": "configs/digits/x.yaml",
        "auto": {
            "s_per_round": 1.1,
            "wall_s": 9.0,
            "peak_mb": 900.0,
            "summary": {"plan": {"trainer": "sequential", "reason": "probe"}},
        },
        "sequential": {"s_per_round": 1.0, "wall_s": 8.0, "peak_mb": 800.0},
        "vectorized": {"error": "out of memory"},
    }
    assert shipped_configs.table_row(row) == (
        "| configs/digits/x.yaml | 1.10 | 1.00 | out of memory | sequential (probe) | 1.10x | 9.0/8.0/- | 900/800/- |"
    )
    assert shipped_configs.fastest([{"s_per_round": 2.0}, {"error": "x"}, {"s_per_round": 1.5}]) == {"s_per_round": 1.5}
    assert "other repetitions chose vectorized" in shipped_configs.table_row(
        {**row, "auto_choices": ["sequential", "vectorized"]}
    )


def test_paper_configs_benchmark_picks_the_configs_that_make_their_data_and_caps_their_rounds():
    papers = BENCHMARKS.parent / "configs" / "papers"
    synthetic, flis = papers / "pfclus" / "syn_o_h2_kfed.yaml", papers / "flis" / "cifar10" / "ls20_fedavg.yaml"
    assert not paper_configs.reads_files(synthetic)  # SyntheticGaussians draws its points
    assert paper_configs.reads_files(flis)  # its data section is a file naming CIFAR10Federated (a root)
    assert paper_configs.configured_rounds(synthetic, 10) == 1  # its own
    assert paper_configs.configured_rounds(flis, 10) == 10  # 200 in common/federation.yaml, capped
    assert {f.config for f in paper_configs.FAMILIES} <= {
        p.relative_to(BENCHMARKS.parent).as_posix() for p in shipped_configs.configs_under([papers])
    }


def test_a_run_past_its_time_or_memory_is_stopped_with_its_peak_memory():
    sleeper = [sys.executable, "-c", "import time; b = b'x' * (50 << 20); time.sleep(30)"]
    status, usage = shipped_configs.wait_for(subprocess.Popen(sleeper), timeout=1.5)
    assert status is None and usage.ru_maxrss / 1024 > 50  # its 50 MB buffer was counted before it was stopped
    status, usage = shipped_configs.wait_for(subprocess.Popen(sleeper), max_mb=40)
    assert status is None and usage.ru_maxrss / 1024 > 40
    status, _ = shipped_configs.wait_for(subprocess.Popen([sys.executable, "-c", "pass"]), timeout=30, max_mb=1000)
    assert status == 0  # a run within both limits ends by itself
    row = {
        "config": "c.yaml",
        "data": "d",
        "rounds": 1,
        "result": {"error": "stopped past 300 s", "wall_s": 300.4, "peak_mb": 2048.0},
    }
    assert paper_configs.table_row(row) == "| c.yaml | d | 1 | stopped past 300 s | - | 300.4 | 2048 |"


def test_paper_configs_benchmark_runs_a_made_data_config_end_to_end(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = BENCHMARKS.parent / "configs" / "papers" / "pfclus" / "syn_o_h2_kfed.yaml"
    [row] = run_main(paper_configs, monkeypatch, tmp_path, "--configs", str(config), "--families", "none")
    assert row["rounds"] == 1 and row["result"]["s_per_round"] > 0 and row["result"]["peak_mb"] > 0
    assert row["result"]["summary"]["plan"]["trainer"] == "sequential"  # k-FED trains its clients itself


def test_made_femnist_gives_each_chosen_writer_its_drawn_train_and_test_sizes():
    """The in-memory FEMNIST for GPU runs: one client per chosen writer, whose train and test splits have the sizes
    `leaf_writers` drew for it (LEAF's 90/10 split), every made sample used once."""
    data_module = made_femnist.MadeFemnist(
        writers=40, images=2000, num_writers=25, writer_order="random", val_fraction=0.0
    )
    data = data_module.build()
    drawn = femnist_load.leaf_writers(40, 2000)
    assert data.train.num_clients == 25 and len(data_module.writers) == 25
    got = [(data.train.size(k), data.test.size(k)) for k in range(25)]
    assert got == [drawn[w] for w in data_module.writers]
    assert sum(a + b for a, b in drawn.values()) == 2000


def test_virtual_time_to_accuracy_takes_the_first_round_that_reaches_the_target():
    from virtual_time_to_accuracy import first_time_at

    rows = [
        {"system/virtual_time_s": "3.0", "test/acc_mean": "0.5"},
        {"system/virtual_time_s": "7.5", "test/acc_mean": ""},  # a round not evaluated
        {"system/virtual_time_s": "9.0", "test/acc_mean": "0.82"},
        {"system/virtual_time_s": "12.0", "test/acc_mean": "0.79"},
    ]
    assert first_time_at(rows, "test/acc_mean", 0.8) == 9.0
    assert first_time_at(rows, "test/acc_mean", 0.5) == 3.0
    assert first_time_at(rows, "test/acc_mean", 0.9) is None


def test_lora_benchmark_measures_fedlight_the_plain_peft_loop_and_the_memory(monkeypatch, tmp_path):
    """Each measurement of benchmarks/lora_clients.py at 4 clients of a very small model: tokens trained, the plain
    loop's adapters moved, and the memory run's rows: the clients' B rows at 10 a round."""
    size = {"hidden": 16, "layers": 1, "heads": 2, "max_length": 8}
    monkeypatch.setattr(lora_clients, "SIZE", size)
    monkeypatch.setattr(lora_clients, "ROWS_PER_CLIENT", 8)
    corpus, model = lora_clients.make_files(tmp_path, 4, size)
    fed = lora_clients.measure_fedlight(corpus, model, 4, "cpu", 4)
    plain = lora_clients.measure_plain(corpus, model, 4, "cpu")
    for result in (fed, plain):
        assert result["tokens_per_s"] > 0 and result["peak_bytes"] > 0
    corpus, model = lora_clients.make_files(tmp_path, 12, size)
    memory = lora_clients.measure_memory(corpus, model, 12, "cpu")
    assert 10 <= memory["store_rows"] <= 12 and memory["base_bytes"] > memory["adapter_bytes"]


def test_leaderboard_reads_every_pfllib_configs_published_number():
    """Each pfllib config's comment yields the number tests/integration/test_pfllib_configs.py checks it quotes, or
    None where the leaderboard has no row for it ("not found")."""
    from helpers.pfllib import FMNIST_PUBLISHED, PUBLISHED, SPLITS

    paths = leaderboard.configs()
    assert sorted({path.parent.name for path in paths}) == sorted(SPLITS)
    for path in paths:
        table = FMNIST_PUBLISHED if path.parent.name.startswith("fmnist_") else PUBLISHED
        expected = table[path.stem][0 if path.parent.name.endswith("_pat") else 1] if path.stem in table else None
        assert leaderboard.published(path) == expected, path
        assert (expected is None) == ("number: not found" in path.read_text()), path


def test_leaderboard_skips_every_config_whose_data_is_missing(monkeypatch, tmp_path, capsys):
    """Without the data files nothing runs: every config is a "skipped" row, with its published number."""

    def no_run(*args, **kwargs):
        raise AssertionError(f"ran {args} without data")

    monkeypatch.setattr(leaderboard.subprocess, "run", no_run)
    rows = leaderboard.main([str(tmp_path / "data"), "--output_dir", str(tmp_path / "runs")])
    assert len(rows) == 2 + len(leaderboard.configs())
    assert all(" | skipped: no data | " in row for row in rows[2:])
    assert not (tmp_path / "runs").exists()
    out, err = capsys.readouterr()
    assert "| fedala | fmnist_pat | skipped: no data | 99.57 ± 0.01 |" in out
    assert "| fedbn | cifar100_pat | skipped: no data | not found |" in out
    assert err.count("skipped configs/papers/pfllib/") == len(leaderboard.configs())
