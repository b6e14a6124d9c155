"""The staging directory of a distributed write: beside the destination, leased, committed by one rename.

``.<dstname>.qckpt-stage-<host>-<pid>-<random>`` is created in the destination's directory (so the
commit never crosses a filesystem) with a control directory ``<staging>.ctl`` beside it holding
``lease.json`` (host, pid, expiry; renewed by the coordinator every :data:`RENEW_SECONDS`) and one
marker file per task attempt (``attempts/<task>-<random>``: the retries are counted from them,
whatever the engine). A stale staging directory, one whose lease expired (any host) or whose
coordinator on this host is dead, is removed by the next write to the same destination.
:meth:`Staging.commit` renames the staging directory onto the destination and fsyncs the parent
(:mod:`converter.write.atomic`'s commit: an existing destination is replaced only with overwrite);
:meth:`Staging.remove` deletes both directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path

from converter.write import atomic

__all__ = ["Staging", "clean_stale_staging", "LEASE_SECONDS", "RENEW_SECONDS"]

_TAG = ".qckpt-stage-"
#: A lease not renewed for this long is stale (seconds).
LEASE_SECONDS = 120.0
#: The coordinator renews its lease this often (seconds).
RENEW_SECONDS = 15.0


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _read_lease(ctl: Path) -> dict | None:
    try:
        doc = json.loads((ctl / "lease.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _stale(staging: Path, now: float) -> bool:
    """True when ``staging`` belongs to nobody alive: its lease expired, or its coordinator ran on this
    host and its pid is gone (a directory whose name or lease does not parse is left alone)."""
    lease = _read_lease(staging.with_name(staging.name + ".ctl"))
    if lease is not None and isinstance(lease.get("expires"), (int, float)) and lease["expires"] < now:
        return True
    parts = staging.name.split(_TAG, 1)[-1].split("-")
    if len(parts) < 3 or not parts[1].isdigit():
        return False
    host, pid = (lease or {}).get("host", parts[0]), int((lease or {}).get("pid", parts[1]))
    return host == _host() and not atomic._pid_alive(pid)


def clean_stale_staging(dst: Path) -> list[Path]:
    """Remove the stale staging directories (and control directories) of ``dst``; returns them."""
    removed: list[Path] = []
    if not dst.parent.is_dir():
        return removed
    prefix, now = f".{dst.name}{_TAG}", time.time()
    for entry in sorted(dst.parent.iterdir()):
        if entry.name.startswith(prefix) and not entry.name.endswith(".ctl") and _stale(entry, now):
            shutil.rmtree(entry, ignore_errors=True)
            shutil.rmtree(entry.with_name(entry.name + ".ctl"), ignore_errors=True)
            removed.append(entry)
    return removed


class Staging:
    """A leased staging directory for ``dst`` (created on construction; see the module)."""

    def __init__(self, dst: str | os.PathLike) -> None:
        self.dst = Path(dst)
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_staging(self.dst)
        self.path = self.dst.with_name(f".{self.dst.name}{_TAG}{_host()}-{os.getpid()}-{secrets.token_hex(4)}")
        self.ctl = self.path.with_name(self.path.name + ".ctl")
        self.ctl.mkdir()
        (self.ctl / "attempts").mkdir()
        self._renew()
        self.path.mkdir()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="qckpt-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        doc = {"host": _host(), "pid": os.getpid(), "destination": str(self.dst),
               "expires": time.time() + LEASE_SECONDS}
        tmp = self.ctl / f"lease.json.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.ctl / "lease.json")

    def _keep(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            with contextlib.suppress(OSError):
                self._renew()

    def attempts(self) -> dict[int, int]:
        """Task number -> attempts started (from the markers the tasks left)."""
        counts: dict[int, int] = {}
        with contextlib.suppress(OSError):
            for entry in (self.ctl / "attempts").iterdir():
                head = entry.name.split("-", 1)[0]
                if head.isdigit():
                    counts[int(head)] = counts.get(int(head), 0) + 1
        return counts

    def _release(self) -> None:
        self._stop.set()
        self._thread.join()

    def commit(self, overwrite: bool) -> None:
        """Rename the staging directory onto the destination (one rename; an existing destination
        only with ``overwrite``), fsync the parent, drop the lease."""
        self._release()
        for name in os.listdir(self.path):
            atomic._fsync(self.path / name)
        atomic._fsync(self.path)
        atomic._commit(self.path, self.dst, overwrite)
        atomic._fsync(self.dst.parent)
        shutil.rmtree(self.ctl, ignore_errors=True)

    def remove(self) -> None:
        """Delete the staging and control directories (after a failure; idempotent).

        Each is first renamed aside, so a task still running somewhere (cancelled, not yet stopped) can no
        longer create a file in it by its path (its retry marker, its shard: ``ENOENT``); a tree that still
        changed under ``rmtree`` is removed again."""
        self._release()
        for d in (self.path, self.ctl):
            gone = d.with_name(d.name + f".gone-{secrets.token_hex(4)}")
            try:
                os.rename(d, gone)
            except FileNotFoundError:
                continue
            except OSError:
                gone = d
            for _ in range(5):
                atomic._remove(gone)
                if not gone.exists():
                    break
                time.sleep(0.1)
