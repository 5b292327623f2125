"""Settings declared once. A component owns its settings as a kw-only dataclass whose fields are made with
``setting()``: the default, the help text and the bounds live in the field, and everything else is derived from
it — the click option (``forge.cli.options``), the ``FORGE_<COMMAND>_<OPTION>`` environment variable, the key in
the run file's TOML table, and the validation that runs whenever the dataclass is built, from the command line or
from code.

A secret field (``secret=True``, an API key) also gets a key-file setting, ``<option>_file``: its option, variable
and TOML key are derived like any other's, and the built field holds the keys read from that file (one per line),
so that no key need be given on a command line, where every local user can read it in the process list.

A ``dict[str, Any]`` field is a table of values handed on as they are (keyword arguments for user code): an inline
table in a run file, a JSON object on the command line and in a variable.

A field whose type is itself a settings dataclass is a group: its fields are options of the same command (the
option names of one command are flat and unique), and in a run file they may be written flat in the command's
table or in a sub-table named after the group (``[learner.loss]``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

SETTING = "forge.setting"
GROUP_DEFAULTS = "forge.group_defaults"
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()      # no default given by a group
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Setting:
    """How one field is offered to users (see ``setting`` for the meaning of each)."""

    help: str
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    env: str | None = None
    secret: bool = False
    separator: str | None = None
    scale: int = 1
    unit: str = ""
    metavar: str | None = None
    negative: str | None = None
    click_type: str | None = None
    path: str | None = None
    validate: Callable[[Any], None] | None = None
    argument: bool = False
    short: str | None = None


def setting(default: Any = MISSING, *, factory: Any = MISSING, help: str, flag: str | None = None,
            choices: tuple[str, ...] | None = None, min: float | None = None, max: float | None = None,
            min_open: bool = False, env: str | None = None, secret: bool = False, separator: str | None = None,
            scale: int = 1, unit: str = "", metavar: str | None = None, negative: str | None = None,
            click_type: str | None = None, path: str | None = None,
            validate: Callable[[Any], None] | None = None, argument: bool = False, short: str | None = None) -> Any:
    """A settings field.

    - ``help``: one sentence for ``--help``, ``forge config show`` and the docs.
    - ``flag``: the option's name (without dashes) when it is not the field's name with dashes.
    - ``choices``, ``min``/``max`` (``min_open``: strictly greater): checked on every build.
    - ``env``: an environment variable read besides the derived ``FORGE_<COMMAND>_<OPTION>``.
    - ``secret``: never shown (``forge config show`` prints ``***``) nor logged.
    - ``separator``: a tuple field given as one string, e.g. ``"a,b"`` with ``","``, or a command line with
      ``"shell"`` (split as a shell would); without one a tuple field is a repeatable option.
    - ``scale`` and ``unit``: the option is given in units of ``scale`` field units (``--kv-cache-mb`` sets bytes).
    - ``negative``: the off switch of a boolean (default ``no-FLAG``).
    - ``click_type``: how the option parses its text when the field's type does not say: ``"bytes"`` (64MiB).
    - ``path``: ``"file"`` or ``"dir"`` for a ``Path`` field.
    - ``validate``: a check of its own for a value (None aside), raising ValueError with the reason.
    - ``argument``: given on the command line as a positional argument (``forge pool stats PATH``) rather than an
      option; the variable and the TOML key are derived as for an option.
    - ``short``: a one-letter alias of the option (``"n"`` for ``-n``).
    """
    if argument and (secret or short):
        raise TypeError("a positional argument is neither secret nor has a short alias")
    meta = {SETTING: Setting(help=help, flag=flag, choices=choices, min=min, max=max, min_open=min_open, env=env,
                             secret=secret, separator=separator, scale=scale, unit=unit, metavar=metavar,
                             negative=negative, click_type=click_type, path=path, validate=validate,
                             argument=argument, short=short)}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type, **defaults: Any) -> Any:
    """A settings field holding the group ``cls`` whose own defaults for some of its fields are ``defaults`` (field
    name → value): one group serves two commands that want other defaults (forge up's rollouts and forge
    rollout's), each option still declared once."""
    unknown = set(defaults) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    return dataclasses.field(default_factory=lambda: cls(**defaults), metadata={GROUP_DEFAULTS: dict(defaults)})


@dataclass(frozen=True)
class Entry:
    """One setting of a settings tree: where it sits (``path`` of field names) and how it is offered."""

    path: tuple[str, ...]
    field: dataclasses.Field
    spec: Setting
    kind: type                          # the value's type once ``None`` is set aside: int, float, str, bool, Path, tuple
    optional: bool                      # ``None`` is a valid value
    key_file: bool = False              # the key-file setting of the secret ``field`` (a Path, not a field itself)
    override: Any = UNSET               # the default its group gives it (``group``), in place of the field's

    @property
    def name(self) -> str:
        """The option's name with underscores: click's parameter name and the TOML key."""
        return (self.spec.flag or self.field.name).replace("-", "_")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> Any:
        if self.key_file:
            return None
        if self.override is not UNSET:
            return self.override
        if self.field.default is not MISSING:
            return self.field.default
        if self.field.default_factory is not MISSING:
            return self.field.default_factory()
        return None

    @property
    def required(self) -> bool:
        return (not self.key_file and self.override is UNSET and self.field.default is MISSING
                and self.field.default_factory is MISSING)


class SettingsError(ValueError):
    """A setting has a value it cannot take. ``flag`` names the option when one option alone is at fault (then
    ``reason`` is the message without it); the message always names the options."""

    def __init__(self, reason: str, flag: str | None = None) -> None:
        super().__init__(f"{flag}: {reason}" if flag else reason)
        self.reason = reason
        self.flag = flag


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(type, optional) for ``X`` or ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"a setting has one type (or that type or None), not {annotation}")
        return args[0], True
    return annotation, False


