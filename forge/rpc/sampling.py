"""Sampling parameters on the wire: ``forge.v1.SamplingParams`` to and from the model's ``SamplingParams``, as the
actors read them and their clients (the gateway, the rollout drivers) write them."""

from __future__ import annotations

from forge.model.sampling import SamplingParams
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
    )


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                        max_tokens=params.max_tokens or 0, stop_token_ids=params.stop_token_ids,
                                        ignore_eos=params.ignore_eos, min_tokens=params.min_tokens,
                                        top_logprobs=params.top_logprobs)
    if params.seed is not None:
        message.seed = params.seed
    return message
