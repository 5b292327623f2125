"""The summary a rollout driver keeps of its run (``forge rollout --summary FILE``): sessions, failures, training
reward, and the held-out reward per domain at the run's start and end, as JSON that is always whole (written to a
side file, then renamed). It is written once the start is evaluated and again at the end, so a driver started
again on the same file — a requeued cluster job, a resubmitted one — continues the run: the start's held-out
reading is kept and the sessions add up."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    episodes: int = 0
    failed_episodes: int = 0
    blackbox_episodes: int = 0
    failures: list[str] = field(default_factory=list)          # the latest failure reasons
    train_reward: dict[str, float] = field(default_factory=dict)   # of the latest start's sessions, per domain
    eval_start: dict[str, float] = field(default_factory=dict)
    eval_end: dict[str, float] = field(default_factory=dict)
    eval_failed_sessions: int = 0
    minutes: float = 0.0
    starts: int = 0                                            # how many times a driver ran this run

    @classmethod
    def read(cls, path: Path | None) -> RunSummary:
        """The summary at ``path`` to continue, or a new one (no file, or one that is not a summary: said once)."""
        if path is None or not path.exists():
            return cls()
        try:
            found = json.loads(path.read_text())
            known = {name: found[name] for name in cls.__dataclass_fields__ if name in found}
            blank = cls()
            for name, value in known.items():
                kind = type(getattr(blank, name))
                if not isinstance(value, kind) and not (kind is float and isinstance(value, int)):
                    raise TypeError(f"{name} is {value!r}")
            return cls(**known)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("%s is not a run summary (%s): starting a new one", path, exc)
            return cls()

    def write(self, path: Path | None) -> None:
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(asdict(self), indent=2))
        os.replace(partial, path)

    def add(self, stats: Any, minutes: float) -> None:
        """This start's sessions (a driver's ``DriverStats``) and time, added to the run's."""
        self.episodes += stats.episodes
        self.failed_episodes += stats.failed
        self.blackbox_episodes += stats.blackbox
        self.failures = [*self.failures, *stats.failures][-8:]
        self.train_reward = stats.reward()
        self.minutes += minutes
