"""forge.rollout.sandbox on real bubblewrap sandboxes: no network, nothing of the host readable or writable beyond what is
mounted, the limits enforced, no process left after a command, 32 sandboxes at once from one pool, and each kind of
escape attempt counted (and ordinary work not)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forge.rollout.sandbox import Sandbox, SandboxConfig, SandboxPool, tripwires
from forge.rollout.sandbox.sandbox import user_processes

from conftest import script

pytestmark = pytest.mark.sandbox

ROOT = os.getuid() == 0
UID = 210_000 if ROOT else None
FAST = SandboxConfig(timeout_s=60.0, max_processes=16)


def sandbox(tmp_path: Path, config: SandboxConfig = FAST, seed: Path | None = None) -> Sandbox:
    return Sandbox.create(tmp_path / "sandbox", config, UID, seed)


def left_behind(marker: str) -> list[int]:
    """Processes on the host whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and marker in Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(name))
        except OSError:
            continue
    return found


def test_the_workspace_is_the_one_writable_place_and_seeded_from_the_task(tmp_path):
    seed = tmp_path / "task"
    seed.mkdir()
    (seed / "main.py").write_text("print('task')\n")
    box = sandbox(tmp_path, seed=seed)
    result = box.run("python3 main.py && echo made > out.txt && pwd && echo scratch > /tmp/t && cat /tmp/t &&"
                     " touch /usr/forge-x; echo usr=$?")
    assert result.ok and result.stdout.splitlines() == ["task", "/workspace", "scratch", "usr=1"], result
    assert "Read-only file system" in result.stderr
    assert (box.workspace / "out.txt").read_text() == "made\n" and not Path("/usr/forge-x").exists()


