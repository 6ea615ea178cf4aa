"""The checkpoint section: distributed checkpoints (gemref/checkpoint/) into a folder."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError


@dataclass(frozen=True)
class CheckpointConfig(Section):
    folder: str = switch("", "checkpoint_dir", "write distributed checkpoints into this folder (\"\" = none)")
    every: int = switch(0, "checkpoint_every", "save a checkpoint every N steps (0: never)")
    resume: bool = switch(False, "resume", "continue from the newest checkpoint in --checkpoint-dir")
    overwrite: bool = switch(False, "checkpoint_overwrite", "let a fresh run delete the checkpoints it finds in "
                             "--checkpoint-dir (never with --resume)")

    def check(self) -> None:
        if self.every < 0:
            raise UsageError(f"checkpoint_every must be >= 0, got {self.every}")
        if (self.every or self.resume) and not self.folder:
            raise UsageError("checkpoint_every and resume need checkpoint_dir")
        if self.folder and not (self.every or self.resume):
            raise UsageError(f"checkpoint_dir={self.folder!r} with checkpoint_every=0 and no resume: "
                             "nothing would be saved or loaded; set checkpoint_every N (or resume)")
        if self.resume and self.overwrite:
            raise UsageError("resume and checkpoint_overwrite contradict each other: resuming keeps the checkpoints")
