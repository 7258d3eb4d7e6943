"""The run's interface and records: the command line, the round loop with its callbacks, and what a run writes.

| module | what it holds |
|---|---|
| `cli` | `python -m fedlight fit / list / report / sweep / tune`, config parsing and one-line errors |
| `config_errors`, `config_upgrade`, `registry` | jsonargparse errors explained; run configs of earlier versions read in the current format (a moved key told its new name); algorithms, data and models found by entry point |
| `early_checks`, `lazy_types`, `catalog` | what the command line answers before Lightning loads: option and key typos, the parser's base classes, `list` read from the source files, README's algorithm table |
| `runner` | `fit`: rounds, resume, Ctrl-C and SIGTERM, the summary; callbacks called by hook name |
| `termination`, `failures` | SIGTERM handled as Ctrl-C (exit 143; several processes stop after the same round); the line after a failed run's error |
| `callbacks`, `callback_keys` | `Callback`, `Run`, `EarlyStopping`; the key of a callback's state in a checkpoint (its class and arguments) |
| `recorder`, `wandb_logger`, `console`, `checkpoint` | the built-in callbacks: CSV files, W&B, the console, round checkpoints |
| `sweep` | a grid of runs in one process, then the report |
| `compatibility`, `compatibility_table` | every algorithm run with each extension (DP, FedBuff, robust rules and attacks, deadlines, newcomers, a cohort): the table `fedlight list --compatibility` prints, the rows it last made and each algorithm's derived setting |
| `api_reference` | the API reference pdoc builds from the docstrings, and the check that every public name has one |
| `tune`, `tune_space`, `tune_study`, `trial_reporter` | `fedlight tune`: Optuna search on validation data; the search-space file; the study's storage and trial count; the callback reporting each round to the trial |
"""
