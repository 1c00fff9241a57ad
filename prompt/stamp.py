"""The stamp every results JSON carries: which checkpoint, which command, when, at which commit.

Every command whose output feeds a table in README.md or docs/ (bench, bench --drives, bench on
onnxruntime, the precision report, profile, drive, roofline, train eval) writes
`record["stamp"] = results_stamp(...)`; `specdrive report` renders the tables from those JSONs and
puts the stamp's fingerprint in each table's marker, and tests/test_results_stamps.py fails when a
marker's fingerprint is not the shipped checkpoint's. The fingerprint is
prompt/artifacts.py `folder_fingerprint` of the checkpoint folder (the one `specdrive plan`,
`bench` and `drive` print at start); a command that already computed it passes it in.
"""
from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
from pathlib import Path

from prompt.artifacts import folder_fingerprint
from prompt.config import ConfigError, read_json

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


def engines_checkpoint(engines) -> Path:
    """The checkpoint folder an exported engines folder was made from (its meta.json `source`),
    checked: every module sha256 the export recorded must still be that folder's (ConfigError
    naming the module otherwise), so the stamp's fingerprint is the checkpoint the graphs hold."""
    where = Path(engines) / "meta.json"
    meta = read_json(where, "engines meta.json")
    source = meta.get("source") if isinstance(meta, dict) else None
    if not isinstance(source, dict) or not isinstance(source.get("checkpoint"), str):
        raise ConfigError(f"{where}: no source.checkpoint; re-export the folder (`specdrive export onnx`)")
    for kind, model in (source.get("models") or {}).items():
        folder = Path(model["folder"])
        now = read_json(folder / "meta.json", f"{kind} meta.json") if (folder / "meta.json").is_file() else None
        if now is None:
            raise ConfigError(f"{where}: its {kind} came from {folder}, which has no meta.json now; "
                              "re-export from the shipped checkpoint")
        for name, sha in model.get("modules", {}).items():
            have = ((now.get("modules") or {}).get(name) or {}).get("sha256")
            if have != sha:
                raise ConfigError(f"{where}: its {kind} module {name!r} was exported from sha256 {sha[:12]}, but "
                                  f"{folder} now holds {str(have)[:12]}: the graphs are of another checkpoint; "
                                  "re-export (make engines-cpu)")
    return Path(source["checkpoint"])
