"""python -m kvcache_ext {layout, capacity, demo, transfer}: see a plan, size a cache, run the
kernels, list the spans that move a request between two plans.

Bad arguments give one line on stderr and exit status 2 before anything else is printed;
no subcommand prints this help on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import capacity, demo, layout, transfer
from .args import CliError, Parser

SUBCOMMANDS = (layout, capacity, demo, transfer)  # each: add_parser(sub), setting func=


def build_parser() -> Parser:
    p = Parser(prog="python -m kvcache_ext", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{layout,capacity,demo,transfer}",
                           parser_class=Parser)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # usage and the list of subcommands, not a one-line error
        parser.print_help(sys.stderr)
        return 2
    try:
        args.func(args)
    except (CliError, ValueError, IndexError, KeyError, TypeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 0
