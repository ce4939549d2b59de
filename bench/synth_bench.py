"""Synth benchmark: the whole default platform against a one-bucket CDK app, side by side.

Both apps run through the same pinned CDK CLI, the same Python environment, the same App
options and cdk.json context, alternating so that machine load falls on both. Merges
``{"synth": {...}}`` into bench/results.json; the goal is ``ratio <= 2``.

Usage: python bench/synth_bench.py [--rounds 5] [--results bench/results.json]
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

import results_file

ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"
BASELINE_APP = """
import aws_cdk as cdk
from aws_cdk import aws_s3 as s3

app = cdk.App(builtin_cloud_formation_validation=False)
stack = cdk.Stack(app, "OneBucket")
s3.Bucket(stack, "Bucket")
app.synth()
"""


def synth_seconds(app_dir: Path, outdir: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_VERSION_CHECK="true",
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    start = time.perf_counter()
    subprocess.run(
        [str(CDK), "synth", "--no-notices", "--quiet", "--output", str(outdir)],
        cwd=app_dir,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def baseline_dir(parent: Path) -> Path:
    app_dir = parent / "one-bucket"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(BASELINE_APP)
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    cdk_json["app"] = f"{sys.executable} app.py"
    (app_dir / "cdk.json").write_text(json.dumps(cdk_json))
    return app_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    platform_times: list[float] = []
    baseline_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        parent = Path(tmp)
        baseline = baseline_dir(parent)
        for round_number in range(args.rounds + 1):
            pair = [
                (platform_times, ROOT, parent / "platform.out"),
                (baseline_times, baseline, parent / "baseline.out"),
            ]
            if round_number % 2:
                pair.reverse()
            for times, app_dir, outdir in pair:
                seconds = synth_seconds(app_dir, outdir)
                if round_number:  # round 0 warms caches for both
                    times.append(seconds)
    figures = {
        "make_synth_s": round(statistics.median(platform_times), 2),
        "one_bucket_synth_s": round(statistics.median(baseline_times), 2),
        "ratio": round(statistics.median(platform_times) / statistics.median(baseline_times), 2),
        "goal_ratio_at_most": 2.0,
        "rounds": args.rounds,
        "command": "python bench/synth_bench.py",
    }
    results_file.merge(args.results, "synth", figures)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
