"""The example's verifier: 1 when the reply's final `Answer:` line names the right colors, in order, else 0."""

import re

ANSWER = re.compile(r"Answer:[ \t]*([^\n]*)")


def score(task: dict, reply: str, session: dict) -> dict[str, float]:
    found = ANSWER.findall(reply)
    given = found[-1].strip().rstrip(".").strip() if found else None
    return {"correct": 1.0 if given == task["answer"] else 0.0}
