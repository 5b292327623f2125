"""``forge-actor``: serve token generation from a checkpoint over gRPC."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from forge.actors.parts import kv_connector, load_policy, model_id_of, trtllm_backend, weight_subscriber
from forge.cache.client import FETCH_POLICIES, parse_addresses
from forge.cli.common import CONTEXT_SETTINGS, config_option, log_level_option, setup_logging, write_ready_file

log = logging.getLogger("forge.actor")


@click.command("actor", context_settings=CONTEXT_SETTINGS)
@config_option
@click.option("--model", default="tiny", show_default=True,
              help="Checkpoint directory in the Hugging Face layout, or 'tiny' for the built-in model.")
@click.option("--backend", type=click.Choice(["torch", "trtllm", "vllm"]), default="torch", show_default=True,
              help="Inference backend: the embedded torch engine, TensorRT-LLM (GPU, optional extra) or vLLM.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535),
              help="gRPC port; 0 picks a free one (see --ready-file).")
@click.option("--name", default=None, help="Instance name in stats and records [default: actor-PORT].")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N, or auto.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--kv-cache-mb", default=256, show_default=True, type=click.IntRange(1),
              help="Memory for the paged KV cache.")
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(1, 1024),
              help="Tokens per KV block (also the prefix-reuse granularity).")
@click.option("--max-batch", default=64, show_default=True, type=click.IntRange(1),
              help="Sequences decoded together at most.")
@click.option("--max-batched-tokens", default=4096, show_default=True, type=click.IntRange(16),
              help="Prompt tokens in one prefill step (longer prompts are chunked).")
@click.option("--max-waiting", default=1024, show_default=True, type=click.IntRange(0),
              help="Queued requests beyond the running batch; more are refused with RESOURCE_EXHAUSTED.")
@click.option("--speculative/--no-speculative", default=True, show_default=True,
              help="Draft with the checkpoint's MTP head and verify with the main model (when it has one).")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="Reuse the KV blocks of earlier requests that share a prompt prefix.")
@click.option("--on-weight-swap", type=click.Choice(["continue", "abort"]), default="continue", show_default=True,
              help="What in-flight requests do when a new weight version arrives.")
@click.option("--weights-fetch", default=None,
              help="Subscribe to weight versions from the learner at this ZeroMQ endpoint (e.g. tcp://127.0.0.1:5701).")
@click.option("--weights-announce", default=None,
              help="The learner's announcement endpoint (e.g. tcp://127.0.0.1:5702); needed with --weights-fetch.")
@click.option("--first-version-timeout", default=300.0, show_default=True, type=click.FloatRange(min=0),
              help="With --weights-fetch: seconds to wait for the learner's first version before giving up.")
@click.option("--api-key", "api_keys", multiple=True, envvar="FORGE_ACTOR_API_KEYS",
              help="Require this API key on every call (repeatable).")
@click.option("--l3-cache", default=None, metavar="ADDR[,ADDR...]",
              help="forge-cache servers: publish computed KV blocks there and fetch missing prompt blocks (torch).")
@click.option("--l3-fetch", type=click.Choice(FETCH_POLICIES), default="auto", show_default=True,
              help="With --l3-cache: fetch when estimated cheaper than recomputing (auto), whenever held, or never.")
@click.option("--l3-api-key", default=None, envvar="FORGE_ACTOR_L3_API_KEY", help="API key of the cache servers.")
@click.option("--threads", default=0, type=click.IntRange(0),
              help="Torch CPU threads of the engine loop, which runs every step (0 = torch's default, the cores).")
@click.option("--cpu-kernels/--no-cpu-kernels", default=True, show_default=True,
              help="On CPU, decode attention with the compiled C kernel (built on first use; needs a C compiler).")
@click.option("--compile-decode/--no-compile-decode", default=False, show_default=True,
              help="Graph mode: torch.compile the decode step (fuses its small ops; the first decode steps pay the "
                   "compile, seconds to a minute, cached on disk by inductor).")
@click.option("--stream-interval", default=0, show_default=True, type=click.IntRange(0),
              help="Stream each request's tokens in messages of N (its first token and its end are sent at once); "
                   "0 adapts N to the load: N = running requests // 4, so one message per token below 8 running "
                   "requests, then 4 to 7 messages a step. Fewer messages leave more of the process to decoding "
                   "when many streams are open.")
@click.option("--engine-process/--in-process", default=True, show_default=True,
              help="Run the torch engine's loop in a process of its own (the engine core), so that the gRPC "
                   "handlers of many streams do not share its interpreter lock; --in-process runs it in a thread "
                   "of the server.")
@click.option("--seed", default=0, show_default=True, help="Seed for requests that bring none.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {address, instance, pid} as JSON here once serving.")
@log_level_option
def actor(model: str, backend: str, host: str, port: int, name: str | None, device: str, dtype: str,
          kv_cache_mb: int, block_size: int, max_batch: int, max_batched_tokens: int, max_waiting: int,
          speculative: bool, prefix_caching: bool, on_weight_swap: str, weights_fetch: str | None,
          weights_announce: str | None, first_version_timeout: float, api_keys: tuple[str, ...],
          l3_cache: str | None, l3_fetch: str, l3_api_key: str | None, threads: int, cpu_kernels: bool,
          compile_decode: bool, stream_interval: int, engine_process: bool, seed: int, ready_file: Path | None,
          log_level: str) -> None:
    """Serve token generation from MODEL over gRPC (forge.v1.Actor: Generate, Abort, Stats, plus health and
    reflection). Token ids in, token ids out, with the log-probability and weight version of every token."""
    setup_logging(log_level)
    if (weights_fetch is None) != (weights_announce is None):
        raise click.UsageError("--weights-fetch and --weights-announce go together")
    if l3_cache is not None:
        if backend != "torch":
            raise click.UsageError("--l3-cache needs the torch backend")
        try:
            parse_addresses(l3_cache)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--l3-cache") from exc
    import torch

    from forge.actors.server import ActorServicer
    from forge.rpc import ServerOptions, ServiceBinding
    from forge.rpc.aio_server import AioGrpcServer
    from forge.v1 import actor_pb2, actor_pb2_grpc

    if backend == "torch":
        from forge.actors.engine.engine import reserve_cpu_threads

        threads = reserve_cpu_threads(threads)
    elif threads:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if backend == "vllm":
        from forge.actors.trtllm import backend_unavailable

        raise click.ClickException(backend_unavailable(backend))
    if backend == "trtllm":
        try:
            engine, model_id = trtllm_backend(model, max_waiting)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
    else:
        from forge.actors.engine.engine import EngineConfig, TorchEngine

        try:
            model_id = model_id_of(model)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from exc
        config = EngineConfig(kv_cache_bytes=kv_cache_mb * 2**20, block_size=block_size, max_num_seqs=max_batch,
                              max_num_batched_tokens=max_batched_tokens, max_waiting=max_waiting,
                              speculative=speculative, prefix_caching=prefix_caching,
                              abort_on_weight_swap=on_weight_swap == "abort", seed=seed,
                              model_id=model_id, threads=threads, cpu_kernels=cpu_kernels,
                              compile_decode=compile_decode, stream_interval=stream_interval)
        # Subscribed to a learner: serve only once its first version is in (every token carries a learner version).
        initial_version = -1 if weights_fetch else 0
    subscriber = None
    events = None
    servers: list = []                  # stopped if the engine process dies
    if backend == "torch" and engine_process:
        from forge.actors.engine.core import EngineSpec
        from forge.actors.engine.process import EngineProcess

        spec = EngineSpec(model, device, dtype, config, initial_version, weights_fetch, weights_announce, l3_cache,
                          l3_fetch, l3_api_key, kv_events=True, log_level=log_level)
        try:
            engine = EngineProcess(spec, on_exit=lambda reason: [each.stop(5) for each in servers])
        except (RuntimeError, TimeoutError) as exc:
            raise click.ClickException(str(exc)) from exc
        events = engine.kv_events()
    elif backend == "torch":
        policy, model_id = load_policy(model, device, dtype)
        engine = TorchEngine(policy, config, initial_version=initial_version)
        connector = kv_connector(engine, l3_cache, l3_fetch, l3_api_key)
        events = connector.events, connector.describe
    if weights_fetch and not (backend == "torch" and engine_process):     # the engine core subscribes itself
        subscriber = weight_subscriber(engine, weights_fetch, weights_announce)
    if weights_fetch:
        log.info("waiting for the learner's first weight version on %s", weights_fetch)
        deadline = time.monotonic() + first_version_timeout
        while engine.weight_version < 0:
            if time.monotonic() > deadline:
                if subscriber is not None:
                    subscriber.close()
                engine.close()
                raise click.ClickException(f"no weight version arrived from {weights_fetch} within "
                                           f"{first_version_timeout:.0f} s")
            time.sleep(0.05)

    def stop() -> None:
        if subscriber is not None:
            subscriber.close()
        engine.close()

    options = ServerOptions(host=host, port=port, api_keys=api_keys)
    servicer = ActorServicer(engine, name or "actor", {"model": model_id, "device": device})
    bindings = [ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")]
    event_source = None
    if events is not None:
        from forge.cache.events import KVEventSourceServicer
        from forge.v1 import router_pb2, router_pb2_grpc

        event_source = KVEventSourceServicer(*events)
        bindings.append(ServiceBinding.of(router_pb2_grpc.add_KVEventSourceServicer_to_server, event_source,
                                          router_pb2, "KVEventSource"))
    server = AioGrpcServer(bindings, options)
    servers.append(server)
    engine_gone = click.ClickException("the engine process exited; the actor stopped (see the log above)")
    if engine.failed:
        stop()
        raise engine_gone
    servicer.instance = name or f"actor-{server.port}"
    if event_source is not None:
        event_source.instance = servicer.instance

    def ready() -> None:
        log.info("actor %s serving %s on %s (device %s)", servicer.instance, model_id, server.address, device)
        if ready_file:
            write_ready_file(ready_file, address=server.address, instance=servicer.instance)

    server.run_until_signal(on_stop=stop, on_ready=ready)
    if engine.failed:
        raise engine_gone
