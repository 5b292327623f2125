"""The KV blocks of a prompt of more than 128k tokens through a real ``forge-cache`` process on loopback: stored in
one stream of 8,192 blocks named by the chain ``forge.kvhash`` computes over the whole prompt, found whole by the
longest-prefix lookup (and a longer prompt's chain found as far as it was stored), and fetched back byte for byte,
also in several requests where a chain is longer than one request may carry; then fetched by a torch engine's L3
link for a request with that prompt, installed into its paged KV cache exactly as stored, and the request served
after them. The payloads are a one-layer random model's KV (1 KiB a block), so a prompt this long costs megabytes,
not the gigabytes a real model's would."""

from __future__ import annotations

import random

import pytest
import torch

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.actors.engine.l3 import KVConnector
from forge.kv.blocks import MAX_HASHES, KVBlock
from forge.kv.client import CacheClient
from forge.kvhash import chain_hashes, kv_salt
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

from helpers.engines import run
from helpers.random_model import random_model, small_config

BLOCK = 16
PROMPT_TOKENS = 128 * 1024 + 5               # 8,192 full blocks and a partial one
CONFIG = small_config(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      num_nextn_predict_layers=0, max_position_embeddings=PROMPT_TOKENS + 64)
BLOCK_SHAPE = (2, CONFIG.num_hidden_layers, BLOCK, CONFIG.num_key_value_heads, CONFIG.head_dim)     # keys, values
MODEL_ID = "long-prompt"


def long_prompt(seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(CONFIG.vocab_size) for _ in range(PROMPT_TOKENS)]


def kv_blocks(hashes: list[bytes], seed: int = 0) -> list[KVBlock]:
    """A block of float32 keys and values of the engine's shape for each hash, every one different."""
    generator = torch.Generator().manual_seed(seed)
    tensors = torch.randn((len(hashes), *BLOCK_SHAPE), generator=generator)
    return [KVBlock.build(h, BLOCK, "float32", BLOCK_SHAPE, t.numpy().tobytes()) for h, t in zip(hashes, tensors,
                                                                                                 strict=True)]


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return random_model(CONFIG, seed=0, std=0.15)


@pytest.fixture(scope="module")
def stored(cache_server) -> tuple[list[int], bytes, list[KVBlock]]:
    """A 128k-token prompt, the salt of its chain, and its blocks, stored in one stream of 8 MiB."""
    prompt, salt = long_prompt(), kv_salt(MODEL_ID, 3)
    hashes = chain_hashes(prompt, BLOCK, salt)
    assert len(hashes) == PROMPT_TOKENS // BLOCK == 8192 and len(set(hashes)) == len(hashes)
    blocks = kv_blocks(hashes)
    client = CacheClient([cache_server.address], timeout_s=120)
    try:
        assert client.lookup(hashes) == 0
        assert client.put(blocks) == (len(blocks), 0)
    finally:
        client.close()
    return prompt, salt, blocks


def test_the_blocks_of_a_128k_token_prompt_are_found_whole_and_fetched_byte_for_byte(cache_server, stored):
    prompt, salt, blocks = stored
    hashes = [b.block_hash for b in blocks]
    client = CacheClient([cache_server.address], timeout_s=120)
    try:
        assert client.lookup(hashes) == len(hashes)
        extended = chain_hashes([*prompt, *long_prompt(1)[:BLOCK * 100]], BLOCK, salt)   # the next turn's prompt
        assert len(extended) == len(hashes) + 100 and extended[:len(hashes)] == hashes
        assert client.lookup(extended) == len(hashes)
        assert client.lookup(chain_hashes(prompt, BLOCK, kv_salt(MODEL_ID, 4))) == 0       # the next version: none
        fetched = client.get_prefix(extended)
        assert len(fetched) == len(blocks)
        assert all(got == sent for got, sent in zip(fetched, blocks, strict=True))        # hashes, shapes, bytes
        gauges = client.stats()[cache_server.address].gauges
        assert gauges["blocks"] >= len(blocks) and gauges["rejected"] == 0
    finally:
        client.close()


def test_a_chain_longer_than_one_request_carries_is_asked_for_in_several(cache_server, stored):
    """A client asks for a chain in requests of at most ``max_request_hashes`` hashes: the answers are those of one
    request, and a chain past the servers' limit per request (70,000 blocks: a 1.1M-token prompt) is looked up and
    fetched rather than refused."""
    prompt, salt, blocks = stored
    hashes = [b.block_hash for b in blocks]
    small = CacheClient([cache_server.address], timeout_s=120, max_request_hashes=1000)
    try:
        before = small.stats()[cache_server.address].gauges
        assert small.lookup(hashes) == len(hashes)
        assert small.lookup([*hashes[:5000], bytes(16), *hashes[5001:]]) == 5000           # a hole in request 6
        assert small.get_prefix(hashes) == blocks
        after = small.stats()[cache_server.address].gauges
        assert after["lookups"] - before["lookups"] == 9 + 6 and after["get_blocks"] - before["get_blocks"] == 8192
    finally:
        small.close()
    rng = random.Random(3)
    longest = chain_hashes([*prompt, *(rng.randrange(CONFIG.vocab_size) for _ in range(BLOCK * 61_808))], BLOCK, salt)
    assert len(longest) == 70_000 > MAX_HASHES and longest[:len(hashes)] == hashes
    client = CacheClient([cache_server.address], timeout_s=120)
    try:
        assert client.lookup(longest) == len(hashes)
        assert client.get_prefix(longest) == blocks
    finally:
        client.close()


def test_an_engine_fetches_a_128k_token_prompts_kv_from_the_cache_and_serves_after_it(model, cache_server):
    prompt = long_prompt(2)
    per_block = 2 * CONFIG.num_hidden_layers * BLOCK * CONFIG.num_key_value_heads * CONFIG.head_dim * 4
    config = EngineConfig(kv_cache_bytes=(PROMPT_TOKENS // BLOCK + 64) * per_block, block_size=BLOCK,
                          speculative=False, model_id=MODEL_ID, threads=1)
    engine = TorchEngine(model, config, initial_version=5)
    KVConnector(engine, CacheClient([cache_server.address], timeout_s=120), fetch="always")
    try:
        hashes = chain_hashes(prompt[:-1], BLOCK, engine.salt())        # the blocks the engine will look for
        blocks = kv_blocks(hashes, seed=2)
        writer = CacheClient([cache_server.address], timeout_s=120)
        assert writer.put(blocks) == (len(blocks), 0)
        writer.close()
        tokens, _, versions, last = run(engine, prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert len(tokens) == 4 and versions == [5] * 4 and last.finish_reason is not None
        stats = engine.stats()
        assert stats["l3_lookups"] == 1 and stats["l3_fetch_failures"] == 0
        assert stats["l3_fetched_blocks"] == len(hashes) == (PROMPT_TOKENS - 1) // BLOCK
        keys, values = engine.cache.keys, engine.cache.values
        for block_hash, block in zip(hashes, blocks, strict=True):
            stored = torch.frombuffer(bytearray(block.data), dtype=torch.float32).reshape(BLOCK_SHAPE)
            block_id = engine.blocks.by_hash[block_hash]
            assert torch.equal(keys[:, block_id], stored[0]) and torch.equal(values[:, block_id], stored[1])
    finally:
        engine.close()
