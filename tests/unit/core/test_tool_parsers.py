"""Tool-call parsers of each model family: the final parse, the streamed content (it only grows, and adds up to the
final one whatever the chunking), malformed calls left as content, values typed by the tools' schemas, the splice
property through the families' public chat templates (vLLM's examples, tests/assets/templates), and ``auto``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.assets import TINY_DIR
from forge.parsing.tools import TOOL_PARSERS, ToolCallParser, pick_tool_parser
from forge.tokenizer import Tokenizer
from forge.tokenizer.tokenizer import reads_string_arguments

TEMPLATES = Path(__file__).parents[2] / "assets" / "templates"
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "add numbers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "note", "description": "write a note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"},
                                         "loud": {"type": "boolean"}, "meta": {"type": ["object", "null"]}}}}},
]
ADD = ("add", {"a": 1, "b": 2.5})
NOTE = ("note", {"text": "hi\nthere 42", "tags": ["x", "y"], "loud": True, "meta": None})

# parser -> [(completion text, content, calls as (name, arguments))]
CASES: dict[str, list[tuple[str, str, list[tuple[str, dict]]]]] = {
    "hermes": [
        ('Let me add.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>', "Let me add.",
         [ADD]),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2.5}}</tool_call>\n<tool_call>{"name": "note", '
         '"arguments": {"text": "hi\\nthere 42", "tags": ["x", "y"], "loud": true, "meta": null}}</tool_call>', "",
         [ADD, NOTE]),
    ],
    "llama3_json": [
        ('{"name": "add", "parameters": {"a": 1, "b": 2.5}}', "", [ADD]),
        ('Sure.<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2.5}}; {"name": "note", "arguments": '
         '{"text": "hi\\nthere 42", "tags": ["x", "y"], "loud": true, "meta": null}}', "Sure.", [ADD, NOTE]),
    ],
    "mistral": [
        ('Adding.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2.5}}, {"name": "note", "arguments": '
         '{"text": "hi\\nthere 42", "tags": ["x", "y"], "loud": true, "meta": null}, "id": "abcdef123"}]',
         "Adding.", [ADD, NOTE]),
        ('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2.5}[TOOL_CALLS]note[CALL_ID]abcdef123[ARGS]{"text": "hi\\nthere 42", '
         '"tags": ["x", "y"], "loud": true, "meta": null}', "", [ADD, NOTE]),
    ],
    "qwen3_coder": [
        ("I will add.\n\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n"
         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=note>\n<parameter=text>\nhi\nthere 42\n"
         "</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n<parameter=loud>\ntrue\n</parameter>\n"
         "<parameter=meta>\nnull\n</parameter>\n</function>\n</tool_call>", "I will add.\n\n", [ADD, NOTE]),
    ],
    "deepseek_v3": [
        ("Let me add.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
         '{"a": 1, "b": 2.5}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>note\n```json\n'
         '{"text": "hi\\nthere 42", "tags": ["x", "y"], "loud": true, "meta": null}\n```<｜tool▁call▁end｜>'
         "<｜tool▁calls▁end｜>", "Let me add.", [ADD, NOTE]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1, "b": 2.5}<｜tool▁call▁end｜>'
         "<｜tool▁calls▁end｜>", "", [ADD]),
    ],
    "glm45": [
        ("Adding.\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>\n"
         "<arg_value>2.5</arg_value>\n</tool_call><tool_call>note\n<arg_key>text</arg_key>\n<arg_value>hi\nthere 42"
         "</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"x\", \"y\"]</arg_value>\n<arg_key>loud</arg_key>\n"
         "<arg_value>true</arg_value>\n<arg_key>meta</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
         "Adding.\n", [ADD, NOTE]),
    ],
    "kimi_k2": [
        ("Adding.<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
         '{"a": 1, "b": 2.5}<|tool_call_end|><|tool_call_begin|>functions.note:1<|tool_call_argument_begin|>'
         '{"text": "hi\\nthere 42", "tags": ["x", "y"], "loud": true, "meta": null}<|tool_call_end|>'
         "<|tool_calls_section_end|>", "Adding.", [ADD, NOTE]),
    ],
    "minimax_m2": [
        ('Adding.\n<minimax:tool_call>\n<invoke name="add">\n<parameter name="a">1</parameter>\n'
         '<parameter name="b">2.5</parameter>\n</invoke>\n<invoke name="note">\n<parameter name="text">hi\nthere 42'
         '</parameter>\n<parameter name="tags">["x", "y"]</parameter>\n<parameter name="loud">true</parameter>\n'
         '<parameter name="meta">null</parameter>\n</invoke>\n</minimax:tool_call>', "Adding.\n", [ADD, NOTE]),
    ],
}

MALFORMED: dict[str, list[str]] = {
    "hermes": ['x<tool_call>{"name": "add", "arguments": {"a": </tool_call>', '<tool_call>{"arguments": {}}</tool_call>'],
    "llama3_json": ['{"name": "add", "parameters": {"a": 1}', '{"name": "add", "parameters": 3}',
                    '{"name": "add", "parameters": {}} and then', '<|python_tag|>not json'],
    "mistral": ["[TOOL_CALLS] [", '[TOOL_CALLS] [{"name": "add", "arguments": {}}', "[TOOL_CALLS] []",
                "[TOOL_CALLS]add[ARGS]{", '[TOOL_CALLS] [{"arguments": {}}]', "[TOOL_CALLS]add"],
    "qwen3_coder": ["<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>",
                    "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",
                    "<tool_call>\nadd\n</tool_call>"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}",
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n[1]\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜>"],
    "glm45": ["<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>",
              "<tool_call>add\n<arg_key>a</arg_key>\n</tool_call>", "<tool_call></tool_call>"],
    "kimi_k2": ["<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{\"a\"",
                "<|tool_calls_section_begin|><|tool_call_begin|>add<|tool_call_argument_begin|>{}<|tool_call_end|>",
                "<|tool_calls_section_begin|>"],
    "minimax_m2": ['<minimax:tool_call>\n<invoke name="add">\n<parameter name="a">1</parameter>\n</invoke>',
                   '<minimax:tool_call>\n<invoke name="add">oops</invoke>\n</minimax:tool_call>',
                   "<minimax:tool_call></minimax:tool_call>"],
}

ALL_CASES = [(name, *case) for name, cases in CASES.items() for case in cases]


def calls_of(parser: ToolCallParser, text: str) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = parser.parse(text, TOOLS)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def streamed(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    """The content a client sees as ``pieces`` arrive (each visible delta, then the rest at the end) and the calls
    that come with the end, as the gateway streams them."""
    text = shown = ""
    for piece in pieces:
        text += piece
        visible = parser.visible(text)
        assert visible.startswith(shown)
        shown = visible
    content, calls = calls_of(parser, text)
    assert content.startswith(shown)
    return shown + content[len(shown):], calls


def test_every_parser_is_registered_and_has_cases():
    assert set(TOOL_PARSERS) == set(CASES) == set(MALFORMED)


@pytest.mark.parametrize(("name", "text", "content", "calls"), ALL_CASES)
def test_final_parse(name, text, content, calls):
    parser = TOOL_PARSERS[name]()
    assert calls_of(parser, text) == (content, calls)
    assert parser.parse("no calls here", TOOLS) == ("no calls here", [])
    parsed = parser.parse(text, TOOLS)[1]
    assert len({c.id for c in parsed}) == len(parsed)


@pytest.mark.parametrize(("name", "text", "content", "calls"), ALL_CASES)
def test_streamed_parse_agrees_at_every_split(name, text, content, calls):
    parser = TOOL_PARSERS[name]()
    for cut in range(len(text) + 1):
        assert streamed(parser, [text[:cut], text[cut:]]) == (content, calls)
    assert streamed(parser, list(text)) == (content, calls)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(ALL_CASES), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_streamed_parse_agrees_for_random_chunks(case, cuts):
    name, text, content, calls = case
    ends = sorted({c % (len(text) + 1) for c in cuts} | {len(text)})
    pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    assert streamed(TOOL_PARSERS[name](), pieces) == (content, calls)


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, texts in MALFORMED.items() for t in texts])
def test_malformed_calls_stay_content(name, text):
    parser = TOOL_PARSERS[name]()
    for body in (text, "Before. " + text if name != "llama3_json" else text):
        assert parser.parse(body, TOOLS) == (body, [])
        assert streamed(parser, list(body)) == (body, [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_nested_past_decodings_depth_stays_content(name):
    parser, deep = TOOL_PARSERS[name](), "[" * 100_000
    for text in (parser.start + deep, '{"name": "add", "parameters": ' + deep, "[TOOL_CALLS] [" + deep):
        assert parser.parse(text, TOOLS) == (text, [])


@pytest.mark.parametrize("name", ["qwen3_coder", "glm45", "minimax_m2"])
def test_untyped_values_follow_the_schema(name):
    parser = TOOL_PARSERS[name]()
    text = CASES[name][0][0].replace(">1<", ">one<").replace("\n1\n", "\none\n")
    assert calls_of(parser, text)[1][0] == ("add", {"a": "one", "b": 2.5})     # not an integer: kept as text
    assert calls_of(parser, CASES[name][0][0].replace("note", "other"))[1][1][1]["tags"] == '["x", "y"]'


def test_model_written_ids_are_kept_where_templates_write_them_back():
    assert [c.id for c in TOOL_PARSERS["kimi_k2"]().parse(CASES["kimi_k2"][0][0])[1]] == \
        ["functions.add:0", "functions.note:1"]
    assert [c.id for c in TOOL_PARSERS["mistral"]().parse(CASES["mistral"][1][0])[1]][1] == "abcdef123"


# ------------------------------------------------------------------------------------------- shared helpers


def test_json_values_reads_a_separated_run_and_nothing_else():
    from forge.parsing.tools.base import json_values

    assert json_values(' {"a": 1} ;\n[2] ', 0, ";") == ['{"a": 1}', "[2]"]
    assert json_values('x[ {"a": 1}, "b" ]\n', 2, ",", "]") == ['{"a": 1}', '"b"']
    for text, at, separator, close in [("[]", 1, ",", "]"), ("[1,]", 1, ",", "]"), ("[1] x", 1, ",", "]"),
                                       ("[1 2]", 1, ",", "]"), ("1;", 0, ";", ""), ("1 2", 0, ";", ""), ("", 0, ";", "")]:
        assert json_values(text, at, separator, close) is None, text


def test_only_matches_allows_whitespace_alone_around_the_elements():
    import re

    from forge.parsing.tools.parameters import only_matches

    pattern = re.compile(r"<p>(.*?)</p>")
    assert [m.group(1) for m in only_matches(pattern, " <p>a</p>\n<p>b</p> ")] == ["a", "b"]
    assert only_matches(pattern, " \n") == []
    assert only_matches(pattern, "<p>a</p>x<p>b</p>") is None
    assert only_matches(pattern, "<p>a</p> x") is None


def test_trim_newlines_takes_one_newline_off_each_side():
    from forge.parsing.tools.parameters import trim_newlines

    assert [trim_newlines(t) for t in ("\n\na\n\n", "\na", "a\n", "\n", " a ")] == ["\na\n", "a", "a", "", " a "]


@pytest.mark.parametrize("name", ["deepseek_v3", "kimi_k2"])
def test_sections_may_leave_out_their_end_but_hold_only_calls(name):
    parser = TOOL_PARSERS[name]()
    text = CASES[name][-1][0]
    section_end = type(parser).end
    assert calls_of(parser, text.replace(section_end, "")) == calls_of(parser, text)
    assert calls_of(parser, text.replace(section_end, section_end + " trailing")) == calls_of(parser, text)
    assert parser.parse(text.replace(parser.start, parser.start + "x"), TOOLS)[1] == []


# ------------------------------------------------------------------------------------------- splice


def assistant_message(parser: ToolCallParser, text: str) -> dict:
    """The assistant message the gateway returns for ``text``, as a client sends it back (arguments as text: these
    templates read them as an object, and the tokenizer hands them over decoded, as vLLM and transformers do)."""
    content, calls = parser.parse(text, TOOLS)
    message = {"role": "assistant", "content": content or None, "tool_calls": [c.to_openai() for c in calls]}
    return {k: v for k, v in message.items() if v is not None}


def family_tokenizer(template: str) -> Tokenizer:
    """The built-in tokenizer with a family's chat template (rendering is what is under test, not encoding)."""
    return Tokenizer(Tokenizer.from_dir(TINY_DIR).backend, {"bos_token": "<s>", "eos_token": "</s>"},
                     (TEMPLATES / template).read_text())


