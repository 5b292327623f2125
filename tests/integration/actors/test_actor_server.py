"""The gRPC actor server as a real forge-actor process: streams, isolation, clear errors, backpressure, abort on
client cancel, stats and graceful stop."""

from __future__ import annotations

import os
import random
import signal
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

from helpers.processes import start_actor
from helpers.random_model import random_tiny
from helpers.waiting import wait_for

# The same cases against each backend: the torch engine in its own process and in the server's, and vLLM.
# The model's context is long (LONG positions), so that a long stream outlasts any client on a loaded machine.
LONG = 32768
BACKENDS = [pytest.param(("--engine-process",), id="torch-process"), pytest.param(("--in-process",), id="torch"),
            pytest.param(("--backend", "vllm"), id="vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]


def backend_of(args: tuple[str, ...]) -> str:
    return "vllm" if "vllm" in args else "torch"


@pytest.fixture(scope="module", params=BACKENDS)
def actor(tmp_path_factory, request):
    directory = tmp_path_factory.mktemp("actor")
    service = start_actor(directory, "--model", str(random_tiny(directory, context=LONG)), "--kv-cache-mb", "128",
                          *request.param, timeout_s=900)
    service.backend = backend_of(request.param)
    yield service
    assert service.stop() == 0


def generate(stub, prompt, **sampling):
    request = actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=common_pb2.SamplingParams(**sampling))
    return list(stub.Generate(request, timeout=60))


def test_stream_carries_tokens_logprobs_versions_and_a_final_timing(actor):
    with grpc.insecure_channel(actor.address) as channel:
        chunks = generate(actor_pb2_grpc.ActorStub(channel), [1, 2, 3], temperature=0, max_tokens=6,
                          ignore_eos=True)
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == 6
    assert sum(len(c.logprobs) for c in chunks) == 6 and sum(len(c.weight_versions) for c in chunks) == 6
    assert chunks[0].actor == actor.info["instance"]
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert chunks[-1].timing.total_s > 0
    assert all(c.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])


