"""The shipped federated algorithms, a module each beside the bases some share (`centroid_base`, `lora_base`), installed
as `fedlight.algorithms`; pyproject.toml registers each algorithm under the `fedlight.algorithms` entry points, which
`fedlight list` shows."""
