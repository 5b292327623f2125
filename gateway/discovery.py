"""Actors that come and go: the directory of ready files the gateway watches (``--actors-dir``).

Every ``forge-actor --ready-file DIR/NAME.json`` announces itself there once it serves: a JSON object with at least
its ``address`` (host:port), ``instance`` and ``pid``, written atomically (``os.replace``), so a reader never sees
half a file. ``ReadyDir.scan`` lists the directory and reads only the files that are new or were rewritten (their
modification time, size or inode changed); what the gateway then does (an actor joins, is drained, is dropped, is
added again) is ``forge.gateway.actors.ActorSet``'s.

The directory is polled, not watched with inotify: inotify only sees changes made through the local kernel, so on
NFS or another distributed file system it misses the files written on other hosts, which is where actors run.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from forge.rpc.client import check_address

log = logging.getLogger(__name__)

Stamp = tuple[int, int, int]            # (mtime_ns, size, inode): a rewritten file has another one


@dataclass(frozen=True)
class Announcement:
    """One ready file that names an actor. ``name`` (the file name without ``.json``) stays the same when the actor
    restarts with the same ``--ready-file``, possibly on another port."""

    name: str
    path: Path
    address: str
    instance: str = ""
    pid: int | None = None
    stamp: Stamp = (0, 0, 0)

    def describe(self) -> str:
        """``NAME.json (instance I, pid P)``, for logs."""
        details = [f"instance {self.instance}"] if self.instance else []
        if self.pid is not None:
            details.append(f"pid {self.pid}")
        return self.path.name + (f" ({', '.join(details)})" if details else "")


def parse_ready_file(path: Path, text: str, stamp: Stamp = (0, 0, 0)) -> Announcement:
    """The announcement in ``text``, the content of ready file ``path``; ValueError saying why it names no actor."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    address = data.get("address")
    if not isinstance(address, str):
        raise ValueError('no "address" (an actor\'s ready file has one: host:port)')
    check_address(address)
    pid = data.get("pid")
    instance = data.get("instance")
    return Announcement(name=path.name.removesuffix(".json"), path=path, address=address,
                        instance=instance if isinstance(instance, str) else "",
                        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None, stamp=stamp)


class ReadyDir:
    """The ready files of one directory, read again only when they change. Its files are ``*.json`` (hidden files
    and others, such as a writer's ``NAME.json.tmp``, are not looked at; nor are subdirectories)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._known: dict[str, tuple[Stamp, Announcement | None]] = {}
        self._unreadable: set[tuple[str, type]] = set()      # (file, error) already logged

    def scan(self) -> dict[str, Announcement]:
        """The actors announced now, by name. Blocking file I/O: run it off the event loop. Raises OSError when the
        directory cannot be listed (then nothing is known about it: the caller keeps what it had)."""
        found: dict[str, Announcement] = {}
        seen: dict[str, tuple[Stamp, Announcement | None]] = {}
        with os.scandir(self.directory) as entries:
            files = [e for e in entries if e.name.endswith(".json") and not e.name.startswith(".")]
        for entry in files:
            known = self._known.get(entry.name)
            try:
                if not entry.is_file():
                    continue
                status = entry.stat()
                stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
                if known is None or known[0] != stamp:
                    text = Path(entry.path).read_text(encoding="utf-8")
                    known = (stamp, self._parse(Path(entry.path), text, stamp))
            except FileNotFoundError:           # removed since it was listed
                continue
            except (OSError, UnicodeDecodeError) as exc:
                # e.g. a hiccup of the file system: what it announced stands, and it is read again next time
                if (entry.name, exc.__class__) not in self._unreadable:
                    self._unreadable.add((entry.name, exc.__class__))
                    log.warning("cannot read %s (%s); trying again", entry.path, exc)
                if known is None:
                    continue
            seen[entry.name] = known
            if known[1] is not None:
                found[known[1].name] = known[1]
        self._known = seen
        listed = {e.name for e in files}
        self._unreadable = {k for k in self._unreadable if k[0] in listed}
        return found

    @staticmethod
    def _parse(path: Path, text: str, stamp: Stamp) -> Announcement | None:
        try:
            return parse_ready_file(path, text, stamp)
        except ValueError as exc:
            log.warning("%s names no actor (%s); ignored until it changes", path, exc)
            return None
