"""A team's rollouts assembled from their settings: the task set, the verifier and the agent (a program or a
``forge.agents.Agent`` class), or an environment that brings all three; each checked before anything starts, and
the workload that plays them. Shared by ``forge up`` and ``forge rollout``."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.rollout.config import AgentConfig, EnvConfig, TasksConfig
from forge.rollout.sandbox.config import SandboxConfig
from forge.sampling.params import SamplingParams


@dataclass
class Team:
    """A team's run, checked: its tasks, verifier and agent, or an environment's."""

    tasks: Any                           # forge.rollout.tasks.source.TaskSet
    verifier: Any = None                 # forge.rollout.verifier.Verifier
    runner: Any = None                   # forge.rollout.blackbox.BlackBoxRunner, for a program
    agent_class: Any = None              # a forge.agents.Agent subclass, for a white-box agent
    sandbox: SandboxConfig | None = None     # each session's program gets a sandbox (enabled)
    base_dir: Path = Path(".")               # where the run file is: tasks' workspace folders are relative to it
    environment: Any = None                  # an environment playing its own tasks (forge.rollout.*_env)

    @classmethod
    def load_env(cls, env: EnvConfig, base_dir: Path, seed: int = 0) -> Team:
        """The environment ``env`` names, made and its tasks read; ValueError (PluginError) with the reason."""
        if env.verifiers:
            from forge.rollout.verifiers_env import VerifiersEnvironment

            environment: Any = VerifiersEnvironment.load(env.verifiers, env.args, base_dir, env.eval_fraction, seed,
                                                         env.timeout_s)
        else:
            from forge.rollout.openenv_env import OpenEnvEnvironment

            environment = OpenEnvEnvironment.load(
                spec=env.openenv, url=env.openenv_url, base_dir=base_dir, reset_args=env.args, seeds=env.seeds,
                eval_fraction=env.eval_fraction, seed=seed, max_turns=env.max_turns, concurrency=env.concurrency,
                timeout_s=env.timeout_s, tool_choice=env.tool_choice)
        return cls(environment.tasks, base_dir=base_dir, environment=environment)

    @classmethod
    def load(cls, tasks: TasksConfig, agent: AgentConfig, base_dir: Path, seed: int = 0,
             sandbox: SandboxConfig | None = None) -> Team:
        """Raises ValueError (TaskError, PluginError, AgentCommandError, a sandbox without bwrap) with the
        reason."""
        from forge.rollout.blackbox import AgentCommand, BlackBoxRunner
        from forge.rollout.tasks.source import load_task_set
        from forge.rollout.verifier import load_verifier

        task_set = load_task_set(train=tasks.train, eval=tasks.eval, eval_fraction=tasks.eval_fraction,
                                 source=tasks.source, seed=seed, base_dir=base_dir, dataset=tasks.dataset_spec(),
                                 eval_dataset=tasks.dataset_spec(tasks.eval_split) if tasks.eval_split else None)
        runner = agent_class = None
        if agent.command:
            runner = BlackBoxRunner(AgentCommand(agent.command, timeout_s=agent.timeout_s,
                                                 concurrency=agent.concurrency, cwd=base_dir))
        elif agent.mcp.servers:
            from forge.rollout.mcp_agent import mcp_agent_class

            agent_class = mcp_agent_class(agent.mcp, base_dir)
        else:
            agent_class = load_agent_class(agent.python, base_dir)
        verifier = load_verifier(tasks.verifier, base_dir, workers=tasks.verifier_workers,
                                 timeout_s=tasks.verifier_timeout_s)
        if sandbox is not None and sandbox.enabled:
            check_sandboxed(task_set, agent, base_dir)
        else:
            sandbox = None
        return cls(task_set, verifier, runner, agent_class, sandbox, base_dir)

    def workload(self, sampling: SamplingParams, seed: int = 0, tokenizer: Any = None):
        """The workload that plays the team's training tasks; ``tokenizer`` (the model's) decodes the calls of the
        session records the verifier gets."""
        from forge.rollout.workload import TeamWorkload

        if self.environment is not None:
            return self.environment.workload(sampling, seed)
        return TeamWorkload(self.tasks.train, self.verifier, runner=self.runner, agent_class=self.agent_class,
                            sampling=sampling, seed=seed, tokenizer=tokenizer, sandbox=self.sandbox,
                            base_dir=self.base_dir)


def check_sandboxed(task_set: Any, agent: AgentConfig, base_dir: Path) -> None:
    """ValueError unless sandboxes can serve the team: bwrap is there, the agent is a program (it runs commands
    through FORGE_SANDBOX), and every task's ``workspace`` folder exists."""
    from forge.rollout.sandbox import find_bwrap

    try:
        find_bwrap()
    except RuntimeError as exc:
        raise ValueError(f"[sandbox] enabled: {exc}") from None
    if not agent.command:
        raise ValueError("[sandbox] enabled needs an agent program ([agent] command): it runs its commands through "
                         "FORGE_SANDBOX")
    for task in (*task_set.train, *task_set.eval):
        folder = task.get("workspace")
        if folder is not None and not (isinstance(folder, str) and (base_dir / folder).is_dir()):
            raise ValueError(f"task {task['id']!r}: workspace {folder!r} is not a folder (relative to {base_dir})")


def load_agent_class(spec: str, base_dir: Path) -> type:
    """The white-box agent class ``spec`` names; PluginError (a ValueError) unless it is a concrete Agent."""
    from forge.agents import Agent
    from forge.loading import PluginError, load_object

    found = load_object(spec, what="agent", base_dir=base_dir)
    if not (isinstance(found, type) and issubclass(found, Agent)):
        raise PluginError("agent", spec, f"{found!r} is not a subclass of forge.agents.Agent")
    if inspect.isabstract(found):
        raise PluginError("agent", spec, f"{found.__qualname__} does not implement run")
    return found
