"""Prime Intellect's verifiers environments (``verifiers.v1``), played unchanged: ``[env] verifiers`` names a
function returning an environment (``my_env.py:load_environment``, called with ``[env] args``) or a taskset's
module (its plugin id, ``args`` its settings). Every session is one ``env.run_episode(task, ModelContext)`` whose
client points at the session's base URL, so the environment's own harness, prompts, tools (MCP toolsets) and
interception proxy run as they do anywhere, and the gateway records every call token for token; each reward
function's weighted score becomes an outcome reward under its own name (their sum is the environment's reward).
Each episode brings up its own interception server and per-task toolsets; a taskset's shared toolsets are held by
``SharedServing`` while episodes use them.

Nothing may need the network at run time. verifiers' default runtime is a hosted sandbox: an agent seat left at
that default runs in the local subprocess runtime instead, and one that names another runtime is refused. Its
built-in chat program (the ``null`` and ``bash`` harnesses) is a PEP 723 script verifiers would set up with ``uv``;
Forge registers it with this Python, which has every package it declares (verifiers depends on them), so no
``uv`` runs. The folder of an environment given as a file goes on ``sys.path`` and ``PYTHONPATH``: verifiers
imports tasksets and toolsets by module name, here and in the processes it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge import variables
from forge.loading import PluginError, first_line, load_object
from forge.rollout.held import Held
from forge.rollout.tasks.source import TaskSet, split, task_cycle
from forge.rollout.workload import SESSION_MODEL, Outcome, Plan, Session, Workload
from forge.sampling.params import SamplingParams

log = logging.getLogger(__name__)

WHAT = "verifiers environment"
INSTALL_HINT = "verifiers is not installed: pip install 'forge-rl[envs]'"
KEY_VARIABLE = "FORGE_SESSION_API_KEY_{}"    # a session's key, read by verifiers' client; "API_KEY" in the name
                                             # keeps it from the processes verifiers starts
SESSIONS_PER_SERVING = 256                   # episodes one shared serving relays before a fresh one


def import_verifiers() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise PluginError(WHAT, "verifiers", f"{INSTALL_HINT} ({first_line(exc)})") from None
    return vf


def importable_from(folder: Path) -> None:
    """Let ``folder``'s modules import by name here and in the processes verifiers starts."""
    entry = str(folder)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    paths = [p for p in (variables.read("PYTHONPATH") or "").split(os.pathsep) if p]
    if entry not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *paths])


def load_environment(spec: str, args: dict[str, Any], base_dir: Path) -> Any:
    """The verifiers Env ``spec`` names, made with ``args``, set to run on this host. PluginError (a ValueError)
    with the reason when it cannot be imported or made."""
    vf = import_verifiers()
    target, colon, _ = spec.rpartition(":")
    if colon and (target.endswith(".py") or "/" in target):
        importable_from((base_dir / target).resolve().parent)
    elif not colon and (base_dir / f"{spec.replace('-', '_')}.py").is_file():
        importable_from(base_dir.resolve())
    try:
        if colon:
            made = load_object(spec, what=WHAT, base_dir=base_dir)
            if not callable(made):
                raise PluginError(WHAT, spec, f"{made!r} is not a function")
            made = made(**args)
            if isinstance(made, vf.EnvConfig):
                made = vf.load_environment(made)
            if not isinstance(made, vf.Env):
                raise PluginError(WHAT, spec, f"it returned {type(made).__name__}, not a verifiers.v1 Env "
                                              f"(e.g. vf.SingleAgentEnv)")
        else:
            made = vf.load_environment(vf.resolve_env_config({"taskset": {"id": spec, **args}}))
        return on_this_host(made, spec)
    except PluginError:
        raise
    except (Exception, SystemExit) as exc:  # whatever the user's code raised, the environment cannot be made
        raise PluginError(WHAT, spec, f"it cannot be made: {first_line(exc)}") from exc


