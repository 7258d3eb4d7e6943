"""The engine proper: a federation and its round, how clients train and where, evaluation, processes and settings.
Algorithms never import it: they see the run through `fedlight.plugin`.

| module | what it holds |
|---|---|
| `federation` | `Federation`: set-up and `run_round`, select -> train -> aggregate -> evaluate |
| `execution` | the plan and a round's training: its groups, spread over processes, each group's `train_group` |
| `group_training` | both trainers, the probe's choice between them, group sizes by memory: every `train_many` call |
| `extensions` | `RoundExtensions`: a run's round extensions, each hook called on all of them in order |
| `held_out`, `newcomer_evaluation` | `HeldOutClients`, the engine's `Newcomers`; the round extension that evaluates them (`unseen/*`) |
| `round_result` | the typed record a round produces |
| `divergence` | `RoundDiverged`: a round whose server model is not finite or whose clients were all left out stops the run |
| `run_errors` | the errors a run stops with in one line (a diverged round, a full disk under the spill files), without torch, for the command line |
| `evaluator` | every client's model on its split (sharded over processes) |
| `processes` | the collectives of a federation spread over processes |
| `client_states`, `spill` | the client-state stores algorithms declare (rows in memory up to a budget, beyond it in a memory-mapped file), written from what clients return and checkpointed; the file's slots |
| `state_limits` | the client state's memory budget against one round's rows, and the disk of its spill files against the rows a run may spill |
| `round_limits` | a round that holds every update (trained models and starts) against the device's free memory, refused at set-up |
| `config`, `devices` | the federation's settings, Fabric and devices (and the memory they have) |
| `threads` | torch's CPU threads: the usable cores (affinity, cgroup quota) shared among processes and parallel runs |
"""
