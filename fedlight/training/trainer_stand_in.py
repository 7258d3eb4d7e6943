"""What a client module reads as `self.trainer`: a stand-in for Lightning's Trainer, with federated meanings.

A LightningModule written for `Trainer.fit` reads its Trainer in `configure_optimizers` and `training_step`
(`OneCycleLR(optimizer, max_lr, total_steps=self.trainer.estimated_stepping_batches)`, `self.current_epoch`,
`self.global_step`). fedlight runs those two methods itself, without a Trainer, so it attaches a `TrainerStandIn` as
the module's trainer (`module.trainer = ...`, as `Trainer.fit` attaches itself), and Lightning's own properties
(`self.current_epoch`, `self.global_step`, `self.global_rank`, `self.local_rank`, `self.logger`, `self.print`) read it
as they read a Trainer. Every number is a plain Python int, so a step run under `torch.func.vmap` (the vectorized
trainer) reads what it reads alone, and both trainers show a step the same values:

- `max_epochs`: the local epochs (`federation.local_epochs`);
- `num_training_batches`: batches of one local epoch of the largest client (held-out clients included);
- `estimated_stepping_batches`: one round's optimizer steps of the largest client, `num_training_batches *
  max_epochs`. Step schedulers start afresh each round (`fedlight.training.schedules`), so
  `OneCycleLR(total_steps=estimated_stepping_batches)` runs one whole cycle a round (a smaller client trains its
  first steps); the run's total steps would keep every round in the cycle's warm-up;
- `current_epoch`: the local epoch being trained (0 in `configure_optimizers`);
- `global_step`: the run's step clock, `(round - 1) * estimated_stepping_batches + current_epoch *
  num_training_batches + batch_idx`: the same for every client at one point of a round (a client's own count would
  differ between the clients of one vectorized step), rising through the run;
- `num_devices`: the run's processes on this node (1 in one process); `num_nodes`, `world_size`, `global_rank`,
  `local_rank`, `node_rank`, `is_global_zero`: Fabric's;
- `logger`, `loggers`, `progress_bar_callback`: None, [], None (a client logs through `self.log` in `training_step`);
  `barebones`: True, so Lightning skips a `self.log` outside `training_step`, as it does with no Trainer.

Any other attribute has no meaning here: reading it raises `TrainerAttributeError`, one line naming the attribute and
why. It is a ValueError, so the command line prints it as its one-line error, and an AttributeError, so
`getattr(self.trainer, name, default)` still gives the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

#: why an attribute a Trainer has means nothing here, for those a module is likely to read
_WHY_NOT = {
    "datamodule": "the clients' data are tensors on the device, split by client, with no data module attached",
    "train_dataloader": "a client's batches are gathered from its rows on the device, with no DataLoader",
    "max_steps": "local training runs max_epochs epochs over each client's data, with no step limit",
    "optimizers": "each client trains with the optimizer configure_optimizers returned, reset for every client",
    "lr_scheduler_configs": "schedulers run on the federation's clock (interval 'epoch' = a round)",
    "strategy": "fedlight takes the optimizer steps itself (automatic optimization only)",
    "callbacks": "callbacks observe rounds (the config's `callbacks:`), not local steps",
    "callback_metrics": "what training_step logs becomes train/<name> of the round, a mean over clients",
}
_GENERAL = "fedlight runs configure_optimizers and training_step itself, without a Trainer"


class TrainerAttributeError(AttributeError, ValueError):
    """A client module read a Trainer attribute that has no meaning in a federated run."""


class TrainerStandIn:
    """The Trainer a client module sees (see the module doc for each attribute's meaning)."""

    def __init__(
        self,
        local_epochs: int,
        num_training_batches: int,
        num_nodes: int = 1,
        world_size: int = 1,
        global_rank: int = 0,
        local_rank: int = 0,
        node_rank: int = 0,
    ) -> None:
        self.max_epochs = local_epochs
        self.num_training_batches = num_training_batches
        self.estimated_stepping_batches = num_training_batches * local_epochs
        self.num_nodes, self.world_size = num_nodes, world_size
        self.num_devices = max(1, world_size // num_nodes)
        self.global_rank, self.local_rank, self.node_rank = global_rank, local_rank, node_rank
        self.is_global_zero = global_rank == 0
        self.logger, self.progress_bar_callback = None, None
        self.loggers: list[Any] = []
        self.barebones = True
        self.current_epoch = 0
        self.global_step = 0

    @classmethod
    def of_run(
        cls, fabric: L.Fabric, num_nodes: int, local_epochs: int, batch_size: int, largest_client: int
    ) -> "TrainerStandIn":
        """The stand-in of a run: its local epochs, the batches of an epoch of its largest client (`largest_client`
        training rows in batches of `batch_size`) and Fabric's processes."""
        return cls(
            local_epochs,
            -(-largest_client // batch_size),
            num_nodes,
            fabric.world_size,
            fabric.global_rank,
            fabric.local_rank,
            fabric.node_rank,
        )

    def at(self, round: int, epoch: int, batch_idx: int) -> None:
        """Where local training is: step `batch_idx` of local epoch `epoch` in round `round` (1-based)."""
        self.current_epoch = epoch
        self.global_step = (round - 1) * self.estimated_stepping_batches + epoch * self.num_training_batches + batch_idx

    def __getattr__(self, name: str) -> Any:
        """Called only for what the stand-in does not have: one line naming the attribute, why, and what there is."""
        if name.startswith("__") and name.endswith("__"):  # Python's own protocols (copy, pickle) probe these
            raise AttributeError(name)
        readable = ", ".join(sorted(vars(self)))
        raise TrainerAttributeError(
            f"self.trainer.{name} has no meaning in a federated run: {_WHY_NOT.get(name, _GENERAL)}; a client module "
            f'can read self.trainer\'s {readable} (docs/architecture.md, "Clients are LightningModules")'
        )
