"""Client training: how one module trains clients from flat parameter vectors (no algorithm, no round).

| module | what it holds |
|---|---|
| `flat` | `FlatModel`: the module's parameters and buffers as views of one flat vector; masks over it |
| `layer_masks` | layer-count masks (half layers included) for personalization layers |
| `sequential` | `ClientTrainer`: one client at a time with the module's own training_step and optimizer |
| `vectorized` | `VectorizedTrainer`: many clients at once through torch.func.vmap, functional optimizer |
| `client_pooling` | vmap's max-pooling of many clients as one pooling over their channels (no copies, on a CPU) |
| `local_work` | `LocalWork`: what one group call of local training does (epochs, hook, trainable entries, weights) |
| `work_shares` | `WorkShares`: the share of its local steps each client a deadline cuts short finishes (partial work) |
| `group_batches` | a group's batches step by step, each client's exactly as alone, for custom group loops |
| `probe` | times both trainers on the same work and keeps the faster (`federation.vectorize: -1`) |
| `schedules` | learning-rate schedulers on the federation's clock |
| `step_logs` | what training_step logs with self.log, captured per client without device syncs |
| `trainer_stand_in` | `TrainerStandIn`: what a client module reads as `self.trainer`, with federated meanings |
"""
