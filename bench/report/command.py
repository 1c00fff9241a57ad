"""`specdrive report` (tools/report.py): re-render every measurement table of README.md and docs/
from its run's committed summary (results/RUN.json, bench/report/summary.py), first cut afresh from
the run's own stamped JSON where that is there; with run_stale, first re-run each run
(bench/report/registry.py) that has neither, or is stamped with another checkpoint than checkpoints/tiny.

Each table sits between `<!-- results NAME fingerprint=... -->` and `<!-- /results NAME -->`
(core/stamp.py). A run with neither JSON nor summary is a ConfigError (exit 2) naming the table
and the command to run, unless the registry says why its summary is not kept (`unkept`): its
tables are then left as written, and a line says so. check: write nothing; 1 when a table or a
summary would change, or is stale.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.report import registry, summary
from core.config import ConfigError
from core.stamp import SHIPPED, folder_fingerprint, replace_block, stale_markers, stamp_line


@dataclass(frozen=True)
class ReportRun:
    run_stale: bool = False
    only: str | None = None        # comma list of tables (None: all)
    check: bool = False


def argv_of(command: str) -> list[str]:
    """A registry command line -> what to execute: `specdrive X` runs this Python's tools.cli."""
    args = shlex.split(command)
    if args[0] == "specdrive":
        return [sys.executable, "-m", "tools.cli", *args[1:]]
    if args[0] == "make":
        return args
    raise ConfigError(f"registry command {command!r}: must start with 'specdrive' or 'make'")


def load(path: str) -> dict | None:
    """A results JSON: an object whose stamp, when there is one, is an object; None when missing;
    else a ConfigError naming what is wrong (not UTF-8, not JSON, nested too deep, another type)."""
    p = Path(path)
    if not p.is_file():
        return None
    redo = "re-run the command that writes it (bench/report/registry.py) or `specdrive report --run-stale`"
    try:
        rec = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); allowed: the results JSON its command writes; {redo}") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested deeper than a results file is (the reader's limit is "
                          f"{sys.getrecursionlimit()} levels); allowed: the results JSON its command writes; {redo}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e}); {redo}") from None
    if not isinstance(rec, dict):
        raise ConfigError(f"{path}: a JSON {type(rec).__name__}, where a results object belongs; {redo}")
    if "stamp" in rec and not isinstance(rec["stamp"], dict):
        raise ConfigError(f"{path}: its stamp is a {type(rec['stamp']).__name__}, where an object (checkpoint, "
                          f"fingerprint, command, date) belongs; {redo}")
    return rec


def staleness(name: str, current: str) -> str | None:
    """Why run `name` must run again (no JSON of its own and no committed summary, an unreadable
    JSON, no stamp, another fingerprint), or None. The run's own JSONs are judged when they are
    all there, else results/NAME.json."""
    outputs = registry.RUNS[name].outputs
    try:
        recs = full_records(name)
    except ConfigError as e:
        return str(e)
    where = list(outputs)
    if recs is None:
        recs, where = summary.read(name, outputs), [str(summary.path_of(name))] * len(outputs)
        if recs is None:
            return f"{' and '.join(o for o in outputs if not Path(o).is_file())} is missing (and no {summary.path_of(name)})"
    for out, rec in zip(where, recs):
        stamp = rec.get("stamp") if isinstance(rec, dict) else None
        if not isinstance(stamp, dict):
            return f"{out} has no stamp"
        if stamp.get("fingerprint") != current:
            return f"{out} is stamped {str(stamp.get('fingerprint'))[:12]}, not {current[:12]}"
    return None


