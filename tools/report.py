"""`specdrive report`: re-render every measurement table of README.md and docs/ from its results.

    specdrive report [--run-stale] [--only NAME,...] [--check]

Each table sits between `<!-- results NAME fingerprint=... -->` and `<!-- /results NAME -->`;
bench/report/registry.py says which command makes its JSON and which renderer draws it. After a
run, `specdrive report` cuts the fields the tables read from its JSON (out/, runs/: not in git)
into results/RUN.json, stamped, and renders from that; a clone renders from results/ alone.
--run-stale (`make results`) first re-runs every run with neither, or stamped with another
checkpoint than checkpoints/tiny, one at a time, a progress line each. Without it a missing run
exits 2, naming the table and the command to run. --check writes nothing and exits 1 when a
table or a summary would change or is stale. The library: bench/report/command.py.
"""
from __future__ import annotations


def add_parser(subparsers) -> None:
    from bench.report import registry

    p = subparsers.add_parser("report", help="re-render the results tables of README.md and docs/ from their JSON",
                              description=__doc__.splitlines()[0])
    p.add_argument("--run-stale", action="store_true", help="first re-run every run whose JSON is missing or "
                   "stamped with another checkpoint than checkpoints/tiny (make results)")
    p.add_argument("--only", default=None, help=f"comma list of tables (default all): {', '.join(registry.TABLES)}")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table would change or is stale")
    p.set_defaults(run=run)


def run(args) -> int:
    from bench.report.command import ReportRun, run as report

    return report(ReportRun(run_stale=args.run_stale, only=args.only, check=args.check))
