"""How an actor builds the embedded torch engine: in an engine core process of its own (the default), which loads
the policy, links the L3 cache and follows the learner's weights itself, or in a thread of the server's process."""

from __future__ import annotations

from dataclasses import replace

from forge.actors.backend import BackendFactory, Serving, StartContext
from forge.actors.config import ActorConfig
from forge.actors.engine.policy import model_id_of


class TorchFactory(BackendFactory):
    name = "torch"

    def check(self, config: ActorConfig) -> None:
        from forge.checkpoints import is_native, model_type
        from forge.model import SUPPORTED_MODEL_TYPES

        if not is_native(config.model):
            raise ValueError(f"the torch engine serves {' and '.join(SUPPORTED_MODEL_TYPES)} checkpoints; "
                             f"{config.model} is {model_type(config.model)!r}: serve it with --backend vllm")

    def threads(self, config: ActorConfig) -> int:
        from forge.actors.engine.cpu_threads import reserve_cpu_threads

        return reserve_cpu_threads(config.engine.threads)

    def build(self, config: ActorConfig, context: StartContext) -> Serving:
        model_id = model_id_of(config.model)
        engine_config = replace(config.engine, model_id=model_id, threads=context.threads)
        if config.engine_process:
            return self._engine_process(config, context, engine_config, model_id)
        from forge.actors.engine.engine import TorchEngine
        from forge.actors.engine.l3 import kv_connector
        from forge.actors.engine.policy import grammars_of, load_policy

        policy, model_id = load_policy(config.model, context.device, config.dtype)
        engine = TorchEngine(policy, engine_config, initial_version=context.initial_version,
                             grammars=grammars_of(config.model, policy))
        connector = kv_connector(engine, config.l3_cache, config.l3_fetch, config.l3_api_key)
        return Serving(engine, model_id, (connector.events, connector.describe))

    @staticmethod
    def _engine_process(config: ActorConfig, context: StartContext, engine_config, model_id: str) -> Serving:
        """The engine in a core process of its own, which also follows the learner's weights (and relays them)."""
        from forge.actors.engine.core import EngineSpec
        from forge.actors.engine.process import EngineProcess

        spec = EngineSpec(model=config.model, device=context.device, dtype=config.dtype, config=engine_config,
                          initial_version=context.initial_version, weights_fetch=config.weights_fetch,
                          weights_announce=config.weights_announce, weights_curve=context.curve,
                          l3_cache=config.l3_cache, l3_fetch=config.l3_fetch, l3_api_key=config.l3_api_key,
                          kv_events=True, log_level=config.log_level, adapters=config.adapter_links,
                          adapter_curves=context.adapter_curves,
                          relay_fetch=config.relay_fetch if context.relaying else None,
                          relay_announce=config.relay_announce if context.relaying else None,
                          relay_curve=context.relay_curve)
        engine = EngineProcess(spec, on_exit=context.on_exit)
        relay = {"relay_fetch": engine.info.relay_fetch, "relay_announce": engine.info.relay_announce} \
            if context.relaying else {}
        return Serving(engine, model_id, engine.kv_events(), follows_weights=True, relay_endpoints=relay)
