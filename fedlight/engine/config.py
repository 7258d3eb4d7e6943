"""The federation's settings (the `federation:` section of a run config)."""

from __future__ import annotations

from dataclasses import dataclass

#: evaluation's rows per forward pass on an accelerator by default (a CPU's are fitted to the network:
#: `fedlight.plugin.eval_rows`)
ACCELERATOR_EVAL_BATCH = 4096


@dataclass
class FederationConfig:
    """How the federation runs.

    Args:
        rounds: communication rounds.
        local_epochs: passes over its training data each selected client makes per round.
        clients_per_round: exactly this many clients train every round, drawn from a (seed, round) stream, whatever
            the algorithm (`fedlight.plugin.cohort`: 10 of 3,400 for cross-device runs); None: the algorithm's
            `participation` share. Give one of the two: with a count, participation stays 1.0.
        batch_size: local mini-batch size.
        accelerator: "auto", "cpu", "cuda", ... (Lightning Fabric's names).
        precision: Fabric precision; None picks bf16-mixed (or 16-mixed) on a GPU and 32-true on a CPU.
        eval_every: evaluate every client's model every this many rounds (and always after the last).
        eval_split: the per-client split evaluated ("test", "val", or "train" for methods such as data
            clustering that are scored on the data they fit).
        eval_batch_size: rows per forward pass during evaluation and inference; None: 4,096 on an accelerator, and
            on a CPU the most (up to 512) whose largest activation stays under 32 MiB, which glibc's allocator
            reuses instead of mapping afresh (`fedlight.plugin.eval_rows`: LeafCNN 256, LeNet-5 512).
        vectorize: train this many clients at once through torch.func (0 = one after another; -1 = auto: groups
            of as many as half the free memory holds, on a CPU at most 256; round 1 trains part of the first group
            each way, timed, and the faster is kept, see `fedlight.training.probe`). Give 0 or a group size
            for runs that must repeat bit for bit on other machines: the two trainers agree only up to float
            rounding. What cannot be vectorized (other optimizers, a gradient scaler) trains sequentially. An
            algorithm that aggregates by running sums (FedAvg, FedProx, FedPer, ...) also receives the updates
            in groups of this size, so memory does not grow with clients x parameters.
        finetune_epochs: when above 0, every evaluation also fine-tunes each client's evaluation model on its own
            training split for this many epochs (the module's SGD, a stream of its own) and evaluates that:
            `<split>_ft/*` beside `<split>/*`, per-client `ft_*` (FedAvg-FT, FedBABU's and Per-FedAvg's protocols).
            The server's state does not change.
        devices: processes per machine ("auto": one per GPU, and one on a CPU, as Fabric counts); each trains
            its share of every round's clients (`fedlight.engine.processes`). More than one starts the other
            processes itself, unless a launcher (torchrun, `fabric run`, SLURM) already started them.
        num_nodes: machines the processes are spread over (each runs `devices` processes).
        strategy: Fabric's multi-process strategy ("ddp": gloo on CPUs, NCCL on GPUs).
        threads: torch's CPU threads per process; None: `OMP_NUM_THREADS` when set, else the cores this process may
            use (affinity, cgroup quota) shared among the run's processes on the machine and the runs launched beside
            it (`fedlight.engine.threads`), so parallel runs do not oversubscribe the cores.
        client_state_memory: GB of per-client state (personal models, control variates: `fedlight.plugin.client_state`)
            kept in memory, over all of the algorithm's stores; rows beyond it go to memory-mapped files in the run
            folder's `client_state/`. None: a quarter of the memory available on the device at set-up. It must hold
            one round's rows, which the round has on the device at once (`fedlight.engine.state_limits`).
    """

    rounds: int = 20
    local_epochs: int = 1
    clients_per_round: int | None = None
    batch_size: int = 32
    accelerator: str = "auto"
    precision: str | None = None
    eval_every: int = 1
    eval_split: str = "test"
    eval_batch_size: int | None = None
    vectorize: int = -1
    finetune_epochs: int = 0
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "ddp"
    threads: int | None = None
    client_state_memory: float | None = None

    def eval_rows(self, device_type: str) -> int | None:
        """Rows per forward pass of evaluation on a device of type `device_type` ("cpu", "cuda"): `eval_batch_size`,
        the accelerator's default, or None on a CPU, where the rows are fitted to the network's activations. (A type
        name, not a torch.device: the command line reads this file without torch, and jsonargparse evaluates even a
        type-checking import.)"""
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        return None if device_type == "cpu" else ACCELERATOR_EVAL_BATCH

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"federation.{name} must be at least 1, got {getattr(self, name)}")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ValueError(
                f"federation.clients_per_round must be at least 1 (or null: the algorithm's participation "
                f"share), got {self.clients_per_round}"
            )
        if self.finetune_epochs < 0:
            raise ValueError(f"federation.finetune_epochs must be 0 (off) or more, got {self.finetune_epochs}")
        if self.vectorize < -1:
            raise ValueError(f"federation.vectorize must be -1 (auto), 0 (off) or a client count, got {self.vectorize}")
        if self.eval_split not in ("test", "val", "train"):
            raise ValueError(f"federation.eval_split must be 'test', 'val' or 'train', got {self.eval_split!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"federation.threads must be at least 1 (or null: the usable cores), got {self.threads}")
        if self.client_state_memory is not None and not self.client_state_memory > 0:
            raise ValueError(
                f"federation.client_state_memory must be above 0 GB (or null: a quarter of the available "
                f"memory), got {self.client_state_memory}"
            )
        if not (self.devices == "auto" or isinstance(self.devices, int) and self.devices >= 1) or self.num_nodes < 1:
            raise ValueError(
                f"federation.devices must be 'auto' or at least 1 and federation.num_nodes at least 1, "
                f"got {self.devices!r} and {self.num_nodes}"
            )
