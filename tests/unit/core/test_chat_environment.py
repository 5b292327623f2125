"""The chat templates' sandbox reaches a dict's keys as attributes straight away, and renders what Jinja's immutable
sandbox renders: generated messages whose keys include dict methods' names, underscores and missing names, read
through attributes, items and tests, give the same text or the same error. (Rendering as transformers does:
test_tokenizer.py.)"""

from __future__ import annotations

import jinja2
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from forge.tokenizer.chat_template import _ChatEnvironment

NAMES = ["role", "content", "items", "get", "keys", "update", "pop", "_hidden", "__class__", "name", "missing"]
TEMPLATE = "".join([
    "{% for m in messages %}[",
    *(f"{name}:{{{{ m.{name} is defined }}}}/{{{{ m['{name}'] is defined }}}}/{{{{ (m.{name} is string) and m.{name} "
      f"or '' }}}};" for name in NAMES if not name.startswith("__")),
    "{{ m.get('role', 'none') }}{% if m.content is mapping %}{{ m.content.role }}{% endif %}",
    "]{% endfor %}",
])

values = st.text(max_size=4) | st.integers() | st.none() | st.dictionaries(st.sampled_from(NAMES), st.text(max_size=3),
                                                                           max_size=3)
messages = st.lists(st.dictionaries(st.sampled_from(NAMES), values, max_size=6), max_size=4)


def render(environment: jinja2.Environment, source: str, chat: list[dict]) -> str:
    try:
        return environment.from_string(source).render(messages=chat)
    except jinja2.TemplateError as exc:
        return f"error {type(exc).__name__}: {exc}"


@settings(max_examples=300, deadline=None)
@given(messages)
def test_attribute_reads_render_as_in_the_immutable_sandbox(chat):
    assert render(_ChatEnvironment(), TEMPLATE, chat) == render(ImmutableSandboxedEnvironment(), TEMPLATE, chat)


@settings(max_examples=100, deadline=None)
@given(messages, st.sampled_from(["{{ messages[0].__class__ }}", "{{ messages[0].update }}", "{{ messages[0]._hidden }}",
                                  "{% for m in messages %}{{ m.pop('role') }}{% endfor %}"]))
def test_what_the_sandbox_refuses_stays_refused(chat, source):
    assert render(_ChatEnvironment(), source, chat) == render(ImmutableSandboxedEnvironment(), source, chat)
