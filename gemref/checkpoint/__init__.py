"""Checkpoints: a run's model, optimizer, data position and RNG, saved and resumed exactly.

    dcp.py     the collective save and load through torch.distributed.checkpoint (DCP), the
               run's identity, resuming (`start_from_checkpoint`); why a checkpoint is trusted input
    folder.py  what is on disk in a checkpoint folder: owner, complete steps, the manifest of
               sizes and hashes, verified without unpickling anything (rank-local)
"""
from .dcp import claim_checkpoint_dir, load_checkpoint, run_identity, save_checkpoint, start_from_checkpoint
from .folder import checkpoint_path, latest_checkpoint, resume_checkpoint, run_description, verify_checkpoint

__all__ = ["claim_checkpoint_dir", "load_checkpoint", "run_identity", "save_checkpoint", "start_from_checkpoint",
           "checkpoint_path", "latest_checkpoint", "resume_checkpoint", "run_description", "verify_checkpoint"]
