"""The bounds a grammar keeps before anything compiles it, checked on the schema's JSON alone, in time linear in its
size: no allocation a schema asks for can happen before these checks pass.

- **Counts.** ``minItems``/``maxItems``/``minProperties``/``maxProperties``/``minContains``/``maxContains`` at most
  ``MAX_COUNT``; ``minLength``/``maxLength`` at most ``MAX_LENGTH`` (more than any context holds). A grammar engine
  spells a count out: ``minItems: 1000000000`` is a few bytes of JSON and gigabytes of grammar.
- **Patterns.** At most ``MAX_PATTERN_CHARS`` characters, and counted repetitions (``a{5}``, ``(ab){2,9}``) of at
  most ``MAX_REPEAT`` in all, nested ones multiplied: ``^a{1000000000}$`` compiles lazily and then exhausts the
  lexer while the model writes.
- **Depth.** Subschemas nested at most ``MAX_SCHEMA_DEPTH`` levels.
- **A finite document.** Every subschema must match some finite document: a ``$ref`` cycle that nothing ends
  (``{"$ref": "#"}``, ``a`` -> ``b`` -> ``a``) or a schema that requires itself (a required property, an item of a
  non-empty array, an ``allOf`` part whose schema is the whole again) has none, and a grammar engine fails on it only
  while sampling. Recursion through optional parts (a tree whose ``children`` may be empty) is fine. Found as the
  least fixed point of "productive" over the schema's nodes, by counting (linear, as for Horn clauses).

What these cannot see, the sandbox (``forge.structured.sandbox``) finds by compiling under a memory limit."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator

MAX_COUNT = 10_000
MAX_LENGTH = 1_000_000
MAX_PATTERN_CHARS = 1_000
MAX_REPEAT = 1_000
MAX_SCHEMA_DEPTH = 32

COUNT_KEYWORDS = ("minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")
LENGTH_KEYWORDS = ("minLength", "maxLength")
MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
ONE_KEYWORDS = ("additionalProperties", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
                "unevaluatedItems", "unevaluatedProperties", "contentSchema")
LIST_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems")
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_LARK_JSON = re.compile(r"%json\s*")


class BoundsError(ValueError):
    """A grammar beyond the bounds: the message names the place and the limit."""


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _children(schema: dict, pointer: str) -> Iterator[tuple[object, str]]:
    """Each subschema of ``schema`` with its JSON pointer."""
    for keyword in MAP_KEYWORDS:
        value = schema.get(keyword)
        if isinstance(value, dict):
            for key, child in value.items():
                yield child, f"{pointer}/{keyword}/{_escape(str(key))}"
    for keyword in (*ONE_KEYWORDS, "items"):
        value = schema.get(keyword)
        if isinstance(value, dict | bool):
            yield value, f"{pointer}/{keyword}"
    for keyword in (*LIST_KEYWORDS, "items"):
        value = schema.get(keyword)
        if isinstance(value, list):
            for i, child in enumerate(value):
                yield child, f"{pointer}/{keyword}/{i}"


def _where(pointer: str) -> str:
    shown = pointer if len(pointer) <= 80 else f"{pointer[:38]}...{pointer[-38:]}"
    return "the schema" if pointer == "#" else f"the schema at {shown}"


def _number_problem(schema: dict, pointer: str) -> str | None:
    for keywords, limit in ((COUNT_KEYWORDS, MAX_COUNT), (LENGTH_KEYWORDS, MAX_LENGTH)):
        for keyword in keywords:
            value = schema.get(keyword)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
                return f"{_where(pointer)}: {keyword} is {value:.0f}; at most {limit} is supported"
    return None


def _patterns(schema: dict) -> Iterator[str]:
    if isinstance(schema.get("pattern"), str):
        yield schema["pattern"]
    if isinstance(schema.get("patternProperties"), dict):
        yield from (key for key in schema["patternProperties"] if isinstance(key, str))


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class that opens at ``pattern[i]`` (``[``), read as llguidance's regex
    syntax (Rust's) reads it: classes nest, and a ``]`` first in a class is a literal."""
    depth = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            depth += 1
            i += 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)
            continue
        if char == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def repeat_weight(pattern: str) -> int:
    """The most characters one atom of ``pattern`` is repeated by counted repetitions, nested ones multiplied
    (``(a{10}){20}`` is 200); ``*``, ``+`` and ``?`` count once (an engine loops on them, it does not spell them out)."""
    frames = [1]                # per open group: the heaviest element inside it
    atom = 1                    # the weight of the element a quantifier would repeat
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            end = i + 2
            if end < len(pattern) and pattern[i + 1].isalpha() and pattern[end] == "{":    # \p{L}, \x{41}
                close = pattern.find("}", end)
                end = len(pattern) if close < 0 else close + 1
            i, atom = end, 1
        elif char == "[":
            i, atom = _skip_class(pattern, i), 1
        elif char == "(":
            frames.append(1)
            i, atom = i + 1, 1
        elif char == ")" and len(frames) > 1:
            atom = frames.pop()
            i += 1
        elif char == "{" and (match := _QUANTIFIER.match(pattern, i)):
            low, high = match.group(1), match.group(2)
            atom *= max(int(low), int(high) if high else 0, 1)
            i = match.end()
        else:
            i, atom = i + 1, 1
        frames[-1] = max(frames[-1], atom)
    return max(frames)


