"""What test modules share, imported as `helpers.<module>` (pytest puts tests/ on the path: `pythonpath` in
pyproject.toml). A test module imports from here, never from another test module or from conftest.py, which holds
fixtures only.

| module | what it holds |
| --- | --- |
| `federations` | small in-process federations (`small_federation`, `mlp_federation`), `every_row` of a client state, noisy starts, a one-ulp nudge, a network whose head is not linear |
| `softmax_regression` | softmax regression on the digits with its gradient written out, and a resume check on it |
| `resume` | a run crashed and resumed through the command line (`crash_and_resume`, `resumed_and_whole`), metrics.csv `rows` |
| `newcomers` | stand-ins for clients that arrive after training |
| `system_times` | devices set by hand for the system model's virtual clock |
| `reports` | a rich table as text, a run summary, the HTML report's comparison table, a run folder in miniature |
| `pfllib` | PFLlib's benchmark splits and its leaderboard's published numbers |
| `shipped` | every algorithm fedlight installs, by short name |
| `schedules` | the learning rates of a standalone OneCycleLR |
| `ordinary_module` | a LightningModule written for `Trainer.fit` (BatchNorm, `self.log`, StepLR) |
| `data_files` | files in each data family's published on-disk format, with random content |
| `data_checks` | the data-module tests' checks: shapes, label ranges, client counts, no sample in two clients |
| `many_clients` | a data module of many tiny clients built at once (cross-device scale) |
| `tiny_pretrained` | tiny random pretrained-model folders and planted text |
| `prestarted` | `python -m fedlight ARGS` as a process forked from a preloaded server |
"""