# The Qwen3-Coder template writes a value with Jinja's ``string`` (Python's True, None): the model's true and null
# cannot render back, so the spliced text has neither.
QWEN_SPLICED = CASES["qwen3_coder"][0][0].replace("\n<parameter=loud>\ntrue\n</parameter>", "") \
    .replace("\n<parameter=meta>\nnull\n</parameter>", "")
# vLLM's DeepSeek V3 template indents what it writes (its ``{{ }}`` lines keep their leading spaces), so no turn
# renders back exactly; it is only read by ``auto``.
SPLICES = [  # (template, parser, sampled text, what the template writes after it)
    ("qwen3_coder.jinja", "qwen3_coder", QWEN_SPLICED, "<|im_end|>\n"),
    ("qwen3_coder.jinja", "qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n"
                                         "</tool_call>", "<|im_end|>\n"),
    ("llama3.1_json.jinja", "llama3_json", CASES["llama3_json"][0][0], "<|eot_id|>"),
    ("mistral_parallel.jinja", "mistral", CASES["mistral"][0][0].replace("Adding.", "")
     .replace('{"a": 1, "b": 2.5}}', '{"a": 1, "b": 2.5}, "id": "zyxwvu987"}'), "</s>"),
]


@pytest.mark.parametrize(("template", "name", "text", "after"), SPLICES)
def test_parsed_message_renders_back_to_the_sampled_text(template, name, text, after):
    tokenizer = family_tokenizer(template)
    user = [{"role": "user", "content": "Add 1 and 2.5, and take a note."}]
    prompt = tokenizer.render_chat(user, TOOLS, add_generation_prompt=True, date_string="26 Jul 2024")
    message = assistant_message(TOOL_PARSERS[name](), text)
    assert message.get("tool_calls") and all(isinstance(c["function"]["arguments"], str)
                                             for c in message["tool_calls"])
    full = tokenizer.render_chat([*user, message], TOOLS, date_string="26 Jul 2024")
    assert full.endswith(text + after)
    if name != "mistral":       # this template moves its system prompt into the last user message
        assert full == prompt + text + after