def pattern_problem(pattern: str) -> str | None:
    """Why the regular expression ``pattern`` is beyond the bounds, or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a pattern is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS} are supported"
    weight = repeat_weight(pattern)
    if weight > MAX_REPEAT:
        return (f"the pattern {pattern[:60]!r} repeats {weight} times in all (counted repetitions, nested ones "
                f"multiplied); at most {MAX_REPEAT} are supported")
    return None


def _requirements(schema: dict, pointer: str, nodes: dict[str, dict]) -> list[list[str]]:
    """What ``schema`` needs to match a finite document: each requirement a list of alternatives (pointers of
    subschemas), one of which must match one; an empty list is a requirement nothing meets."""
    def alternatives(*children: tuple[object, str]) -> list[str] | None:
        """The pointers of the schema children, None when one is ``true`` (met whatever the rest)."""
        found = []
        for child, where in children:
            if child is True or (isinstance(child, dict) and not child):
                return None
            if isinstance(child, dict):
                found.append(where)
        return found

    needs: list[list[str] | None] = []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref in nodes:
        needs.append([ref])
    for i, child in enumerate(schema.get("allOf") or () if isinstance(schema.get("allOf"), list) else ()):
        needs.append(alternatives((child, f"{pointer}/allOf/{i}")))
    for keyword in ("anyOf", "oneOf"):
        if isinstance(schema.get(keyword), list):
            needs.append(alternatives(*((c, f"{pointer}/{keyword}/{i}") for i, c in enumerate(schema[keyword]))))
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    for name in schema.get("required") or () if isinstance(schema.get("required"), list) else ():
        if isinstance(name, str) and name in properties:
            needs.append(alternatives((properties[name], f"{pointer}/properties/{_escape(name)}")))
    least = schema.get("minItems")
    if isinstance(least, int) and not isinstance(least, bool) and least > 0:
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        for i, child in enumerate(prefix[:least]):
            needs.append(alternatives((child, f"{pointer}/prefixItems/{i}")))
        items = schema.get("items")
        if least > len(prefix) and isinstance(items, dict | bool):
            needs.append(alternatives((items, f"{pointer}/items")))
    return [need for need in needs if need is not None]


def _unproductive(requirements: dict[str, list[list[str]]]) -> list[str]:
    """The pointers of the subschemas that match no finite document: the least fixed point of "all its
    requirements have a productive alternative", found by counting unmet requirements (linear in the schema)."""
    unmet = {pointer: len(needs) for pointer, needs in requirements.items()}
    waiting: dict[str, list[tuple[str, int]]] = {}            # pointer -> the (node, requirement) it would meet
    for pointer, needs in requirements.items():
        for index, alternatives in enumerate(needs):
            for alternative in alternatives:
                waiting.setdefault(alternative, []).append((pointer, index))
    met: set[tuple[str, int]] = set()
    ready = [pointer for pointer, count in unmet.items() if count == 0]
    productive = set(ready)
    while ready:
        for owner, index in waiting.get(ready.pop(), ()):
            if (owner, index) in met:
                continue
            met.add((owner, index))
            unmet[owner] -= 1
            if unmet[owner] == 0 and owner not in productive:
                productive.add(owner)
                ready.append(owner)
    return [pointer for pointer in requirements if pointer not in productive]


def schema_problem(schema: object) -> str | None:
    """Why the JSON schema ``schema`` (decoded) is beyond the bounds, or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return "a JSON schema must be an object (or true)"
    nodes: dict[str, dict] = {}
    stack: list[tuple[dict, str, int]] = [(schema, "#", 0)]
    while stack:
        node, pointer, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"{_where(pointer)} is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are supported"
        problem = _number_problem(node, pointer) or next(filter(None, map(pattern_problem, _patterns(node))), None)
        if problem:
            return problem if problem.startswith("the schema") else f"{_where(pointer)}: {problem}"
        nodes[pointer] = node
        stack.extend((child, where, depth + 1) for child, where in _children(node, pointer) if isinstance(child, dict))
    for pointer, node in nodes.items():
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and ref not in nodes:
            return f"{_where(pointer)}: $ref {ref[:80]!r} points to no subschema of this schema"
    stuck = _unproductive({pointer: _requirements(node, pointer, nodes) for pointer, node in nodes.items()})
    if stuck:
        return (f"{_where(stuck[0])} matches no finite document: it refers to itself (through $ref) with nothing "
                "to end the recursion")
    return None


@functools.lru_cache(maxsize=256)
def schema_text_problem(text: str) -> str | None:
    """Why the JSON schema given as JSON text is not valid JSON or is beyond the bounds, or None. Cached: an agent
    sends the same schema with every call."""
    try:
        return schema_problem(json.loads(text))
    except ValueError as exc:
        return f"the JSON schema is not valid JSON: {exc}"
    except RecursionError:
        return f"the JSON schema is nested too deeply (at most {MAX_SCHEMA_DEPTH} levels are supported)"


@functools.lru_cache(maxsize=256)
def lark_problem(lark: str) -> str | None:
    """Why a Lark grammar is beyond the bounds, or None: each JSON schema it embeds (``%json {...}``) is checked."""
    decoder = json.JSONDecoder()
    for match in _LARK_JSON.finditer(lark):
        try:
            schema, _end = decoder.raw_decode(lark, match.end())
        except ValueError:
            continue                    # not a schema here (e.g. inside a string literal): llguidance judges it
        except RecursionError:
            return f"an embedded JSON schema is nested too deeply (at most {MAX_SCHEMA_DEPTH} levels are supported)"
        problem = schema_problem(schema)
        if problem:
            return problem
    return None


__all__ = ["MAX_COUNT", "MAX_LENGTH", "MAX_PATTERN_CHARS", "MAX_REPEAT", "MAX_SCHEMA_DEPTH", "BoundsError",
           "lark_problem", "pattern_problem", "repeat_weight", "schema_problem", "schema_text_problem"]