def is_settings(cls: Any) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls) and getattr(cls, "__settings__", False)


@cache
def entries(cls: type) -> tuple[Entry, ...]:
    """Every setting of ``cls``, groups flattened in field order; option names are checked to be unique."""
    found: list[Entry] = []

    def walk(klass: type, path: tuple[str, ...], defaults: Mapping[str, Any]) -> None:
        hints = typing.get_type_hints(klass)
        for f in dataclasses.fields(klass):
            kind, optional = _unwrap(hints[f.name])
            if is_settings(kind):
                walk(kind, (*path, f.name), f.metadata.get(GROUP_DEFAULTS, {}))
                continue
            spec = f.metadata.get(SETTING)
            if spec is None:
                continue                            # internal: set by the component, not by users
            origin = typing.get_origin(kind) or kind
            if origin not in (int, float, str, bool, Path, tuple, dict):
                raise TypeError(f"{klass.__name__}.{f.name}: unsupported setting type {kind}")
            found.append(Entry((*path, f.name), f, spec, origin, optional, override=defaults.get(f.name, UNSET)))
            if spec.secret:
                found.append(key_file_entry(found[-1]))

    walk(cls, (), {})
    names = [e.name for e in found]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise TypeError(f"{cls.__name__}: options named twice: {sorted(duplicates)}")
    return tuple(found)


def key_file_entry(secret: Entry) -> Entry:
    """The key-file setting of ``secret``: ``--<option>-file PATH``."""
    what = (f"the values of {secret.flag} from this file, one per line" if secret.kind is tuple else
            f"{secret.flag} from this file, one line")
    spec = Setting(help=f"Read {what} (blank lines and # comments ignored); keep the file readable by you alone.",
                   flag=f"{secret.name}_file", metavar="PATH", path="file")
    return Entry(secret.path, secret.field, spec, Path, True, key_file=True)


