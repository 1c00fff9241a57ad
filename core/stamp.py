"""The stamp every results JSON carries: which checkpoint, which command, when, at which commit.

Every command whose output feeds a table in README.md or docs/ (bench, bench --drives, bench on
onnxruntime, the precision report, profile, drive, roofline, train eval) writes
`record["stamp"] = results_stamp(...)`; `specdrive report` renders the tables from those JSONs and
puts the stamp's fingerprint in each table's marker, and tests/test_results_stamps.py fails when a
marker's fingerprint is not the shipped checkpoint's. The fingerprint is
core/artifacts.py `folder_fingerprint` of the checkpoint folder (the one `specdrive plan`,
`bench` and `drive` print at start); a command that already computed it passes it in.
"""
from __future__ import annotations

import datetime
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.artifacts import META, CheckpointMeta, folder_fingerprint, read_engines_meta, read_meta
from core.config import ConfigError

SHIPPED = Path("checkpoints/tiny")      # the checkpoint the published tables are measured on


def command_line(argv: list[str] | None = None, prog: str = "specdrive") -> str:
    """This process's command line as a user types it: `specdrive SUBCOMMAND ARGS`."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([prog, *(shlex.quote(a) for a in args)])


def git_commit(where: Path | None = None) -> dict:
    """{"commit": HEAD's sha, "dirty": whether tracked files differ from it}; Nones outside a git
    work tree or without git."""
    cwd = str(where or Path.cwd())
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=30)
        return {"commit": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def results_stamp(checkpoint, fingerprints: dict | None = None, command: str | None = None,
                  reads_checkpoint: bool = True, **extra) -> dict:
    """The stamp of one results JSON.

    checkpoint: the checkpoint folder the numbers come from (None: random-init presets). fingerprints: {folder: fingerprint}
    as bench/common/sources.py `announce_fingerprints` returned them (the checkpoint's is taken
    from there, not hashed again); otherwise the folder is fingerprinted here. command: the
    command line (default: this process's). reads_checkpoint False: the numbers do not read the
    checkpoint (a roofline projection); the stamp then names the checkpoint shipped beside the
    code when they were made, and says so. extra: more fields (e.g. the engines folder)."""
    fp = None
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        fp = (fingerprints or {}).get(str(checkpoint)) or folder_fingerprint(checkpoint)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    out = {"checkpoint": None if checkpoint is None else str(checkpoint), "fingerprint": fp, "command": command or command_line(),
           "date": now.isoformat().replace("+00:00", "Z"), **git_commit()}
    if not reads_checkpoint:
        out["note"] = "the numbers do not read the checkpoint; it is the one shipped with the code at the run"
    out.update(extra)
    return out


def engines_stamp(engines, command: str | None = None, **extra) -> dict:
    """The stamp of a run on an exported engines folder: its source checkpoint (meta.json
    `source`), when every module sha256 the export recorded is still that folder's; otherwise the
    stamp's fingerprint is None and its note says which module differs (the numbers are then of
    no checkpoint in the tree, and `specdrive report --run-stale` re-runs them)."""
    checkpoint, problem = engines_checkpoint(engines)
    if problem is not None:
        out = results_stamp(None, command=command, engines=str(engines), **extra)
        out["note"] = problem
        return out
    return results_stamp(checkpoint, command=command, engines=str(engines), **extra)


def engines_checkpoint(engines) -> tuple[Path | None, str | None]:
    """(the checkpoint folder an exported engines folder was made from, None) when every module
    sha256 its meta.json `source` recorded is still that folder's; else (None, why not)."""
    where = Path(engines) / META
    try:
        source = read_engines_meta(engines).source
    except ConfigError as e:
        return None, f"{where}: not an export this code reads ({e})"
    if source is None:
        return None, f"{where}: no source.checkpoint (re-export the folder: `specdrive export onnx`)"
    for kind, model in source.models.items():
        folder = Path(model["folder"])
        if not (folder / META).is_file():
            return None, f"{where}: its {kind} came from {folder}, which has no meta.json now"
        now = _module_hashes(folder)
        if now is None:
            return None, f"{where}: its {kind} came from {folder}, whose meta.json is no checkpoint's now"
        for name, sha in model["modules"].items():
            have = now.get(name)
            if have != sha:
                return None, (f"{where}: its {kind} module {name!r} was exported from sha256 {sha[:12]}, but "
                              f"{folder} now holds {str(have)[:12]}: the graphs are of another checkpoint")
    return Path(source.checkpoint), None


def _module_hashes(folder: Path) -> dict | None:
    """{module: sha256} of a checkpoint folder (its card); None when it holds no checkpoint."""
    try:
        meta = read_meta(folder)
    except ConfigError:
        return None
    return {n: m.sha256 for n, m in meta.modules.items()} if isinstance(meta, CheckpointMeta) else None


# --- the markers a rendered table sits between, in README.md and docs/*.md -----------------------
#
#   <!-- results NAME fingerprint=<64 hex> -->
#   *Rendered by `specdrive report` from OUT.json: `COMMAND`, DATE, commit ABC, checkpoint ... .*
#
#   | the table |
#   <!-- /results NAME -->
#
# A table of no measured number (flags, files, folders) says so on the line before it:
#   <!-- reference table -->

OPEN = re.compile(r"<!-- results (?P<name>[a-z0-9][a-z0-9-]*) fingerprint=(?P<fp>[0-9a-f]{64}|unknown) -->")
CLOSE = re.compile(r"<!-- /results (?P<name>[a-z0-9][a-z0-9-]*) -->")
REFERENCE = "<!-- reference table -->"
SEPARATOR = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$")


@dataclass(frozen=True)
class Block:
    """One marked table: its name, the fingerprint its opening marker carries, and the lines
    (0-based) of its opening and closing markers."""
    name: str
    fingerprint: str
    open_line: int
    close_line: int


def blocks(text: str, where: str = "markdown") -> list[Block]:
    """Every results block of a markdown text, checked: each opening marker is closed by the
    closing marker of the same name before the next opens, no name twice, no stray closing
    marker, no malformed marker (ConfigError naming the file and line)."""
    out, open_ = [], None
    for i, line in enumerate(text.split("\n")):
        s = line.strip()
        if s.startswith("<!-- results ") or s.startswith("<!-- /results"):
            m_open, m_close = OPEN.fullmatch(s), CLOSE.fullmatch(s)
            if m_open is None and m_close is None:
                raise ConfigError(f"{where}:{i + 1}: malformed results marker {s!r}; allowed: "
                                  "'<!-- results NAME fingerprint=<64 hex> -->' and '<!-- /results NAME -->'")
            if m_open is not None:
                if open_ is not None:
                    raise ConfigError(f"{where}:{i + 1}: results marker {m_open['name']!r} opens inside "
                                      f"{open_[0]!r} (opened at line {open_[2] + 1}); close that one first")
                open_ = (m_open["name"], m_open["fp"], i)
            else:
                if open_ is None or open_[0] != m_close["name"]:
                    what = "nothing is open" if open_ is None else f"{open_[0]!r} is open (line {open_[2] + 1})"
                    raise ConfigError(f"{where}:{i + 1}: closing marker of {m_close['name']!r}, but {what}")
                out.append(Block(open_[0], open_[1], open_[2], i))
                open_ = None
    if open_ is not None:
        raise ConfigError(f"{where}:{open_[2] + 1}: results marker {open_[0]!r} is never closed "
                          f"(add '<!-- /results {open_[0]} -->' after its table)")
    names = [b.name for b in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: results block(s) {twice} appear more than once; each name once per file")
    return out


def replace_block(text: str, name: str, fingerprint: str | None, body: str, where: str = "markdown") -> str:
    """`text` with block `name`'s content replaced by `body` and its opening marker's
    fingerprint by `fingerprint` (None: 'unknown'); every other line as it was. ConfigError
    when the markers are unbalanced or the block is not there."""
    found = {b.name: b for b in blocks(text, where)}
    if name not in found:
        raise ConfigError(f"{where}: no results block {name!r}; put the table between "
                          f"'<!-- results {name} fingerprint=unknown -->' and '<!-- /results {name} -->'")
    b, lines = found[name], text.split("\n")
    marker = f"<!-- results {name} fingerprint={fingerprint or 'unknown'} -->"
    indent = lines[b.open_line][: len(lines[b.open_line]) - len(lines[b.open_line].lstrip())]
    return "\n".join(lines[: b.open_line] + [indent + marker] + body.strip("\n").split("\n")
                     + lines[b.close_line:])


def stamp_line(stamp: dict | None, source: str, by: str = "specdrive report", full_fingerprint: bool = False) -> str:
    """What a reader sees under the opening marker (or under a model card's title, `by` the command
    that wrote the card, with the whole fingerprint): where the numbers come from."""
    stamp = stamp or {}
    commit = stamp.get("commit")
    commit = "" if not commit else f", commit {commit[:10]}" + (" (with local changes)" if stamp.get("dirty") else "")
    fp = stamp.get("fingerprint")
    ck = (f"checkpoint `{stamp.get('checkpoint')}` (fingerprint `{fp if full_fingerprint else fp[:12] + '…'}`)" if fp
          else "no checkpoint fingerprint" + (f" ({stamp['note']})" if stamp.get("note") else ""))
    return (f"*Rendered by `{by}` from `{source}`: `{stamp.get('command')}`, "
            f"{stamp.get('date')}{commit}; {ck}.*")


def tables_outside(text: str, where: str = "markdown") -> list[str]:
    """Markdown tables (a `|---|` separator line) outside every results block and not marked
    `<!-- reference table -->` on the line before the table: 'FILE:LINE: header' each. Tables in
    fenced code blocks do not render and are not counted."""
    lines = text.split("\n")
    inside = set()
    for b in blocks(text, where):
        inside.update(range(b.open_line, b.close_line + 1))
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or i in inside or not SEPARATOR.match(line) or i == 0:
            continue
        if i >= 2 and lines[i - 2].strip() == REFERENCE:
            continue
        out.append(f"{where}:{i}: {lines[i - 1].strip()[:80]}")
    return out


def stale_markers(text: str, fingerprint: str, where: str = "markdown") -> list[str]:
    """Results blocks whose opening marker carries another fingerprint than `fingerprint`."""
    return [f"{where}:{b.open_line + 1}: {b.name} fingerprint={b.fingerprint[:12]}"
            for b in blocks(text, where) if b.fingerprint != fingerprint]


def published_files(root) -> list[Path]:
    """The markdown whose tables are published: README.md and docs/*.md under `root`."""
    root = Path(root)
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def published_problems(root, fingerprint: str) -> list[str]:
    """Every results marker of README.md and docs/*.md with another fingerprint than
    `fingerprint`, and every table outside the markers not marked as a reference table
    (ConfigError on unbalanced markers). Empty when every table is rendered on that checkpoint."""
    root, out = Path(root), []
    for p in published_files(root):
        text, where = p.read_text(), p.relative_to(root).as_posix()
        out += [f"{s} (not the shipped checkpoint's {fingerprint[:12]})" for s in stale_markers(text, fingerprint, where)]
        out += [f"{s} (a table outside any results marker; mark it '{REFERENCE}' if it holds no measured number)"
                for s in tables_outside(text, where)]
    return out
