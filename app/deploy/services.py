"""Each service's command line in a deployment: the one place where the deploy settings and the cluster's addresses
become the services' options. Both targets render these commands (Kubernetes as container commands, Slurm as
``srun`` steps); a target passes addresses, and shell references (``Shell``) where a value is known only in the pod
or on the node.

The run file goes to every service as it is (``--config``): the services read their own tables. What is set here
is the wiring — listeners, addresses, directories, keys — which a run file's table must then leave out
(``check_wiring``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.app.command_line import Shell, key_file_words, key_variables, option_words, quote
from forge.app.deploy.config import LEARNER_PORT, DeployConfig
from forge.app.deploy.runfile import RunFile, RunFileError
from forge.app.registry import Service, service
from forge.weights.endpoints import WEIGHTS_ANNOUNCE_PORT, WEIGHTS_FETCH_PORT

ANY = "0.0.0.0"                      # services listen on every interface of their pod or node

# Options deploy decides although it may not pass them (they would contradict what it passes).
ALSO_WIRED: dict[str, tuple[str, ...]] = {
    "learner": ("pool", "create_pool"), "gateway": ("actor", "prefill_actor", "pool"),
}
# Options deploy passes, derived from the run file's own value (forge rollout's seed, offset per driver).
DERIVED: dict[str, tuple[str, ...]] = {"rollout": ("seed",)}

__all__ = ["ANY", "Command", "Shell", "check_wiring", "quote", "shell_words"]


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

def multinode_values(nodes: int, rank: int | Shell, rdzv: str) -> dict[str, Any]:
    """The learner's settings for a torchrun job over ``nodes`` nodes (none on one node)."""
    if nodes == 1:
        return {}
    return {"nnodes": nodes, "node_rank": rank, "rdzv_endpoint": rdzv}


def relay_values(fetch: str, announce: str) -> dict[str, Any]:
    """An actor's settings to re-serve the weight versions it applied, for its children in the relay tree."""
    return {"relay_fetch": fetch, "relay_announce": announce}


def discovery_values(actors_dir: str) -> dict[str, Any]:
    """The gateway's settings to find its actors from the ready files they write into ``actors_dir``."""
    return {"actors_dir": _path(actors_dir)}


@dataclass(frozen=True)
class Command:
    """One service's command line before a target renders it: the run file (``--config``), then the settings
    deploy wires, by option name, typed or shell references; its keys are added by the target."""

    name: str                                       # the instance: learner-rank0, actor-3, gateway-0, pool, ...
    service: Service
    run_file: str
    values: Mapping[str, Any]                       # option name → value
    keys: tuple[tuple[str, str], ...]               # (secret option name, key kind)

    @property
    def kind(self) -> str:
        return self.service.kind

    @property
    def program(self) -> tuple[str, ...]:
        return self.service.program

    def words(self, extra: Sequence[str] = ()) -> list[str]:
        """The program and its options, ``extra`` words (a target's key files) last."""
        return [*self.program, "--config", self.run_file, *option_words(self.service, self.values), *extra]

    def key_file_options(self, directory: str) -> list[str]:
        """The keys as key-file options, each kind's key in ``directory``/KIND.key."""
        return key_file_words(self.service, {name: Shell(f"{directory}/{kind}.key") for name, kind in self.keys})

    def key_variables(self) -> list[tuple[str, str]]:
        """The keys as environment variables: (the option's variable, key kind)."""
        variables = key_variables(self.service, [name for name, _ in self.keys])
        return [(variables[name], kind) for name, kind in self.keys]


def _command(run: RunFile, kind: str, name: str, run_file: str, values: Mapping[str, Any],
             keys: Mapping[str, str] | None = None) -> Command:
    """``values`` with ``--model`` from ``[model]`` where the service's own table does not name one (as forge up
    does)."""
    from forge.checkpoints.reference import hub_id_of

    spec = service(kind)
    fields = {e.name for e in _entries(spec)}
    for field, value in (("model", run.model), ("model_impl", run.model_impl)):
        if value is not None and field in fields and field not in run.options(kind):
            hub = hub_id_of(value) if field == "model" else None
            if hub is not None:
                # A Hub model is looked up in the cache of the node the service runs on (after the job fetched it
                # there), not in this machine's: passed on as it is, its id's characters safe in a shell word.
                value = Shell(str(hub))
            values = {**values, field: value}
    return Command(name, spec, run_file, values, tuple((keys if keys is not None else spec.keys).items()))


def _entries(spec: Service):
    from forge.settings import entries

    return entries(spec.settings_class)


def _path(value: str) -> Path | Shell:
    """A path on the pod or node, as a Path setting takes it (a shell reference stays one)."""
    return value if isinstance(value, Shell) else Path(value)


def _ready(ready_file: str | None) -> dict[str, Any]:
    return {"ready_file": _path(ready_file)} if ready_file else {}


