"""`specdrive profile`: N planner cycles with named ranges on every stage and engine call.

    specdrive profile (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                      [--profile cpu] [--cycles N] [--warmup W] [--threads T] [--device cpu|cuda]
                      [--no-nsys] --out DIR

What it measures and writes: bench/profile_run.py (the library this command calls).
"""
from __future__ import annotations


from bench.profiling import command as profile_run
from bench.common.sources import add_source_args
from tools.argtypes import count, out_folder


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="profile planner cycles (Nsight Systems, or ranges recorded here)",
                              description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--draft", default=None, help="draft variant, 'self' or 'none' (plain decoding)")
    p.add_argument("--backend", default=None, choices=["torch", "onnxruntime", "tensorrt", "tensorrt-llm"])
    p.add_argument("--profile", default="cpu", help="planner profile configs/planner/NAME.yaml")
    p.add_argument("--cycles", type=count(1), default=16, help="measured cycles, one per synthetic scene")
    p.add_argument("--warmup", type=count(0), default=2, help="cycles before the capture range")
    p.add_argument("--seed", type=int, default=0, help="first synthetic scene")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA)")
    p.add_argument("--threads", type=count(1), default=1, help="torch CPU threads (bench/threads.py)")
    p.add_argument("--no-nsys", action="store_true", help="record the ranges here even where nsys is")
    p.add_argument("--nvtx", action="store_true", help="also emit NVTX ranges (set for the child of nsys)")
    p.add_argument("--out", type=out_folder, required=True)
    p.set_defaults(run=profile_run.run)
