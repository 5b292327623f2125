"""What a sandbox allows: its limits and the host paths it sees read-only (the ``[sandbox]`` table of a run file)."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class SandboxConfig(Settings):
    cpu_seconds: int = setting(120, min=1, help="CPU seconds each process of a command may use.")
    memory_bytes: int = setting(2048 * MIB, flag="memory-mb", min=16 * MIB, scale=MIB, unit="MiB",
                                help="Address space each process of a command may map, in MiB.")
    max_processes: int = setting(64, min=1, help="Processes and threads a sandbox may run at once.")
    max_file_bytes: int = setting(256 * MIB, flag="max-file-mb", min=MIB, scale=MIB, unit="MiB",
                                  help="Largest file a command may write, in MiB.")
    timeout_s: float = setting(120.0, flag="timeout", min=0.1,
                               help="Seconds a command may run before it and everything it started are killed.")
    max_output_bytes: int = setting(MIB, flag="max-output-kb", min=1024, scale=1024, unit="KiB",
                                    help="Output kept of each stream of a command, in KiB (the rest is dropped).")
    read_only: tuple[str, ...] = setting((), help="More host paths the sandbox sees, read-only, at the same place "
                                                  "(repeatable; the system, Python and its packages always are).")
    pool_size: int = setting(32, min=1, help="Sandboxes ready at once; a session beyond them waits for one to free.")
    first_uid: int = setting(200_000, min=1000, help="Run as root, sandbox N's commands run as user first_uid + N "
                                                     "(ids no account on the host should have).")


__all__ = ["MIB", "SandboxConfig"]
