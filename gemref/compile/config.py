"""The compile section (rung 3): regional torch.compile and which region kinds it compiles."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

# torch.compile's region kinds (gemref/compile/regions.py REGION_KINDS, plus the loss)
COMPILE_REGIONS = ("sequence.project", "sequence.mix", "interaction", "cross.project", "cross.mix", "loss")


def parse_compile_regions(text: str) -> tuple[str, ...]:
    """The region kinds `text` names ("all", or COMPILE_REGIONS comma-separated), in COMPILE_REGIONS
    order; an unknown, repeated or missing name is a UsageError listing the valid ones."""
    if text == "all":
        return COMPILE_REGIONS
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in COMPILE_REGIONS]
    if bad or not names or len(set(names)) != len(names):
        raise UsageError(f"compile_regions={text!r}: give 'all' or distinct names among "
                         f"{', '.join(COMPILE_REGIONS)}, comma-separated")
    return tuple(n for n in COMPILE_REGIONS if n in names)


@dataclass(frozen=True)
class CompileConfig(Section):
    enabled: bool = switch(False, "compile", "rung 3: torch.compile, block by block (gemref/compile/apply.py)")
    regions: str = switch("all", "compile_regions",
                          "with --compile: the region kinds to compile, comma-separated (the rest stay eager): all, "
                          "or " + ", ".join(COMPILE_REGIONS))

    def check(self) -> None:
        if self.regions != "all":
            parse_compile_regions(self.regions)
            if not self.enabled:
                raise UsageError(f"compile_regions={self.regions!r} is read only with compile=True")

    @property
    def region_kinds(self) -> tuple[str, ...]:
        """The region kinds compiled (COMPILE_REGIONS order)."""
        return parse_compile_regions(self.regions)
