"""Checked configuration dataclasses and the one place that reads YAML.

Every concern (model, draft, spec, budget, engine profile) is a dataclass that validates itself
in `__post_init__` and raises `ConfigError` with what is wrong and what is allowed. YAML under
`configs/` is loaded here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path


class ConfigError(ValueError):
    """A bad config or argument value. The message names the value and what is allowed."""


def check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of {sorted(allowed)}")


def check_range(name: str, value, lo=None, hi=None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r} must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is not a finite number; give a finite value")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise ConfigError(f"{name}={value!r} is out of range; allowed {bounds}")


def from_dict(cls, data: dict, where: str = ""):
    """Build dataclass `cls` from a plain dict; nested dataclass fields are built recursively."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed keys are {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        sub = hints.get(name)
        if dataclasses.is_dataclass(sub):
            value = from_dict(sub, value, f"{where}.{name}")
        else:
            check_type(f"{where}.{name}", value, sub)
            if isinstance(value, list) and _is_tuple_hint(sub):
                value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # a missing required key
        raise ConfigError(f"{where}: {e}") from None


def check_type(name: str, value, hint) -> None:
    """Refuse a value of the wrong type for a field annotated `hint`: YAML's "false" is a string,
    not a bool; 2.5 is not an int; a bool is not a number. Unknown hints are not checked."""
    if not _fits(value, hint):
        raise ConfigError(f"{name}={value!r} ({type(value).__name__}) must be {_type_name(hint)}")


def check_types(obj) -> None:
    """check_type on every field of dataclass `obj` (for __post_init__: direct construction is
    held to the same types as YAML)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not dataclasses.is_dataclass(hints.get(f.name)):
            check_type(f"{type(obj).__name__}.{f.name}", getattr(obj, f.name), hints.get(f.name))


def _fits(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is tuple or hint is list or origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        elem = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis) else None
        return elem is None or all(_fits(v, elem) for v in value)
    return True


def _type_name(hint) -> str:
    if hint in (bool, int, float, str):
        return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[hint]
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is tuple or hint is list or typing.get_origin(hint) in (tuple, list):
        args = typing.get_args(hint)
        return f"a list of {_type_name(args[0])}" if args else "a list"
    return str(hint)


def _is_tuple_hint(hint) -> bool:
    return typing.get_origin(hint) is tuple or hint is tuple


def to_dict(obj) -> dict:
    """Plain JSON/YAML-ready dict of a (nested) config dataclass; tuples become lists."""
    def plain(v):
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(dataclasses.asdict(obj))


def _unique_loader():
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice; "
                                      "give each key once")
                seen.add(key)
            return super().construct_mapping(node, deep)
    return Loader


def load_yaml(cls, path: str | Path, empty_ok: bool = True, overrides=()):
    """Load `path` (YAML) into the checked dataclass `cls`. A key given twice is refused; an empty
    file (every default) too unless `empty_ok` (`{}` says every default on purpose). `overrides`:
    "dotted.key=value" strings (value read as YAML) applied over the file before checking."""
    import yaml  # core dependency; imported here so `import prompt` stays numpy-only

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    with path.open() as f:
        try:
            data = yaml.load(f, Loader=_unique_loader())
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None and not empty_ok:
        raise ConfigError(f"{path}: the file is empty, so every field would be its default (the budget off); "
                          "write the fields, or {} for every default on purpose")
    data = data or {}
    for item in overrides:
        _override(data, item, yaml)
    return from_dict(cls, data, where=str(path) + (f" with {list(overrides)}" if overrides else ""))


def _override(data: dict, item: str, yaml) -> None:
    key, eq, value = item.partition("=")
    if not eq or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. run.out=runs/x")
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
    try:
        node[leaf] = yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML: {e}") from None


def load_named(cls, name_or_path: str | Path, folder: Path, what: str, whats: str, empty_ok: bool = True):
    """A preset name (folder/NAME.yaml) or a path to a YAML file -> the checked dataclass `cls`.
    `what` / `whats` name one preset and several in the error ("planner profile", "profiles")."""
    path = Path(name_or_path)
    if not path.suffix:
        path = Path(folder) / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(folder).glob("*.yaml"))
        raise ConfigError(f"{what} {str(name_or_path)!r} not found; known {whats}: {known}")
    return load_yaml(cls, path, empty_ok)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (artifact hashes in meta.json)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: str | Path, what: str):
    """Parse a JSON file; a missing or malformed file is a ConfigError naming `what` and the path."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {str(path)!r} is not valid JSON: {e}") from None
