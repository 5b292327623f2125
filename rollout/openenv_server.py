"""An OpenEnv environment class served on loopback in a process of its own, as ``forge up`` starts one for
``[env] openenv = "module:Class"``: openenv-core's own FastAPI app (``create_fastapi_app``) under uvicorn, one
environment instance per WebSocket session. It binds a free port on 127.0.0.1 and prints ``{"url": ...}`` as its
first line once it accepts connections; a crash in the environment stays in this process.

    python -m forge.rollout.openenv_server MODULE:CLASS --base-dir DIR --concurrency N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import typing
from pathlib import Path
from typing import Any

from forge.loading import PluginError, load_object

WHAT = "OpenEnv environment"


def environment_class(spec: str, base_dir: Path) -> type:
    """The OpenEnv Environment subclass ``spec`` names; PluginError unless it is one."""
    try:
        from openenv.core.env_server import Environment
    except ImportError as exc:
        raise PluginError(WHAT, spec, f"openenv-core is not installed: pip install 'forge-rl[envs]' ({exc})") from None
    found = load_object(spec, what=WHAT, base_dir=base_dir)
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise PluginError(WHAT, spec, f"{found!r} is not a subclass of openenv's Environment")
    return found


def wire_classes(env_class: type, spec: str) -> tuple[type, type]:
    """The (action, observation) classes ``env_class`` declares: an MCP environment's tool calls, or the parameters
    of its ``Environment[Action, Observation, State]`` base."""
    from openenv.core.env_server import Action, CallToolAction, CallToolObservation, MCPEnvironment, Observation

    if issubclass(env_class, MCPEnvironment):
        return CallToolAction, CallToolObservation
    for klass in env_class.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if len(args) >= 2 and isinstance(args[0], type) and issubclass(args[0], Action) \
                    and isinstance(args[1], type) and issubclass(args[1], Observation):
                return args[0], args[1]
    raise PluginError(WHAT, spec, f"{env_class.__qualname__} names no action and observation classes: declare it as "
                                  f"Environment[YourAction, YourObservation, YourState]")


def app_for(env_class: type, spec: str, concurrency: int) -> Any:
    from openenv.core.env_server import create_fastapi_app

    action, observation = wire_classes(env_class, spec)
    concurrent = getattr(env_class, "SUPPORTS_CONCURRENT_SESSIONS", False)
    return create_fastapi_app(env_class, action, observation, max_concurrent_envs=concurrency if concurrent else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--base-dir", type=Path, default=Path.cwd())
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    import uvicorn

    app = app_for(environment_class(args.spec, args.base_dir), args.spec, args.concurrency)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=100 * 2**20))

    async def serve() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
        await serving

    asyncio.run(serve())
    sys.exit(0 if server.started else 1)


if __name__ == "__main__":
    main()
