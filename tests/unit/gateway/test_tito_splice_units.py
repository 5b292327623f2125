"""Token-in-token-out prompt building without processes: a session's sampled ids spliced into the next prompt,
tool calls that render back, and the partial, fallback and fresh builds."""

from __future__ import annotations

from forge.gateway.tito import FALLBACK, FRESH, PARTIAL, SPLICE, CallHistory
from forge.parsing.completion import CompletionParser

from helpers.tiny_text import TOK, TOOLS, split_ids


def _history_after(prompt_text: str, completion_ids: list[int]) -> tuple[CallHistory, list[int]]:
    history = CallHistory()
    prompt = TOK.encode(prompt_text)
    history.add(0, prompt, completion_ids)
    return history, prompt


def test_splice_reuses_sampled_ids_that_retokenising_would_change():
    messages = [{"role": "user", "content": "Compute 2+3."}]
    first_text = TOK.render_chat(messages, add_generation_prompt=True)
    reply = "Answer: 5 because 2 plus 3"
    completion = [*split_ids(reply), TOK.eos_token_id]
    assert TOK.encode(TOK.decode(completion)) != completion
    history, prompt = _history_after(first_text, completion)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    text = TOK.render_chat(messages, add_generation_prompt=True)
    built = history.build(TOK, text)
    assert built.kind == SPLICE and built.source == 0
    assert built.ids[:len(prompt) + len(completion)] == prompt + completion
    assert TOK.decode(built.ids) == text and built.ids != TOK.encode(text)


def test_assistant_tool_calls_splice_and_render():
    messages = [{"role": "user", "content": "Add 1 and 2."}]
    first_text = TOK.render_chat(messages, TOOLS, add_generation_prompt=True)
    sampled = 'I will add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    completion = [*split_ids(sampled), TOK.eos_token_id]
    history, prompt = _history_after(first_text, completion)
    parsed = CompletionParser().parse(sampled, parse_tools=True)
    assistant = {"role": "assistant", "content": parsed.content,
                 "tool_calls": [c.to_openai() for c in parsed.tool_calls]}
    messages += [assistant, {"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "content": "3"}]
    text = TOK.render_chat(messages, TOOLS, add_generation_prompt=True)
    built = history.build(TOK, text)
    assert built.kind == SPLICE and built.ids[:len(prompt) + len(completion)] == prompt + completion
    assert TOK.decode(built.ids) == text


def test_partial_splice_fallback_and_fresh():
    messages = [{"role": "user", "content": "Tell me."}]
    first_text = TOK.render_chat(messages, add_generation_prompt=True)
    sampled = "It is blue. STOP and more"
    completion = split_ids(sampled)
    history, prompt = _history_after(first_text, completion)
    cut = [*messages, {"role": "assistant", "content": "It is blue. "}, {"role": "user", "content": "ok"}]
    text = TOK.render_chat(cut, add_generation_prompt=True)
    built = history.build(TOK, text)                       # a stop string cut the reply: reuse what matches
    assert built.kind == PARTIAL and len(prompt) < built.reused < len(prompt) + len(completion)
    assert built.ids[:built.reused] == prompt + completion[:built.reused - len(prompt)]
    assert TOK.decode(built.ids) == text
    edited = [*messages, {"role": "assistant", "content": "Something else"}, {"role": "user", "content": "ok"}]
    text = TOK.render_chat(edited, add_generation_prompt=True)
    built = history.build(TOK, text)
    assert built.kind == FALLBACK and built.ids == TOK.encode(text)
    assert history.build(TOK, first_text, has_history=False).kind == FRESH
    assert CallHistory().build(TOK, first_text).kind == FRESH


def test_history_keeps_the_latest_calls():
    history = CallHistory(max_calls=3)
    for i in range(5):
        history.add(i, [1, 2], [3])
    assert sorted(history.calls) == [2, 3, 4]
