"""Intervals over seeds (`fedlight.reports.intervals`), against the Student-t formula worked by hand."""

import math

import pytest

from fedlight.reports.intervals import client_bootstrap, mean_interval, paired_difference

T_975_2 = 4.302652729911275  # the 0.975 quantile of Student's t with 2 degrees of freedom (tables)


def test_three_values_give_the_t_interval_worked_by_hand():
    interval = mean_interval([1.0, 2.0, 3.0])  # mean 2, sample sd 1
    assert interval.mean == 2.0 and interval.n == 3
    assert interval.half_width == pytest.approx(T_975_2 / math.sqrt(3))
    assert interval.text(2) == "2.00 ± 2.48"
    assert not interval.excludes_zero()  # [-0.48, 4.48] spans 0


def test_the_paired_difference_uses_the_seeds_both_methods_ran():
    a, b = {0: 1.0, 1: 2.0, 2: 4.0, 7: 9.0}, {0: 0.0, 1: 1.0, 2: 1.0}  # seed 7 has no pair
    interval = paired_difference(a, b)  # differences 1, 1, 3: mean 5/3, sd sqrt(4/3)
    assert interval.n == 3 and interval.mean == pytest.approx(5 / 3)
    assert interval.half_width == pytest.approx(T_975_2 * math.sqrt(4 / 3) / math.sqrt(3))
    assert not interval.excludes_zero()  # 1.667 ± 2.868 spans 0
    assert paired_difference({0: 1.0, 1: 1.1, 2: 1.2}, {0: 0.0, 1: 0.0, 2: 0.1}).excludes_zero()


def test_one_run_has_no_interval_and_none_is_refused():
    one = mean_interval([0.5])
    assert one.text() == "0.500" and math.isnan(one.low) and not one.excludes_zero()
    with pytest.raises(ValueError, match="at least one value"):
        mean_interval([])
    with pytest.raises(ValueError, match="share no seed"):
        paired_difference({0: 1.0}, {1: 1.0})


def test_the_benchmark_table_pairs_each_configuration_with_the_reference_by_seed(tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import seed_intervals

    finals = {"fedavg": [0.80, 0.70, 0.90], "fedadam": [0.85, 0.76, 0.95]}  # differences 0.05, 0.06, 0.05
    for name, values in finals.items():
        for seed, value in enumerate(values):
            run = tmp_path / f"{name}-s{seed}"
            run.mkdir()
            (run / "metrics.csv").write_text(f"round,test/acc_mean\n1,0.1\n2,{value}\n")
            (run / "summary.json").write_text(json.dumps({"run": run.name, "algorithm": "FedAvg", "seed": seed}))
            (run / "config.yaml").write_text(
                f"seed: {seed}\nalgorithm: fedavg\nserver_optimizer: {name == 'fedadam'}\n"
            )
    assert seed_intervals.main([str(tmp_path), "--metrics", "test/acc_mean", "--against", "fedavg"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    half = T_975_2 * math.sqrt(1 / 3) * 0.01 / math.sqrt(3)  # the differences' sample sd: 0.01 / sqrt(3)
    assert f"0.053 ± {half:.3f} *" in rows["fedadam"] and "0.800 ± " in rows["fedavg"]  # [0.039, 0.068]: not 0


def test_the_client_bootstrap_of_half_right_clients_is_the_binomial_interval():
    """100 clients, half at 1 and half at 0: the resampled mean is Binomial(100, 1/2) / 100, whose 95 % interval is
    0.5 -+ 1.96 x 0.05 = [0.402, 0.598] (the normal approximation), to a resample's granularity."""
    interval = client_bootstrap([1.0] * 50 + [0.0] * 50 + [math.nan] * 3)  # NaN: clients with nothing to evaluate
    assert interval.mean == 0.5 and interval.n == 100
    assert abs(interval.low - 0.402) <= 0.021 and abs(interval.high - 0.598) <= 0.021
    assert client_bootstrap([0.5] * 7).low == client_bootstrap([0.5] * 7).high == 0.5  # no spread to resample
    assert math.isnan(client_bootstrap([0.7]).low)


def test_the_summary_carries_the_client_interval_and_the_resolution(tmp_path, tiny_run_args):
    import json

    from fedlight.datamodules import DigitsFederated
    from fedlight.run.cli import main

    assert main(tiny_run_args + ["--run_name", "run"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test/acc_mean_low"] <= summary["test/acc_mean"] <= summary["test/acc_mean_high"]
    data = DigitsFederated(num_clients=6)
    data.setup()
    median = sorted(data.federated.test.sizes())[2:4]  # six clients: the median is the mean of the middle two
    assert summary["test/acc_resolution"] == pytest.approx(1 / (sum(median) / 2))
