"""Pictures of a run's cycles (the cycles.jsonl that `specdrive plan` and `specdrive profile` write).

    specdrive timeline RUN/cycles.jsonl [--out DIR]

What it measures and writes: bench/profile/timeline.py (the library this command calls).
"""
from __future__ import annotations


from bench.profile import timeline
from tools.argtypes import input_file, out_folder


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("timeline", help="pictures of a run's cycles.jsonl (timeline, stages, accepted)",
                              description=__doc__.splitlines()[0])
    p.add_argument("cycles", type=input_file, help="cycles.jsonl of `specdrive plan` or `specdrive profile`")
    p.add_argument("--out", type=out_folder, help="folder of the pictures (default: beside the file)")
    p.set_defaults(run=lambda a: print(timeline.draw_all(timeline.load_cycles(a.cycles), a.out or a.cycles.parent)) or 0)
