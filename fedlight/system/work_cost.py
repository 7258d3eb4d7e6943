"""What the work clients actually ran costs on their devices (`fedlight.plugin.client_work`): the virtual clock
charges each method its own work, not one model's training and transfer a round.

compute = (training steps x batch size + forward-only samples x FORWARD_SHARE) / training samples per second, every
step counted as a full batch (FedScale's rule); transfer = (models received + the trained model + what the message
carried beside it) / link speed, where the models received are the most models one client's work used in the round
(IFCA's K cluster models, FedEM's K components, Ditto's personal model beside the global one: an upper bound, since
a model a client keeps on its device is counted as received). A client whose work nothing counted (an algorithm's
own `train_client`, local k-means on its points) is charged its nominal local steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlight.plugin.client_work import WorkDone
from fedlight.system.clock import DeviceProfiles

#: a forward pass's share of a training step's forward and backward passes (the backward costs about twice the
#: forward), so a loss pass over n samples costs as n / 3 training samples
FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True)
class WorkCost:
    """Seconds of clients' counted work on their devices.

    Attributes:
        devices: every client's compute and link speed.
        batch_size: samples a training step counts.
        model_bits: bits of one flat model.
        nominal_compute_s: (clients,) each client's nominal local work (its local steps), charged when its work
            counted nothing.
    """

    devices: DeviceProfiles
    batch_size: int
    model_bits: float
    nominal_compute_s: np.ndarray

    def compute_s(self, done: WorkDone, clients: np.ndarray) -> np.ndarray:
        """(len(clients),) seconds of the clients' counted local work."""
        samples = done.steps[clients].astype(float) * self.batch_size + done.forward_samples[clients] * FORWARD_SHARE
        counted = samples / self.devices.samples_per_s[clients]
        return np.where(samples > 0, counted, self.nominal_compute_s[clients])

    def transfer_s(self, done: WorkDone, clients: np.ndarray) -> np.ndarray:
        """(len(clients),) seconds of the clients' transfers: the models they used received, the trained model and
        the message's other entries sent."""
        received = np.maximum(done.models_used[clients], 1) * self.model_bits
        sent = self.model_bits + done.sent_bytes[clients] * 8.0
        return (received + sent) / (self.devices.link_mbps[clients] * 1e6)

    def phase_s(self, done: WorkDone) -> float:
        """Seconds of a phase every client that worked in runs at once (the selection's loss passes): its slowest
        client's work and the models it received."""
        worked = np.flatnonzero((done.steps > 0) | (done.forward_samples > 0))
        if not len(worked):
            return 0.0
        samples = done.steps[worked].astype(float) * self.batch_size + done.forward_samples[worked] * FORWARD_SHARE
        received = np.maximum(done.models_used[worked], 1) * self.model_bits
        seconds = samples / self.devices.samples_per_s[worked] + received / (self.devices.link_mbps[worked] * 1e6)
        return float(seconds.max())
