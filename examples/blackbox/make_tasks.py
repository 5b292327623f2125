"""Writes this example's task files (tasks/train.jsonl, tasks/eval.jsonl) from Forge's built-in tool-use tasks:
find the colors of a few objects with a `lookup` tool. Each line carries the tool's data (`values`) for the agent
and the right answer (`answer`) for the verifier. Run it again to make other tasks:

    python examples/blackbox/make_tasks.py [--train 256] [--eval 48] [--seed 0]
"""

import argparse
import json
import random
from pathlib import Path

from forge.rollout.tasks import eval_set, unseen
from forge.rollout.tasks.agent import make
from forge.rollout.tasks.builtin_source import task_dict

HERE = Path(__file__).resolve().parent


def line(task) -> str:
    return json.dumps({**task_dict(task), "domain": "colors"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--eval", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    train = [unseen(lambda i=i: make(rng, f"colors-{i}")) for i in range(args.train)]
    held_out = eval_set("agent", args.eval)                   # prompts the training tasks never show
    (HERE / "tasks").mkdir(exist_ok=True)
    (HERE / "tasks/train.jsonl").write_text("".join(line(t) + "\n" for t in train))
    (HERE / "tasks/eval.jsonl").write_text("".join(line(t) + "\n" for t in held_out))
    print(f"wrote {len(train)} training and {len(held_out)} held-out tasks to {HERE / 'tasks'}")


if __name__ == "__main__":
    main()
