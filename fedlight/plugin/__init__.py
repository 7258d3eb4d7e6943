"""The plugin namespace: everything an algorithm (or a round extension, a data module) may import, from one package.

    from fedlight.plugin import Algorithm, RoundUpdates, ClientModels, Trained

| module | what it holds |
|---|---|
| `algorithm` | `Algorithm`: the hooks of a round, the server state (models, assignment, personal parts), FedAvg; `Plan`, how its rounds run; `GroupModels`, the models it evaluates |
| `cohort` | `Cohort`: the clients of a round, an exact count (`federation.clients_per_round`) or a share (`participation`); `share_count`, the clients a share selects; `CohortDraw`, the run's draw (`server.cohort`); `Sampling`, how clients are chosen |
| `server` | `ServerContext`: the services an algorithm may use, in namespaces (`run`, `data`, `clients`, `model`, `random`, `state`, `message`, `aggregation`, `cohort`, `log`) |
| `model_view` | `ModelView`: the network as flat models (`server.model`: predict, features, gradients, layer masks) |
| `updates`, `round_updates` | `Updates` (stacked rows of trained models) and `RoundUpdates` (a round's, streamed or held) |
| `training_stats` | a round's training losses and logged values, reduced in client order; `Processes`, what a round needs of the processes (the engine's `Collective` meets it) |
| `client_state` | `ClientState`: what an algorithm sees of a per-client tensor the engine keeps for it (`read`, `write`, `touched`; the stores are `fedlight.engine.client_states`) |
| `personal_part` | the base class's personal part as a client state: clients never written read `PersonalStart` rows; re-slicing at a mask change |
| `aggregation` | `ClusterAverage` (cluster-wise weighted averages as running sums), `ClientModels` (per-client models built on demand) |
| `shared_body` | `SharedBodyModels`: per-client models that differ from their cluster's only in the head, which evaluation runs as one body pass a cluster and a head a client |
| `channels_last` | evaluation's convolutions in channels-last layout on a CPU, on copies of the weights for one forward pass |
| `eval_rows` | evaluation's rows a forward pass on a CPU: the most whose largest activation stays under 32 MiB, which glibc reuses instead of mapping afresh |
| `client_work` | `ClientWork`: what each client's local work ran (training steps, forward passes, models used, bytes sent), counted where it runs, which the virtual clock charges |
| `population` | `ClientPopulation`: a set of clients and their data (sizes, splits, losses, per-sample losses, local training), the training clients' (`ServerContext.clients`) and the newcomers' |
| `newcomers` | `Newcomers`: clients held out of training, as an algorithm sees them when it gives each a model; `nearest_update_direction`, `nearest_direction`, `best_fitting` |
| `message` | `MessageSchema`: what a client's message carries beside its trained model (`MODEL`, `SUMMED`, `PER_CLIENT`, `ROUTING` entries), which every round extension reads to refuse what it cannot handle |
| `extension` | `RoundExtension`: hooks at fixed points of the set-up and the round for what a run adds around it |
| `round_work` | `RoundWork`: what a round's selected clients get done (who sends nothing, who is cut short), as extensions decide; `Arrivals`: the updates an asynchronous round aggregates |
| `round_log` | what an algorithm records as it acts (`Algorithm.log`, `log_matrix`) |
| `data` | the data contract: `ClientSplit`, `FederatedData`, what a data module gives |
| `evaluation` | per-client metrics and their summaries (mean, spread, worst client) |
| `model_parts` | `ModelParts`: the model as a method extends it before set-up (`Algorithm.extend_model`); `head_inputs`: the features (the head's input) beside the outputs; `features_with`: another model's features |
| `choices` | the error for a name outside a fixed set, with the nearest valid name (a typo's "did you mean") |

What an algorithm may import is this package and `fedlight.cluster` (tests/docs/test_layout.py checks `algorithms/`).
"""

