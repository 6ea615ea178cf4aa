"""Rung 6: parallelism applied from outside the model (docs/design.md: model code never knows about it).

The idea (chapter 07_fsdp_2d): ranks form a 2D mesh RxS, R "replicate" groups of S "shard"
ranks. Dense layers are FSDP2 units whose parameters live as 1/S shards, gathered around
their forward and backward, their gradients reduce-scattered over "shard" and all-reduced over
"replicate" (HSDP). Embedding tables are never gathered: their rows are split over "shard"
(row- or table-wise), a lookup moves ids and rows with all-to-alls (all tables in one exchange
per direction), and the R replicas either sum their table gradients after backward (AdamW
tables) or train on their own with row-wise Adagrad or Adam and average their tables every N steps
(TorchRec's DMPCollection). Chapter 08_communication measures the bytes each
collective moves per step and how much of their time compute hides.

Any model: the caller names the modules. `shard_tables(model, mesh, tables, mode)` (fully
qualified names of nn.Embedding / nn.EmbeddingBag modules) returns the sharded tables,
`apply_fsdp(model, mesh, layers, device)` (names of the modules to shard as units, forward
order), `sync_replica_grads(tables, mesh)` after every backward (AdamW tables), or
`RowWiseAdagrad(tables, lr, sync_interval=N)` or `RowWiseAdam(...)` (stepped inside backward,
replicas averaged every N steps; `row_state_dict(model)` for a checkpoint), `fuse_lookups(model,
tables, features)` for one exchange per forward. A missing or wrong name, or an R > 1 mesh whose
tables are never synced, is a ValueError. Units: ranks, rows, bytes.

Copying FSDP2 2D + sharded tables into your trainer: read sparse.py (the tables, their exchange
and replica sync; it imports nothing from gemref), then fsdp.py (the dense units; it imports
sparse.py only to leave the tables out). Build the mesh with init_device_mesh and dims
("replicate", "shard"), or copy mesh.py. For how GEMRef composes them, parallelize.py third.

    sparse.py       named Embedding/EmbeddingBag tables sharded row- or table-wise over "shard",
                    the exchange (one counts, ids and rows all-to-all for any number of tables,
                    one per forward with fuse_lookups), the replicas' gradient sum
    fsdp.py         dense: FSDP2 fully_shard per named layer and on the root (FSDP 1D / HSDP 2D)
    parallelize.py  GEMRef's path: the mesh of a run (parallel_state), its tables then FSDP
                    applied last (parallelize; the names passed by train/compose.py)
    replicate.py    replicated data parallelism (mesh Rx1): DDP's bucketed all-reduce, overlapped
    config.py       the switches: ParallelConfig (mesh, resharding, tables, backend), the RxS
                    spec (MeshShape, parse_mesh), EmbeddingConfig (native or TorchRec tables)
    rowwise.py      row-wise Adagrad and Adam stepped inside backward; the replicas' weight + state average
    mesh.py         the 2D DeviceMesh ("replicate", "shard") over the process group
    backend.py      backend choice (gloo, nccl, ncclx) and the NCCLX mesh
    launch.py       local spawned ranks and torchrun's environment
    memory.py       bytes per rank of parameters, gradients and optimizer state (the lab's)
    volume.py       analytic bytes per step of every collective, FSDP's padded sizes (the lab's
                    comm measurement, gemref/measure/comm.py, sets what was recorded beside it)

Checkpoints (gemref/checkpoint/) and what every command needs from the OS, files, folder locks
and interrupts (gemref/runtime/), have packages of their own: none of them is parallelism.

gemref/train/compose.py composes them with the other switches; launch.py starts ranks (the one launcher).
This file imports nothing: `import gemref.parallel` stays cheap, and each submodule pulls in
torch.distributed itself.
"""
