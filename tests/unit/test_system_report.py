"""The report plots accuracy against virtual time for runs with a `system:` section: each evaluated round at the
runs' mean virtual time, the accuracy their mean."""

import json

import yaml

from fedlight.reports import plots
from fedlight.reports.figures import figures
from fedlight.reports.runs import VIRTUAL_TIME, group_runs, load_run


def timed_run(folder, seed: int, times: list[float], accuracies: list[float]):
    """A run folder in miniature: three rounds, virtual time every round, accuracy in rounds 2 and 3."""
    folder.mkdir(parents=True)
    rows = [f"1,{times[0]},", f"2,{times[1]},{accuracies[0]}", f"3,{times[2]},{accuracies[1]}"]
    (folder / "metrics.csv").write_text(f"round,{VIRTUAL_TIME},test/acc_mean\n" + "\n".join(rows) + "\n")
    (folder / "summary.json").write_text(
        json.dumps(
            {"run": folder.name, "algorithm": "FedAvg", "seed": seed, "rounds": 3, "test/acc_mean": accuracies[-1]}
        )
    )
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "algorithm": "fedlight.x.FedAvg"}))
    return load_run(folder)


def test_accuracy_over_virtual_time_is_drawn_at_the_runs_mean_time_of_each_evaluated_round(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "to_svg", lambda figure, salt: "")  # the figures' titles, not their drawing
    runs = [
        timed_run(tmp_path / "a", 0, [5.0, 10.0, 20.0], [0.5, 0.7]),
        timed_run(tmp_path / "b", 1, [6.0, 30.0, 40.0], [0.3, 0.9]),
    ]
    (group,) = group_runs(runs)
    curve = group.curve("test/acc_mean", VIRTUAL_TIME)
    assert curve.x.tolist() == [20.0, 30.0] and curve.mean.tolist() == [0.4, 0.8]
    titles = [f.title for f in figures([group], "test", "acc")]
    assert "Client accuracy over virtual time" in titles
    assert group.curve("test/acc_mean").x.tolist() == [2, 3]
