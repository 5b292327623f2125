"""Settings of a team's rollouts, as a run file's ``[tasks]`` and ``[agent]`` tables give them: where the tasks
and the verifier come from, and the agent program that plays each session. Paths are relative to the run file."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, SettingsError, setting


@dataclass(frozen=True, kw_only=True)
class TasksConfig(Settings):
    train: str | None = setting(None, flag="tasks", metavar="FILE",
                                help="The team's training tasks: a JSONL file, one task a line (none: the built-in "
                                     "tasks).")
    source: str | None = setting(None, flag="task-source", metavar="MODULE:FUNCTION",
                                 help="Or Python code that makes them: a function returning task dicts.")
    eval: str | None = setting(None, flag="eval-tasks", metavar="FILE",
                               help="Held-out tasks (JSONL), read at the start and the end of the run.")
    eval_fraction: float = setting(0.0, min=0, max=0.9,
                                   help="Or hold out this fraction of the training tasks (0: none).")
    verifier: str | None = setting(None, metavar="FILE.py:FUNCTION",
                                   help="score(task, reply, session) -> float or {name: float}: the outcome reward "
                                        "of each session.")
    verifier_workers: int = setting(4, min=1, help="Threads the verifier runs on (rollouts never wait on it).")
    verifier_timeout_s: float = setting(60.0, flag="verifier-timeout", min=0, min_open=True,
                                        help="Seconds a verifier call may take; a slower one fails its session.")
    group_size: int = setting(4, min=1, max=64, help="Rollouts per task (G).")

    @property
    def team(self) -> bool:
        """Whether the run uses the team's tasks rather than the built-in ones."""
        return bool(self.train or self.source)

    def check(self) -> None:
        if self.train and self.source:
            raise SettingsError("give --tasks or --task-source, not both")
        if self.eval and self.eval_fraction:
            raise SettingsError("give --eval-tasks or --eval-fraction, not both")
        if self.team and not self.verifier:
            raise SettingsError("the team's tasks need a verifier: give --verifier (FILE.py:FUNCTION)")
        if not self.team and (self.verifier or self.eval or self.eval_fraction):
            raise SettingsError("--verifier and held-out tasks go with the team's tasks: give --tasks too")


@dataclass(frozen=True, kw_only=True)
class AgentConfig(Settings):
    command: tuple[str, ...] = setting((), flag="agent", separator="shell", metavar="COMMAND",
                                       help="The agent program run once per session, e.g. 'python my_agent.py' (a "
                                            "list in a run file); it reads OPENAI_BASE_URL and OPENAI_API_KEY.")
    timeout_s: float = setting(600.0, flag="agent-timeout", min=0, min_open=True,
                               help="Seconds a session's program may run; a slower one is killed and the session "
                                    "fails.")
    concurrency: int = setting(16, flag="agent-concurrency", min=1, help="Agent programs running at once at most.")
