"""The `tracea` command."""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import TraceaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracea", description="Tracea, an MLIR-based kernel compiler.")
    parser.add_argument("--version", action="version", version=f"tracea {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="compile and run a transformer block on the CPU, check it, time it")
    demo.add_argument("--batch", type=int, default=2)
    demo.add_argument("--seq", type=int, default=128)
    demo.add_argument("--dim", type=int, default=128)
    demo.add_argument("--hidden", type=int, default=512)
    demo.add_argument("--vocab", type=int, default=256)
    demo.add_argument("--repeat", type=int, default=5, help="timed runs (median reported)")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "demo":
            from .demo import run
            ok = run(args.batch, args.seq, args.dim, args.hidden, args.vocab, args.repeat)
            return 0 if ok else 1
    except TraceaError as e:
        print(f"tracea: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
