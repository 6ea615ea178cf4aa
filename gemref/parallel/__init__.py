"""Parallelism applied from outside the model (DESIGN.md: model code never knows about it).

    mesh.py        the 2D DeviceMesh ("replicate", "shard") from --mesh RxS
    fsdp.py        dense: FSDP2 fully_shard per GEMLayer and on the root (FSDP 1D / HSDP 2D)
    sparse.py      embedding tables sharded row- or table-wise over "shard", all-to-all lookups
    memory.py      bytes per rank of parameters, gradients and optimizer state
    comm.py        backend choice (gloo, nccl, ncclx), collective recording, overlap
    volume.py      analytic bytes per step of every collective
    cost_model.py  alpha-beta time of collectives per link tier (for the scale projection)
    checkpoint.py  atomic distributed checkpoints (torch.distributed.checkpoint)
    launch.py      local spawned ranks and torchrun's environment

gemref/distributed.py wires them into training; gemref/train.py composes the switches.
Submodules are imported where used (this package imports nothing on purpose, so that
gemref.config can validate a mesh spec without pulling in torch.distributed).
"""