def on_this_host(env: Any, spec: str) -> Any:
    """``env`` with every agent seat left at verifiers' default (hosted) runtime moved to the local subprocess
    runtime; PluginError for a seat that names a runtime of its own (a container or a hosted sandbox)."""
    vf = import_verifiers()
    from verifiers.v1.configs.agent import agent_config_fields

    update = {}
    for name, seat in agent_config_fields(env.config).items():
        if isinstance(seat.runtime, vf.SubprocessConfig):
            continue
        if "runtime" in seat.model_fields_set:
            raise PluginError(WHAT, spec, f"its seat {name!r} runs in a {seat.runtime.type!r} runtime; Forge plays "
                                          f"environments on this host without the network: leave the runtime out "
                                          f"or set it to subprocess")
        update[name] = seat.model_copy(update={"runtime": vf.SubprocessConfig()})
    return type(env)(env.config.model_copy(update=update)) if update else env


def register_chat_program() -> None:
    """Have verifiers' subprocess runtime run its built-in chat program with this Python instead of setting it up
    with uv (which would download uv and the program's packages)."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(CHAT_PROGRAM_SOURCE.encode()).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != CHAT_PROGRAM_SOURCE:
        path.write_text(CHAT_PROGRAM_SOURCE)
    SubprocessRuntime._interpreters[str(path)] = sys.executable


def task_dicts(env: Any, eval_fraction: float, seed: int) -> TaskSet:
    """The environment's tasks as Forge's task dicts (``id``, ``domain``: the environment's name, ``task``: the
    verifiers Task), split into train and held-out as ``eval_fraction`` and ``seed`` say."""
    if not env.taskset.bounded:
        raise ValueError(f"{WHAT} {env.config.env_id!r}: its taskset is endless; give it a size (its take or "
                         f"num_examples setting) so that Forge can cycle through it and hold some out")
    domain = env.config.env_id or type(env.taskset).__name__
    tasks = [{"id": str(task.data.id if task.data.id is not None else f"{domain}-{index}"), "domain": domain,
              "task": task} for index, task in enumerate(env.taskset)]
    if not tasks:
        raise ValueError(f"{WHAT} {domain!r}: its taskset has no tasks")
    if eval_fraction and len(tasks) < 2:
        raise ValueError(f"{WHAT} {domain!r}: one task cannot be split into train and held-out")
    return split(tasks, eval_fraction, seed)


@dataclass
class VerifiersEnvironment:
    """A loaded environment and its tasks, checked before anything starts."""

    env: Any
    tasks: TaskSet
    timeout_s: float

    @classmethod
    def load(cls, spec: str, args: dict[str, Any], base_dir: Path, eval_fraction: float = 0.0, seed: int = 0,
             timeout_s: float = 600.0) -> VerifiersEnvironment:
        env = load_environment(spec, args, base_dir)
        register_chat_program()
        return cls(env, task_dicts(env, eval_fraction, seed), timeout_s)

    def workload(self, sampling: SamplingParams, seed: int = 0) -> VerifiersWorkload:
        return VerifiersWorkload(self.env, self.tasks.train, sampling, seed=seed, timeout_s=self.timeout_s)

    def describe(self) -> str:
        """One line for the start of a run: what is played, and a warning when the model's commands run here."""
        from verifiers.v1.utils.loaders import harness_class

        harnesses = sorted({config.id for config in self.env.config.agent_harnesses().values()})
        line = (f"environment: {self.env.config.env_id} (verifiers, harness {', '.join(harnesses)}; "
                f"{len(self.tasks.train)} tasks, {len(self.tasks.eval)} held out)")
        if any(harness_class(name).EXECUTES_CODE for name in harnesses):
            line += " - its harness runs the model's commands on this host, outside any sandbox"
        return line


