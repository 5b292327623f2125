"""Sampling parameters on the wire: ``forge.v1.SamplingParams`` to and from the model's ``SamplingParams``, as the
actors read them and their clients (the gateway, the rollout drivers) write them."""

from __future__ import annotations

from forge.model.grammar import ANY_OBJECT
from forge.model.sampling import SamplingError, SamplingParams
from forge.v1 import common_pb2


def sampling_from_proto(message: common_pb2.SamplingParams) -> SamplingParams:
    """Proto sampling parameters to the engine's (unset temperature = 1, unset top_p = 1, max_tokens 0 = no cap)."""
    return SamplingParams(
        temperature=message.temperature if message.HasField("temperature") else 1.0,
        top_p=message.top_p or 1.0,
        top_k=message.top_k,
        seed=message.seed if message.HasField("seed") else None,
        max_tokens=message.max_tokens or None,
        stop_token_ids=tuple(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        min_tokens=message.min_tokens,
        top_logprobs=message.top_logprobs,
        logit_bias=tuple(sorted(message.logit_bias.items())),
        frequency_penalty=message.frequency_penalty,
        presence_penalty=message.presence_penalty,
        repetition_penalty=message.repetition_penalty or 1.0,
        json_schema=json_schema_of(message.grammar) if message.HasField("grammar") else None,
    )


def json_schema_of(grammar: common_pb2.Grammar) -> str:
    """The JSON schema a grammar stands for: ``json_object`` is the schema of any object."""
    kind = grammar.WhichOneof("kind")
    if kind == "json_schema":
        return grammar.json_schema
    if kind == "json_object" and grammar.json_object:
        return ANY_OBJECT
    raise SamplingError("a grammar needs json_schema or json_object")


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                        max_tokens=params.max_tokens or 0, stop_token_ids=params.stop_token_ids,
                                        ignore_eos=params.ignore_eos, min_tokens=params.min_tokens,
                                        top_logprobs=params.top_logprobs)
    if params.seed is not None:
        message.seed = params.seed
    message.logit_bias.update(dict(params.logit_bias))
    message.frequency_penalty = params.frequency_penalty
    message.presence_penalty = params.presence_penalty
    if params.repetition_penalty != 1.0:
        message.repetition_penalty = params.repetition_penalty
    if params.json_schema is not None:
        message.grammar.json_schema = params.json_schema
    return message
