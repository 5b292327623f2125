"""Completions read back without processes: tool-call and reasoning parsing and their round trip through the chat
template, what a stream shows at every split, and text assembled from ids with stop strings and partial characters."""

from __future__ import annotations

import json

import pytest

from forge.gateway.detokenize import TextAssembler
from forge.parsing.completion import CompletionParser, HermesToolParser, ThinkReasoningParser

from helpers.tiny_text import TOK, TOOLS, split_ids

# ------------------------------------------------------------------------------------------- parsing


def test_hermes_parser_keeps_the_models_argument_text():
    parser = HermesToolParser()
    text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1,  "b": [2]}}</tool_call>' \
           '<tool_call>{"name": "mul", "arguments": {}}</tool_call>'
    content, calls = parser.parse(text)
    assert content == "Let me add."
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1,  "b": [2]}'), ("mul", "{}")]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    relaxed = '<tool_call>\n{"arguments": {"a": 1}, "name": "add"}\n</tool_call>'
    assert [(c.name, json.loads(c.arguments)) for c in parser.parse(relaxed)[1]] == [("add", {"a": 1})]
    stringly = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>'
    assert json.loads(parser.parse(stringly)[1][0].arguments) == {"a": 2}
    for broken in ('x<tool_call>{"name": "add", "arguments": {"a": </tool_call>', 'x<tool_call>{"name": "add"',
                   '<tool_call>[1, 2]</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                   '<tool_call>{"name": "a", "arguments": 3}</tool_call>'):
        assert parser.parse(broken) == (broken, [])
    assert parser.parse("no calls") == ("no calls", [])
    assert parser.visible("Let me <tool") == "Let me "
    assert parser.visible("Let me <tool_call>{") == "Let me "
    assert parser.visible("a < b") == "a < b"


def test_think_parser_final_and_streaming():
    parser = ThinkReasoningParser()
    assert parser.parse("<think>plan</think>\nanswer") == ("plan", "answer")
    assert parser.parse("<think>plan</think>answer") == ("plan", "answer")
    assert parser.parse("<think>unfinished") == ("unfinished", "")
    assert parser.parse("answer") == (None, "answer")
    assert parser.visible("<thi") == ("", "")
    assert parser.visible("<think>pl") == ("pl", "")
    assert parser.visible("<think>plan</th") == ("plan", "")
    assert parser.visible("<think>plan</think>") == ("plan", "")
    assert parser.visible("<think>plan</think>\nans") == ("plan", "ans")
    assert parser.visible("hello") == ("", "hello")


@pytest.mark.parametrize("text", [
    "plain answer",
    "<think>first add</think>\nThe sum is 3.",
    'Calling.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
    '<think>r</think>\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": "x y"}}</tool_call>',
    "odd \ufffd bytes",
])
def test_parsed_message_renders_back_to_the_sampled_text(text):
    parsed = CompletionParser().parse(text, parse_tools=True)
    message = {"role": "assistant", "content": parsed.content or None,
               "tool_calls": [c.to_openai() for c in parsed.tool_calls] or None,
               "reasoning_content": parsed.reasoning}
    prefix = [{"role": "user", "content": "hi"}]
    head = TOK.render_chat(prefix, TOOLS, add_generation_prompt=True)
    full = TOK.render_chat([*prefix, message], TOOLS)
    assert full == head + text + "<|im_end|>\n"


def test_streamed_parse_adds_up_to_the_final_message():
    parser = CompletionParser()
    text = '<think>think hard</think>\nSo: <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    reasoning = content = ""
    for end in range(len(text) + 1):
        r, c = parser.visible(text[:end], parse_tools=True)
        assert r.startswith(reasoning) and c.startswith(content)
        reasoning, content = r, c
    final = parser.parse(text, parse_tools=True)
    assert final.reasoning.startswith(reasoning) and final.content.startswith(content)
    assert (final.reasoning, final.content, final.tool_calls[0].name) == ("think hard", "So: ", "add")
    assert parser.parse(text, parse_tools=False).content.startswith("So: <tool_call>")


# ------------------------------------------------------------------------------------------- text


def test_text_assembler_cuts_at_stop_strings_across_tokens_and_holds_back_prefixes():
    ids = split_ids("The answer is 42. Done")
    assembler = TextAssembler(TOK, stop=["42.", "zzz"])
    shown = ""
    for token in ids:
        assembler.feed([token])
        visible = assembler.visible()
        assert visible.startswith(shown) and "4" not in visible
        shown = visible
        if assembler.stop_hit:
            break
    assert assembler.stop_hit == "42." and assembler.final() == "The answer is "


def test_text_assembler_waits_for_complete_characters():
    ids = TOK.encode("é€")
    pieces = [TOK.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)         # split multi-byte characters
    assembler = TextAssembler(TOK)
    seen = []
    for token in ids:
        assembler.feed([token])
        seen.append(assembler.visible())
    assert all("\ufffd" not in s for s in seen) and assembler.final() == "é€"
    broken = TextAssembler(TOK)
    broken.feed(ids[:1])
    assert broken.visible() == "" and broken.final().endswith("\ufffd")



@pytest.mark.parametrize("name", ["think", "mistral"])
@pytest.mark.parametrize("opened_by_prompt", [False, True])
def test_reasoning_parsers_stream_what_they_parse_at_every_split(name, opened_by_prompt):
    from forge.parsing.reasoning import REASONING_PARSERS

    parser = REASONING_PARSERS[name]()
    lead = parser.open_tag if opened_by_prompt else ""
    for body in ("plan it</C>\nThe answer.", "plan</C>", "unfinished pla", "</C>\nonly an answer"):
        text = (("" if opened_by_prompt else parser.open_tag) + body).replace("</C>", parser.close_tag)
        final = parser.parse(lead + text)
        for cut in range(len(text) + 1):
            reasoning, rest = parser.visible(lead + text[:cut])
            assert (final[0] or "").startswith(reasoning) and final[1].startswith(rest), (cut, reasoning, rest)
        assert parser.visible(lead + text) == (final[0] or "", final[1])
    assert parser.parse(parser.open_tag + "a" + parser.close_tag + "\nb") == ("a", "b")
    assert parser.parse("just an answer") == (None, "just an answer")


def test_a_prompt_that_leaves_its_reasoning_block_open_is_told_apart():
    from forge.parsing.reasoning import MistralReasoningParser

    think = ThinkReasoningParser()
    assert think.opened_by("<|im_start|>assistant\n<think>\n") == "<think>"
    assert think.opened_by("<|im_start|>assistant\n<think>") == "<think>"
    assert think.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n") == ""       # thinking switched off
    assert think.opened_by("<think>old</think>\nanswer<|im_end|>\n<|im_start|>assistant\n") == ""
    assert MistralReasoningParser().opened_by("[INST]hi[/INST][THINK]") == "[THINK]"
    parser = CompletionParser("hermes", "think")
    assert parser.parse("<think>" + "why</think>\nok", parse_tools=True).reasoning == "why"
    assert CompletionParser("hermes", "none").opened_reasoning("<think>\n") == ""


@pytest.mark.parametrize(("template", "name"), [
    ("{{ '<think>' + reasoning + '</think>' }}", "think"),
    ("{{ '[THINK]' + reasoning + '[/THINK]' }} (not <think>)", "mistral"),
    ("{{ messages[0].content }}", "none"),
])
def test_auto_reads_the_reasoning_tags_the_template_writes(template, name):
    from forge.parsing.reasoning import pick_reasoning_parser

    assert pick_reasoning_parser(template)[0] == name
    assert pick_reasoning_parser({"default": "plain", "tool_use": template})[0] == name
    assert pick_reasoning_parser(TOK.chat_template)[0] == "think"         # the built-in model's (Qwen3's)
