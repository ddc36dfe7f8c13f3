"""Where eqsat keeps what it computed once: machine rates, optimized programs, object code.

One directory for all of it: the argument, else `$EQSAT_CACHE_DIR`, else `$XDG_CACHE_HOME/eqsat`,
else `~/.cache/eqsat`. Entries are written atomically, and a cache that cannot be read or written
is skipped, never an error: it only ever saves time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import tempfile
from pathlib import Path

from .host import usable_cores

CACHE_ENV = "EQSAT_CACHE_DIR"
_PACKAGE = Path(__file__).resolve().parent


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The cache directory (see the module docstring for the order of precedence)."""
    if override is not None:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "eqsat"
    return Path.home() / ".cache" / "eqsat"


def load(directory: Path | None, name: str) -> bytes | None:
    """The entry `name`, or None when there is none (or no cache)."""
    if directory is None:
        return None
    try:
        return (directory / name).read_bytes()
    except OSError:
        return None


def _entry_mode() -> int:
    """The permissions of an entry: what `open` would give a new file (0o666 less the umask).
    mkstemp's own 0o600 made a cache filled by one user (a container image's build step) one
    that every other user could not read: each of their compiles was a cold one."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # without /proc the umask is only read by setting it
    os.umask(mask)
    return 0o666 & ~mask


def store(directory: Path | None, name: str, data: bytes) -> None:
    """Write entry `name` atomically: a concurrent reader sees all of it or nothing. A write
    that fails (a full disk, a directory in the entry's place) removes its temporary file: each
    one left behind took more of the disk that was already full."""
    if directory is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _entry_mode())
            f.write(data)
        os.replace(tmp, directory / name)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


_CHECKED = b"eqsat-entry sha256="


def store_checked(directory: Path | None, name: str, data: bytes) -> None:
    """`store` with a digest of `data` in front, so that `load_checked` can tell a damaged
    entry (emptied or cut short by a crash or a full disk, edited) from a good one."""
    digest = hashlib.sha256(data).hexdigest().encode()
    store(directory, name, _CHECKED + digest + b"\n" + data)


def load_checked(directory: Path | None, name: str) -> bytes | None:
    """The entry `name` written by `store_checked`, or None when there is none or it does not
    match its digest (object code that does not is never handed to the loader: an empty or
    cut object crashed the process)."""
    raw = load(directory, name)
    if raw is None or not raw.startswith(_CHECKED):
        return None
    digest, sep, data = raw[len(_CHECKED):].partition(b"\n")
    if not sep or hashlib.sha256(data).hexdigest().encode() != digest:
        return None
    return data


# Bumped when the rates' measurement changes, so rates measured the old way are measured again.
RATES_VERSION = 4


@functools.cache
def machine_key() -> str:
    """What identifies this machine for measured rates: host, processor and core count (and
    how the rates are measured)."""
    import numpy as np

    return "|".join([platform.node(), platform.machine(), _processor(),
                     str(usable_cores()), np.__version__, f"rates{RATES_VERSION}"])


def _processor() -> str:
    # The CPU model from /proc/cpuinfo where there is one: platform.processor() runs `uname -p`
    # in a subprocess on Linux (~5 ms of every cached compile) and says only "x86_64" there.
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


@functools.cache
def source_fingerprint(*packages: str) -> str:
    """A hash of the source files of eqsat's subpackages `packages`, so that cached results
    made by another version of the code are never used (once per process: the source a
    process runs is the source it imported)."""
    h = hashlib.sha256()
    for package in packages:
        for path in sorted((_PACKAGE / package).rglob("*.py")):
            h.update(path.relative_to(_PACKAGE).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]
