"""What does recording each log line's time cost a chatty rank? Straight to a file vs the rank
wrapper (``trainhouse.executors.node.rank``), which copies the rank's output through a pipe into its
log and writes a time record per piece.

The two sides, in the same run, alternating ABBA
    file     ``python -c <print N lines, flushing each>`` with its stdout on a log file (what
             the rank wrapper did before it recorded times)
    wrapper  the same command under the rank wrapper, as torchrun starts it (its log and its
             time index ``rank-0.log.times`` in a temporary directory)

What it prints
    Per side the median wall time of the whole process and lines per second; the ratio
    wrapper / file (target <= 1.25: a rank that prints 200k lines a second flat out, far more
    than training prints, pays at most a quarter more for its prints) with PASS or BELOW
    TARGET, and how many time records the wrapper wrote (one per piece, not per line). Exits
    0 whatever the numbers (non-zero only when a run fails).

    python bench/logs.py [--lines 200000] [--repeats 5] [--json]
    python bench/logs.py --smoke     # 20,000 lines, one pair: a check, not a number
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainhouse.executors.node.torchrun import RANK_WRAPPER  # noqa: E402
from trainhouse.jobfs.layout import ATTEMPT_DIR_ENV, LOG_DIR_ENV  # noqa: E402

TARGET = 1.25

CHATTY = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "for i in range(n):\n"
    "    print(f'step {i} loss {1.0 / (i + 1):.6f} lr 0.001 throughput 1234.5 samples/s', "
    "flush=(i % 100 == 0))\n"
)


def run_file(lines: int, where: Path) -> float:
    log = where / "direct.log"
    start = time.perf_counter()
    with log.open("ab") as out:
        subprocess.run([sys.executable, "-c", CHATTY, str(lines)], stdout=out, check=True)
    return time.perf_counter() - start


def run_wrapper(lines: int, where: Path) -> tuple[float, int]:
    env = {**os.environ, "RANK": "0", LOG_DIR_ENV: str(where / "logs"), ATTEMPT_DIR_ENV: str(where)}
    start = time.perf_counter()
    subprocess.run([*RANK_WRAPPER, "python", "-c", CHATTY, str(lines)], env=env, check=True)
    took = time.perf_counter() - start
    records = (where / "logs" / "rank-0.log.times").stat().st_size // 16
    return took, records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.lines, args.repeats = 20_000, 1
    file_times, wrapper_times, records = [], [], 0
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-logs-") as tmp:
        for i in range(args.repeats):
            for side in ("file", "wrapper") if i % 2 == 0 else ("wrapper", "file"):
                where = Path(tmp) / f"{side}-{i}"
                where.mkdir()
                if side == "file":
                    file_times.append(run_file(args.lines, where))
                else:
                    took, records = run_wrapper(args.lines, where)
                    wrapper_times.append(took)
    f, w = statistics.median(file_times), statistics.median(wrapper_times)
    ratio = w / f
    result = {
        "lines": args.lines,
        "repeats": args.repeats,
        "file_s": round(f, 3),
        "wrapper_s": round(w, 3),
        "file_lines_per_s": round(args.lines / f),
        "wrapper_lines_per_s": round(args.lines / w),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "time_records": records,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    verdict = "PASS" if ratio <= TARGET else "BELOW TARGET"
    print(f"{args.lines} lines, median of {args.repeats}")
    print(f"  file     {f:7.3f} s  {args.lines / f:10.0f} lines/s")
    print(f"  wrapper  {w:7.3f} s  {args.lines / w:10.0f} lines/s  ({records} time records)")
    print(f"ratio wrapper/file {ratio:.3f} (target <= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
