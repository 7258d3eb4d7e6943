"""How a round's updates are combined, and what a run adds around the combination: robust rules, the engine's
cluster aggregator, client-level differential privacy and attacks (the last two as round extensions).

| module | what it holds |
|---|---|
| `robust` | robust rules on update matrices (median, trimmed mean, Krum, Multi-Krum, Bulyan, geometric median, clipped mean) |
| `config` | the sections it acts on as plain dataclasses (no torch: the command line reads them): `AggregatorConfig` (the rule and its parameters, the rules' table), `AttackConfig`, `PrivacyConfig`, `ServerOptimizerConfig` |
| `cluster_aggregator` | the run's aggregator of each cluster's rows: the weighted mean, a robust rule or DP's noised sums |
| `server_optimizer` | a server optimizer for any method, a round extension: FedAvgM, FedAdam, FedYogi, FedAdagrad stepping each aggregated model with its own state |
| `privacy` | client-level DP, a round extension: DP-FedAvg's clipped and noised cluster sums, adaptive clipping, Opacus's accountant |
| `attacks` | malicious clients for testing robustness, a round extension: data attacks (label flip, backdoor) and update attacks (sign flip, scaling, random) |
"""
