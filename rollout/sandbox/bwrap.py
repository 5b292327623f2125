"""The isolation tool under every sandbox: bubblewrap (``bwrap``), which builds a command's world from Linux
namespaces without a daemon or root (user namespaces suffice).

A command sees a root of its own: the system's programs and libraries, this Python and its packages, and the
configured paths, all read-only; a fresh /proc and a minimal /dev; a private /tmp; and its sandbox's workspace, the
one writable place, at ``/workspace``. The root that holds them is read-only too, so a write anywhere else fails as
a write to a read-only file system (which ``forge.rollout.sandbox.tripwires`` counts). It has no network (a network
namespace with nothing but loopback), no view of other processes (a PID namespace, torn down with everything in it
when the command ends), and a session of its own (no terminal to inject into). ``make`` installs bwrap from the
distribution's package where the host lacks it.

Run by root, bwrap builds the world with its privileges and the command then drops to the sandbox's own user
(util-linux's ``setpriv``, with every capability dropped), so it can reach what root mounted but nothing root owns.
Run by another user, bwrap works in a user namespace and the command runs as that user.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

WORKSPACE = "/workspace"
SETPRIV = "/usr/bin/setpriv"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc to run (the dynamic linker's cache, names, certificates, time zone), not the host's
# configuration or secrets.
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/nsswitch.conf",
       "/etc/passwd", "/etc/group", "/etc/hosts", "/etc/localtime", "/etc/ssl", "/etc/ca-certificates",
       "/etc/mime.types")
INSTALL_HINT = ("bubblewrap (bwrap) is not installed: `make venv` puts it in the environment (Debian/Ubuntu: apt-get "
                "install bubblewrap)")


def find_bwrap() -> str:
    """The bwrap program: on PATH, else beside this Python (where ``make`` puts it). RuntimeError if neither."""
    found = shutil.which("bwrap") or shutil.which("bwrap", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(INSTALL_HINT)
    return found


def python_paths() -> list[str]:
    """This Python's installation and environment, which commands in the sandbox run."""
    paths = {sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(p for p in paths if p and not any(p.startswith(s + "/") or p == s for s in SYSTEM))


def bwrap_argv(bwrap: str, workspace: Path, read_only: tuple[str, ...], env: dict[str, str],
               cwd: str = WORKSPACE, uid: int | None = None, info_fd: int | None = None,
               block_fd: int | None = None) -> list[str]:
    """bwrap's arguments and, with ``uid`` (bwrap run by root), the drop to that user: everything up to the
    command. ``info_fd``: where bwrap writes ``{"child-pid": N}``, the host's pid of the namespace's init;
    ``block_fd``: the namespace waits for a byte there before it starts the command."""
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    argv = [bwrap, *namespaces, *([] if uid is not None else ["--unshare-user"]), "--die-with-parent",
            "--new-session", "--clearenv"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]  # first: mounts below it stay
    made = {"/", "/tmp"}
    for path in (*SYSTEM, *ETC, *python_paths(), *read_only):
        if os.path.islink(path) and path in SYSTEM:      # a merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(path), path]
            continue
        if not os.path.exists(path):
            continue
        for parent in reversed(Path(path).parents):       # bwrap would make them private (0700)
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    argv += ["--bind", str(workspace), WORKSPACE, "--remount-ro", "/", "--chdir", cwd]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    if uid is None:
        return [*argv, "--"]
    drop = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
            "--no-new-privs"]
    return [*argv, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", *drop, "--"]


__all__ = ["INSTALL_HINT", "SETPRIV", "WORKSPACE", "bwrap_argv", "find_bwrap", "python_paths"]
