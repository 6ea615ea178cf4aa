"""Checkpoints: a run's model, optimizer, data position and RNG, saved and resumed exactly.

    config.py  the switches (CheckpointConfig: --checkpoint-dir, --checkpoint-every, --resume, ...)
    dcp.py     the collective save and load through torch.distributed.checkpoint (DCP), the
               run's identity, resuming (`start_from_checkpoint`); why a checkpoint is trusted input
    folder.py  what is on disk in a checkpoint folder: owner, complete steps, the manifest of
               sizes and hashes, verified without unpickling anything (rank-local)
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("CheckpointConfig",),
    ".dcp": ("claim_checkpoint_dir", "load_checkpoint", "run_identity", "save_checkpoint", "start_from_checkpoint"),
    ".folder": ("checkpoint_path", "latest_checkpoint", "resume_checkpoint", "verify_checkpoint")})