# ------------------------------------------------------------------------------------------- auto


@pytest.mark.parametrize(("template", "name"), [
    ("qwen3_coder.jinja", "qwen3_coder"), ("deepseek_v3.jinja", "deepseek_v3"),
    ("llama3.1_json.jinja", "llama3_json"), ("mistral_parallel.jinja", "mistral"),
])
def test_auto_picks_the_parser_of_the_template(template, name):
    picked, why = pick_tool_parser((TEMPLATES / template).read_text(), "llama")
    assert picked == name and "chat template" in why


@pytest.mark.parametrize(("snippet", "name"), [
    ("{{ '<tool_call>\\n' + tc.name + '<arg_key>' }}", "glm45"),
    ("{{ '<|tool_calls_section_begin|>' }}", "kimi_k2"),
    ("{{ '<minimax:tool_call>\\n<invoke name=\"' }}", "minimax_m2"),
    ("{{ '<tool_call>\\n{\"name\": ' }}", "hermes"),
    ("{{ '<|python_tag|>' }}", "llama3_json"),
])
def test_auto_reads_each_familys_marker(snippet, name):
    assert pick_tool_parser(snippet)[0] == name
    assert pick_tool_parser({"default": "plain", "tool_use": snippet})[0] == name


def test_auto_falls_back_to_the_model_type_then_hermes():
    assert pick_tool_parser("{{ messages }}", "deepseek_v3") == ("deepseek_v3",
                                                                 "config.json has model_type 'deepseek_v3'")
    assert pick_tool_parser(None, "gpt2")[0] == "hermes"
    assert pick_tool_parser(None, None)[0] == "hermes"