def test_a_request_can_ask_for_its_tokens_in_larger_messages(actor):
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        sampling = common_pb2.SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)
        every = list(stub.Generate(actor_pb2.GenerateRequest(prompt_ids=[4, 5, 6], sampling=sampling), timeout=60))
        fives = list(stub.Generate(actor_pb2.GenerateRequest(prompt_ids=[4, 5, 6], sampling=sampling,
                                                             stream_interval=5), timeout=60))
    # One request running: a message per step (two tokens when an MTP draft is accepted; vLLM merges steps when the
    # reader lags, by as many as a loaded machine makes it); asked for fives: the first token alone, then messages
    # of at least five but the last.
    if actor.backend == "torch":
        assert max(len(c.token_ids) for c in every) <= 2 and len(every) > len(fives)
    assert len(fives[0].token_ids) == 1 and all(len(c.token_ids) >= 5 for c in fives[1:-1])
    assert [t for c in fives for t in c.token_ids] == [t for c in every for t in c.token_ids]
    assert fives[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and fives[-1].timing.total_s > 0


def test_concurrent_streams_are_isolated(actor):
    prompts = [[i, i + 1, i + 2, 7 * i % 50] for i in range(1, 11)]
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        alone = [[t for c in generate(stub, p, temperature=0, max_tokens=12, ignore_eos=True) for t in c.token_ids]
                 for p in prompts]
        together: dict[int, list[int]] = {}

        def worker(i: int) -> None:
            chunks = generate(stub, prompts[i], temperature=0, max_tokens=12, ignore_eos=True)
            together[i] = [t for c in chunks for t in c.token_ids]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert [together[i] for i in range(len(prompts))] == alone


def test_generate_whole_is_the_stream_joined_into_one_answer(actor):
    """Random prompts, greedy: the same tokens, log-probs and versions as the stream's chunks, the first chunk's
    actor and request id, the last one's finish reason and timing."""
    rng = random.Random(7)
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        for _ in range(3):
            request = actor_pb2.GenerateRequest(
                request_id=f"r{rng.randrange(10**9)}", prompt_ids=[rng.randrange(1, 200) for _ in range(rng.randrange(2, 30))],
                sampling=common_pb2.SamplingParams(temperature=0, max_tokens=rng.randrange(2, 12), ignore_eos=True),
                stream_interval=rng.choice([0, 3]))
            chunks = list(stub.Generate(request, timeout=60))
            whole = stub.GenerateWhole(request, timeout=60)
            assert list(whole.token_ids) == [t for c in chunks for t in c.token_ids]
            assert list(whole.logprobs) == pytest.approx([p for c in chunks for p in c.logprobs], abs=1e-3)
            assert list(whole.weight_versions) == [v for c in chunks for v in c.weight_versions]
            assert (whole.request_id, whole.actor) == (request.request_id, chunks[0].actor)
            assert whole.finish_reason == chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert whole.timing.total_s > 0 and whole.timing.decode_s <= whole.timing.total_s
        with pytest.raises(grpc.RpcError) as err:
            stub.GenerateWhole(actor_pb2.GenerateRequest(prompt_ids=[1, 99999]), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "outside the vocabulary" in err.value.details()


def test_a_cancelled_generate_whole_aborts_its_request(actor):
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)

        def gauges() -> dict[str, float]:
            return stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges

        answer = stub.GenerateWhole.future(actor_pb2.GenerateRequest(
            prompt_ids=list(range(40)), sampling=common_pb2.SamplingParams(max_tokens=LONG - 100, ignore_eos=True)))
        wait_for(lambda: gauges()["running"] == 1, "the request to run", 300)
        answer.cancel()
        wait_for(lambda: gauges()["running"] + gauges()["waiting"] == 0, "the cancelled request to end", 300)
        assert gauges()["kv_used_frac"] == 0


@pytest.mark.parametrize("prompt, sampling, message", [
    ([], {}, "empty"),
    ([1, 99999], {}, "outside the vocabulary"),
    (list(range(1000)) * (LONG // 1000 + 1), {}, "context"),
    ([1], {"temperature": -1.0}, "temperature"),
    ([1], {"top_p": 2.0}, "top_p"),
    ([1], {"top_k": -3}, "top_k"),
])
def test_bad_requests_get_invalid_argument_and_the_server_keeps_serving(actor, prompt, sampling, message):
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            generate(stub, prompt, **sampling)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
        assert generate(stub, [1, 2], max_tokens=2)[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


def test_cancelled_streams_and_abort_free_their_kv_blocks(actor):
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)
        stream = stub.Generate(actor_pb2.GenerateRequest(
            prompt_ids=list(range(40)), sampling=common_pb2.SamplingParams(max_tokens=LONG // 2, ignore_eos=True)))
        next(stream)
        stream.cancel()
        # A fast engine on a slow machine may finish the request before the abort arrives: then it is not found,
        # its stream ended on its own, and the attempt is repeated with another request.
        for attempt in range(5):
            request_id = f"to-abort-{attempt}"
            aborted = stub.Generate(actor_pb2.GenerateRequest(
                request_id=request_id, prompt_ids=list(range(40)),
                sampling=common_pb2.SamplingParams(max_tokens=LONG - 100, ignore_eos=True)))
            next(aborted)
            if stub.Abort(actor_pb2.AbortRequest(request_id=request_id)).found:
                break
            assert list(aborted)[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        else:
            pytest.fail("no request was still running when its abort arrived")
        assert list(aborted)[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
        assert not stub.Abort(actor_pb2.AbortRequest(request_id=request_id)).found
        generate(stub, [1], max_tokens=1)
        stats = stub.Stats(common_pb2.StatsRequest()).gauges
    assert stats["running"] == 0 and stats["kv_used_frac"] == 0


def test_stats_and_health(actor):
    with grpc.insecure_channel(actor.address) as channel:
        report = actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest())
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="forge.v1.Actor"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert report.service == "actor" and report.labels["backend"] == actor.backend and report.labels["model"]
    for key in ("tokens_per_s", "running", "waiting", "kv_used_frac", "prefix_hit_rate", "weight_version"):
        assert key in report.gauges
    assert actor.backend != "torch" or "spec_acceptance" in report.gauges
    assert report.host.cpu_count >= 1 and report.host.memory_total_bytes > 0
    assert report.host.gpu_available or report.host.gpu_unavailable_reason


def test_more_open_streams_than_server_threads_are_all_admitted_and_stats_still_answer(actor):
    """100 streams open at once (the threaded server had 64 threads: the rest, Stats and health included, queued
    behind them): Stats and health answer while they are open, and every stream is admitted: each is counted
    running, waiting or finished (a fast engine may finish some before the last arrive), none refused. The streams
    are not read: unread, they fill the connection's flow-control window, which would hold back later streams'
    first messages."""
    with grpc.insecure_channel(actor.address) as channel:
        stub = actor_pb2_grpc.ActorStub(channel)

        def gauges() -> dict[str, float]:
            return stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges

        before = gauges()
        sampling = common_pb2.SamplingParams(max_tokens=1000, ignore_eos=True)
        streams = [stub.Generate(actor_pb2.GenerateRequest(prompt_ids=[1, i % 50 + 2], sampling=sampling))
                   for i in range(100)]

        def admitted() -> float:
            now = gauges()
            return now["running"] + now["waiting"] + now["finished"] - before["finished"]

        wait_for(lambda: admitted() == 100, "all 100 streams to be admitted", 300)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert gauges()["refused"] == before["refused"]
        for stream in streams:
            stream.cancel()
        wait_for(lambda: gauges()["running"] + gauges()["waiting"] == 0, "the cancelled streams to end", 300)
        assert gauges()["kv_used_frac"] == 0


def drain(stream, into: list) -> None:
    """Read ``stream`` to its end into ``into``; a cancelled stream just ends."""
    try:
        into.extend(stream)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.CANCELLED:
            into.append(err)


def start_long_stream(stub, max_tokens: int):
    """A stream of ``max_tokens`` tokens, read up to its first message (so the engine is running it)."""
    stream = stub.Generate(actor_pb2.GenerateRequest(
        prompt_ids=[1], sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    next(stream)
    return stream


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_a_full_queue_answers_resource_exhausted(tmp_path, backend):
    """With room for one request, a second gets RESOURCE_EXHAUSTED while the first runs. A fast engine on a slow
    machine may finish the first before the second arrives, which then rightly runs: the attempt is repeated, and
    the test fails when no attempt sees the refusal. The first stream is read as it comes (a stream left unread
    stalls its connection, which the server may then close)."""
    service = start_actor(tmp_path, "--max-batch", "1", "--max-waiting", "0", "--kv-cache-mb", "128", "--model",
                          str(random_tiny(tmp_path, context=LONG)), *backend, timeout_s=900)
    longest = LONG - 100
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            for _attempt in range(5):
                busy = start_long_stream(stub, longest)
                rest: list = []
                reader = threading.Thread(target=drain, args=(busy, rest), daemon=True)
                reader.start()
                try:
                    generate(stub, [2], max_tokens=2)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in err.details()
                    busy.cancel()
                    reader.join(60)
                    break
                reader.join(600)                     # admitted: only right if the first had already finished
                assert rest and not isinstance(rest[-1], grpc.RpcError), rest[-1:]
                assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
                assert 1 + sum(len(c.token_ids) for c in rest) == longest
            else:
                pytest.fail("no second request was refused while the first ran")
    finally:
        assert service.stop(signal.SIGINT) == 0


def test_an_actor_whose_engine_process_dies_stops_with_an_error(tmp_path):
    service = start_actor(tmp_path)
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = actor_pb2_grpc.ActorStub(channel)
            busy = start_long_stream(stub, 5000)
            core = int(stub.Stats(common_pb2.StatsRequest()).gauges["engine_pid"])
            os.kill(core, signal.SIGKILL)
            last = list(busy)[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_ERROR and "not running" in last.error
        assert service.proc.wait(timeout=60) == 1
        assert "the engine process exited" in service.log_text()
    finally:
        service.kill()


def test_api_keys_are_enforced(tmp_path):
    service = start_actor(tmp_path, "--api-key", "secret-1")
    try:
        with grpc.insecure_channel(service.address) as channel:
            with pytest.raises(grpc.RpcError) as err:
                generate(actor_pb2_grpc.ActorStub(channel), [1], max_tokens=1)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        from forge.rpc import connect

        with connect(service.address, api_key="secret-1") as channel:
            assert generate(actor_pb2_grpc.ActorStub(channel), [1], max_tokens=1)
    finally:
        service.stop()
    assert "secret-1" not in service.log.read_text()


def test_a_taken_port_is_told_in_one_line_before_the_model_loads(tmp_path):
    import socket
    import subprocess

    from conftest import script

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([script("forge-actor"), "--port", str(port), "--log-level", "INFO"],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Address already in use" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "torch engine ready" not in result.stderr
