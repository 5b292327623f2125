"""``forge deploy --target slurm``: one batch script for one run, submitted with ``sbatch``.

Layout: the job's first node runs the services that need no GPU (the pool service, the cache, the gateways and
the rollout drivers); the next ``--learner-nodes`` nodes run one learner rank each (a multi-node torchrun job
meeting on the first of them); the rest run the actors, ``--actors-per-node`` to a node. The script reads the
node names from ``scontrol show hostnames``, makes the run's keys (mode 0600), starts every service as a named job
step (``srun --job-name``) in dependency order, waiting for each to be ready, then waits: when a service ends (or
the rollout drivers are done) it stops the others, and it forwards SIGTERM (sent before the time limit) to all of
them, the learner checkpointing."""

from __future__ import annotations

from forge.app.command_line import Shell, quote
from forge.app.deploy import services
from forge.app.deploy.config import (
    ACTOR_PORT,
    CACHE_PORT,
    GATEWAY_GRPC_PORT,
    GATEWAY_HTTP_PORT,
    POOL_PORT,
    RDZV_PORT,
    SLOT_STRIDE,
    DeployConfig,
    OutFile,
    relay_parent,
    relays,
)
from forge.app.deploy.runfile import RunFile
from forge.app.deploy.services import ANY, Command, shell_words
from forge.app.registry import KEY_KINDS
from forge.weights.endpoints import RELAY_ANNOUNCE_PORT, RELAY_FETCH_PORT, WEIGHTS_ANNOUNCE_PORT, WEIGHTS_FETCH_PORT

STOP_BEFORE_END_S = 300         # SIGTERM this long before the time limit: the learner's last step and checkpoint

# Shell helpers of the script: start a named step, wait for a service, stop them all (each group at once, in the
# reverse order of their start).
HELPERS = r'''
PIDS=()
NAMES=()

# start NAME NODE COMMAND...: run COMMAND as the job step NAME on NODE, in the background; its output goes to
# $LOGS/NAME.log.
start() {
    local name=$1 node=$2
    shift 2
    srun --job-name="$name" --nodes=1 --ntasks=1 --nodelist="$node" --overlap --output="$LOGS/$name.log" "$@" &
    PIDS+=("$!")
    NAMES+=("$name")
    echo "started $name on $node (log: $LOGS/$name.log)"
}

# alive NAME: whether the step NAME still runs.
alive() {
    local k
    for k in "${!NAMES[@]}"; do
        if [ "${NAMES[k]}" = "$1" ]; then
            kill -0 "${PIDS[k]}" 2>/dev/null
            return
        fi
    done
    return 1
}

# not_ready NAME: NAME stopped before it was ready; stop everything.
not_ready() {
    echo "$1 stopped before it was ready: see $LOGS/$1.log" >&2
    stop_all
    exit 1
}

# wait_file NAME FILE: wait until the service NAME has written its ready file FILE.
wait_file() {
    until [ -s "$2" ]; do
        alive "$1" || not_ready "$1"
        sleep 5
    done
    echo "$1 is ready"
}

# wait_port NAME HOST PORT: wait until the service NAME accepts connections on HOST:PORT.
wait_port() {
    until (exec 3<>"/dev/tcp/$2/$3") 2>/dev/null; do
        alive "$1" || not_ready "$1"
        sleep 2
    done
    echo "$1 is ready"
}

# stop_all: SIGTERM to every step (srun passes it on to the service), the rollout drivers first and the pool
# last, each group at once (the learner's ranks stop together), waiting for each group to end.
stop_all() {
    trap - TERM INT
    local group k
    for group in rollout gateway actor learner cache pool; do
        for k in "${!NAMES[@]}"; do
            if [[ ${NAMES[k]} == "$group"* ]]; then kill -TERM "${PIDS[k]}" 2>/dev/null || true; fi
        done
        for k in "${!NAMES[@]}"; do
            if [[ ${NAMES[k]} == "$group"* ]]; then wait "${PIDS[k]}" 2>/dev/null || true; fi
        done
    done
}

trap 'echo "signal received: stopping the services"; stop_all; exit 143' TERM INT
'''