class VerifiersWorkload(Workload):
    """Each session one episode of a verifiers environment, played through the session's base URL."""

    def __init__(self, env: Any, tasks: Sequence[dict[str, Any]], sampling: SamplingParams, *, seed: int = 0,
                 timeout_s: float = 600.0) -> None:
        self.env = env
        self.domains = tuple(sorted({t["domain"] for t in tasks}))
        self.sampling = sampling
        self.timeout_s = timeout_s
        self._tasks = task_cycle(tasks, seed)
        self._serving = SharedServing(env) if env.taskset.toolsets(env.taskset.config) else None

    def next_plan(self) -> Plan:
        return self.plan_for(next(self._tasks))

    def plan_for(self, task: dict[str, Any]) -> Plan:
        return Plan(task["id"], task["domain"], task, blackbox=True)

    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        import verifiers.v1 as vf

        variable = KEY_VARIABLE.format(secrets.token_hex(8))
        os.environ[variable] = session.api_key or session.driver_key
        context = vf.ModelContext(
            model=SESSION_MODEL, client=vf.EvalClientConfig(base_url=session.base_url, api_key_var=variable),
            sampling=vf.SamplingConfig(temperature=self.sampling.temperature, max_tokens=self.sampling.max_tokens))
        started = time.perf_counter()
        try:
            async with self._serving.episode() if self._serving else contextlib.nullcontext(), \
                    asyncio.timeout(self.timeout_s):
                episode = await self.env.run_episode(plan.task["task"], context)
        except TimeoutError:
            return Outcome(plan.domain, failed=f"the episode took longer than {self.timeout_s:g} s", blackbox=True)
        except Exception as exc:  # the environment's failure fails its session, not the driver
            return Outcome(plan.domain, failed=f"the episode raised {first_line(exc)}"[:1000], blackbox=True)
        finally:
            del os.environ[variable]
        return outcome_of(plan.domain, episode, time.perf_counter() - started)

    async def close(self) -> None:
        if self._serving is not None:
            await self._serving.close()


class SharedServing:
    """A taskset's shared tool servers (and verifiers' interception pool), held while episodes use them: verifiers'
    ``env.serving()``, entered by a task of its own. The pool keeps a client for every session URL it relays to for
    as long as it serves, so after ``per_serving`` episodes the next ones wait for those in play to end and a fresh
    serving starts (an environment holds one serving at a time)."""

    def __init__(self, env: Any, per_serving: int = SESSIONS_PER_SERVING) -> None:
        self.env = env
        self.per_serving = per_serving
        self._held: Held | None = None
        self._started = 0
        self._in_play = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def episode(self) -> AsyncIterator[None]:
        async with self._lock:
            if self._held is not None and self._started >= self.per_serving:
                await self._idle.wait()
                await self.close()
            if self._held is None:
                held = Held(self.env.serving)
                await held.open()
                self._held, self._started = held, 0
            self._started += 1
            self._in_play += 1
            self._idle.clear()
        try:
            yield
        finally:
            self._in_play -= 1
            if not self._in_play:
                self._idle.set()

    async def close(self) -> None:
        if self._held is not None:
            await self._held.close()
            self._held = None


def outcome_of(domain: str, episode: Any, seconds: float) -> Outcome:
    """A finished episode as the session's outcome: each reward function's weighted score under its name, the
    environment's metrics, or the reason it failed."""
    trace = episode.traces[-1] if episode.traces else None
    reply = trace.last_reply if trace is not None else ""
    errors = [*episode.errors, *(trace.errors if trace is not None else [])]
    if not episode.ok or trace is None:
        reason = f"{errors[-1].type}: {errors[-1].message}" if errors else "the episode did not complete"
        return Outcome(domain, failed=reason[:1000], blackbox=True, reply=reply)
    rewards = {name: reward.score * reward.weight for name, reward in trace.rewards.items() if reward is not None}
    metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
    metrics.update(completion_time_s=seconds, turns=float(trace.num_turns))
    return Outcome(domain, rewards, {}, metrics, "", True, reply)


__all__ = ["VerifiersEnvironment", "VerifiersWorkload", "load_environment", "outcome_of", "task_dicts"]
