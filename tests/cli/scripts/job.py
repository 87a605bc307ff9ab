"""A job for the CLI tests; ``--mode`` picks what it does.

lines  prints ``--count`` numbered lines, 0.1 s apart, and exits 0
fail   writes SageMaker's failure file and exits 1
sleep  sleeps until stopped
"""

import argparse
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="lines")
parser.add_argument("--count", type=int, default=5)
args = parser.parse_args()

if args.mode == "lines":
    for n in range(1, args.count + 1):
        print(f"line {n} of {args.count}", flush=True)
        time.sleep(0.1)
elif args.mode == "fail":
    Path(os.environ["SM_OUTPUT_DIR"], "failure").write_text("no data to infer on")
    sys.exit(1)
elif args.mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(600)
