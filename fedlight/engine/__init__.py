"""The engine: a federation and its round, and the plugin boundary algorithms are written against.

| module | what it holds |
|---|---|
| `algorithm` | `Algorithm`: the hooks of a round, the server state (models, assignment, personal parts), FedAvg |
| `server` | `ServerContext`: the services an algorithm may use (data, running the model, layer masks, randomness) |
| `updates`, `round_updates` | `Updates` (stacked rows of trained models) and `RoundUpdates` (a round's, streamed or held) |
| `round_log`, `round_result` | what an algorithm records as it acts, and the typed record a round produces |
| `federation` | `Federation`: set-up and `run_round`, select -> train -> aggregate -> evaluate |
| `execution` | the plan and a round's training: its groups, spread over processes, each group's `train_group` |
| `group_training` | both trainers, the probe's choice between them, group sizes by memory: every `train_many` call |
| `client_state`, `spill` | `ClientState`: a per-client tensor the engine keeps for an algorithm (rows in memory up to a budget, beyond it in a memory-mapped file), written from what clients return and checkpointed; the file's slots |
| `aggregation` | cluster-wise weighted averages as running sums; per-client models built on demand |
| `robust`, `cluster_aggregator` | robust rules on update matrices (median, Krum, ...); the engine's choice of aggregator per run |
| `extensions` | `RoundExtension`: hooks at fixed points of the set-up and the round for what a run adds around it (attacks, DP, held-out clients); `RoundExtensions`, a run's list |
| `attacks` | malicious clients for testing robustness, a round extension: data attacks (label flip, backdoor) and update attacks (sign flip, scaling, random) |
| `privacy` | client-level DP, a round extension: DP-FedAvg's clipped and noised cluster sums, adaptive clipping, Opacus's accountant |
| `evaluator`, `evaluation` | every client's model on its split (sharded over processes); per-client metrics and summaries |
| `processes` | the collectives of a federation spread over processes |
| `newcomers` | `Newcomers`: clients held out of training, as an algorithm sees them when it gives each a model; `HeldOutClients`, the engine's; `nearest_update_direction` |
| `newcomer_evaluation` | `NewcomerEvaluation`: the round extension that evaluates the held-out clients at every evaluation (`unseen/*`) |
| `data`, `config`, `devices` | the data contract, the federation's settings, Fabric and devices |
| `threads` | torch's CPU threads: the usable cores (affinity, cgroup quota) shared among processes and parallel runs |
| `training_stats` | a round's training losses and logged values, reduced in client order |
"""
