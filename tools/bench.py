"""`specdrive bench`: speculative vs plain decoding in one process, on the same scenes.

    specdrive bench (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                    [--drafts a,b] [--backend torch] [--ks 4,8] [--no-adaptive] [--trees "16,8,4;32,8,8"] [--aa]
                    [--scenes N --seed S | --data DIR --split S] [--repeats R] [--threads T] --json OUT
    specdrive bench ... --drives DIR [--drive-count N] [--cycles C] [--modes M,..] --json OUT
    specdrive bench --checkpoint DIR --stream-breakdown [--seed 11] [--cycles 20] --json OUT

What it measures: bench/bench/ (snapshots; stream_breakdown.py), bench/bench/drives/ (--drives), called with a typed config.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.bench import command as snapshots, stream_breakdown
from bench.bench.drives import command as drives_command
from bench.bench.drives.measure import DriveBenchConfig
from bench.bench.measure import BenchConfig
from core.config import ConfigError
from scenes.config import DT, MAX_DRIVE_SECONDS, MAX_DRIVES
from tools.argtypes import MAX_THREADS, add_source_args, count, int_list, integer, model_source, out_file, tree_list


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="speculative vs plain decoding: speedup, identity, where accepted",
                              description=__doc__.splitlines()[0])
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    add_source_args(p, checkpoint_help="trained planner folder (tokenizer.json, target, expert, one or more drafts)")
    p.add_argument("--drafts", help="comma list: with --checkpoint the draft variants to run (default all); "
                   "with --preset any of self, noised:SIGMA, routine (default self,noised:0.02)")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA)")
    p.add_argument("--profile", default="cpu", help="planner profile configs/planner/NAME.yaml or a YAML path")
    p.add_argument("--ks", type=int_list(), default=(4, 8), help="fixed draft lengths, comma separated (default 4,8)")
    p.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive-k modes")
    p.add_argument("--aa", action="store_true", help="A/A control: the longest --ks chain twice (the run's noise)")
    p.add_argument("--trees", type=tree_list, default=(), help="token trees N,d,K ';'-separated (\"16,8,4;32,8,8\"): tree modes")
    p.add_argument("--scenes", type=integer, default=16, help="synthetic scenes (default 16)")
    p.add_argument("--seed", type=integer, default=0, help="seed of the first scene")
    p.add_argument("--split", default="test", help="with --data its split; else families and ranges only")
    p.add_argument("--data", type=Path, help="dataset folder: bench the first --scenes scenes of its --split")
    p.add_argument("--repeats", type=integer, default=3, help="timed rounds over all scenes and modes")
    p.add_argument("--warmup", type=integer, default=1, help="untimed cycles per mode first")
    p.add_argument("--budget-ms", type=float, default=0.0, help="planner budget in the timed cycles (default 0 = off, so every mode decodes the same tokens)")
    p.add_argument("--deadline-ms", type=float, default=None, help="cycles longer than this count as deadline misses (default: the profile's budget_ms)")
    p.add_argument("--max-reasoning", type=integer, default=None, help="reasoning tokens per cycle at most")
    p.add_argument("--threads", type=count(0, MAX_THREADS), default=1, help="torch CPU threads (0 = torch's default); 1 keeps timings steady")
    p.add_argument("--json", type=out_file, required=True, help="where the bench record goes")
    p.add_argument("--plot", type=out_file, help="speedup plot (default: OUT with .png)")
    p.add_argument("--accept-plot", type=out_file, help="where-accepted picture (default: OUT_accept.png)")
    p.add_argument("--picture-scene", type=integer, default=0, help="scene index of the where-accepted picture")
    p.add_argument("--drives", type=Path, help="drives folder (`scenes generate --drives`): whole drives in plain, speculative, reuse modes")
    p.add_argument("--drive-count", type=count(1, MAX_DRIVES), default=4, help="drives of the split to run (--drives; default 4)")
    p.add_argument("--cycles", type=count(0, round(MAX_DRIVE_SECONDS / DT)), default=0, help="cycles per drive at most (--drives; default 0 = whole "
                   "drives: 3 s of a drive can end before its event; --stream-breakdown: default 20)")
    p.add_argument("--expect-drives-fingerprint", metavar="SHA256", help="the --drives folder's pinned fingerprint")
    p.add_argument("--modes", help="comma list of drive modes besides plain (--drives; default all; spec+tree with --trees)")
    p.add_argument("--stream-breakdown", action="store_true", help="full against streamed prefill per stage, the drive of --seed")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The parsed arguments -> the typed config of one bench, drives bench or stream breakdown -> its library."""
    if args.drives is not None:     # whole drives, reuse against none
        return drives_command.run(drives_run(args))
    if args.stream_breakdown:
        return stream_breakdown.run(stream_breakdown.BreakdownRun(model_source(args), args.json, args.seed, args.cycles or 20,
                                                                  args.profile, args.threads, command_line(args)))
    if args.expect_drives_fingerprint is not None:
        raise ConfigError("--expect-drives-fingerprint pins the --drives folder, and no --drives was given; allowed: both or neither")
    return snapshots.run(snapshots_run(args))


def snapshots_run(args: argparse.Namespace) -> snapshots.BenchRun:
    measure = BenchConfig(scenes=args.scenes, seed=args.seed, split=args.split, data=args.data, repeats=args.repeats, warmup=args.warmup,
                          ks=args.ks, adaptive=not args.no_adaptive, trees=args.trees, aa=args.aa, budget_ms=args.budget_ms,
                          max_reasoning_tokens=args.max_reasoning, picture_scene=args.picture_scene, raw=args.device != "cpu")
    return snapshots.BenchRun(source=model_source(args), measure=measure, json=args.json, drafts=args.drafts, profile=args.profile,
                              deadline_ms=args.deadline_ms, threads=args.threads, plot=args.plot,
                              accept_plot=args.accept_plot, command=command_line(args))


def drives_run(args: argparse.Namespace) -> drives_command.DrivesRun:
    measure = DriveBenchConfig(drives=args.drive_count, cycles=args.cycles or None, split=args.split,
                               warmup=args.warmup, k=args.ks[0] if args.no_adaptive and args.ks else None,
                               max_reasoning_tokens=args.max_reasoning, tree=args.trees[0] if args.trees else None,
                               modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()) if args.modes else None)
    return drives_command.DrivesRun(source=model_source(args), drives_dir=args.drives, measure=measure, json=args.json,
                                    drafts=args.drafts, profile=args.profile, threads=args.threads, command=command_line(args),
                                    expect_drives_fingerprint=args.expect_drives_fingerprint)


def command_line(args: argparse.Namespace) -> str:
    """How to rerun this bench: `specdrive bench` and the arguments it was given."""
    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[1:]
        argv = argv[argv.index("bench") + 1:] if "bench" in argv else argv
    return " ".join(["specdrive bench", *argv])


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.bench ...` (the same as `specdrive bench ...`)."""
    parser = argparse.ArgumentParser(prog="specdrive bench", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except ConfigError as e:
        parser.exit(2, f"specdrive bench: error: {e}\n")


if __name__ == "__main__":
    raise SystemExit(main())
