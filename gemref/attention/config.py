"""The attention section: the history's layout (rung 1) and the gdpa kernel (rung 2).

It imports only gemref/config/'s helpers (never torch): TrainConfig and the command line read it
without loading a kernel."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

# "auto" and every kernel api.py registers (tests/test_config_sections.py keeps them equal)
KERNEL_NAMES = ("auto", "reference", "cpu_jagged", "cpu_fused", "cpu_fused_amx", "sdpa", "flash_attn", "triton")


@dataclass(frozen=True)
class AttentionConfig(Section):
    jagged: bool = switch(False, "jagged", "rung 1: keep histories jagged instead of padding to max_len")
    kernel: str = switch("reference", "kernel", "rung 2: gdpa kernel (jagged layout; auto picks the fastest that "
                         "runs here; reference = naive materialised)", KERNEL_NAMES)

    def check(self) -> None:
        if self.kernel != "reference" and not self.jagged:
            raise UsageError(f"kernel={self.kernel!r} runs on the jagged layout: add jagged (--jagged); the padded "
                             "layout always runs materialised attention")
