"""The one `specdrive` command: parses arguments and hands each subcommand to its library function.

Subcommands live where their work lives; this file only wires them. Heavy imports (torch,
onnxruntime, ...) happen inside a subcommand, never at start-up, so `specdrive --help` is instant.
"""
from __future__ import annotations

import argparse
import sys

from prompt.config import ConfigError


class UsageError(ConfigError):
    """A bad argument or config value: the message names it and what is allowed (exit status 2)."""


def _subcommands():
    # name -> "module:function" that receives the subparsers object and adds itself
    return {
        "scenes": "scenes.cli:add_parser",
        "plan": "tools.plan:add_parser",
        "demo": "tools.demo:add_parser",
        "train": "train.cli:add_parser",
        "bench": "tools.bench:add_parser",
        "trajectory-cost": "tools.trajectory_cost:add_parser",
        "profile": "tools.profile:add_parser",
        "roofline": "tools.roofline:add_parser",
        "timeline": "tools.timeline:add_parser",
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdrive", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    import importlib
    for name, target in _subcommands().items():
        module_name, func = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # that stage has not landed yet
        getattr(module, func)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (UsageError, ConfigError) as e:
        # the message names the bad value and what is allowed
        parser.exit(2, f"specdrive {args.command}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