def read_key_file(path: Path, flag: str, several: bool) -> tuple[str, ...]:
    """The keys in the file at ``path`` (one per line; blank lines and lines starting with # are skipped, and the
    whitespace around a key is not part of it); SettingsError naming ``flag`` when it cannot be read or holds none
    (or, unless ``several``, more than one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror or exc}", flag) from exc
    except UnicodeDecodeError as exc:
        raise SettingsError(f"cannot read {path}: it is not UTF-8 text", flag) from exc
    keys = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise SettingsError(f"{path} holds no key (one per line; # starts a comment)", flag)
    if len(keys) > 1 and not several:
        raise SettingsError(f"{path} holds {len(keys)} keys; this option takes one", flag)
    return keys


def groups(cls: type) -> dict[str, type]:
    """The nested groups of ``cls`` by field name (one level; their own groups are found through them)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name])[0] for f in dataclasses.fields(cls) if is_settings(_unwrap(hints[f.name])[0])}


def group_defaults(cls: type) -> dict[str, dict[str, Any]]:
    """The defaults each group field of ``cls`` gives its group's fields (``group``), by group field name."""
    return {f.name: dict(f.metadata.get(GROUP_DEFAULTS, {})) for f in dataclasses.fields(cls) if f.name in groups(cls)}


def check_value(entry: Entry, value: Any) -> None:
    """Raise SettingsError unless ``value`` fits the entry's type, choices and bounds."""
    spec, flag = entry.spec, entry.flag
    if value is None:
        if entry.optional:
            return
        raise SettingsError("needs a value", flag)
    kind = entry.kind
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is tuple:
        ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    elif kind is Path:
        ok = isinstance(value, Path)
    elif kind is dict:
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise SettingsError(f"must be {kind.__name__}, got {value!r}", flag)
    if kind is float and not math.isfinite(value):
        raise SettingsError(f"must be finite, got {value!r}", flag)
    items = value if kind is tuple else (value,)
    if spec.choices is not None:
        bad = [v for v in items if v not in spec.choices]
        if bad:
            raise SettingsError(f"must be one of {', '.join(spec.choices)}, got {bad[0]!r}", flag)
    if spec.secret and any(isinstance(v, str) and not v.strip() for v in items):
        raise SettingsError("an empty value is not allowed: give a real one or leave the option out", flag)
    if kind in (int, float):
        shown = value / spec.scale if spec.scale != 1 else value          # in the option's units
        if spec.min is not None and (value < spec.min or (spec.min_open and value == spec.min)):
            raise SettingsError(f"must be {'>' if spec.min_open else '>='} {spec.min / spec.scale:g}, got {shown!r}",
                                flag)
        if spec.max is not None and value > spec.max:
            raise SettingsError(f"must be <= {spec.max / spec.scale:g}, got {shown!r}", flag)
    if spec.validate is not None:
        try:
            spec.validate(value)
        except ValueError as exc:
            raise SettingsError(str(exc), flag) from exc


class Settings:
    """Base of every settings dataclass (declare them ``@dataclass(frozen=True, kw_only=True)``): builds are
    validated field by field, then by ``check``. Not a dataclass itself, so that frozen and mutable ones share it."""

    __settings__: ClassVar[bool] = True

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            spec = f.metadata.get(SETTING)
            if spec is not None:
                kind, optional = _unwrap(hints[f.name])
                check_value(Entry((f.name,), f, spec, typing.get_origin(kind) or kind, optional),
                            getattr(self, f.name))
        _check_metrics_port(self)
        self.check()

    def check(self) -> None:
        """Rules across fields; raise SettingsError naming the options."""


def log_level_setting(default: str = "INFO") -> Any:
    """The ``log_level`` field every service's settings have."""
    return setting(default, help="Logging verbosity (logs go to stderr).", choices=LOG_LEVELS)


def ready_file_setting(fields: str) -> Any:
    """The ``ready_file`` field of a service's settings: where it announces itself once serving."""
    return setting(None, help=f"Write {{{fields}}} as JSON here once serving.", path="file")


def metrics_port_setting() -> Any:
    """The ``metrics_port`` field of a gRPC-only service's settings: Prometheus metrics over HTTP, off unless given;
    ``Settings`` checks that it is not the service's gRPC ``port``."""
    return setting(None, min=0, max=65535, help="Serve Prometheus metrics (GET /metrics over HTTP, on --host) on this "
                                                "port; 0 picks a free one (see --ready-file) [default: off].")


