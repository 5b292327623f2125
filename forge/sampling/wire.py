"""Sampling parameters on the wire: ``forge.v1.SamplingParams`` to and from the model's ``SamplingParams``, as the
actors read them and their clients (the gateway, the rollout drivers) write them."""

from __future__ import annotations

from forge.sampling.grammar import ANY_OBJECT, Grammar
from forge.sampling.params import SamplingError, SamplingParams
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
        grammar=grammar_of(message.grammar) if message.HasField("grammar") else None,
    )


def grammar_of(message: common_pb2.Grammar) -> Grammar:
    """A grammar off the wire: ``json_object`` is the JSON schema of any object."""
    kind = message.WhichOneof("kind")
    if kind == "json_schema":
        return Grammar("json_schema", message.json_schema)
    if kind == "json_object" and message.json_object:
        return Grammar("json_schema", ANY_OBJECT)
    if kind == "lark":
        return Grammar("lark", message.lark)
    raise SamplingError("a grammar needs json_schema, json_object or lark")


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
    if params.grammar is not None:
        setattr(message.grammar, params.grammar.kind, params.grammar.text)
    return message
