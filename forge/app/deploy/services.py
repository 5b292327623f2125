"""Each service's command line in a deployment: the one place where the deploy settings and the cluster's addresses
become the services' options. Both targets render these commands (Kubernetes as container commands, Slurm as
``srun`` steps); a target passes addresses, and shell references (``Shell``) where a value is known only in the pod
or on the node.

The run file goes to every service as it is (``--config``): the services read their own tables. What is set here
is the wiring — listeners, addresses, directories, keys — which a run file's table must then leave out
(``check_wiring``)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from forge.app.deploy.config import (
    LEARNER_PORT,
    WEIGHTS_ANNOUNCE_PORT,
    WEIGHTS_FETCH_PORT,
    DeployConfig,
)
from forge.app.deploy.runfile import RunFile, RunFileError, commands

ANY = "0.0.0.0"                      # services listen on every interface of their pod or node

PROGRAMS: dict[str, tuple[str, ...]] = {
    "learner": ("forge-learner",), "actor": ("forge-actor",), "gateway": ("forge-gateway",),
    "cache": ("forge-cache",), "pool": ("forge", "pool", "serve"), "rollout": ("forge", "rollout"),
}

# The run's keys, one per kind, and the secret options each service is given (option name → key kind).
KEY_KINDS = ("gateway", "actor", "pool", "cache", "session")
SERVICE_KEYS: dict[str, dict[str, str]] = {
    "learner": {"pool_api_key": "pool"},
    "actor": {"api_key": "actor", "l3_api_key": "cache"},
    "gateway": {"api_key": "gateway", "actor_api_key": "actor", "pool_api_key": "pool",
                "session_key_secret": "session"},
    "cache": {"api_key": "cache"},
    "pool": {"api_key": "pool"},
    "rollout": {"api_key": "gateway"},
}

# Options deploy decides although it may not pass them (they would contradict what it passes).
ALSO_WIRED: dict[str, tuple[str, ...]] = {
    "learner": ("pool", "create_pool"), "gateway": ("actor", "prefill_actor", "pool"),
}
# Options deploy passes, derived from the run file's own value (forge rollout's seed, offset per driver).
DERIVED: dict[str, tuple[str, ...]] = {"rollout": ("seed",)}


class Shell(str):
    """A value the shell expands where the service starts (``$KEYS/pool.key``, ``$rank``): rendered in double
    quotes, never single."""

    __slots__ = ()


def quote(value: str) -> str:
    """``value`` as one shell word: a ``Shell`` reference in double quotes, anything else quoted literally."""
    if isinstance(value, Shell):
        return f'"{value}"'
    return shlex.quote(value)


def shell_words(words: Iterable[str], indent: str = "    ") -> str:
    """Words as a shell command line, an option and its value per line for reading."""
    lines: list[str] = []
    for word in words:
        text = quote(word)
        if word.startswith("--") or not lines:
            lines.append(text)
        else:
            lines[-1] += " " + text
    return (" \\\n" + indent).join(lines)


# The options of multi-node deployments, in one place: the learner's multi-node torchrun job, the actors' weights
# relay, and the gateway's discovery of actors from their ready files.

def multinode_options(nodes: int, rank: str, rdzv: str) -> list[tuple[str, str]]:
    """The learner's options for a torchrun job over ``nodes`` nodes (none on one node)."""
    if nodes == 1:
        return []
    return [("--nnodes", str(nodes)), ("--node-rank", rank), ("--rdzv-endpoint", rdzv)]


def relay_options(fetch: str, announce: str) -> list[tuple[str, str]]:
    """An actor's options to re-serve the weight versions it applied, for its children in the relay tree."""
    return [("--relay-fetch", fetch), ("--relay-announce", announce)]


def discovery_options(actors_dir: str) -> list[tuple[str, str]]:
    """The gateway's options to find its actors from the ready files they write into ``actors_dir``."""
    return [("--actors-dir", actors_dir)]


@dataclass(frozen=True)
class Command:
    """One service's command line before a target renders it."""

    name: str                                       # the instance: learner-rank0, actor-3, gateway-0, pool, ...
    kind: str                                       # learner, actor, gateway, cache, pool, rollout
    options: tuple[tuple[str, str], ...]            # (--flag, value); a target adds its key options
    keys: tuple[tuple[str, str], ...]               # (secret option name, key kind)

    @property
    def program(self) -> tuple[str, ...]:
        return PROGRAMS[self.kind]

    def words(self, extra: Sequence[tuple[str, str]] = ()) -> list[str]:
        """The program and its options, ``extra`` ones (a target's keys) last."""
        words = list(self.program)
        for flag, value in (*self.options, *extra):
            words += [flag, value]
        return words

    def key_file_options(self, directory: str) -> list[tuple[str, str]]:
        """The keys as key-file options, each kind's key in ``directory``/KIND.key."""
        return [("--" + name.replace("_", "-") + "-file", Shell(f"{directory}/{kind}.key")) for name, kind in self.keys]

    def key_variables(self) -> list[tuple[str, str]]:
        """The keys as environment variables: (the option's variable, key kind)."""
        from forge.cli.options import envvars_of
        from forge.settings import entries

        command = commands()[self.kind]
        by_name = {e.name: e for e in entries(command.settings_class) if not e.key_file}
        return [(envvars_of(by_name[name], command.settings_table)[0], kind) for name, kind in self.keys]


def _common(run: RunFile, table: str, run_file: str, model: bool = True) -> list[tuple[str, str]]:
    """``--config`` always; ``--model`` from ``[model]`` where the service's own table does not name one (as forge up
    does)."""
    options = [("--config", run_file)]
    if model and run.model is not None and "model" not in run.options(table):
        options.append(("--model", run.model))
    return options