def learner(run: RunFile, config: DeployConfig, *, name: str, run_file: str, rank: int | Shell, rdzv: str,
            pool: str, run_dir: str, ready_file: str | None = None, teachers: Sequence[str] = ()) -> Command:
    """One learner node: ``--nproc`` processes, rank 0 of the job serving Stats and the weights, asking the actors
    at ``teachers`` for the teacher's log-probs when the run distils."""
    keys = {**service("learner").keys, "teacher_api_key": "actor"} if teachers else None
    return _command(run, "learner", name, run_file, {
        "nproc": config.learner_processes, **multinode_values(config.learner_nodes, rank, rdzv),
        "host": ANY, "port": LEARNER_PORT, "weights_fetch": f"tcp://{ANY}:{WEIGHTS_FETCH_PORT}",
        "weights_announce": f"tcp://{ANY}:{WEIGHTS_ANNOUNCE_PORT}", "pool_address": pool, "run_dir": _path(run_dir),
        **({"teacher_actor": tuple(teachers)} if teachers else {}), **_ready(ready_file)}, keys)


def actor(run: RunFile, config: DeployConfig, *, name: str, run_file: str, host: str, port: int, fetch: str,
          announce: str, relay: tuple[str, str] | None = None, cache: str | None = None,
          ready_file: str | None = None) -> Command:
    """One actor, fetching weights from ``fetch``/``announce`` (the learner or its parent in the relay tree) and
    re-serving them on ``relay`` (fetch, announce) for its children."""
    keys = {k: v for k, v in service("actor").keys.items() if cache or k != "l3_api_key"}
    return _command(run, "actor", name, run_file, {
        "host": host, "port": port, "name": name, "weights_fetch": fetch, "weights_announce": announce,
        **(relay_values(*relay) if relay else {}), **({"l3_cache": cache} if cache else {}), **_ready(ready_file)},
        keys)


def teacher(run: RunFile, config: DeployConfig, *, name: str, run_file: str, host: str, port: int,
            ready_file: str | None = None) -> Command:
    """An actor serving the run's ``[learner] teacher`` (on-policy distillation): the actors' settings, but its own
    model on the backend ``auto`` picks for it (the torch engine or vLLM: both score), no weight stream and no L3
    cache."""
    from forge.checkpoints.reference import hub_id_of

    keys = {k: v for k, v in service("actor").keys.items() if k != "l3_api_key"}
    command = _command(run, "actor", name, run_file, {"host": host, "port": port, "name": name, "backend": "auto",
                                                      **_ready(ready_file)}, keys)
    hub = hub_id_of(run.teacher) if run.teacher is not None else None
    return dataclasses.replace(command, values={**command.values,
                                                "model": Shell(str(hub)) if hub is not None else run.teacher})


def gateway(run: RunFile, config: DeployConfig, *, name: str, run_file: str, grpc_port: int, http_port: int,
            pool: str | None = None, pool_path: str | None = None, actors: Sequence[str] = (),
            actors_dir: str | None = None, ready_file: str | None = None) -> Command:
    """One gateway, recording into the pool service at ``pool`` (or the pool directory ``pool_path``, opened in its
    process: an eval gateway's, which no learner reads) and routing to ``actors`` (addresses) or to the actors whose
    ready files are in ``actors_dir``."""
    found = {"actor": tuple(actors)} if actors_dir is None else discovery_values(actors_dir)
    recorded = {"pool_address": pool} if pool_path is None else {"pool": _path(pool_path)}
    return _command(run, "gateway", name, run_file, {
        "host": ANY, "grpc_port": grpc_port, "http_port": http_port, **recorded, **found, **_ready(ready_file)})


def pool(run: RunFile, config: DeployConfig, *, run_file: str, path: str, port: int) -> Command:
    """The pool service (forge pool serve) over the pool directory."""
    return _command(run, "pool", "pool", run_file, {"path": _path(path), "host": ANY, "port": port})


def cache(run: RunFile, config: DeployConfig, *, run_file: str, directory: str, port: int,
          ready_file: str | None = None) -> Command:
    """The L3 KV cache over its block directory."""
    return _command(run, "cache", "cache", run_file, {"dir": _path(directory), "host": ANY, "port": port, "name": "cache",
                                                       **_ready(ready_file)})


def rollout(run: RunFile, config: DeployConfig, *, name: str, run_file: str, gateway: str, http: str,
            seed: int | Shell, eval_gateway: tuple[str, str] | None = None, summary: str | None = None) -> Command:
    """A rollout driver: the team's tasks played by its agent through one gateway; with ``eval_gateway`` (gRPC
    address, HTTP root) the held-out tasks too, at the start and the end, and the run's summary written to
    ``summary``."""
    values: dict[str, Any] = {"gateway": gateway, "http": http, "seed": seed}
    if eval_gateway is not None:
        values |= {"eval_gateway": eval_gateway[0], "eval_http": eval_gateway[1]}
    if summary is not None:
        values["summary"] = _path(summary)
    return _command(run, "rollout", name, run_file, values)


def rollout_seed(run: RunFile) -> int:
    """The run file's ``[rollout] seed`` (0 by default): driver i plays the tasks in the order of seed + i."""
    return int(run.options("rollout").get("seed", 0))


def wired(command: Command) -> set[str]:
    """The option names (underscores) a command sets or decides, its keys' files included."""
    names = set(command.values) - {"model"}
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