def tables_of(only: str | None) -> list[str]:
    if only is None:
        return list(registry.TABLES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    bad = [n for n in names if n not in registry.TABLES]
    if bad or not names:
        raise ConfigError(f"--only {only!r}: unknown table(s) {bad}; tables: {', '.join(registry.TABLES)}")
    return names


def run_stale(tables: list[str], current: str) -> None:
    runs = list(dict.fromkeys(r for t in tables for r in registry.TABLES[t].runs))
    for i, name in enumerate(runs, 1):
        why = staleness(name, current)
        if why is None:
            print(f"report: [{i}/{len(runs)}] {name}: fresh", flush=True)
            continue
        print(f"report: [{i}/{len(runs)}] {name}: {why}; running {len(registry.RUNS[name].commands)} command(s)",
              flush=True)
        for cmd in registry.RUNS[name].commands:
            print(f"report:   $ {cmd}", flush=True)
            rc = subprocess.run(argv_of(cmd)).returncode
            if rc != 0:
                raise ConfigError(f"run {name!r}: `{cmd}` exited {rc}; fix it and run `specdrive report --run-stale` again")
        why = staleness(name, current)
        if why is not None:
            raise ConfigError(f"run {name!r} ran, but {why}")


def full_records(run: str) -> list[dict] | None:
    """The run's own JSONs (out/..., runs/...), one per output, or None unless every one is there."""
    recs = [load(out) for out in registry.RUNS[run].outputs]
    return None if any(r is None for r in recs) else recs


def summaries(tables: list[str], check: bool, current: str) -> tuple[dict, list[str]]:
    """{run: [summary per output]} for every run the tables read: cut from the run's own JSONs where
    they are all there (results/RUN.json rewritten unless check), else results/RUN.json as
    committed. Also the summary files that would change (check) or changed."""
    wanted = list(dict.fromkeys(r for t in tables for r in registry.TABLES[t].runs))
    full = {r: recs for r in wanted if (recs := full_records(r)) is not None}
    stale = [why for r in full if (why := staleness(r, current)) is not None]
    if stale and not check:
        raise ConfigError(f"report: {'; '.join(stale)}: a summary is cut only from results stamped with "
                          "checkpoints/tiny's fingerprint; nothing was written. Run `specdrive report --run-stale` "
                          "(or the run's commands), or `specdrive report --check` to see what differs")
    readers = {n: t for n, t in registry.TABLES.items() if set(t.runs) & set(full)}
    around = {r for t in readers.values() for r in t.runs} | set(wanted)
    records = {r: full.get(r) or summary.read(r, registry.RUNS[r].outputs) for r in around}
    records = {r: recs for r, recs in records.items() if recs is not None}
    try:
        cut = summary.summarize(records, {n: (t.runs, t.render) for n, t in readers.items()
                                          if all(r in records for r in t.runs)})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        outs = [o for r in sorted(full) for o in registry.RUNS[r].outputs]
        raise ConfigError(f"report: {', '.join(outs)} is not the results JSON its runs write ({type(e).__name__}: "
                          f"{e}); allowed: each run's own JSON; re-run it or `specdrive report --run-stale`") from None
    out, changed = {r: records[r] for r in wanted if r in records}, []
    for r in full:
        run = registry.RUNS[r]
        text, path = summary.document(r, run.outputs, cut[r], run.compact), summary.path_of(r)
        out[r] = cut[r]
        if not path.is_file() or path.read_text() != text:
            changed.append(str(path))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return out, changed


def render(tables: list[str], check: bool, current: str) -> int:
    texts, problems = {}, []
    records_of, changed_summaries = summaries(tables, check, current)
    for f in changed_summaries:
        print(f"report: {f} {'would change' if check else 'written'}: cut from the run's own JSON", flush=True)
    for t in tables:
        entry = registry.TABLES[t]
        unkept = [registry.RUNS[r].unkept for r in entry.runs if r not in records_of and registry.RUNS[r].unkept]
        if unkept:
            print(f"report: {t}: not rendered, and not checked from git: {'; '.join(unkept)}", flush=True)
            continue
        records, stamps = [], []
        for run in entry.runs:
            if run not in records_of:
                raise ConfigError(f"table {t!r}: neither {', '.join(registry.RUNS[run].outputs)} nor "
                                  f"{summary.path_of(run)} is there; run `{' && '.join(registry.RUNS[run].commands)}` "
                                  "or `specdrive report --run-stale`")
            for out, rec in zip(registry.RUNS[run].outputs, records_of[run]):
                records.append(rec)
                stamps.append((out, rec.get("stamp") or {}))
        fps = {s.get("fingerprint") for _, s in stamps}
        fp = fps.pop() if len(fps) == 1 else None
        if fp != current:
            problems.append(f"{t}: stamped {', '.join(sorted(str(f)[:12] for f in ({fp} | fps)))}, "
                            f"not checkpoints/tiny's {current[:12]}")
        body = "\n\n".join(stamp_line(s, out) for out, s in stamps) + "\n\n" + _rendered(t, entry, records)
        for f in entry.files:
            texts.setdefault(f, Path(f).read_text())
            texts[f] = replace_block(texts[f], t, fp, body, f)
        print(f"report: {t}: {'checked against' if check else 'rendered into'} {', '.join(entry.files)}", flush=True)
    if problems and not check:
        raise ConfigError(f"report: {'; '.join(problems)}: a table is rendered only from results stamped with "
                          "checkpoints/tiny's fingerprint; nothing was written. Run `specdrive report --run-stale` "
                          "(or the table's commands), or `specdrive report --check` to see what differs")
    changed = [f for f, text in texts.items() if Path(f).read_text() != text]
    if check:
        for f in changed:
            print(f"report: {f} would change", flush=True)
    else:
        for f in changed:
            Path(f).write_text(texts[f])
    for p in problems:
        print(f"report: stale: {p}", flush=True)
    others = [s for f in texts for s in stale_markers(texts[f], current, f)]
    for s in others:
        print(f"report: marker not on the shipped checkpoint: {s}", flush=True)
    return 1 if check and (changed or problems or changed_summaries) else 0


def _rendered(name: str, entry, records: list[dict]) -> str:
    """The table `name` rendered from `records`, or a ConfigError when they are not what its runs
    write (another run's JSON, a field missing, a number written as a string)."""
    try:
        return entry.render(records)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        runs = [c for r in entry.runs for c in registry.RUNS[r].commands]
        outs = [o for r in entry.runs for o in registry.RUNS[r].outputs]
        raise ConfigError(f"table {name!r}: {', '.join(outs)} is not the results JSON its runs write "
                          f"({type(e).__name__}: {e}); allowed: the JSON of `{' && '.join(runs)}`; re-run it "
                          "or `specdrive report --run-stale`") from None


def run(cfg: ReportRun) -> int:
    """The command: optionally re-run what is stale, then render every table asked for."""
    tables = tables_of(cfg.only)
    current = folder_fingerprint(SHIPPED)
    print(f"report: checkpoints/tiny fingerprint {current}", flush=True)
    if cfg.run_stale and not cfg.check:
        run_stale(tables, current)
    return render(tables, cfg.check, current)