def _ready(ready_file: str | None) -> list[tuple[str, str]]:
    return [("--ready-file", ready_file)] if ready_file else []


def learner(run: RunFile, config: DeployConfig, *, name: str, run_file: str, rank: str, rdzv: str, pool: str,
            run_dir: str, ready_file: str | None = None) -> Command:
    """One learner node: ``--nproc`` processes, rank 0 of the job serving Stats and the weights."""
    options = [*_common(run, "learner", run_file), ("--nproc", str(config.learner_processes)),
               *multinode_options(config.learner_nodes, rank, rdzv),
               ("--host", ANY), ("--port", str(LEARNER_PORT)),
               ("--weights-fetch", f"tcp://{ANY}:{WEIGHTS_FETCH_PORT}"),
               ("--weights-announce", f"tcp://{ANY}:{WEIGHTS_ANNOUNCE_PORT}"),
               ("--pool-address", pool), ("--run-dir", run_dir), *_ready(ready_file)]
    return Command(name, "learner", tuple(options), tuple(SERVICE_KEYS["learner"].items()))


def actor(run: RunFile, config: DeployConfig, *, name: str, run_file: str, host: str, port: int, fetch: str,
          announce: str, relay: tuple[str, str] | None = None, cache: str | None = None,
          ready_file: str | None = None) -> Command:
    """One actor, fetching weights from ``fetch``/``announce`` (the learner or its parent in the relay tree) and
    re-serving them on ``relay`` (fetch, announce) for its children."""
    options = [*_common(run, "actor", run_file), ("--host", host), ("--port", str(port)), ("--name", name),
               ("--weights-fetch", fetch), ("--weights-announce", announce),
               *(relay_options(*relay) if relay else []),
               *([("--l3-cache", cache)] if cache else []), *_ready(ready_file)]
    keys = {k: v for k, v in SERVICE_KEYS["actor"].items() if cache or k != "l3_api_key"}
    return Command(name, "actor", tuple(options), tuple(keys.items()))


def gateway(run: RunFile, config: DeployConfig, *, name: str, run_file: str, grpc_port: int, http_port: int,
            pool: str, actors: Sequence[str] = (), actors_dir: str | None = None,
            ready_file: str | None = None) -> Command:
    """One gateway, recording into the pool service and routing to ``actors`` (addresses) or to the actors whose
    ready files are in ``actors_dir``."""
    found = [("--actor", address) for address in actors] if actors_dir is None else discovery_options(actors_dir)
    options = [*_common(run, "gateway", run_file), ("--host", ANY), ("--grpc-port", str(grpc_port)),
               ("--http-port", str(http_port)), ("--pool-address", pool), *found, *_ready(ready_file)]
    return Command(name, "gateway", tuple(options), tuple(SERVICE_KEYS["gateway"].items()))


def pool(run: RunFile, config: DeployConfig, *, run_file: str, path: str, port: int) -> Command:
    """The pool service (forge pool serve) over the pool directory."""
    options = [*_common(run, "pool", run_file, model=False), ("--path", path), ("--host", ANY), ("--port", str(port))]
    return Command("pool", "pool", tuple(options), tuple(SERVICE_KEYS["pool"].items()))


def cache(run: RunFile, config: DeployConfig, *, run_file: str, directory: str, port: int,
          ready_file: str | None = None) -> Command:
    """The L3 KV cache over its block directory."""
    options = [*_common(run, "cache", run_file, model=False), ("--dir", directory), ("--host", ANY),
               ("--port", str(port)), ("--name", "cache"), *_ready(ready_file)]
    return Command("cache", "cache", tuple(options), tuple(SERVICE_KEYS["cache"].items()))


def rollout(run: RunFile, config: DeployConfig, *, name: str, run_file: str, gateway: str, http: str,
            seed: str) -> Command:
    """A rollout driver: the team's tasks played by its agent through one gateway."""
    options = [*_common(run, "rollout", run_file, model=False), ("--gateway", gateway), ("--http", http),
               ("--seed", seed)]
    return Command(name, "rollout", tuple(options), tuple(SERVICE_KEYS["rollout"].items()))


def rollout_seed(run: RunFile) -> int:
    """The run file's ``[rollout] seed`` (0 by default): driver i plays the tasks in the order of seed + i."""
    return int(run.options("rollout").get("seed", 0))


def wired(command: Command) -> set[str]:
    """The option names (underscores) a command sets or decides, its keys' files included."""
    names = {flag.removeprefix("--").replace("-", "_") for flag, _ in command.options} - {"config", "model"}
    for name, _ in command.keys:
        names |= {name, f"{name}_file"}
    return (names | set(ALSO_WIRED.get(command.kind, ()))) - set(DERIVED.get(command.kind, ()))


def check_wiring(run: RunFile, generated: Iterable[Command]) -> None:
    """Refuse a run file whose service tables set what deploy wires (the service would be given both, or the two
    would contradict each other): RunFileError naming the table and the keys."""
    by_kind: dict[str, set[str]] = {}
    for command in generated:
        by_kind.setdefault(command.kind, set()).update(wired(command))
    for kind, names in by_kind.items():
        clash = sorted(names & set(run.options(kind)))
        if clash:
            keys = ", ".join(clash)
            raise RunFileError(f"{run.path}: [{kind}] sets {keys}, which forge deploy wires (addresses, "
                               "ports, directories, keys): remove "
                               f"{'it' if len(clash) == 1 else 'them'} (see docs/deploy.md)")
