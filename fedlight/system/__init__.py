"""The system model (the `system:` section of a run config): who is available, who is slow, who drops out and who
the server picks, on a virtual clock (docs/architecture.md, "System model"). Off unless a run configures it.

| module | what it holds |
|---|---|
| `config` | `SystemConfig` (the section) and `SpeedDistribution` (a per-client speed's distribution) |
| `speeds` | per-client draws from (seed, purpose, client) streams: speeds, phases, time zones |
| `traces` | trace files of device speeds and online intervals, fedlight's fields or FedScale's |
| `clock` | `DeviceProfiles` (each client's compute and transfer time) and the `VirtualClock` |
| `work_cost` | `WorkCost`: the seconds of what clients' work actually ran (steps, forward passes, models received, bytes sent) |
| `availability` | when clients are online: always, a share, on/off periods, diurnal by time zone, a trace |
| `stragglers` | a synchronous round: the deadline, dropouts, partial work, the round's length |
| `buffered` | asynchronous rounds (FedBuff): the clients in flight, their arrivals, staleness weights, re-basing |
| `selection` | `ClientSelector`, `SelectionContext`; the `uniform` and `data_size` selectors |
| `power_of_choice`, `oort`, `cluster_stratified` | the scoring and stratified selectors |
| `selectors` | `system.selection`'s names and the selector each builds |
| `losses` | the candidates' training losses under their cluster models (power-of-choice, Oort) |
| `system_model` | `SystemModel`: the round extension that puts it all in a run |
"""
