"""How an actor builds the load-test backend: the model's tokenizer and config.json give its vocabulary, context and
end ids; no weights are read."""

from __future__ import annotations

import json

from forge.actors.backend import BackendFactory, Serving, StartContext
from forge.actors.config import ActorConfig
from forge.actors.limits import RequestLimits


def _limits(config: ActorConfig, vocab_size: int) -> RequestLimits:
    """The model's context and end ids (config.json; a multimodal model's text_config) and the actor's queue."""
    from forge.checkpoints import resolve_model
    from forge.model.config import eos_token_ids

    path = resolve_model(config.model).directory / "config.json"
    found = json.loads(path.read_text())
    text = found.get("text_config") if isinstance(found.get("text_config"), dict) else {}
    context = found.get("max_position_embeddings") or text.get("max_position_embeddings")
    if not isinstance(context, int) or context <= 1:
        raise ValueError(f"{path}: no context length (max_position_embeddings)")
    engine = config.engine
    return RequestLimits(vocab_size, context, context, eos_token_ids(found.get("eos_token_id", text.get("eos_token_id"))),
                         engine.max_num_seqs + engine.max_waiting)


class LoadTestFactory(BackendFactory):
    name = "loadtest"

    def threads(self, config: ActorConfig) -> int:
        return 0                        # it runs no torch work

    def build(self, config: ActorConfig, context: StartContext) -> Serving:
        from forge.actors.engine.policy import model_id_of
        from forge.actors.loadtest.backend import LoadTestBackend, plain_ids
        from forge.checkpoints import load_tokenizer

        tokenizer = load_tokenizer(config.model)
        backend = LoadTestBackend(plain_ids(tokenizer), _limits(config, tokenizer.vocab_size), config.loadtest,
                                  config.engine.stream_interval, config.engine.seed, context.initial_version)
        return Serving(backend, model_id_of(config.model))