def test_the_setting_offers_every_parser_and_defaults_to_auto():
    from dataclasses import fields

    from forge.gateway.config import GatewayConfig
    from forge.settings import SETTING

    field = next(f for f in fields(GatewayConfig) if f.name == "tool_parser")
    assert field.default == "auto"
    assert set(field.metadata[SETTING].choices) == {"auto", "none", *TOOL_PARSERS}


def test_the_gateway_logs_the_parser_auto_picks(caplog):
    from types import SimpleNamespace

    from forge.gateway.service import Gateway

    template = (TEMPLATES / "qwen3_coder.jinja").read_text()
    model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template), model_type="qwen3_moe")
    with caplog.at_level("INFO", logger="forge.gateway.service"):
        assert Gateway._tool_parser(SimpleNamespace(config=SimpleNamespace(tool_parser="auto"), model=model)) == \
            "qwen3_coder"
    assert "tool-call parser: qwen3_coder (the chat template writes <tool_call> and <function=)" in caplog.text
    assert Gateway._tool_parser(SimpleNamespace(config=SimpleNamespace(tool_parser="mistral"), model=model)) == \
        "mistral"


def test_arguments_stay_text_for_templates_that_read_text_and_are_decoded_for_the_others():
    """The built-in template tests ``is string`` (the client's text renders back as sent); the families' templates
    here do not, and get objects."""
    assert reads_string_arguments(Tokenizer.from_dir(TINY_DIR).template_for())
    assert not any(reads_string_arguments((TEMPLATES / t).read_text())
                   for t in ("qwen3_coder.jinja", "llama3.1_json.jinja"))
    spaced = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "add", "arguments": '{"a":1}'}}]}
    user = {"role": "user", "content": "hi"}
    assert '"arguments": {"a":1}' in Tokenizer.from_dir(TINY_DIR).render_chat([user, spaced], TOOLS)
    assert '"parameters": {"a": 1}' in family_tokenizer("llama3.1_json.jinja").render_chat(
        [user, spaced], TOOLS, date_string="26 Jul 2024")
