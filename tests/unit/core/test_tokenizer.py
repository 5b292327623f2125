"""Tokenizers and chat templates: the built-in tokenizer and any HF tokenizer directory encode, decode and render
chats exactly as transformers does; the built-in tokenizer is reproducible from its build script."""

from __future__ import annotations

import json
import random

import pytest

from forge.app.tiny_tokenizer import build
from forge.assets import TINY_DIR
from forge.tokenizer import ChatTemplateError, Tokenizer

transformers = pytest.importorskip("transformers")

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                      "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                     "required": ["key"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers; ünïcode ok.",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                      "b": {"type": "integer"}}}}},
]

CONVERSATIONS = {
    "single-user": [{"role": "user", "content": "What is 12 * 7?"}],
    "system-and-turns": [
        {"role": "system", "content": "You answer tersely."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Compute (3 + 4) * 2."},
    ],
    "tool-calls-string-and-dict-arguments": [
        {"role": "user", "content": "Find Ka and add 2 and 3."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "Ka"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Ka lives in Tor."},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
        {"role": "assistant", "content": "Tor, and 5.", "reasoning_content": "both tools answered"},
    ],
    "system-messages-anywhere": [          # as frameworks send them: a retry prompt in mid-conversation
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Name a city."},
        {"role": "assistant", "content": "Tor"},
        {"role": "system", "content": "That was not JSON; try again."},
    ],
    "reasoning-under-old-name": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "thinking": "a hidden thought"},
        {"role": "user", "content": "日本語 and émojis 🙂"},
    ],
}

# A second template that exercises what real templates use: namespace, loop controls, tojson options, dict(),
# the generation tag, raise_exception and special-token variables.
OTHER_TEMPLATE = (
    "{{ bos_token or '' }}{% set ns = namespace(turns=0) %}"
    "{% if tools %}[TOOLS]{{ tools | tojson(indent=2, sort_keys=True) }}[/TOOLS]\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% if m.role == 'assistant' %}{% generation %}<A>{{ m.content | default('', true) }}"
    "{% for c in m.tool_calls | default([]) %}{{ dict(name=c.function.name) | tojson }}{% endfor %}</A>"
    "{% endgeneration %}{% else %}<{{ m.role | upper }}>{{ m.content }}{% endif %}"
    "{% if loop.index > 50 %}{% break %}{% endif %}{% endfor %}"
    "turns={{ ns.turns }}{% if add_generation_prompt %}<A>{% endif %}{{ eos_token }}"
)


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_dir(TINY_DIR)


@pytest.fixture(scope="module")
def reference():
    return transformers.AutoTokenizer.from_pretrained(str(TINY_DIR))


def random_text(rng: random.Random) -> str:
    pieces = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", " ", "\n", "  ", "Answer:",
              "12345", "-7", "{\"a\": 1}", "Compute", "é", "日本", "🙂", "\t", "don't", "Ka lives in Tor."]
    return "".join(rng.choice(pieces) if rng.random() < 0.6 else chr(rng.randrange(32, 0x2FF))
                   for _ in range(rng.randrange(1, 40)))


def test_encode_decode_match_transformers(ours, reference):
    rng = random.Random(0)
    assert len(ours) == len(reference)
    assert ours.eos_token_id == reference.eos_token_id and ours.pad_token_id == reference.pad_token_id
    for _ in range(300):
        text = random_text(rng)
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == reference.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_digits_are_single_tokens(ours):
    for token in ours.encode("Compute 1234567890 + 99"):
        piece = ours.decode([token]).strip()
        assert not piece.isdigit() or len(piece) == 1


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_builtin_chat_template_matches_transformers(ours, reference, name, tools, generation_prompt):
    messages = CONVERSATIONS[name]
    expected = reference.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                             tokenize=False)
    assert ours.render_chat(messages, tools=tools, add_generation_prompt=generation_prompt) == expected
    expected_ids = reference.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                                 tokenize=True, return_dict=False)
    assert ours.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt) == expected_ids


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_any_template_from_a_tokenizer_directory_matches_transformers(tmp_path, name):
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / file).write_bytes((TINY_DIR / file).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(chat_template=OTHER_TEMPLATE, bos_token="<|endoftext|>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = Tokenizer.from_dir(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for tools in (None, TOOLS):
        expected = reference.apply_chat_template(CONVERSATIONS[name], tools=tools, add_generation_prompt=True,
                                                 tokenize=False)
        assert ours.render_chat(CONVERSATIONS[name], tools=tools, add_generation_prompt=True) == expected


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path):
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / file).write_bytes((TINY_DIR / file).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "D{{ messages | length }}"},
                               {"name": "tool_use", "template": "T{{ tools | length }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_dir(tmp_path)
    messages = CONVERSATIONS["single-user"]
    assert tokenizer.render_chat(messages) == "D1"
    assert tokenizer.render_chat(messages, tools=TOOLS) == "T2"


def test_a_later_system_message_is_a_system_turn_in_place(ours):
    rendered = ours.render_chat(CONVERSATIONS["system-messages-anywhere"], add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nAnswer in JSON.<|im_end|>\n")
    assert rendered.endswith("<|im_start|>assistant\nTor<|im_end|>\n<|im_start|>system\nThat was not JSON; try "
                             "again.<|im_end|>\n<|im_start|>assistant\n")


def test_template_errors_are_clear(ours):
    with pytest.raises(ChatTemplateError, match="unknown role"):
        ours.render_chat([{"role": "wizard", "content": "a"}])
    with pytest.raises(ChatTemplateError, match="empty"):
        ours.render_chat([])


def test_sandbox_refuses_python_internals(tmp_path):
    from forge.tokenizer.chat_template import render_chat

    with pytest.raises(ChatTemplateError):
        render_chat("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", [{"role": "user"}])
    with pytest.raises(ChatTemplateError):
        render_chat("{% set ns = namespace(_x=1) %}", [{"role": "user"}])


def test_build_script_reproduces_the_shipped_tokenizer(tmp_path):
    build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_text() == (TINY_DIR / name).read_text(), f"{name} is stale: run make assets"
