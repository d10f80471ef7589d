"""The local spool: receipts and failures are written here, fsynced, before they are sent.

One JSON file per event, named so that sorting the names gives the order they were
written in. A file is deleted only once the server has acknowledged it, so an event
outlives a crash, a lost connection or a server that is away, and the next client on
the same spool sends it again; the server deduplicates, so delivery is exactly-once in
effect. An entry being sent is held under an exclusive `flock`, so two threads or
processes sharing a spool do not send it at the same time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("tallybook")

# A temporary file this old is the remains of a process that died while writing it.
STALE_TMP_SECONDS = 3600


def default_root() -> Path:
    """$TALLYBOOK_SPOOL_DIR, else the user's cache directory, else ./.tallybook-spool."""
    if configured := os.environ.get("TALLYBOOK_SPOOL_DIR"):
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(cache) / "tallybook" / "spool"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return Path(".tallybook-spool")
    return root if os.access(root, os.W_OK) else Path(".tallybook-spool")


def spool_dir(root: Path, url: str, api_key: str) -> Path:
    """Each server and key has its own folder, so no event is replayed into another project."""
    digest = hashlib.sha256(f"{url}\n{api_key}".encode()).hexdigest()[:16]
    return root / digest


def _key_of(path: Path) -> str | None:
    """The effect key of a spooled event; None when it cannot be read (it is sent as it is)."""
    try:
        key = json.loads(path.read_bytes())["body"].get("key")
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return key if isinstance(key, str) else None


@dataclass
class Entry:
    """One spooled event, held under its lock until it is done or released."""

    path: Path
    endpoint: str
    body: dict[str, Any]
    handle: BinaryIO


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rejected = directory / "rejected"
        self.rejected.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        # Each pending entry and the key of its effect, oldest first.
        self._pending: dict[Path, str | None] = {
            path: _key_of(path) for path in sorted(directory.glob("*.json"))
        }
        self._sweep_tmp()

    def pending(self) -> list[Path]:
        with self._lock:
            return list(self._pending)

    def pending_for(self, key: str) -> list[Path]:
        """The entries of one effect, oldest first: what its next intent must not overtake."""
        with self._lock:
            return [path for path, entry_key in self._pending.items() if entry_key == key]

    def put(self, endpoint: str, body: dict[str, Any]) -> Entry:
        """Write an event durably and return it, locked, for the caller to send."""
        data = json.dumps({"endpoint": endpoint, "body": body}).encode()
        name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}.json"
        path = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        handle = open(tmp, "xb")  # noqa: SIM115 -- held open (and locked) past this function
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.rename(tmp, path)
            self._sync_directory()
        except BaseException:
            handle.close()
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._pending[path] = body.get("key")
        return Entry(path, endpoint, body, handle)

    def claim(self, path: Path, *, wait: bool) -> Entry | None:
        """Lock a pending entry for sending; None when it is gone (or, unless `wait`, busy)."""
        try:
            handle = open(path, "rb")  # noqa: SIM115 -- held open (and locked) by the Entry
        except FileNotFoundError:
            self._forget(path)
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        try:
            # Deleted by the sender that held the lock before us: already delivered.
            if os.fstat(handle.fileno()).st_ino != os.stat(path).st_ino:
                raise FileNotFoundError(path)
            event = json.loads(handle.read())
        except FileNotFoundError:
            handle.close()
            self._forget(path)
            return None
        return Entry(path, event["endpoint"], event["body"], handle)

    def done(self, entry: Entry) -> None:
        """The server has the event: forget it."""
        entry.path.unlink(missing_ok=True)
        entry.handle.close()
        self._forget(entry.path)

    def reject(self, entry: Entry, answer: str) -> None:
        """The server refused the event: keep it aside, with the answer, for a person."""
        target = self.rejected / entry.path.name
        target.with_suffix(".answer").write_text(answer)
        os.rename(entry.path, target)
        entry.handle.close()
        # Logged before it leaves the pending list, which `flush` waits on: once a flush
        # returns, every refusal it waited for has been logged.
        log.error("Tallybook refused spooled %s %s: %s", entry.endpoint, target, answer)
        self._forget(entry.path)

    def release(self, entry: Entry) -> None:
        """Not delivered this time: unlock it for the next try."""
        entry.handle.close()

    def _forget(self, path: Path) -> None:
        with self._lock:
            self._pending.pop(path, None)

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _sweep_tmp(self) -> None:
        cutoff = time.time() - STALE_TMP_SECONDS
        for tmp in self.directory.glob(".*.tmp"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
            except FileNotFoundError:
                continue
