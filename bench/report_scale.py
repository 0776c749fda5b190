#!/usr/bin/env python3
"""The run history and report.html at scale: synthetic verdicts of 10, 100 and 1000 nodes.

For each size, records ``--runs`` verdicts into a fresh history database (cluster_preflight/outputs/history.py) and
writes report.html with each node's sparkline from it (cluster_preflight/outputs/report.py), as the verdict task
does after every run.  Prints the seconds of one history write (median), of the report (median) and the
report's size.  Target: a 1000-node report in well under 5 s and a few MB.  Use the project's venv:
    .venv/bin/python bench/report_scale.py [--sizes 10,100,1000] [--runs 5]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from cluster_preflight.outputs import history, report  # noqa: E402  pylint: disable=wrong-import-position
from report_helpers import synthetic_verdict  # noqa: E402  pylint: disable=wrong-import-position


def measure(count, runs):
    failed = tuple("node%04d" % index for index in range(0, count, 37))
    with tempfile.TemporaryDirectory() as place:
        db = os.path.join(place, history.DB_FILE)
        writes, renders, size = [], [], 0
        for number in range(1, runs + 1):
            verdict = synthetic_verdict(count, failed=failed if number % 2 else (), localize=True,
                                        run_id="r%03d" % number, finished="2026-11-25T%02d:00:00Z" % (number % 24))
            start = time.perf_counter()
            result = history.record(db, verdict, "preflight", "x")
            writes.append(time.perf_counter() - start)
            if not result["recorded"]:
                raise SystemExit(result["warning"])
            run_dir = os.path.join(place, verdict["run_id"])
            os.mkdir(run_dir)
            start = time.perf_counter()
            path = report.write_report(verdict, run_dir, db)
            renders.append(time.perf_counter() - start)
            size = os.path.getsize(path)
    return statistics.median(writes), statistics.median(renders), size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000", help="node counts, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="runs recorded per size (the sparklines' history)")
    args = parser.parse_args()
    print("%6s  %12s  %12s  %12s" % ("nodes", "history s", "report s", "report KiB"))
    for count in [int(item) for item in args.sizes.split(",")]:
        write, render, size = measure(count, args.runs)
        print("%6d  %12.3f  %12.3f  %12.0f" % (count, write, render, size / 1024.0))


if __name__ == "__main__":
    main()
