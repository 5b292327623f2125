"""What token-in-token-out costs a chat session as its calls add up: the gateway's ``CallHistory`` building each
call's prompt from the session's earlier calls (``build``: the longest call whose text begins the rendered
request, its ids and the new turn's) and holding the call once answered (``add``), against encoding the whole
rendered text afresh, what a gateway that re-tokenises does.

One session of ``--calls`` calls with the built-in tokenizer: each request is the text of the last call and a new user
turn, each answer ``--completion`` words; the figure is the time of ``build`` and ``add`` (against ``encode`` of the
same text), median over the first and the last ``--window`` calls. Flat from the first calls to the last is the claim:
a call costs its new turn and the comparisons with what is held, not a walk over the session's calls.

Usage: python bench/tito_history.py [--calls 1000] [--window 100] [--completion 12] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from forge.assets import TINY_DIR
from forge.gateway.tito import SPLICE, CallHistory
from forge.tokenizer import Tokenizer

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "seven", "tired", "cats",
         "watch", "from", "a", "warm", "windowsill")


def run(calls: int, window: int, completion_words: int, seed: int) -> dict:
    tokenizer, rng = Tokenizer.from_dir(TINY_DIR), random.Random(seed)

    def words(count: int) -> list[int]:
        return tokenizer.encode(" " + " ".join(rng.choices(WORDS, k=count)))

    history, ids = CallHistory(), words(completion_words)
    spliced, fresh, splices = [], [], 0
    for index in range(calls):
        text = tokenizer.decode(ids) + " user: go on"
        completion = words(completion_words)
        t0 = time.perf_counter()
        built = history.build(tokenizer, text)
        history.add(index, built.ids, completion)
        t1 = time.perf_counter()
        tokenizer.encode(text)
        t2 = time.perf_counter()
        spliced.append(t1 - t0)
        fresh.append(t2 - t1)
        splices += built.kind == SPLICE
        ids = built.ids + completion
    first, last = slice(0, window), slice(calls - window, calls)
    return {"calls": calls, "context_tokens": len(ids), "splices": splices,
            "tito_ms": [statistics.median(spliced[part]) * 1e3 for part in (first, last)],
            "encode_ms": [statistics.median(fresh[part]) * 1e3 for part in (first, last)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100, help="calls at the start and at the end to take medians of")
    parser.add_argument("--completion", type=int, default=12, help="words of each answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.calls < 2 or not 1 <= args.window <= args.calls // 2 or args.completion < 1:
        parser.error("--calls >= 2, 1 <= --window <= --calls / 2 and --completion >= 1")
    result = run(args.calls, args.window, args.completion, args.seed)
    if args.json:
        print(json.dumps(result))
        return
    (tito_first, tito_last), (encode_first, encode_last) = result["tito_ms"], result["encode_ms"]
    print(f"{result['calls']} calls, {result['context_tokens']} tokens at the end, {result['splices']} splices; "
          f"medians of {args.window} calls, ms a call")
    print(f"{'':>22} {'first':>8} {'last':>8} {'last/first':>10}")
    print(f"{'build + add (tito)':>22} {tito_first:8.3f} {tito_last:8.3f} {tito_last / tito_first:10.2f}")
    print(f"{'encode the whole text':>22} {encode_first:8.3f} {encode_last:8.3f} {encode_last / encode_first:10.2f}")
    print(f"{'encode / tito':>22} {encode_first / tito_first:8.2f} {encode_last / tito_last:8.2f}")


if __name__ == "__main__":
    main()
