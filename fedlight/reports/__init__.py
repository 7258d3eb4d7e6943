"""Reports: run folders read back and compared (HTML page, W&B Report), and the figures shared with W&B.

| module | what it holds |
|---|---|
| `report` | `fedlight report`: one HTML page of the runs (`build`, `write`, `page`) and where it goes |
| `runs` | run folders read back (`find_runs`, `load_run`, `Run`) and grouped by configuration (`Group`, `group_runs`) |
| `tables` | Table 1: its columns, cells as mean ± the 95 % interval over runs, the ranking; the table of runs |
| `figures` | the page's figures, drawn by `plots` and inlined as SVG with their captions |
| `run_groups` | which runs are one configuration (`config_group`) |
| `intervals` | a mean over seeds with its Student-t interval; the paired difference of two methods on the same seeds |
| `selection` | the rounds a run's numbers come from: the last, the one chosen on validation data, the best on test |
| `plots` | every figure, matplotlib's object-oriented API |
| `wandb_report` | the same comparison as a W&B Report; whether W&B runs online |
| `tune_report` | a tuning study's page: search history, parameter importance, tuned against default settings |
"""