class BatchScript:
    """The batch script of one run: ``text()`` renders it, ``commands()`` lists the services' command lines."""

    def __init__(self, config: DeployConfig, run: RunFile) -> None:
        self.config = config
        self.run = run
        self.cache_on = config.cache and run.cache_serves_actors

    @property
    def nodes(self) -> int:
        return 1 + self.config.learner_nodes + self.config.actor_nodes

    @staticmethod
    def learner_node(rank: int) -> Shell:
        return Shell(f"${{LEARNER_NODES[{rank}]}}")

    def actor_node(self, index: int) -> Shell:
        return Shell(f"${{ACTOR_NODES[{index // self.config.actors_per_node}]}}")

    def actor_slot(self, index: int) -> int:
        return index % self.config.actors_per_node

    def actor_devices(self, index: int) -> str | None:
        """CUDA_VISIBLE_DEVICES of an actor sharing its node (or a CPU one); None where it has the node's GPUs."""
        c = self.config
        if c.actor_gpus == 0:
            return ""
        if c.actors_per_node == 1:
            return None
        first = self.actor_slot(index) * c.actor_gpus
        return ",".join(str(d) for d in range(first, first + c.actor_gpus))

    # The services' command lines.
    def pool_command(self) -> Command:
        return services.pool(self.run, self.config, run_file=Shell("$RUN_FILE"), path=Shell("$RUN/pool"),
                             port=POOL_PORT)

    def cache_command(self) -> Command:
        return services.cache(self.run, self.config, run_file=Shell("$RUN_FILE"), directory=Shell("$RUN/cache"),
                              port=CACHE_PORT, ready_file=Shell("$READY/cache.json"))

    def learner_command(self, rank: int) -> Command:
        return services.learner(self.run, self.config, name=f"learner-rank{rank}", run_file=Shell("$RUN_FILE"),
                                rank=rank, rdzv=Shell(f"${{LEARNER_NODES[0]}}:{RDZV_PORT}"),
                                pool=Shell(f"$SERVICE_NODE:{POOL_PORT}"), run_dir=Shell("$RUN/learner"),
                                ready_file=Shell("$READY/learner.json"))

    def actor_command(self, index: int) -> Command:
        c = self.config
        parent = relay_parent(index, c.relay_fanout)
        if parent is None:
            host = self.learner_node(0)
            fetch, announce = WEIGHTS_FETCH_PORT, WEIGHTS_ANNOUNCE_PORT
        else:
            host = self.actor_node(parent)
            offset = self.actor_slot(parent) * SLOT_STRIDE
            fetch, announce = RELAY_FETCH_PORT + offset, RELAY_ANNOUNCE_PORT + offset
        offset = self.actor_slot(index) * SLOT_STRIDE
        relay = None
        if relays(index, c.actors, c.relay_fanout):
            relay = (f"tcp://{ANY}:{RELAY_FETCH_PORT + offset}", f"tcp://{ANY}:{RELAY_ANNOUNCE_PORT + offset}")
        # An actor listens on its node's name, so that the address in its ready file (which the gateway reads)
        # is one the other nodes reach.
        return services.actor(self.run, c, name=f"actor-{index}", run_file=Shell("$RUN_FILE"),
                              host=self.actor_node(index), port=ACTOR_PORT + offset,
                              fetch=Shell(f"tcp://{host}:{fetch}"), announce=Shell(f"tcp://{host}:{announce}"),
                              relay=relay, cache=Shell(f"$SERVICE_NODE:{CACHE_PORT}") if self.cache_on else None,
                              ready_file=Shell(f"$READY/actors/actor-{index}.json"))

    def gateway_command(self, index: int) -> Command:
        return services.gateway(self.run, self.config, name=f"gateway-{index}", run_file=Shell("$RUN_FILE"),
                                grpc_port=GATEWAY_GRPC_PORT + index * SLOT_STRIDE,
                                http_port=GATEWAY_HTTP_PORT + index, pool=Shell(f"$SERVICE_NODE:{POOL_PORT}"),
                                actors_dir=Shell("$READY/actors"), ready_file=Shell(f"$READY/gateway-{index}.json"))

    def rollout_command(self, index: int) -> Command:
        return services.rollout(self.run, self.config, name=f"rollout-{index}", run_file=Shell("$RUN_FILE"),
                                gateway=Shell(f"$SERVICE_NODE:{GATEWAY_GRPC_PORT + index * SLOT_STRIDE}"),
                                http=Shell(f"http://$SERVICE_NODE:{GATEWAY_HTTP_PORT + index}"),
                                seed=services.rollout_seed(self.run) + index)

    def commands(self) -> list[Command]:
        c = self.config
        return [self.pool_command(), *([self.cache_command()] if self.cache_on else []),
                *(self.learner_command(r) for r in range(c.learner_nodes)),
                *(self.actor_command(i) for i in range(c.actors)),
                *(self.gateway_command(g) for g in range(c.gateways)),
                *((self.rollout_command(g) for g in range(c.gateways)) if self.run.rollout else ())]

    # The script.
    def start(self, command: Command, node: str, devices: str | None = None) -> str:
        env = ["env", f"CUDA_VISIBLE_DEVICES={devices}"] if devices is not None else []
        words = [*env, *command.words(command.key_file_options("$KEYS"))]
        return f"start {command.name} {quote(Shell(node))} \\\n    {shell_words(words)}"

    def header(self) -> list[str]:
        c = self.config
        lines = ["#!/bin/bash",
                 f"# Forge run {c.name!r} on Slurm, written by forge deploy from {self.run.path}.",
                 f"# Submit it with: sbatch {c.out / f'{c.name}.sbatch'}",
                 "# Layout of the job's nodes:",
                 "#   node 0: the pool service" + (", the cache" if self.cache_on else "") + ", the gateway(s)"
                 + (" and the rollout driver(s)" if self.run.rollout else ""),
                 f"#   nodes 1-{c.learner_nodes}: the learner, one rank a node ({c.learner_processes} process(es) "
                 "each)",
                 f"#   nodes {1 + c.learner_nodes}-{self.nodes - 1}: the actors, {c.actors_per_node} a node "
                 f"({c.actor_gpus} GPU(s) each)",
                 f"# The run's directory (pool, checkpoints, cache, keys, ready files, logs): {c.shared_dir}/{c.name}",
                 f"#SBATCH --job-name={c.name}",
                 f"#SBATCH --nodes={self.nodes}",
                 "#SBATCH --exclusive",
                 f"#SBATCH --signal=B:TERM@{STOP_BEFORE_END_S}"]
        if c.node_gpus:
            lines.append(f"#SBATCH --gres=gpu:{c.node_gpus}")
        for option, value in (("partition", c.partition), ("account", c.account), ("time", c.time)):
            if value:
                lines.append(f"#SBATCH --{option}={value}")
        return lines

    def text(self) -> str:
        c = self.config
        services.check_wiring(self.run, self.commands())
        kinds = " ".join(KEY_KINDS)
        lines = [*self.header(), "", "set -euo pipefail"]
        if c.setup:
            lines += ["", "# Set-up given with --setup.", c.setup]
        lines += [
            "",
            f"RUN_FILE={quote(str(self.run.path))}",
            f"RUN={quote(f'{c.shared_dir}/{c.name}')}",
            'KEYS="$RUN/keys"',
            'READY="$RUN/ready"',
            'LOGS="$RUN/logs/$SLURM_JOB_ID"',
            "",
            'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            f'if [ "${{#NODES[@]}}" -lt {self.nodes} ]; then',
            f'    echo "this job has ${{#NODES[@]}} node(s); the run needs {self.nodes}" >&2',
            "    exit 1",
            "fi",
            'SERVICE_NODE="${NODES[0]}"',
            f'LEARNER_NODES=("${{NODES[@]:1:{c.learner_nodes}}}")',
            f'ACTOR_NODES=("${{NODES[@]:{1 + c.learner_nodes}:{c.actor_nodes}}}")',
            "",
            'mkdir -p "$RUN/learner" "$RUN/cache" "$LOGS"',
            'rm -rf "$READY"',
            'mkdir -p "$READY/actors"',
            "# The run's keys, made afresh for every job, readable by the owner alone.",
            '(umask 077 && mkdir -p "$KEYS" && chmod 700 "$KEYS"',
            f" for kind in {kinds}; do",
            '     rm -f "$KEYS/$kind.key"',
            "     python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > \"$KEYS/$kind.key\"",
            " done)",
            HELPERS.rstrip("\n"),
            "",
            "# The pool service.",
            self.start(self.pool_command(), "$SERVICE_NODE"),
            f'wait_port pool "$SERVICE_NODE" {POOL_PORT}',
        ]
        if self.cache_on:
            lines += ["", "# The L3 KV cache.", self.start(self.cache_command(), "$SERVICE_NODE"),
                      'wait_file cache "$READY/cache.json"']
        learner_devices = "" if c.learner_gpus == 0 else None
        lines += ["", f"# The learner: {c.learner_nodes} rank(s), rank 0 serving Stats and the weights."]
        lines += [self.start(self.learner_command(r), f"${{LEARNER_NODES[{r}]}}", learner_devices)
                  for r in range(c.learner_nodes)]
        lines += ['wait_file learner-rank0 "$READY/learner.json"', "",
                  f"# The actors{f', in a weights relay tree of fan-out {c.relay_fanout}' if c.relay_fanout else ''}."]
        for i in range(c.actors):
            parent = relay_parent(i, c.relay_fanout)
            lines.append(f"# actor-{i}: weights from {'the learner' if parent is None else f'actor-{parent}'}")
            lines.append(self.start(self.actor_command(i), self.actor_node(i), self.actor_devices(i)))
        lines += [f'wait_file actor-{i} "$READY/actors/actor-{i}.json"' for i in range(c.actors)]
        lines += ["", "# The gateway(s): the agents' door, recording every call in the pool."]
        for g in range(c.gateways):
            lines += [self.start(self.gateway_command(g), "$SERVICE_NODE"),
                      f'wait_file gateway-{g} "$READY/gateway-{g}.json"']
            lines.append(f'echo "gateway-{g}: http://$SERVICE_NODE:{GATEWAY_HTTP_PORT + g}/v1 and gRPC '
                         f'$SERVICE_NODE:{GATEWAY_GRPC_PORT + g * SLOT_STRIDE} (API key in $KEYS/gateway.key)"')
        if self.run.rollout:
            lines += ["", "# The rollout driver(s): the team's tasks played by its agent, one per gateway."]
            lines += [self.start(self.rollout_command(g), "$SERVICE_NODE") for g in range(c.gateways)]
        lines += [
            "",
            "# Run until a service ends (or the rollout drivers are done), then stop the others.",
            "status=0",
            "wait -n || status=$?",
            'for k in "${!NAMES[@]}"; do',
            '    if ! kill -0 "${PIDS[k]}" 2>/dev/null; then echo "${NAMES[k]} ended"; fi',
            "done",
            "stop_all",
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"


def render(config: DeployConfig, run: RunFile) -> list[OutFile]:
    return [OutFile(f"{config.name}.sbatch", BatchScript(config, run).text())]
