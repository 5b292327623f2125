"""What a task is: a JSON object with ``id``, ``messages`` (OpenAI chat messages with a user message among them),
optionally ``domain`` and ``tools`` (OpenAI tool schemas), and any other fields; ``validate_task`` checks one and
says what is wrong in one line (``TaskError``). Every way of reading tasks (a JSONL file, a Python source, a dataset)
checks each task here."""

from __future__ import annotations

from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_DOMAIN = "default"


class TaskError(ValueError):
    """Tasks that cannot be used, and where: ``"{path}:{line}: {reason}"`` or ``"{spec}[{index}]: {reason}"``."""


def kind_name(value: object) -> str:
    """The JSON kind of ``value`` as an error message names it (null, str, list, dict, ...)."""
    return "null" if value is None else type(value).__name__


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_message(message: object, index: int) -> None:
    name = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValueError(f"{name} must be an object, got {kind_name(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{name}.role must be one of {', '.join(ROLES)}, got {_shown(role)}")
    tool_calls = message.get("tool_calls")
    if "tool_calls" in message:
        if role != "assistant":
            raise ValueError(f"{name}.tool_calls is only for assistant messages, not {role}")
        if not isinstance(tool_calls, list) or not tool_calls or not all(isinstance(c, dict) for c in tool_calls):
            raise ValueError(f"{name}.tool_calls must be a non-empty list of objects")
    content = message.get("content")
    if isinstance(content, str) or (content is None and tool_calls):
        return
    needed = "a string, or null with tool_calls" if role == "assistant" else "a string"
    if "content" not in message:
        raise ValueError(f"{name}.content is missing (it must be {needed})")
    raise ValueError(f"{name}.content must be {needed}, got {kind_name(content)}")


def _check_tool(tool: object, index: int, names: dict[str, int]) -> None:
    name = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise ValueError(f"{name} must be an object, got {kind_name(tool)}")
    if tool.get("type") != "function":
        raise ValueError(f"{name}.type must be 'function', got {_shown(tool.get('type'))}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{name}.function must be an object, got {kind_name(function)}")
    tool_name = function.get("name")
    if not isinstance(tool_name, str) or not tool_name:
        raise ValueError(f"{name}.function.name must be a non-empty string, got {_shown(tool_name)}")
    if tool_name in names:
        raise ValueError(f"{name}.function.name {tool_name!r} is already the name of tools[{names[tool_name]}]")
    names[tool_name] = index
    if "description" in function and not isinstance(function["description"], str):
        raise ValueError(f"{name}.function.description must be a string, got {kind_name(function['description'])}")
    if "parameters" in function and not isinstance(function["parameters"], dict):
        raise ValueError(f"{name}.function.parameters must be an object (a JSON schema), "
                         f"got {kind_name(function['parameters'])}")


def _check(task: object) -> dict[str, Any]:
    """The task with its domain filled in; ValueError with the reason when it is not a valid task."""
    if not isinstance(task, dict):
        raise ValueError(f"a task must be an object, got {kind_name(task)}")
    if "id" not in task:
        raise ValueError("missing 'id'")
    if not isinstance(task["id"], str) or not task["id"]:
        raise ValueError(f"'id' must be a non-empty string, got {_shown(task['id'])}")
    messages = task.get("messages")
    if "messages" not in task:
        raise ValueError("missing 'messages'")
    if not isinstance(messages, list) or not messages:
        got = "[]" if isinstance(messages, list) else kind_name(messages)
        raise ValueError(f"'messages' must be a non-empty list, got {got}")
    for index, message in enumerate(messages):
        _check_message(message, index)
    if not any(message["role"] == "user" for message in messages):
        raise ValueError("'messages' has no user message")
    if "domain" in task and (not isinstance(task["domain"], str) or not task["domain"]):
        raise ValueError(f"'domain' must be a non-empty string, got {_shown(task['domain'])}")
    if "tools" in task:
        if not isinstance(task["tools"], list):
            raise ValueError(f"'tools' must be a list, got {kind_name(task['tools'])}")
        names: dict[str, int] = {}
        for index, tool in enumerate(task["tools"]):
            _check_tool(tool, index, names)
    return {**task, "domain": task.get("domain", DEFAULT_DOMAIN)}


def validate_task(task: object, where: str) -> dict[str, Any]:
    """``task`` checked as one task (not against others), as a new dict with ``domain`` filled in (``"default"``
    when absent); ``TaskError("{where}: {reason}")`` when it is not a valid task."""
    try:
        return _check(task)
    except ValueError as exc:
        raise TaskError(f"{where}: {exc}") from None
