"""The one place gemref imports TorchRec (lazily: `torchrec()` on first use).

TorchRec 1.8.0 runs on torch 2.13 CPU with fbgemm-gpu-cpu 1.8.0 (requirements-nodeps.txt).
Importing it makes fbgemm_gpu emit DeprecationWarnings about its own modules (the CPU wheel
lacks the SSD optimizers, and an old module name is deprecated); exactly those are ignored
here, every other warning passes.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import warnings
from types import ModuleType

from ..env import paired_versions
from ..errors import UsageError

log = logging.getLogger(__name__)
INSTALL_HINT = ("on CPU: pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 plus their pure-Python needs "
                "(requirements-nodeps.txt; `make venv` installs them); beside a CUDA torch: requirements-gpu.txt")


def torchrec() -> ModuleType:
    """The `torchrec` package (with `torchrec.distributed` loaded); a UsageError saying why when it cannot load."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"fbgemm_gpu(\.|$)")
            module = importlib.import_module("torchrec")
            importlib.import_module("torchrec.distributed")
    except (ImportError, OSError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"TorchRec is not usable here ({type(e).__name__}: {reason}); {INSTALL_HINT}") from e
    _warn_unpaired()
    return module


@functools.cache
def _warn_unpaired() -> None:
    """Once per process: what does not pair with this torch (gemref/env.py paired_versions)."""
    for problem in paired_versions():
        log.warning("TorchRec loaded, but %s (requirements-gpu.txt lists the pairs)", problem)


def available() -> bool:
    """Whether `torchrec()` would succeed (imports it if so)."""
    try:
        torchrec()
    except UsageError:
        return False
    return True


@contextlib.contextmanager
def quiet_torchrec():
    """Exactly the notices TorchRec's sharded modules print on every rank, silenced (used around a
    rank's work with TorchRec tables): torch's FutureWarning that the collectives TorchRec calls
    (reduce_scatter_tensor, all_gather_into_tensor) have new names, its FutureWarning that
    ShardedTensor (the type of TorchRec's sharded weights, which gemref reads to count a rank's
    bytes) is deprecated, and torch.fx's one-off note on is_fx_tracing, which TorchRec asks."""
    fx_log = logging.getLogger("torch.fx._symbolic_trace")
    level = fx_log.level
    fx_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning,
                                    message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` "
                                            r"is deprecated")
            warnings.filterwarnings("ignore", category=FutureWarning,
                                    message=r"Please use DTensor instead and we are deprecating ShardedTensor")
            yield
    finally:
        fx_log.setLevel(level)
