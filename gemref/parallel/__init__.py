"""Rung 6: parallelism applied from outside the model (docs/design.md: model code never knows about it).

    mesh.py         the 2D DeviceMesh ("replicate", "shard") over the process group (the RxS
                    spec itself, MeshShape/parse_mesh, lives in gemref/config/)
    replicate.py    replicated data parallelism (mesh Rx1): DDP's bucketed all-reduce, overlapped
    fsdp.py         dense: FSDP2 fully_shard per GEMLayer and on the root (FSDP 1D / HSDP 2D)
    sparse.py       embedding tables sharded row- or table-wise over "shard", all-to-all lookups
    parallelize.py  the mesh of a run, tables then FSDP applied last, per-rank timing and comm records
    memory.py       bytes per rank of parameters, gradients and optimizer state
    comm.py         backend choice (gloo, nccl, ncclx), collective recording, overlap
    volume.py       analytic bytes per step of every collective
    launch.py       local spawned ranks and torchrun's environment

Checkpoints (gemref/checkpoint/) and what every command needs from the OS, files, folder locks
and interrupts (gemref/runtime/), have packages of their own: none of them is parallelism.

gemref/train/compose.py composes them with the other switches; launch.py starts ranks (the one launcher).
This file imports nothing: `import gemref.parallel` stays cheap, and each submodule pulls in
torch.distributed itself.
"""
