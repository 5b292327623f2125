"""What a sandbox allows: its limits and the host paths it sees read-only, and whether a team's sessions get one (the
``[sandbox]`` table of a run file)."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class SandboxConfig(Settings):
    enabled: bool = setting(False, flag="sandbox",
                            help="Give each session of the agent program a sandbox for its commands (FORGE_SANDBOX), "
                                 "its workspace a copy of the task's 'workspace' folder; the verifier finds it in "
                                 "session['sandbox'].")
    cpu_seconds: int = setting(120, flag="sandbox-cpu-seconds", min=1,
                               help="CPU seconds each process of a sandboxed command may use.")
    memory_mb: int = setting(2048, flag="sandbox-memory-mb", min=16,
                             help="Address space each process of a sandboxed command may map, in MiB.")
    max_processes: int = setting(64, flag="sandbox-max-processes", min=1,
                                 help="Processes and threads a sandbox may run at once.")
    max_file_mb: int = setting(256, flag="sandbox-max-file-mb", min=1,
                               help="Largest file a sandboxed command may write, in MiB.")
    timeout_s: float = setting(120.0, flag="sandbox-timeout", min=0.1,
                               help="Seconds a sandboxed command may run before it and everything it started are "
                                    "killed.")
    max_output_kb: int = setting(1024, flag="sandbox-max-output-kb", min=1,
                                 help="Output kept of each stream of a sandboxed command, in KiB.")
    read_only: tuple[str, ...] = setting((), flag="sandbox-read-only",
                                         help="More host paths sandboxes see, read-only, at the same place "
                                              "(repeatable; the system, Python and its packages always are).")
    pool_size: int = setting(32, flag="sandbox-pool-size", min=1,
                             help="Sandboxes ready at once; a session beyond them waits for one to free.")
    first_uid: int = setting(200_000, flag="sandbox-first-uid", min=1000,
                             help="Run as root, sandbox N's commands run as user first_uid + N (ids no account on the "
                                  "host should have).")


__all__ = ["MIB", "SandboxConfig"]
