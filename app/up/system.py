"""The service processes of one ``forge up`` run: the run's keys made, every instance's settings checked
(``forge.app.up.plan``), then the services started in dependency order — forge-cache and the learners side by side,
the actors, the gateways — each wired to those before it through their ready files, and stopped in reverse.
``services.json`` in the run directory lists them for ``forge top``."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from forge.app.api_keys import KeyFiles
from forge.app.up.config import UpConfig
from forge.app.up.keys import generate
from forge.app.up.plan import Instance, Plan, actor_roles
from forge.launch import ServiceProcess
from forge.weights.curve import KeySet, create_keys, create_publisher_keys

log = logging.getLogger("forge.up")


def weight_keys(directory: Path, actors: list[str]) -> KeySet:
    """Fresh CURVE key pairs for one run's weight channel: the learner's and one per actor (by name); the previous
    run's are replaced (their processes are gone)."""
    shutil.rmtree(directory, ignore_errors=True)
    return create_keys(directory, actors)


class System:
    """The service processes of one run (of several runs on shared actors with ``--run``: a learner and gateways per
    run, ``forge.app.up.plan.Lane``). ``eval_gateway``: also a gateway per run recording into a pool of its own
    (eval-pool), which no learner reads, for held-out sessions played by the team's agent."""

    def __init__(self, config: UpConfig, eval_gateway: bool = False) -> None:
        self.config = config
        self.eval_gateway = eval_gateway
        self.services: list[ServiceProcess] = []
        self.instances: dict[str, Instance] = {}
        self.keys: KeyFiles | None = None
        self.backend = ("", "")             # the actors' backend and why it was picked, once planned

    def key(self, kind: str) -> str | None:
        """The API key of the services of ``kind`` (gateway, actor, cache), None for an unkeyed run or kind."""
        return self.keys.key(kind) if self.keys is not None and kind in self.keys.keys else None

    def plan(self) -> Plan:
        """Make the run's keys and check every instance's settings; nothing is started."""
        c, run = self.config, self.config.run_dir
        self.keys = generate(run / "keys") if c.keys else None
        curve = weight_keys(run / "keys" / "weights", [name for name, _ in actor_roles(c)]) if c.weights_curve \
            else None
        lane_curves = {name: create_publisher_keys(run / "keys" / "weights" / "runs" / name)
                       for name in c.runs} if curve is not None else {}
        plan = Plan(c, self.keys, curve, lane_curves)
        plan.check(self.eval_gateway)
        self.backend = plan.backend_and_why
        return plan

    def start(self) -> None:
        """Start the services level by level: forge-cache and the learners side by side (after the teacher's
        actors, when distilling: the learners are given their addresses), then every actor, then every gateway;
        each level waits for the ready files of the one before, whose addresses it is given."""
        plan = self.plan()
        cache = self._start(plan.cache()) if plan.cache_on else None
        lanes = plan.lanes()
        for lane in lanes:
            lane.directory.mkdir(parents=True, exist_ok=True)
        teachers = [self._start(plan.teacher_actor(name)) for name in plan.teacher_names()]
        scoring = tuple(teacher.wait_ready().info["address"] for teacher in teachers)
        learners = {lane.name: self._start(plan.learner(lane, scoring)) for lane in lanes}
        l3 = cache.wait_ready().info["address"] if cache is not None else None
        endpoints = {name: {field: learner.wait_ready().info[field] for field in ("weights_fetch", "weights_announce")}
                     for name, learner in learners.items()}
        weights, adapters = (None, plan.adapter_links(endpoints)) if plan.shared else (endpoints[""], ())
        actors = [self._start(plan.actor(i, weights, l3, adapters=adapters)) for i in range(len(plan.roles()))]
        roles = [role for _, role in plan.roles()]
        serving = [a.wait_ready().info["address"] for a, role in zip(actors, roles, strict=True) if role != "prefill"]
        prefill = [a.wait_ready().info["address"] for a, role in zip(actors, roles, strict=True) if role == "prefill"]
        gateways = [self._start(plan.gateway(name, pool, serving, prefill, lane=lane))
                    for lane in lanes for name, pool in plan.gateways(self.eval_gateway)]
        for gateway in gateways:
            gateway.wait_ready()
        (self.config.run_dir / "services.json").write_text(json.dumps([self._listed(s) for s in self.services],
                                                                      indent=2))

    def _start(self, instance: Instance) -> ServiceProcess:
        """Start ``instance``'s process; its caller waits for it to be ready (``ServiceProcess.wait_ready``)."""
        program, *rest = instance.service.program
        withheld = set(instance.withheld())
        env = {name: value for name, value in os.environ.items() if name not in withheld}
        process = ServiceProcess(instance.name, program, [*rest, *instance.arguments()], self.config.run_dir,
                                 {**env, **instance.environment()}, timeout_s=instance.service.start_s,
                                 inherit_env=False, wait=False)
        self.instances[instance.name] = instance
        self.services.append(process)
        return process

    def _listed(self, process: ServiceProcess) -> dict[str, Any]:
        """The service's entry in services.json: name, kind, ready-file fields, and its key file in a keyed run."""
        kind = self.instances[process.name].service.kind
        entry = {"name": process.name, "kind": kind, **process.info}
        if kind == "gateway":
            entry["metrics_url"] = f"{process.info['http_address']}/metrics"
        if self.key(kind) is not None:
            entry["api_key_file"] = str(self.keys.file(kind))
        return entry

    def exited(self) -> list[str]:
        """The services whose process has ended (a learner that made its last step, or one that crashed)."""
        return [process.name for process in self.services if not process.alive]

    def get(self, name: str) -> ServiceProcess:
        return next(s for s in self.services if s.name == name)

    def address(self, name: str) -> str:
        """The gRPC address of the service ``name``, from its ready file."""
        process = self.get(name)
        return process.info[self.instances[name].service.address_field]

    def kind(self, name: str) -> str:
        return self.instances[name].service.kind

    def stop(self) -> None:
        for process in reversed(self.services):
            code = process.stop(grace_s=self.instances[process.name].service.stop_s)
            if code not in (0, None):
                log.warning("%s exited with %s (see %s)", process.name, code, process.log_path)
