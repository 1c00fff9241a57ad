"""The one `specdrive` command: parses arguments and hands each subcommand to its library function.

Subcommands live where their work lives; this file only wires them. Heavy imports (torch,
onnxruntime, ...) happen inside a subcommand, never at start-up, so `specdrive --help` is instant.
"""
from __future__ import annotations

import argparse
import sys

from core.config import ConfigError


class UsageError(ConfigError):
    """A bad argument or config value: the message names it and what is allowed (exit status 2)."""


def _subcommands():
    # name -> "module:function" that receives the subparsers object and adds itself
    return {
        "scenes": "tools.scenes_cli:add_parser",
        "plan": "tools.plan:add_parser",
        "demo": "tools.demo:add_parser",
        "train": "tools.train_cli:add_parser",
        "bench": "tools.bench:add_parser",
        "trajectory-cost": "tools.trajectory_cost:add_parser",
        "profile": "tools.profile:add_parser",
        "roofline": "tools.roofline:add_parser",
        "timeline": "tools.timeline:add_parser",
        "export": "tools.export:add_parser",
        "engines": "tools.engines:add_parser",
        "calibrate": "tools.calibrate:add_parser",
        "drive": "tools.closed_loop:add_parser",
        "report": "tools.report:add_parser",
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
            if e.name == module_name:
                continue  # that stage has not landed yet
            if e.name not in OPTIONAL:
                raise
            _needs(sub, name, e.name)   # a runtime-only install: say what the command needs
            continue
        getattr(module, func)(sub)
    return parser


# packages the vehicle-side install (`pip install .[ort-cpu]`) leaves out -> the extra that brings each
OPTIONAL = {"torch": "torch", "modelopt": "quant"}


def _needs(sub, name: str, package: str) -> None:
    """A subcommand whose module needs a package that is not installed: it exits 2 saying so."""
    def run(args):
        raise UsageError(f"`specdrive {name}` needs {package!r}, which is not installed here; "
                         f"install it: pip install '.[{OPTIONAL[package]}]'")
    p = sub.add_parser(name, help=f"(needs {package})", add_help=False)
    p.add_argument("rest", nargs="*")
    p.set_defaults(run=run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (UsageError, ConfigError) as e:
        # the message names the bad value and what is allowed
        parser.exit(2, f"specdrive {args.command}: error: {e}\n")
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL:
            raise
        parser.exit(2, f"specdrive {args.command}: error: this needs {e.name!r}, which is not installed "
                       f"here; install it: pip install '.[{OPTIONAL[e.name]}]'\n")


if __name__ == "__main__":
    sys.exit(main())
