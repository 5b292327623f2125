"""The sample table: every few steps, some of the step's trajectories as text — domain, task, the calls detokenised,
their tool calls, the reward parts, advantages, weight versions and staleness — appended to RUN_DIR/samples.jsonl
(one JSON object per step) and handed to whoever logs them (the experiment trackers)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from forge.learner.rewards import SessionRewards
from forge.parsing.completion import CompletionParser, pick_tool_parser
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)
Decode = Callable[[Sequence[int]], str]
Rows = list[dict[str, Any]]


def tokenizer_decoder(directory: Path) -> tuple[Decode, CompletionParser | None]:
    """The text of token ids by the tokenizer in ``directory`` and the parser of its model's tool calls; token ids
    as text where it has no tokenizer (a bare checkpoint)."""
    from forge.tokenizer import Tokenizer

    try:
        tokenizer = Tokenizer.from_dir(directory)
    except (OSError, ValueError) as exc:
        log.info("no tokenizer in %s (%s): sample tables show token ids", directory, exc)
        return (lambda ids: " ".join(map(str, ids))), None
    parser = CompletionParser(pick_tool_parser(tokenizer.chat_template)[0], "none")
    return (lambda ids: tokenizer.decode(list(ids))), parser


def trajectory_text(calls: Sequence[pool_pb2.CallRecord], decode: Decode) -> tuple[str, list[str]]:
    """(the whole trajectory, each call's completion) as text: each call's prompt where it goes beyond the previous
    call's prompt and completion (the tool results, a rewritten context whole), then its completion."""
    pieces, completions, previous = [], [], []
    for call in calls:
        prompt = list(call.prompt_ids)
        new = prompt[len(previous):] if prompt[:len(previous)] == previous else prompt
        completion = decode(call.completion_ids)
        pieces += [decode(new), completion]
        completions.append(completion)
        previous = [*prompt, *call.completion_ids]
    return "".join(pieces), completions


def _tool_calls(completions: list[str], parser: CompletionParser | None) -> list[dict[str, str]]:
    if parser is None:
        return []
    found = []
    for index, text in enumerate(completions):
        try:
            calls = parser.parse(text, parse_tools=True).tool_calls
        except ValueError:
            continue
        found += [{"call": index, "name": c.name, "arguments": c.arguments} for c in calls]
    return found


def session_row(item: pool_pb2.SessionWithCalls, reward: SessionRewards, version: int, decode: Decode,
                parser: CompletionParser | None) -> dict[str, Any]:
    """One trajectory of the batch as a row of the table (lists as JSON text, so that every tracker shows them)."""
    session = item.session
    calls = sorted(item.calls, key=lambda c: c.index)
    text, completions = trajectory_text(calls, decode)
    versions = [v for call in calls for v in call.weight_versions]
    return {"domain": session.domain or "default", "task": session.task_id, "session": session.session_id,
            "calls": len(calls), "text": text, "tool_calls": json.dumps(_tool_calls(completions, parser)),
            "outcome": reward.outcome, "speed": reward.speed,
            "process_rewards": json.dumps([list(call.process_rewards) for call in calls]),
            "rewards": json.dumps(reward.rewards), "advantage": json.dumps(reward.advantages),
            "weights_version": min(versions, default=version), "staleness": version - min(versions, default=version)}


class SampleLog:
    """Every ``every`` steps, ``size`` trajectories of the step's batch (one per group in turn, so the table spans
    the batch) to ``path`` and to ``on_rows(step, rows)``."""

    def __init__(self, path: Path, every: int, size: int, decode: Decode, parser: CompletionParser | None = None,
                 on_rows: Callable[[int, Rows], None] | None = None) -> None:
        self.path, self.every, self.size = Path(path), every, size
        self.decode, self.parser, self.on_rows = decode, parser, on_rows

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def pick(self, entries: Sequence[pool_pb2.QueueEntry]) -> list[pool_pb2.SessionWithCalls]:
        groups = [list(entry.sessions) for entry in entries]
        picked: list[pool_pb2.SessionWithCalls] = []
        for turn in range(max((len(g) for g in groups), default=0)):
            picked += [group[turn] for group in groups if turn < len(group)]
        return [item for item in picked if item.calls][:self.size]

    def write(self, step: int, version: int, entries: Sequence[pool_pb2.QueueEntry],
              rewards: Sequence[SessionRewards]) -> Rows:
        """The step's rows (none when it is not due), appended to the file and handed on."""
        if not self.due(step):
            return []
        by_session = {r.session_id: r for r in rewards}
        rows = [{"step": step, **session_row(item, by_session[item.session.session_id], version, self.decode,
                                             self.parser)}
                for item in self.pick(entries) if item.session.session_id in by_session]
        if rows:
            self._append(step, rows)
            if self.on_rows is not None:
                self.on_rows(step, rows)
        return rows

    def _append(self, step: int, rows: Rows) -> None:
        """The rows are telemetry: a file that cannot be written (a full disk) costs the step's rows, with a
        warning, never the step."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": step, "rows": rows}) + "\n")
        except OSError as exc:
            log.warning("step %d's sample table was not written to %s: %s", step, self.path, exc)
