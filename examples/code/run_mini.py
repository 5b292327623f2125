"""The code example's agent: mini-swe-agent (``mini``, unchanged) as a black-box program. It runs ``mini`` on the
task without prompts, with forge-mini.yaml laid over mini's own configuration (its commands go to the session's
sandbox), keeps mini's console on standard error and prints its submission as the reply.

``mini`` comes from ``MSWEA_MINI`` or PATH (``pip install mini-swe-agent==2.4.6`` into an environment of its own;
``make agents-venv`` makes one). The model is reached through litellm with the session's OPENAI_BASE_URL and
OPENAI_API_KEY, and nothing is fetched from the network (litellm's cost map is its local copy)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def task_text() -> str:
    messages = json.loads(Path(os.environ["FORGE_TASK_FILE"]).read_text())["messages"]
    return "\n\n".join(m["content"] for m in messages if m.get("role") in ("system", "user"))


def main() -> int:
    mini = os.environ.get("MSWEA_MINI") or shutil.which("mini")
    if mini is None:
        print("mini-swe-agent is not installed: pip install mini-swe-agent==2.4.6, or set MSWEA_MINI", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="forge-mini-") as scratch:
        work = Path(scratch)
        (work / "task.yaml").write_text(json.dumps({"run": {"task": task_text()}}))     # JSON is YAML
        trajectory = work / "trajectory.json"
        env = {**os.environ, "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
               "MSWEA_GLOBAL_CONFIG_DIR": str(work / "config"), "MSWEA_COST_TRACKING": "ignore_errors",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true"}
        argv = [mini, "-m", "openai/forge", "-c", "mini.yaml", "-c", str(HERE / "forge-mini.yaml"),
                "-c", str(work / "task.yaml"), "--yolo", "--exit-immediately", "-o", str(trajectory)]
        # mini hands its standard input to each command, and `forge sandbox exec` forwards it: give it none.
        code = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr).returncode
        if not trajectory.exists():
            print(f"mini exited with {code} and no trajectory", file=sys.stderr)
            return code or 1
        info = json.loads(trajectory.read_text()).get("info", {})
        print(f"mini: {info.get('exit_status')}", file=sys.stderr)
        print(info.get("submission") or "")
        return 0


if __name__ == "__main__":
    sys.exit(main())
