"""Settings of the load-test backend (``--backend loadtest``): the pace at which it answers."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting


@dataclass(frozen=True, kw_only=True)
class LoadTestConfig(Settings):
    """How fast the load-test backend answers a request: its first token after a fixed delay plus its prompt's
    prefill, then each further token at a fixed rate, every request on its own clock (an engine that never
    saturates)."""

    loadtest_first_token_ms: float = setting(20.0, min=0, unit="ms",
                                             help="--backend loadtest: milliseconds before a request's first token, "
                                                  "besides its prompt's prefill.")
    loadtest_prefill_tokens_per_s: float = setting(20_000.0, min=0, help="--backend loadtest: prompt tokens "
                                                                        "prefilled a second (0: prefill is free).")
    loadtest_tokens_per_s: float = setting(50.0, min=0, help="--backend loadtest: tokens a second each request "
                                                             "decodes after its first (0: all at once).")
