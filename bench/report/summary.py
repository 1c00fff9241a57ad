"""The committed evidence of every published table: one small stamped summary JSON per registry run.

A run's own JSON (out/..., runs/...) holds per-cycle logs and is not in git. `specdrive report`
keeps, for each run, only the fields its tables' renderers read, in `results/RUN.json`:

    {"run": NAME, "outputs": {OUTPUT: {"stamp": {...}, ...the fields read...}, ...}}

one entry per output of the run (bench/report/registry.py RUNS), in its order. The tables are then
rendered from these summaries, so a clone with no out/ or runs/ renders (and `report --check`
compares) every table from what git holds. Which fields are read is found by rendering once on a
record that notes every key looked up (Noted); the summary is then rendered again and must give
the same markdown as the full record, or summarize raises.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from core.config import ConfigError

FOLDER = Path("results")


def path_of(run: str) -> Path:
    return FOLDER / f"{run}.json"


class _Seen:
    """The key paths looked up in one record, its prefixes included."""

    def __init__(self):
        self.paths: set[tuple] = {()}

    def add(self, path: tuple) -> None:
        for i in range(len(path) + 1):
            self.paths.add(path[:i])


class NotedDict(dict):
    """A dict that notes every key looked up (item, get, in) in a shared _Seen; iterating it
    (iter, keys, items, values, list(d), {**d}) notes all its keys."""

    def __init__(self, data: dict, seen: _Seen, path: tuple):
        super().__init__({k: noted(v, seen, path + (k,)) for k, v in data.items()})
        self._seen, self._path = seen, path

    def _note(self, key) -> None:
        self._seen.add(self._path + (key,))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def _note_all(self) -> None:
        for k in super().keys():
            self._note(k)

    def __iter__(self):
        self._note_all()
        return super().__iter__()

    def keys(self):
        self._note_all()
        return super().keys()

    def items(self):
        self._note_all()
        return super().items()

    def values(self):
        self._note_all()
        return super().values()


class NotedList(list):
    def __init__(self, data: list, seen: _Seen, path: tuple):
        super().__init__(noted(v, seen, path + (i,)) for i, v in enumerate(data))


def noted(value, seen: _Seen, path: tuple = ()):
    if isinstance(value, dict):
        return NotedDict(value, seen, path)
    if isinstance(value, list):
        return NotedList(value, seen, path)
    return value


def keep(value, seen: _Seen, path: tuple = ()):
    """`value` with only the dict keys whose paths were looked up (lists keep every element)."""
    if isinstance(value, dict):
        return {k: keep(v, seen, path + (k,)) for k, v in value.items() if path + (k,) in seen.paths}
    if isinstance(value, list):
        return [keep(v, seen, path + (i,)) for i, v in enumerate(value)]
    return value


def summarize(records: dict[str, list[dict]], tables: dict[str, tuple[tuple[str, ...], Callable]]) -> dict:
    """{run: [summary per output]} of full `records` ({run: [record per output]}): each record
    cut to the fields the renderers of `tables` ({name: (runs, render)}) read, plus its stamp.
    Every table reading only runs of `records` is rendered from the summaries again and must give
    the same markdown as from the full records (ConfigError naming the table otherwise)."""
    seen = {run: [_Seen() for _ in recs] for run, recs in records.items()}
    for runs, render in tables.values():
        if all(r in records for r in runs):
            render([noted(rec, seen[r][i]) for r in runs for i, rec in enumerate(records[r])])
    out = {run: [{"stamp": rec.get("stamp"), **keep(rec, s)} for rec, s in zip(recs, seen[run])]
           for run, recs in records.items()}
    for name, (runs, render) in tables.items():
        if all(r in records for r in runs):
            full = render([rec for r in runs for rec in records[r]])
            try:
                same = render([rec for r in runs for rec in out[r]]) == full
            except (KeyError, IndexError, TypeError, ValueError) as e:
                same = f"{type(e).__name__}: {e}"
            if same is not True:
                raise ConfigError(f"table {name!r}: its renderer reads a field the summary did not keep "
                                  f"(a lookup Noted does not see; {same or 'other markdown'}); bench/report/summary.py")
    return out


def document(run: str, outputs: tuple[str, ...], summaries: list[dict], compact: bool = False) -> str:
    """The text of results/RUN.json: indented (compact: one line, for a summary of per-scene
    records that would be megabytes indented), keys in the records' order, one trailing newline."""
    doc = {"run": run, "outputs": dict(zip(outputs, summaries))}
    if compact:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def read(run: str, outputs: tuple[str, ...], root: Path = Path(".")) -> list[dict] | None:
    """The committed summaries of `run` (one per output, in order), or None when results/RUN.json
    is not there. ConfigError when it is not JSON or does not hold exactly the run's outputs."""
    p = root / path_of(run)
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON ({e}); `specdrive report` rewrites it from the run's own JSON") from e
    got = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(got, dict) or list(got) != list(outputs):
        raise ConfigError(f"{p}: must hold {{'run': {run!r}, 'outputs': {{...}}}} with the outputs "
                          f"{list(outputs)} in that order; it holds {list(got or {})}")
    return [got[o] for o in outputs]