def test_host_files_beyond_the_mounts_are_not_there(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("shared data")
    box = sandbox(tmp_path, SandboxConfig(timeout_s=60.0, read_only=(str(shared),)))
    result = box.run(f"cat {secret}; echo secret=$?; cat {shared}/data.txt; echo; echo x > {shared}/data.txt;"
                     f" echo write=$?; ls /root /home 2>&1 | wc -l")
    lines = result.stdout.splitlines()
    assert lines[:2] == ["secret=1", "shared data"] and lines[2] != "write=0", result
    assert "Read-only file system" in result.stderr and "No such file" in result.stderr
    assert (shared / "data.txt").read_text() == "shared data" and "host secret" not in result.stdout


def test_there_is_no_network(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    probe = ("import socket, sys\n"
             "for host in ('127.0.0.1', '1.1.1.1'):\n"
             "    try:\n"
             f"        socket.create_connection((host, {port} if host == '127.0.0.1' else 53), timeout=5)\n"
             "        print(host, 'reached')\n"
             "    except OSError as exc:\n"
             "        print(host, type(exc).__name__)\n")
    result = sandbox(tmp_path).run([sys.executable, "-c", probe])
    assert result.stdout.splitlines() == ["127.0.0.1 ConnectionRefusedError", "1.1.1.1 OSError"], result
    socket.create_connection(("127.0.0.1", port)).close()       # the host's own connection is the only one accepted
    thread.join(10)
    assert len(accepted) == 1
    listener.close()


def test_cpu_memory_file_size_and_time_are_limited(tmp_path):
    box = sandbox(tmp_path, SandboxConfig(timeout_s=60.0, cpu_seconds=1, memory_mb=256, max_file_mb=1))
    spin = box.run([sys.executable, "-c", "while True: pass"])
    assert spin.returncode in (128 + 24, 128 + 9) and not spin.timed_out, spin      # SIGXCPU, then SIGKILL
    hog = box.run([sys.executable, "-c", "x = bytearray(512 * 2**20)"])
    assert hog.returncode == 1 and "MemoryError" in hog.stderr, hog
    big = box.run("head -c 3000000 /dev/zero > big; echo $?")
    assert big.stdout.strip() != "0" and (box.workspace / "big").stat().st_size <= 2**20, big
    slow = box.run("sleep 1000", timeout_s=0.5)
    assert slow.timed_out and not slow.ok


def test_a_fork_bomb_meets_its_limit_and_the_host_is_untouched(tmp_path):
    box = sandbox(tmp_path, SandboxConfig(timeout_s=60.0, max_processes=8))
    bomb = box.run(["bash", "-c", "b() { b | b & }; b; sleep 1; echo still here"], timeout_s=20)
    assert "Resource temporarily unavailable" in bomb.stderr or bomb.timed_out, bomb
    assert subprocess.run(["true"]).returncode == 0
    if ROOT:
        assert user_processes(UID) == 0


def test_nothing_started_in_a_sandbox_outlives_its_command(tmp_path):
    marker = "1000.4242"
    result = sandbox(tmp_path).run(f"sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & setsid sleep {marker} &"
                                   " echo started")
    assert result.ok and result.stdout.strip() == "started"
    assert left_behind(f"sleep\x00{marker}") == []
    killed = sandbox(tmp_path).run(f"sleep {marker} & sleep {marker}", timeout_s=0.5)
    assert killed.timed_out and left_behind(f"sleep\x00{marker}") == []


def test_32_sandboxes_at_once_each_see_only_their_own_workspace(tmp_path):
    pool = SandboxPool(tmp_path / "pool", SandboxConfig(timeout_s=120.0, pool_size=32))
    start = threading.Barrier(32)

    def session(index: int) -> tuple[str, str]:
        with pool.session() as box:
            start.wait(60)
            result = box.run(f"echo {index} > mine.txt; ls /workspace; cat mine.txt; id -u")
            return result.stdout, box.workspace.name
    with ThreadPoolExecutor(32) as executor:
        outputs = list(executor.map(session, range(32)))
    for index, (stdout, _) in enumerate(outputs):
        assert stdout.splitlines()[:2] == ["mine.txt", str(index)], stdout
    if ROOT:       # a user of its own each: one sandbox's processes never count against another's limit
        assert len({stdout.splitlines()[2] for stdout, _ in outputs}) == 32
    with pool.session() as box:         # a slot is wiped before its next session
        assert box.run("ls -A").stdout == ""
    pool.close()


def test_a_black_box_agent_runs_its_commands_through_forge_sandbox_exec(tmp_path):
    box = sandbox(tmp_path)
    env = {**os.environ, "FORGE_SANDBOX": str(box.directory)}
    done = subprocess.run([script("forge"), "sandbox", "exec", "--", "sh", "-c", "cat > got.txt; cat got.txt; exit 3"],
                          input="from the agent", capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3 and done.stdout == "from the agent", done.stderr
    assert (box.workspace / "got.txt").read_text() == "from the agent"
    missing = subprocess.run([script("forge"), "sandbox", "exec", "--sandbox", str(tmp_path), "--", "true"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "is not a sandbox" in missing.stderr


@pytest.mark.parametrize(("arguments", "says"), [(["--", "true"], "no sandbox: give --sandbox DIR or set FORGE_SANDBOX"),
                                                 (["--sandbox", "{box}"], "Missing argument 'COMMAND'")])
def test_forge_sandbox_exec_needs_a_sandbox_and_a_command(tmp_path, arguments, says):
    box = sandbox(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "FORGE_SANDBOX"}
    done = subprocess.run([script("forge"), "sandbox", "exec", *[a.format(box=box.directory) for a in arguments]],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and says in done.stderr, done.stderr


needs_tripwires = pytest.mark.skipif(tripwires.unavailable() is not None,
                                     reason=f"escape attempts are not countable here: {tripwires.unavailable()}")
ESCAPES = {
    "write": "touch /usr/forge-x; mkdir /forge-x; echo x > /etc/passwd; true",
    "network": f"{sys.executable} -c \"import socket; socket.create_connection(('192.0.2.1', 80), timeout=30)\"",
    "processes": "while true; do sleep 1000 & done",
    "memory": f"{sys.executable} -c 'x = bytearray(2**30)'",
}


@needs_tripwires
@pytest.mark.parametrize("kind", list(ESCAPES))
def test_an_escape_attempt_is_counted_by_its_kind(tmp_path, kind):
    box = sandbox(tmp_path, SandboxConfig(timeout_s=60.0, max_processes=8, memory_mb=256))
    result = box.run(ESCAPES[kind])
    assert set(result.attempts) == {kind} and box.attempts() == result.attempts, result
    assert tripwires.describe(result.attempts).endswith(tripwires.KINDS[kind][result.attempts[kind] != 1])
    assert not Path("/usr/forge-x").exists() and not Path("/forge-x").exists()


@needs_tripwires
def test_ordinary_work_is_not_an_escape_attempt(tmp_path):
    seed = tmp_path / "task"
    seed.mkdir()
    (seed / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (seed / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    box = sandbox(tmp_path, seed=seed)
    work = (f"{sys.executable} -m pytest -q && {sys.executable} -c 'import json, sqlite3, numpy, asyncio' && "
            f"sed -i s/+/-/ calc.py && cp calc.py /tmp/ && ls -la / /usr > listing.txt && sort listing.txt | wc -l &&"
            f" {sys.executable} -c \"import socket; socket.socket().connect_ex(('127.0.0.1', 9))\" && "
            f"{sys.executable} -c 'import os; os.access(\"/usr\", os.W_OK)' && (sleep 0.1 & sleep 0.1 & wait)")
    result = box.run(["bash", "-c", work])
    assert result.ok and result.attempts == {} and box.attempts() == {}, result


@needs_tripwires
def test_the_ledger_adds_up_every_process_s_commands_until_reset(tmp_path):
    box = sandbox(tmp_path)
    box.run(ESCAPES["write"])
    env = {**os.environ, "FORGE_SANDBOX": str(box.directory)}
    done = subprocess.run([script("forge"), "sandbox", "exec", "--", "sh", "-c", ESCAPES["network"]],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "forge sandbox: refused: 1 network connection" in done.stderr, done.stderr
    assert box.attempts() == {"write": 3, "network": 1}
    box.reset()
    assert box.attempts() == {}
