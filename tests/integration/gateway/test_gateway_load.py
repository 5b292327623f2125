"""The middleware load harness's smallest configuration (``bench/gateway_load.py``), as the benchmarks run it: real
gateways and a pool in front of an actor on the load-test backend, every path (direct, chat, messages, gRPC whole and streamed) with
several multi-turn sessions, and two gateways recording into one pool service; and the soak
(``bench/gateway_soak.py``), whose sessions end and start anew. Counts, not times: every call made is answered, and
every call through a gateway is recorded in the pool, exactly once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

SESSIONS, CALLS = 4, 3


def load(*arguments: str) -> dict:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gateway_load.py"), "--sessions", str(SESSIONS),
                           "--calls", str(CALLS), "--clients", "1", "--prompt-tokens", "64", "--max-tokens", "8",
                           "--tokens-per-s", "0", "--first-token-ms", "0", "--json", *arguments],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)["results"][str(SESSIONS)]


@pytest.mark.parametrize(("gateways", "paths"), [(1, ("direct", "chat", "messages", "grpc", "grpc-stream", "generate")),
                                                 (2, ("chat", "grpc"))])
def test_every_call_is_answered_and_recorded_once(gateways, paths):
    results = load("--gateways", str(gateways), "--paths", *paths)
    assert set(results) == set(paths)
    assert len({figures["new_tokens_per_call"] for figures in results.values()}) == 1, results   # the same work
    for path, figures in results.items():
        assert figures.get("first_failure") is None, figures
        assert (figures["calls"], figures["failed"]) == (SESSIONS * CALLS, 0), (path, figures)
        if path == "direct":
            assert figures["recorded_calls"] == 0                   # nothing crosses the middleware
        else:
            assert figures["recorded_calls"] == SESSIONS * CALLS, (path, figures)


@pytest.mark.parametrize("path", ["chat", "grpc"])
def test_the_soak_ends_its_sessions_and_records_every_call(path):
    """``bench/gateway_soak.py`` at its smallest: each session slot runs at least one session, whatever the machine's
    speed; every call is recorded, every ended session leaves the gateway's memory."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gateway_soak.py"), "--minutes", "0.02",
                           "--window-minutes", "0.01", "--sessions", str(SESSIONS), "--calls", str(CALLS),
                           "--clients", "1", "--prompt-tokens", "64", "--max-tokens", "8", "--tokens-per-s", "0",
                           "--first-token-ms", "0", "--path", path, "--json"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    summary = report["summary"]
    assert summary["failed"] == 0 and summary["first_failure"] is None, summary
    assert summary["calls"] >= SESSIONS * CALLS and summary["calls"] % CALLS == 0
    assert summary["recorded_calls"] == summary["calls"]
    assert sum(w["calls"] for w in report["windows"]) == summary["calls"]
    assert report["windows"][-1]["held_sessions"] == 0


@pytest.mark.skipif(not (REPO / ".venv-litellm" / "bin" / "litellm").exists(),
                    reason="needs LiteLLM's own environment (.venv-litellm): see bench/litellm_proxy.py")
def test_litellm_keeps_each_session_one_gateway_session():
    """The peer baseline, a LiteLLM proxy in front of the gateway: it forwards X-Forge-Session-Id, so each session's
    calls are recorded in one pool session, as chat's are; and its CPU is counted."""
    results = load("--paths", "chat", "litellm")
    for path, figures in results.items():
        assert figures.get("first_failure") is None, figures
        assert (figures["calls"], figures["recorded_calls"], figures["recorded_sessions"]) == \
            (SESSIONS * CALLS, SESSIONS * CALLS, SESSIONS), (path, figures)
    assert results["litellm"]["proxy_cpu_ms_per_call"] > 0 and "proxy_cpu_ms_per_call" not in results["chat"]


@pytest.mark.parametrize("path", ["chat", "grpc"])
def test_stages_count_each_call_once(path):
    """``--stages``: the gateway runs under ``bench/gateway_stages.py``, whose stage functions are each counted once a
    call (the request read, the template rendered), and whose figures come back for every call made."""
    results = load("--paths", path, "--stages")
    figures = results[path]
    assert (figures["calls"], figures["failed"]) == (SESSIONS * CALLS, 0), figures
    for stage in ("request", "template"):
        assert figures[f"stage_{stage}_calls"] == SESSIONS * CALLS, (stage, figures)
    for stage in ("completion", "answer", "pool"):
        assert figures[f"stage_{stage}_calls"] >= SESSIONS * CALLS, (stage, figures)
    assert all(figures[f"stage_{stage}_ms"] >= 0 for stage in ("request", "template", "tokens", "routing",
                                                               "completion", "answer", "pool"))
