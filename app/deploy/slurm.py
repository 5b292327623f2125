"""``forge deploy --target slurm``: one batch script for one run, submitted with ``sbatch``.

The script reads its nodes from ``scontrol show hostnames`` and each node's address from Slurm (or from
``--interface``), places the services as ``slurm_layout`` says, makes the run's keys (mode 0600), and starts every
service as a named job step (``srun --job-name``) in dependency order, waiting for each to be ready within a bound.
Then it waits: when a service ends (or the rollout drivers are done) it stops the others with a signal each
receives, and it does the same on SIGTERM (sent before the time limit, or with ``scancel --batch --signal=TERM``),
the learner checkpointing. A job requeued after a node failure starts again and the learner resumes from its last
checkpoint."""

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
from forge.app.deploy.slurm_layout import SERVICES_NODE, Layout
from forge.app.deploy.slurm_shell import HELPERS
from forge.app.registry import KEY_KINDS
from forge.weights.endpoints import RELAY_ANNOUNCE_PORT, RELAY_FETCH_PORT, WEIGHTS_ANNOUNCE_PORT, WEIGHTS_FETCH_PORT


class BatchScript:
    """The batch script of one run: ``text()`` renders it, ``commands()`` lists the services' command lines."""

    def __init__(self, config: DeployConfig, run: RunFile) -> None:
        self.config = config
        self.run = run
        self.cache_on = config.cache and run.cache_serves_actors
        self.teachers = config.teacher_actors if run.teacher is not None else 0
        self.layout = Layout.of(config, self.teachers)

    @staticmethod
    def node(index: int) -> Shell:
        """The name of the job's node ``index`` (what srun --nodelist takes)."""
        return Shell(f"${{NODES[{index}]}}")

    @staticmethod
    def address(index: int) -> Shell:
        """The address the other nodes reach the job's node ``index`` at."""
        return Shell(f"${{ADDRS[{index}]}}")

    def learner_address(self, rank: int) -> Shell:
        return self.address(self.layout.learners[rank])

    def actor_address(self, index: int) -> Shell:
        return self.address(self.layout.actors[index])

    def actor_slot(self, index: int) -> int:
        return self.layout.actor_slot(index)

    @property
    def services_address(self) -> Shell:
        return self.address(SERVICES_NODE)

    # The services' command lines.
    def pool_command(self) -> Command:
        return services.pool(self.run, self.config, run_file=Shell("$RUN_FILE"), path=Shell("$RUN/pool"),
                             port=POOL_PORT)

    def cache_command(self) -> Command:
        return services.cache(self.run, self.config, run_file=Shell("$RUN_FILE"), directory=Shell("$RUN/cache"),
                              port=CACHE_PORT, ready_file=Shell("$READY/cache.json"))

    def learner_command(self, rank: int) -> Command:
        return services.learner(self.run, self.config, name=f"learner-rank{rank}", run_file=Shell("$RUN_FILE"),
                                rank=rank, rdzv=Shell(f"{self.learner_address(0)}:{RDZV_PORT}"),
                                pool=Shell(f"{self.services_address}:{POOL_PORT}"), run_dir=Shell("$RUN/learner"),
                                ready_file=Shell("$READY/learner.json"),
                                teachers=[Shell(f"{self.address(self.layout.teachers[k])}:{self.teacher_port(k)}")
                                          for k in range(self.teachers)])

    def teacher_port(self, index: int) -> int:
        return ACTOR_PORT + self.layout.teacher_slot(index) * SLOT_STRIDE

    def teacher_command(self, index: int) -> Command:
        """The teacher's actor ``index`` (on-policy distillation), listening on its node's address."""
        return services.teacher(self.run, self.config, name=f"teacher-{index}", run_file=Shell("$RUN_FILE"),
                                host=self.address(self.layout.teachers[index]), port=self.teacher_port(index),
                                ready_file=Shell(f"$READY/teachers/teacher-{index}.json"))

    def actor_command(self, index: int) -> Command:
        c = self.config
        parent = relay_parent(index, c.relay_fanout)
        if parent is None:
            host = self.learner_address(0)
            fetch, announce = WEIGHTS_FETCH_PORT, WEIGHTS_ANNOUNCE_PORT
        else:
            host = self.actor_address(parent)
            offset = self.actor_slot(parent) * SLOT_STRIDE
            fetch, announce = RELAY_FETCH_PORT + offset, RELAY_ANNOUNCE_PORT + offset
        offset = self.actor_slot(index) * SLOT_STRIDE
        relay = None
        if relays(index, c.actors, c.relay_fanout):
            relay = (f"tcp://{ANY}:{RELAY_FETCH_PORT + offset}", f"tcp://{ANY}:{RELAY_ANNOUNCE_PORT + offset}")
        # An actor listens on its node's address, so that the address in its ready file (which the gateway reads)
        # is one the other nodes reach.
        return services.actor(self.run, c, name=f"actor-{index}", run_file=Shell("$RUN_FILE"),
                              host=self.actor_address(index), port=ACTOR_PORT + offset,
                              fetch=Shell(f"tcp://{host}:{fetch}"), announce=Shell(f"tcp://{host}:{announce}"),
                              relay=relay, cache=Shell(f"{self.services_address}:{CACHE_PORT}") if self.cache_on else None,
                              ready_file=Shell(f"$READY/actors/actor-{index}.json"))

    def gateway_command(self, index: int) -> Command:
        return services.gateway(self.run, self.config, name=f"gateway-{index}", run_file=Shell("$RUN_FILE"),
                                grpc_port=GATEWAY_GRPC_PORT + index * SLOT_STRIDE,
                                http_port=GATEWAY_HTTP_PORT + index, pool=Shell(f"{self.services_address}:{POOL_PORT}"),
                                actors_dir=Shell("$READY/actors"), ready_file=Shell(f"$READY/gateway-{index}.json"))

    def eval_gateway_command(self) -> Command:
        """The gateway of the held-out sessions, after the training ones, recording into a pool no learner reads."""
        index = self.config.gateways
        return services.gateway(self.run, self.config, name="gateway-eval", run_file=Shell("$RUN_FILE"),
                                grpc_port=GATEWAY_GRPC_PORT + index * SLOT_STRIDE,
                                http_port=GATEWAY_HTTP_PORT + index, pool_path=Shell("$RUN/eval-pool"),
                                actors_dir=Shell("$READY/actors"), ready_file=Shell("$READY/gateway-eval.json"))

    def rollout_command(self, index: int) -> Command:
        """Rollout driver ``index``; the first plays the held-out tasks too and writes the run's summary."""
        evaluates = index == 0 and self.run.held_out
        door = self.config.gateways
        return services.rollout(self.run, self.config, name=f"rollout-{index}", run_file=Shell("$RUN_FILE"),
                                gateway=Shell(f"{self.services_address}:{GATEWAY_GRPC_PORT + index * SLOT_STRIDE}"),
                                http=Shell(f"http://{self.services_address}:{GATEWAY_HTTP_PORT + index}"),
                                seed=services.rollout_seed(self.run) + index,
                                eval_gateway=(Shell(f"{self.services_address}:{GATEWAY_GRPC_PORT + door * SLOT_STRIDE}"),
                                              Shell(f"http://{self.services_address}:{GATEWAY_HTTP_PORT + door}"))
                                if evaluates else None,
                                summary=Shell("$RUN/summary.json") if index == 0 else None)

    def commands(self) -> list[Command]:
        c = self.config
        return [self.pool_command(), *([self.cache_command()] if self.cache_on else []),
                *(self.learner_command(r) for r in range(c.learner_nodes)),
                *(self.actor_command(i) for i in range(c.actors)),
                *(self.gateway_command(g) for g in range(c.gateways)),
                *([self.eval_gateway_command()] if self.run.held_out else []),
                *((self.rollout_command(g) for g in range(c.gateways)) if self.run.rollout else ())]

    # The script.
    def start(self, command: Command, node: int, devices: str | None = None) -> str:
        env: list[str] = [f"CUDA_VISIBLE_DEVICES={devices}"] if devices is not None else []
        if command.kind == "rollout" and self.run.hub_models:
            env.append(Shell("HF_HUB_OFFLINE=$HUB_OFFLINE_GIVEN"))
        env = ["env", *env] if env else []
        words = [*env, *command.words(command.key_file_options("$KEYS"))]
        return f"start {command.name} {quote(self.node(node))} \\\n    {shell_words(words)}"

    def placement(self) -> list[str]:
        """One line per node of the job: what runs there."""
        return self.layout.describe(self.run.rollout, self.cache_on)

    def header(self) -> list[str]:
        c, layout = self.config, self.layout
        lines = ["#!/bin/bash",
                 f"# Forge run {c.name!r} on Slurm, written by forge deploy from {self.run.path}.",
                 f"# Submit it with: sbatch {c.out / f'{c.name}.sbatch'}",
                 f"# Placement on the job's {layout.nodes} node(s) ({c.learner_processes} learner process(es) a "
                 f"learner node, {c.actor_gpus} GPU(s) an actor):",
                 *(f"#   {line}" for line in self.placement()),
                 f"# The run's directory (pool, checkpoints, cache, keys, ready files, logs): {c.shared_dir}/{c.name}",
                 f"#SBATCH --job-name={c.name}",
                 f"#SBATCH --nodes={layout.nodes}",
                 "#SBATCH --exclusive",
                 "#SBATCH --requeue",
                 f"#SBATCH --signal=B:TERM@{c.stop_timeout + 60}"]
        if layout.gpus_per_node:
            lines.append(f"#SBATCH --gres=gpu:{layout.gpus_per_node}")
        for option, value in (("partition", c.partition), ("account", c.account), ("time", c.time)):
            if value:
                lines.append(f"#SBATCH --{option}={value}")
        return lines

    def prologue(self) -> list[str]:
        """The job's variables, nodes and addresses, directories and keys, before any service starts."""
        c, layout = self.config, self.layout
        kinds = " ".join(KEY_KINDS)
        lines = [
            f"RUN_FILE={quote(str(self.run.path))}",
            f"RUN={quote(f'{c.shared_dir}/{c.name}')}",
            'KEYS="$RUN/keys"',
            'READY="$RUN/ready"',
            '# A job requeued after a node failure keeps its id: each start logs apart.',
            'LOGS="$RUN/logs/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"',
            f"READY_TIMEOUT={c.ready_timeout}",
            f"STOP_TIMEOUT={c.stop_timeout}",
            f"REQUEUES={c.requeues}",
            f"INTERFACE={quote(c.interface or '')}",
        ]
        if c.interface:
            lines.append('export GLOO_SOCKET_IFNAME="$INTERFACE" NCCL_SOCKET_IFNAME="$INTERFACE"')
        lines += [
            "",
            'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            f'if [ "${{#NODES[@]}}" -ne {layout.nodes} ]; then',
            f'    echo "this job has ${{#NODES[@]}} node(s); the run is placed on {layout.nodes}" >&2',
            "    exit 1",
            "fi",
            HELPERS.strip("\n"),
            "",
            'ADDRS=()',
            'for node in "${NODES[@]}"; do',
            '    found=$(address "$node")',
            '    ADDRS+=("$found")',
            'done',
            'mkdir -p "$RUN/learner" "$RUN/cache" "$LOGS"',
            'rm -rf "$READY"',
            'mkdir -p "$READY/actors" "$READY/teachers"',
            'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
            '    echo "restart ${SLURM_RESTART_COUNT} of job $SLURM_JOB_ID: the learner resumes from its last checkpoint"',
            "fi",
            'echo "placement:"',
            *(f'echo "  {line}: ${{NODES[{n}]}} (${{ADDRS[{n}]}})"' for n, line in enumerate(self.placement())),
            *self.fetches(),
            "# The run's keys, made afresh for every job, readable by the owner alone.",
            '(umask 077 && mkdir -p "$KEYS" && chmod 700 "$KEYS"',
            f" for kind in {kinds}; do",
            '     rm -f "$KEYS/$kind.key"',
            "     python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > \"$KEYS/$kind.key\"",
            " done)",
        ]
        return lines

    def fetches(self) -> list[str]:
        """The script's lines fetching the Hub models into every node's cache; the services then run offline (the
        rollout drivers excepted: a dataset named by Hub id is fetched by them), as forge up runs its services."""
        models = self.run.hub_models
        if not models:
            return []
        return ["# The models named by Hugging Face id, fetched once per node (HF_HOME, HF_TOKEN and HF_ENDPOINT as",
                "# the job has them); the services then read the cache only.",
                *(f"fetch_model {quote(model)}" for model in models),
                'HUB_OFFLINE_GIVEN="${HF_HUB_OFFLINE:-}"',
                "export HF_HUB_OFFLINE=1"]

    def text(self) -> str:
        c, layout = self.config, self.layout
        services.check_wiring(self.run, self.commands())
        lines = [*self.header(), "", "set -euo pipefail"]
        if c.setup:
            lines += ["", "# Set-up given with --setup.", c.setup]
        lines += ["", *self.prologue(), "",
                  "# The pool service.",
                  self.start(self.pool_command(), SERVICES_NODE),
                  f'wait_port pool "{self.services_address}" {POOL_PORT}']
        if self.cache_on:
            lines += ["", "# The L3 KV cache.", self.start(self.cache_command(), SERVICES_NODE),
                      'wait_file cache "$READY/cache.json"']
        if self.teachers:
            lines += ["", f"# The teacher's actors ([learner] teacher: {self.run.teacher}), which the learner asks for "
                          "the log-probs of the student's samples."]
            lines += [self.start(self.teacher_command(k), node, layout.teacher_devices(k))
                      for k, node in enumerate(layout.teachers)]
            lines += [f'wait_file teacher-{k} "$READY/teachers/teacher-{k}.json"' for k in range(self.teachers)]
        lines += ["", f"# The learner: {c.learner_nodes} rank(s), rank 0 serving Stats and the weights."]
        lines += [self.start(self.learner_command(r), node, layout.learner_devices())
                  for r, node in enumerate(layout.learners)]
        lines += ['wait_file learner-rank0 "$READY/learner.json"', "",
                  f"# The actors{f', in a weights relay tree of fan-out {c.relay_fanout}' if c.relay_fanout else ''}."]
        for i, node in enumerate(layout.actors):
            parent = relay_parent(i, c.relay_fanout)
            lines.append(f"# actor-{i}: weights from {'the learner' if parent is None else f'actor-{parent}'}")
            lines.append(self.start(self.actor_command(i), node, layout.actor_devices(i)))
        lines += [f'wait_file actor-{i} "$READY/actors/actor-{i}.json"' for i in range(c.actors)]
        lines += ["", "# The gateway(s): the agents' door, recording every call in the pool."]
        for g in range(c.gateways):
            lines += [self.start(self.gateway_command(g), SERVICES_NODE),
                      f'wait_file gateway-{g} "$READY/gateway-{g}.json"']
            lines.append(f'echo "gateway-{g}: http://{self.services_address}:{GATEWAY_HTTP_PORT + g}/v1 and gRPC '
                         f'{self.services_address}:{GATEWAY_GRPC_PORT + g * SLOT_STRIDE} (API key in '
                         '$KEYS/gateway.key)"')
        if self.run.held_out:
            lines += ["", "# The held-out sessions' gateway, recording into a pool no learner reads.",
                      self.start(self.eval_gateway_command(), SERVICES_NODE),
                      'wait_file gateway-eval "$READY/gateway-eval.json"']
        if self.run.rollout:
            lines += ["", "# The rollout driver(s): the team's tasks played by its agent, one per gateway; the first "
                          "evaluates the held-out tasks at the start and the end and writes $RUN/summary.json."]
            lines += [self.start(self.rollout_command(g), SERVICES_NODE) for g in range(c.gateways)]
        lines += [
            "",
            "# Run until the rollout drivers are done or another service ends, then stop the others. A service that",
            "# failed (a lost node, a crashed rank) requeues the job, up to REQUEUES times: it starts again and the",
            "# learner resumes from its last checkpoint.",
            "status=0",
            "while :; do",
            "    wait -n || status=$?",
            '    if [ "$status" -ne 0 ] || ended_others || ! rollouts_running; then break; fi',
            "done",
            'for k in "${!NAMES[@]}"; do',
            '    if ! kill -0 "${PIDS[k]}" 2>/dev/null; then echo "${NAMES[k]} ended"; fi',
            "done",
            "stop_all",
            'if [ "$status" -ne 0 ] && ! this_start; then',
            '    echo "a service failed (status $status): Slurm requeued the job itself (a node was lost)"',
            'elif [ "$status" -ne 0 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "$REQUEUES" ]; then',
            '    echo "a service failed (status $status): requeueing the job (restart $((${SLURM_RESTART_COUNT:-0} + 1)) '
            'of at most $REQUEUES)"',
            '    scontrol requeue "$SLURM_JOB_ID"',
            "fi",
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"


def render(config: DeployConfig, run: RunFile) -> list[OutFile]:
    return [OutFile(f"{config.name}.sbatch", BatchScript(config, run).text())]