def _check_metrics_port(settings: Settings) -> None:
    """A service's metrics port must not be its gRPC port (0, any free port, aside)."""
    metrics_port = getattr(settings, "metrics_port", None)
    if metrics_port and metrics_port == getattr(settings, "port", None):
        raise SettingsError(f"--metrics-port {metrics_port} is the gRPC --port; give another one")


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of ``cls`` from flat option values (option name with underscores → value); options not given
    keep their defaults. Raises SettingsError (a ValueError) for a value it cannot take."""
    unknown = set(values) - {e.name for e in entries(cls)}
    if unknown:
        raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")

    def make(klass: type, path: tuple[str, ...], defaults: Mapping[str, Any]) -> Any:
        kwargs: dict[str, Any] = dict(defaults)
        nested = group_defaults(klass)
        for name, kind in groups(klass).items():
            kwargs[name] = make(kind, (*path, name), nested[name])
        own = [e for e in entries(klass) if len(e.path) == 1]
        for entry in own:
            if not entry.key_file and entry.name in values:
                kwargs[entry.field.name] = values[entry.name]
        for entry in own:
            if entry.key_file and values.get(entry.name) is not None:
                secret = next(e for e in own if e.field is entry.field and not e.key_file)
                if kwargs.get(secret.field.name) not in (None, ()):
                    raise SettingsError(f"give {secret.flag} or {entry.flag}, not both")
                keys = read_key_file(values[entry.name], entry.flag, several=secret.kind is tuple)
                kwargs[secret.field.name] = keys if secret.kind is tuple else keys[0]
        try:
            return klass(**kwargs)
        except TypeError as exc:                   # a required setting left out
            missing = [e.flag for e in entries(klass) if e.required and e.field.name not in kwargs]
            raise SettingsError(f"give {' and '.join(missing)}" if missing else str(exc)) from exc

    return make(cls, (), {})


def flatten(cls: type, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A run file's table as flat option values. A key is an option name (dashes or underscores) anywhere, or, in
    a group's sub-table, the name of one of that group's fields (``[up.agent] timeout_s`` for ``--agent-timeout``).
    Raises SettingsError for a key that is no setting of ``cls``, naming ``where`` (file and table)."""
    known = {e.name for e in entries(cls)}
    flat: dict[str, Any] = {}

    def walk(klass: type, items: Mapping[str, Any], prefix: str) -> None:
        nested = groups(klass)
        own = {e.field.name + ("_file" if e.key_file else ""): e.name for e in entries(klass) if len(e.path) == 1}
        for key, value in items.items():
            name = key.replace("-", "_")
            if isinstance(value, dict) and name in nested:
                walk(nested[name], value, f"{prefix}{name}.")
            elif name in own or name in known:
                flat[own.get(name, name)] = value
            else:
                raise SettingsError(f"{where}: unknown setting {prefix}{key!s} (see forge config show)")

    walk(cls, table, "")
    return flat


# The grammar sandbox's limits by default (forge.structured.sandbox): the settings below, and the sandbox's own.
DEFAULT_MEMORY_MB = 1024
DEFAULT_TIMEOUT_S = 10.0


def grammar_memory_setting() -> Any:
    """The ``grammar_memory_mb`` field of a service that checks grammars from the network (the gateway, actors)."""
    return setting(DEFAULT_MEMORY_MB, flag="grammar-memory-mb", min=64, unit="MiB",
                   help="Memory a grammar (structured output, a strict tool) may take to compile, in a process of "
                        "its own; a grammar that needs more is refused with the reason.")


def grammar_timeout_setting() -> Any:
    """The ``grammar_timeout_s`` field of a service that checks grammars from the network."""
    return setting(DEFAULT_TIMEOUT_S, flag="grammar-timeout", min=0.1,
                   help="Seconds a grammar may take to compile; a grammar that takes longer is refused.")
