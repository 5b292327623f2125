"""Logit edits: applied sparsely they equal vLLM's dense formulas (mask, bias, repetition, frequency and presence),
they slice, re-number and concatenate without changing what they do, a call's edits follow its completion token
by token, and a grammar's masks keep a random walk inside the schema to its end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from forge.checkpoints import TINY_DIR, tiny_config, tiny_tokenizer
from forge.sampling.grammar import Grammar, GrammarError, Grammars, json_lark
from forge.sampling.logit_edits import CompletionEdits, LogitEdits, RowEdit, call_edits
from forge.sampling.params import SamplingError, SamplingParams

V = 50


def vllm_reference(logits: torch.Tensor, banned: torch.Tensor, bias: torch.Tensor, repetition: torch.Tensor,
                   seen: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
                   ) -> torch.Tensor:
    """vLLM's sampler, dense: masks, logit_bias, then its apply_penalties (repetition over prompt and output,
    frequency and presence over the output)."""
    logits = logits.masked_fill(banned, float("-inf")) + bias
    penalties = torch.where(seen, repetition.unsqueeze(1), torch.ones_like(logits))
    logits = logits * torch.where(logits > 0, 1.0 / penalties, penalties)
    logits = logits - frequency.unsqueeze(1) * counts
    return logits - presence.unsqueeze(1) * (counts > 0)


@pytest.mark.parametrize("seed", range(5))
def test_sparse_edits_equal_the_dense_formulas(seed):
    rng = np.random.default_rng(seed)
    rows = 6
    logits = torch.from_numpy(rng.normal(0, 3, (rows, V)).astype(np.float32))
    banned = torch.zeros(rows, V, dtype=torch.bool)
    bias, counts = torch.zeros(rows, V), torch.zeros(rows, V)
    seen = torch.zeros(rows, V, dtype=torch.bool)
    repetition, frequency, presence = (torch.from_numpy(rng.uniform(lo, hi, rows).astype(np.float32))
                                       for lo, hi in ((0.5, 2.0), (-2, 2), (-2, 2)))
    edits = []
    for row in range(rows):
        edit = RowEdit()
        if row % 3 != 2:
            edit.banned = np.sort(rng.choice(V, 4, replace=False))
            banned[row, edit.banned] = True
        edit.bias_ids = np.sort(rng.choice(V, 5, replace=False))
        edit.bias = rng.uniform(-100, 100, 5).astype(np.float32)
        bias[row, edit.bias_ids] = torch.from_numpy(edit.bias)
        edit.repeated = np.sort(rng.choice(V, 12, replace=False))
        edit.repetition = float(repetition[row])
        seen[row, edit.repeated] = True
        output = edit.repeated[:7]                     # the output's tokens are among those seen
        row_counts = rng.integers(1, 4, len(output))
        edit.penalty_ids = output
        edit.penalty = (frequency[row].item() * row_counts + presence[row].item()).astype(np.float32)
        counts[row, output] = torch.from_numpy(row_counts.astype(np.float32))
        edits.append((row, edit))
    packed = LogitEdits.of_rows(edits)
    expected = vllm_reference(logits, banned, bias, repetition, seen, counts, frequency, presence)
    torch.testing.assert_close(packed.apply(logits), expected, rtol=1e-6, atol=1e-5)
    # Rows 1..4 on their own, and the whole rebuilt from pieces in another order.
    torch.testing.assert_close(packed.select(1, 5).apply(logits[1:5]), expected[1:5], rtol=1e-6, atol=1e-5)
    pieces = LogitEdits.concat([packed.select(3, 6).shifted(3), None, packed.select(0, 3)])
    torch.testing.assert_close(pieces.apply(logits), expected, rtol=1e-6, atol=1e-5)
    order = rng.permutation(rows)                     # row r moves to order[r]
    moved = packed.renumbered(order).apply(logits[np.argsort(order)])
    torch.testing.assert_close(moved, expected[np.argsort(order)], rtol=1e-6, atol=1e-5)


def test_gradients_flow_through_the_values_kept():
    logits = torch.randn(2, V, requires_grad=True)
    edits = LogitEdits.of_rows([(0, RowEdit(banned=np.array([1]), repeated=np.array([2, 3]), repetition=1.5,
                                            bias_ids=np.array([4]), bias=np.array([1.0], dtype=np.float32)))])
    edits.apply(logits).log_softmax(-1)[0, [0, 2, 3, 4]].sum().backward()
    assert logits.grad is not None and logits.grad[0, 1] == 0 and bool((logits.grad[0, [2, 3, 4]] != 0).all())


def test_a_calls_edits_follow_its_completion():
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=2.0, min_tokens=2,
                            stop_token_ids=(9,), logit_bias=((4, -3.0),))
    edits = CompletionEdits(params, prompt_ids=[7, 8, 7], banned=(9, 0))
    first = edits.row()
    assert first.banned.tolist() == [0, 9] and first.penalty_ids is None
    assert first.repeated.tolist() == [7, 8] and first.bias_ids.tolist() == [4]
    for token in (5, 5, 6):
        edits.consume(token)
    later = edits.row()
    assert later.banned is None and later.repeated.tolist() == [5, 6, 7, 8]
    assert dict(zip(later.penalty_ids.tolist(), later.penalty.tolist(), strict=True)) == {5: 2.5, 6: 1.5}
    assert CompletionEdits(SamplingParams(), [1]).row() is None
    with pytest.raises(ValueError, match="ahead"):
        edits.row(ahead=1)


def test_penalty_bounds_are_checked():
    for bad in ({"frequency_penalty": 2.5}, {"presence_penalty": -3}, {"repetition_penalty": 0.0},
                {"repetition_penalty": 2.5}, {"logit_bias": ((3, 101.0),)}, {"logit_bias": ((4, 1.0), (3, 1.0))},
                {"grammar": Grammar("json_schema", '{"type": "object"}'), "ignore_eos": True}):
        with pytest.raises(SamplingError):
            SamplingParams(**bad)


def tiny_grammars() -> Grammars:
    config = tiny_config()
    return Grammars(TINY_DIR, config.vocab_size, tuple(config.eos_token_ids))


SCHEMA = json.dumps({"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                                      "count": {"type": "integer", "minimum": 0, "maximum": 99}},
                     "required": ["colour", "count"], "additionalProperties": False})


@pytest.mark.parametrize("seed", range(4))
def test_a_random_walk_under_the_grammar_ends_in_a_document_of_the_schema(seed):
    config = tiny_config()
    edits = call_edits(SamplingParams(grammar=Grammar("json_schema", SCHEMA)), [1, 2], config.eos_token_ids, tiny_grammars())
    generator = torch.Generator().manual_seed(seed)
    tokens = []
    while len(tokens) < 200:
        logits = LogitEdits.of_rows([(0, edits.row())]).apply(torch.randn(1, config.vocab_size, generator=generator))
        token = int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
        edits.consume(token)
        if token in config.eos_token_ids:
            break
        tokens.append(token)
    document = json.loads(tiny_tokenizer().decode(tokens))
    assert document["colour"] in ("red", "green", "blue") and 0 <= document["count"] <= 99
    assert set(document) == {"colour", "count"}


def test_a_token_the_grammar_refuses_is_an_error():
    matcher = tiny_grammars().matcher(Grammar("json_schema", '{"type": "object"}'))
    opening = tiny_tokenizer().backend.encode("{").ids[0]
    letter = tiny_tokenizer().backend.encode("x").ids[0]
    assert matcher.allows(opening) and not matcher.allows(letter)
    with pytest.raises(GrammarError):
        matcher.consume(letter)


def test_bad_schemas_are_explained():
    assert "not valid JSON" in Grammar("json_schema", "{").bounds_problem()
    assert "must be an object" in Grammar("json_schema", "[1, 2]").bounds_problem()
    assert Grammar("json_schema", SCHEMA).bounds_problem() is None
    with pytest.raises(GrammarError, match="nonsense"):
        tiny_grammars().matcher(Grammar("json_schema", '{"type": "nonsense"}'))
    with pytest.raises(ValueError, match="tokenizer"):
        call_edits(SamplingParams(grammar=Grammar("json_schema", SCHEMA)), [1], (0,), None)


def test_a_lark_grammar_holds_a_schema_between_fixed_text_and_special_tokens():
    """A strict tool call's shape: the arguments' schema, then the template's closing text and special token."""
    tokenizer, closing = tiny_tokenizer(), tiny_tokenizer().backend.token_to_id("</tool_call>")
    schema = '{"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}'
    grammar = Grammar("lark", f'start: {json_lark(schema)} "}}" <[{closing}]>')
    assert grammar.bounds_problem() is None
    matcher = tiny_grammars().matcher(grammar)
    for token in [*tokenizer.backend.encode('{"key": "Bo"}}').ids, closing]:
        assert matcher.allows(token)
        matcher.consume(token)
    assert matcher.allows(tiny_config().eos_token_ids[0])
    compact = tiny_grammars().matcher(grammar)
    for token in tokenizer.backend.encode('{"key":"Bo"}').ids:
        if not compact.allows(token):
            break
        compact.consume(token)
    else:
        raise AssertionError("compact JSON was allowed: JSON is laid out as json.dumps writes it")
