"""W&B across resumes (offline): every resume continues the same W&B run, and the closing line uploads all of it."""

from __future__ import annotations

import re

from fedlight.run.cli import main


def test_a_resumed_runs_offline_folders_share_one_id_and_the_sync_line_names_them_all(tmp_path, tiny_run_args, capsys):
    args = [a if a != "false" else "true" for a in tiny_run_args]  # W&B on (offline in tests)
    run = tmp_path / "run"
    assert main(args + ["--run_name", "run", "--federation.rounds", "1"]) == 0
    for rounds in ("2", "3"):
        assert main(["fit", "--resume", str(run), "--federation.rounds", rounds]) == 0
    folders = sorted((run / "wandb").glob("offline-run-*"))
    ids = {re.sub(r"^offline-run-\d{8}_\d{6}-([0-9a-z]+)(-\d+)?$", r"\1", f.name) for f in folders}
    assert len(folders) >= 2 and len(ids) == 1, [f.name for f in folders]  # one W&B run, written in parts
    last = [line for line in capsys.readouterr().out.splitlines() if line.startswith("upload to W&B:")][-1]
    assert last.split()[3:5] == ["wandb", "sync"] and sorted(last.split()[5:]) == sorted(str(f) for f in folders)
