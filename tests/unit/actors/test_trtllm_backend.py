"""The TensorRT-LLM backend: the request/response mapping is tested everywhere; generation, abort and weight
updates need a GPU with TensorRT-LLM installed (marked, skipped elsewhere)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from forge.actors.backend import FinishReason
from forge.actors.trtllm.backend import chunk_from_output, sampling_kwargs
from forge.sampling.params import SamplingParams


def output(token_ids, logprobs, finished=False, reason=None):
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids, logprobs=logprobs, finish_reason=reason)],
                           finished=finished)


def test_sampling_parameters_map_onto_trtllm_names():
    kwargs = sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=5, max_tokens=33,
                                            stop_token_ids=(7,)), eos_token_ids=(2, 3))
    assert kwargs == {"max_tokens": 33, "logprobs": 1, "detokenize": False, "stop_token_ids": [7, 3],
                      "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 5, "end_id": 2}
    greedy = sampling_kwargs(SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), eos_token_ids=(2,))
    assert greedy["temperature"] == 0.0 and greedy["top_k"] == 1 and greedy["ignore_eos"] and "end_id" not in greedy
    assert sampling_kwargs(SamplingParams(max_tokens=4), ())["top_k"] is None


def test_streamed_outputs_become_chunks_of_new_tokens_only():
    first, sent = chunk_from_output(output([5, 6], [-0.1, -0.2]), 0, version=3)
    assert first.token_ids == [5, 6] and first.logprobs == [-0.1, -0.2] and first.weight_versions == [3, 3]
    assert first.finish_reason is None and sent == 2
    token_logprob = {9: SimpleNamespace(logprob=-1.5, rank=1), 4: SimpleNamespace(logprob=-0.3, rank=2)}
    last, sent = chunk_from_output(output([5, 6, 9], [-0.1, -0.2, token_logprob], True, "length"), sent, 4)
    assert last.token_ids == [9] and last.logprobs == [-1.5] and last.weight_versions == [4]
    assert last.finish_reason is FinishReason.LENGTH and sent == 3
    stopped, _ = chunk_from_output(output([1], [-0.5], True, "stop"), 0, 0)
    assert stopped.finish_reason is FinishReason.STOP


@pytest.mark.gpu
@pytest.mark.trtllm
def test_trtllm_greedy_matches_the_torch_engine(tmp_path):
    from forge.actors.backend import GenerationRequest
    from forge.actors.engine.engine import TorchEngine
    from forge.actors.trtllm.backend import TrtllmBackend
    from forge.checkpoints import write_tiny_checkpoint
    from forge.model import CausalLM

    directory = write_tiny_checkpoint(tmp_path / "tiny")
    model = CausalLM.from_pretrained(directory, device="cuda")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    torch_engine = TorchEngine(model)
    expected = [t for c in torch_engine.submit(GenerationRequest("", [1, 2, 3], params)) for t in c.token_ids]
    torch_engine.close()
    backend = TrtllmBackend(str(directory), model.config.vocab_size, model.config.max_position_embeddings,
                            model.config.eos_token_ids)
    try:
        got = [t for c in backend.submit(GenerationRequest("", [1, 2, 3], params)) for t in c.token_ids]
        assert got == expected
        backend.load_weights(1, model.state_dict())
        chunks = list(backend.submit(GenerationRequest("", [1, 2, 3], params)))
        assert {v for c in chunks for v in c.weight_versions} == {1}
    finally:
        backend.close()