import importlib
from typing import TYPE_CHECKING, Any

#: each public name -> the module that defines it, imported when the name is first asked for (PEP 562), so that
#: importing one light module of the package (`fedlight.plugin.choices`, `message`) does not load torch and
#: scikit-learn through the others: the command line answers `--help` and config errors without them
_WHERE = {
    "ClientModels": "fedlight.plugin.aggregation",
    "ClusterAverage": "fedlight.plugin.aggregation",
    "SharedBodyModels": "fedlight.plugin.shared_body",
    "Algorithm": "fedlight.plugin.algorithm",
    "GroupModels": "fedlight.plugin.algorithm",
    "Plan": "fedlight.plugin.algorithm",
    "ClientState": "fedlight.plugin.client_state",
    "share_count": "fedlight.plugin.cohort",
    "ClientSplit": "fedlight.plugin.data",
    "FederatedData": "fedlight.plugin.data",
    "summarize": "fedlight.plugin.evaluation",
    "ExtensionContext": "fedlight.plugin.extension",
    "RoundExtension": "fedlight.plugin.extension",
    "MODEL": "fedlight.plugin.message",
    "PER_CLIENT": "fedlight.plugin.message",
    "ROUTING": "fedlight.plugin.message",
    "SUMMED": "fedlight.plugin.message",
    "MessageSchema": "fedlight.plugin.message",
    "ModelParts": "fedlight.plugin.model_parts",
    "features_with": "fedlight.plugin.model_parts",
    "head_inputs": "fedlight.plugin.model_parts",
    "Newcomers": "fedlight.plugin.newcomers",
    "best_fitting": "fedlight.plugin.newcomers",
    "nearest_direction": "fedlight.plugin.newcomers",
    "nearest_update_direction": "fedlight.plugin.newcomers",
    "unit_rows": "fedlight.plugin.newcomers",
    "ClientPopulation": "fedlight.plugin.population",
    "RoundUpdates": "fedlight.plugin.round_updates",
    "Arrivals": "fedlight.plugin.round_work",
    "RoundWork": "fedlight.plugin.round_work",
    "ServerContext": "fedlight.plugin.server",
    "Updates": "fedlight.plugin.updates",
    "GroupStep": "fedlight.training.group_batches",
    "half_step": "fedlight.training.layer_masks",
    "LocalWork": "fedlight.training.local_work",
    "Trained": "fedlight.training.sequential",
    "GroupHook": "fedlight.training.vectorized",
}

if TYPE_CHECKING:  # the names as the type checker sees them; at run time `__getattr__` imports them
    from fedlight.plugin.aggregation import ClientModels, ClusterAverage
    from fedlight.plugin.algorithm import Algorithm, GroupModels, Plan
    from fedlight.plugin.client_state import ClientState
    from fedlight.plugin.cohort import share_count
    from fedlight.plugin.data import ClientSplit, FederatedData
    from fedlight.plugin.evaluation import summarize
    from fedlight.plugin.extension import ExtensionContext, RoundExtension
    from fedlight.plugin.message import MODEL, PER_CLIENT, ROUTING, SUMMED, MessageSchema
    from fedlight.plugin.model_parts import ModelParts, features_with, head_inputs
    from fedlight.plugin.newcomers import (
        Newcomers,
        best_fitting,
        nearest_direction,
        nearest_update_direction,
        unit_rows,
    )
    from fedlight.plugin.population import ClientPopulation
    from fedlight.plugin.round_updates import RoundUpdates
    from fedlight.plugin.round_work import Arrivals, RoundWork
    from fedlight.plugin.server import ServerContext
    from fedlight.plugin.updates import Updates
    from fedlight.training.group_batches import GroupStep
    from fedlight.training.layer_masks import half_step
    from fedlight.training.local_work import LocalWork
    from fedlight.training.sequential import Trained
    from fedlight.training.vectorized import GroupHook

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedlight.plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
