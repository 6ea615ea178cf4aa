"""Where and with what a run happens: the device, the versions and git sha a record names.

Cross-cutting helpers used by train, the benches and the waterfall (nothing here imports
another gemref module except the package version).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from . import __version__

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resolve_device(name: str = "auto") -> torch.device:
    """auto -> cuda when available, else cpu; an unavailable or unknown device is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    return torch.device(name)


def versions() -> dict:
    """torch and gemref versions and the git sha of the checkout (None outside a git clone)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5)
        sha = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"torch": torch.__version__, "gemref": __version__, "git_sha": sha}
