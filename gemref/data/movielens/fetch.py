"""The pinned recbole wheel, fetched with pip into gemref's cache (download only: never installed, never run).

`pip download --no-deps --only-binary :all: --require-hashes` of `recbole==1.2.1` with its
sha256 pinned, into a temporary folder inside the cache, then renamed into place: a failed or
interrupted download leaves nothing behind. Without a network (or with an index that does not
have it) pip exits non-zero; that is one UsageError saying so, with the way out (download the
wheel elsewhere and pass it with --wheel).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ...env import cache_root
from ...errors import UsageError
from ..manifest import sha256_file

REQUIREMENT = "recbole==1.2.1"
WHEEL = "recbole-1.2.1-py3-none-any.whl"
WHEEL_SHA256 = "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"
PIP_TIMEOUT_S = 20          # per connection attempt (pip's --timeout)
DOWNLOAD_TIMEOUT_S = 300    # the whole pip run


def wheel_cache() -> Path:
    """$GEMREF_CACHE_DIR/movielens (default ~/.cache/gemref/movielens)."""
    return cache_root() / "movielens"


def _pip_error(stderr: str) -> str:
    errors = [line.strip() for line in stderr.splitlines() if line.strip().startswith("ERROR")]
    return errors[-1] if errors else (stderr.strip().splitlines() or ["no message"])[-1]


def fetch_wheel(cache: str | Path | None = None, *, index_url: str | None = None) -> Path:
    """The cached wheel (its sha256 checked), downloaded first when absent; UsageError when pip
    cannot fetch it or what it fetched is not the pinned wheel."""
    folder = Path(cache) if cache else wheel_cache()
    target = folder / WHEEL
    if target.is_file() and sha256_file(target) == WHEEL_SHA256:
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=folder, prefix=".download-")
    except OSError as e:
        raise UsageError(f"wheel cache {folder}: cannot write there ({e.strerror}); set $GEMREF_CACHE_DIR") from None
    try:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
                   "--disable-pip-version-check", "--quiet", "--timeout", str(PIP_TIMEOUT_S), "--retries", "1",
                   "-r", str(requirements), "-d", tmp] + (["--index-url", index_url] if index_url else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UsageError(f"could not fetch {REQUIREMENT}: pip download ran past {DOWNLOAD_TIMEOUT_S} s "
                             f"(slow or no network?); download {WHEEL} elsewhere and pass --wheel PATH") from None
        if done.returncode != 0:
            raise UsageError(f"could not fetch {REQUIREMENT} with pip (exit {done.returncode}: "
                             f"{_pip_error(done.stderr)}; no network or no package index?): download {WHEEL} "
                             f"(sha256 {WHEEL_SHA256[:16]}...) elsewhere and pass --wheel PATH")
        got = Path(tmp) / WHEEL
        if not got.is_file() or sha256_file(got) != WHEEL_SHA256:
            raise UsageError(f"pip download of {REQUIREMENT} did not give {WHEEL} with the pinned sha256")
        os.replace(got, target)
        return target
    finally:
        for leftover in Path(tmp).iterdir():
            leftover.unlink()
        os.rmdir(tmp)
