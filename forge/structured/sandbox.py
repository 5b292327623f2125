"""Compiling grammars against a model's tokenizer in a separate process under a memory limit, before a process that
serves the network takes them.

llguidance aborts its process when an allocation fails (``memory allocation of 2147483648 bytes failed``), and some
grammars compile but fail at their first token (a schema that is only a ``$ref`` to itself). The gateway and the
actors therefore compile each grammar they have not seen here first: a child process (spawned, light: neither torch
nor the model) holds the tokenizer, runs under ``RLIMIT_AS``, compiles the grammar with tighter limits than the
engines use and computes its masks along a short walk. An allocation past the limit ends the child, not the service: that grammar
is refused ("needs more than N MiB to compile") and the next check starts a new child. A compilation past the time
limit is ended the same way. Verdicts are kept by grammar text, so a schema an agent sends with every call is
compiled once.

``problem`` blocks (it waits on the child): call it from a thread; on an event loop, await ``check``, which answers a
grammar seen before at once and waits for a new one in a thread of the sandbox's own."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from forge.settings import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0        # the child's start (imports, the tokenizer): long on a loaded machine, never in a test
CACHED_VERDICTS = 1024
MAX_GRAMMAR_SYMBOLS = 50_000   # a tenth of llguidance's default: what passes here compiles in the engines with room
WALK_TOKENS = 16               # masks computed along the check's walk through a grammar


@dataclass(frozen=True)
class SandboxSpec:
    """What the child compiles against, and its limits."""

    tokenizer_json: Path
    vocab_size: int | None                   # the logits' width (None: the tokenizer's size)
    eos_token_ids: tuple[int, ...]
    memory_mb: int = DEFAULT_MEMORY_MB
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def of_checkpoint(cls, directory: str | Path, memory_mb: int = DEFAULT_MEMORY_MB,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> SandboxSpec | None:
        """The spec of a checkpoint directory: its ``tokenizer.json``, and config.json's ``vocab_size`` and
        ``eos_token_id`` (what the engines compile with); None without a tokenizer.json (no structured output)."""
        directory = Path(directory)
        if not (directory / "tokenizer.json").exists():
            return None
        try:
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
        vocab, eos = config.get("vocab_size"), config.get("eos_token_id")
        eos_ids = (eos,) if isinstance(eos, int) else tuple(i for i in eos or () if isinstance(i, int))
        return cls(directory / "tokenizer.json", vocab if isinstance(vocab, int) else None, eos_ids, memory_mb,
                   timeout_s)


def _short(error: str) -> str:
    """llguidance's error without the grammar text it echoes (the Lark Forge wrote, not what the client sent)."""
    kept = []
    for line in error.splitlines():
        if line.lstrip()[:1].isdigit() and " | " in line:
            break
        if line.strip() and line.strip() not in ("^", "<non-verbose/>"):
            kept.append(line.strip())
    return " ".join(kept).removeprefix("at 1(8): ")


def _lowest_allowed(mask: bytes) -> int | None:
    """The smallest token id a bitmask (llguidance's, little-endian bits) allows, or None."""
    for index, byte in enumerate(mask):
        if byte:
            return index * 8 + (byte & -byte).bit_length() - 1
    return None


def grammar_problem(tokenizer: object, lark: str, walk_tokens: int = WALK_TOKENS) -> str | None:
    """Why ``lark`` cannot constrain a completion under ``tokenizer`` (an ``llguidance.LLTokenizer``), or None:
    it must compile within the check's limits, its first mask must allow some token, and a short walk (the lowest
    allowed token each time, up to ``walk_tokens``) must find a mask at every step, as the engines will compute
    them (a rule that only refers to itself fails at the second)."""
    import llguidance

    limits = llguidance.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SYMBOLS, verbose_errors=False)
    try:
        matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0,
                                       limits=limits)
    except ValueError as exc:
        return f"the grammar cannot be compiled: {_short(str(exc))}"
    if matcher.is_error():
        return f"the grammar cannot be compiled: {_short(matcher.get_error())}"
    for step in range(walk_tokens):
        mask = matcher.compute_bitmask()
        if matcher.is_error():
            where = "before its first token" if step == 0 else f"after {step} token{'s' * (step > 1)}"
            return f"the grammar fails {where}: {_short(matcher.get_error())}"
        token = _lowest_allowed(mask)
        if token is None:
            return "the grammar allows no first token" if step == 0 else f"the grammar allows nothing at token {step}"
        if matcher.is_stopped() or not matcher.consume_token(token) or matcher.is_stopped():
            break
    return None


def _serve(connection: Connection, spec: SandboxSpec) -> None:
    """The child: limit its memory, load the tokenizer, then answer each grammar text with its problem (or None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # a terminal's Ctrl-C is the parent's to handle
    limit = spec.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        import llguidance

        tokenizer = llguidance.LLTokenizer(spec.tokenizer_json.read_text(encoding="utf-8"), n_vocab=spec.vocab_size,
                                           eos_token=list(spec.eos_token_ids))
    except (OSError, ValueError, MemoryError) as exc:
        connection.send(f"the grammar checker cannot load {spec.tokenizer_json}: {exc}")
        return
    connection.send(None)
    while True:
        try:
            lark = connection.recv()
        except (EOFError, OSError):        # the parent closed its end, or is gone
            return
        try:
            verdict = grammar_problem(tokenizer, lark)
        except MemoryError:
            verdict = f"compiling the grammar needs more than {spec.memory_mb} MiB"
        connection.send(verdict)


def main() -> None:
    """The child's entry (``python -m forge.structured.sandbox FD SPEC``): a module run by path, not a
    multiprocessing child, which would import the parent's main module (the whole service) first."""
    fields = json.loads(sys.argv[2])
    spec = SandboxSpec(**{**fields, "tokenizer_json": Path(fields["tokenizer_json"]),
                          "eos_token_ids": tuple(fields["eos_token_ids"])})
    _serve(Connection(int(sys.argv[1])), spec)


