"""Devices set by hand for the system model's virtual clock (`fedlight.system`)."""

from __future__ import annotations


def hand_set_times(model, compute_s, transfer_s):
    """Give a system model's clients devices on which their nominal local work (all local steps, one model each
    way) takes `compute_s` and their transfers `transfer_s` seconds: the clock then charges exactly these times to a
    method whose clients run their local steps (`fedlight.system.work_cost`)."""
    import numpy as np

    from fedlight.system.clock import DeviceProfiles
    from fedlight.system.work_cost import WorkCost

    compute_s, transfer_s = np.asarray(compute_s, dtype=float), np.asarray(transfer_s, dtype=float)
    cost = model.cost
    speeds = model.steps * cost.batch_size / compute_s
    links = np.divide(2 * cost.model_bits / 1e6, transfer_s, out=np.full_like(transfer_s, np.inf), where=transfer_s > 0)
    model.devices = DeviceProfiles(speeds, links)
    model.compute_s, model.transfer_s = compute_s.copy(), transfer_s.copy()
    model.cost = WorkCost(model.devices, cost.batch_size, cost.model_bits, compute_s.copy())
