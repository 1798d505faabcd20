"""A compile worker of the tuner's pool: reads JSON lines {"text", "threads"} on stdin, compiles
each into the disk cache, answers a JSON line {"error": null or text} per request. A process of
its own (not multiprocessing): spawning would re-run the user's main module in each worker."""
from __future__ import annotations

import json
import sys


def main() -> None:
    import tracea
    from tracea.errors import TraceaError
    for line in sys.stdin:
        request = json.loads(line)
        try:
            tracea.compile(request["text"], threads=request["threads"])
            error = None
        except TraceaError as e:
            error = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