class SandboxUnavailable(RuntimeError):
    """The checker's process cannot start (no tokenizer, no llguidance): structured output cannot be checked."""


class GrammarSandbox:
    """Checks grammar texts (Lark, as ``forge.sampling.grammar.Grammar.lark`` gives) in a child process; thread-safe
    (checks of new grammars take turns)."""

    def __init__(self, spec: SandboxSpec, cached: int = CACHED_VERDICTS) -> None:
        self.spec = spec
        self.cached = cached
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()
        self._verdicts_lock = threading.Lock()
        self._child_lock = threading.Lock()         # one check at a time talks to the child
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self._closed = False
        self._starts = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-check")
        self.counts = {"grammar_checks": 0, "grammar_check_hits": 0, "grammars_refused": 0,
                       "grammar_checker_restarts": 0}

    @property
    def pid(self) -> int | None:
        """The checker's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def known(self, lark: str) -> tuple[bool, str | None]:
        """Whether ``lark`` was checked before, and its verdict then; never waits on a check under way."""
        with self._verdicts_lock:
            if lark not in self._verdicts:
                return False, None
            self._verdicts.move_to_end(lark)
            self.counts["grammar_check_hits"] += 1
            return True, self._verdicts[lark]

    def start(self) -> None:
        """Start the child now (it starts with the first check otherwise)."""
        with self._child_lock:
            self._started()

    async def check(self, lark: str) -> str | None:
        """``problem`` for an event loop: never blocks it."""
        known, verdict = self.known(lark)
        if known:
            return verdict
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.problem, lark)

    def problem(self, lark: str) -> str | None:
        """Why the grammar ``lark`` cannot constrain a completion (None: it can). Blocks until the child answers."""
        known, verdict = self.known(lark)
        if known:
            return verdict
        with self._child_lock:
            known, verdict = self.known(lark)           # checked meanwhile by another thread
            if known:
                return verdict
            self.counts["grammar_checks"] += 1
            verdict, definite = self._compile(lark)
        with self._verdicts_lock:
            if verdict is not None:
                self.counts["grammars_refused"] += 1
            if definite:
                self._verdicts[lark] = verdict
                if len(self._verdicts) > self.cached:
                    self._verdicts.popitem(last=False)
        return verdict

    def _compile(self, lark: str) -> tuple[str | None, bool]:
        """The child's verdict on ``lark``, and whether it is definite (a time-out depends on the machine's load)."""
        connection = self._started()
        try:
            connection.send(lark)
            answered = connection.poll(self.spec.timeout_s)
        except (BrokenPipeError, EOFError, OSError):
            answered = True
        if not answered:
            self._stop()
            return f"the grammar took longer than {self.spec.timeout_s:g} s to compile", False
        try:
            return connection.recv(), True
        except (EOFError, OSError):
            code = self._stop()
            log.warning("the grammar checker died (exit code %s) compiling a grammar of %d characters; refused",
                        code, len(lark))
            if code in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV):
                return f"compiling the grammar needs more than {self.spec.memory_mb} MiB", True
            return f"the grammar checker failed on this grammar (exit code {code})", True

    def _started(self) -> Connection:
        if self._closed:
            raise SandboxUnavailable("the grammar checker is closed")
        if self._connection is not None and self._process is not None and self._process.poll() is None:
            return self._connection
        self._stop()
        mine, theirs = socket.socketpair()
        spec = json.dumps({**asdict(self.spec), "tokenizer_json": str(self.spec.tokenizer_json)})
        with theirs:
            process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno()), spec],
                                       pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        ours = Connection(mine.detach())
        self._process, self._connection = process, ours
        if not ours.poll(START_TIMEOUT_S):
            self._stop()
            raise SandboxUnavailable(f"the grammar checker did not start within {START_TIMEOUT_S:g} s")
        try:
            failure = ours.recv()
        except (EOFError, OSError):
            failure = f"the grammar checker exited at start (exit code {self._stop()})"
        if failure is not None:
            self._stop()
            raise SandboxUnavailable(failure)
        self._starts += 1
        self.counts["grammar_checker_restarts"] = self._starts - 1
        log.debug("grammar checker started (pid %d, %d MiB)", process.pid, self.spec.memory_mb)
        return ours

    def _stop(self) -> int | None:
        """End the child (if any); its exit code."""
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if connection is not None:
            connection.close()
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        return process.wait()

    def gauges(self) -> dict[str, float]:
        return {name: float(count) for name, count in self.counts.items()}

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        with self._child_lock:
            self._closed = True
            self._stop()


if __name__ == "__main__":
    main()

__all__ = ["DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT_S", "GrammarSandbox", "SandboxSpec", "SandboxUnavailable",
           "grammar_problem"]
