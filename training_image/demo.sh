#!/usr/bin/env bash
# `make train-local`: the trainer end to end on CPU in about half a minute. Prepares shards from
# the shipped corpus, trains the tiny preset with checkpoints, stops it with SIGTERM part-way as a
# preemption would, resumes from the checkpoint, and plots the metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${DEMO_OUT:-$(mktemp -d -t trn-train-demo.XXXXXX)}
RUN=("$PY" -m trainer run --preset tiny --device cpu --data "$OUT/data" --max-steps 600
     --checkpoint-dir "$OUT/checkpoints" --checkpoint-every 100 --metrics "$OUT/metrics.jsonl"
     --log-every 50)

"$PY" -m trainer prepare-data --out "$OUT/data"
"${RUN[@]}" &
pid=$!
until grep -q '"step": 250' "$OUT/metrics.jsonl" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do
  sleep 0.2
done
kill -TERM "$pid" 2>/dev/null || true  # a preemption: the trainer checkpoints and exits 0
wait "$pid"
echo "stopped; checkpoints: $(ls "$OUT/checkpoints" | tr '\n' ' ')"
"${RUN[@]}"  # resumes from the newest valid checkpoint
"$PY" -m trainer report "$OUT/metrics.jsonl" --out "$OUT/metrics.png"
echo "metrics: $OUT/metrics.jsonl, plot: $OUT/metrics.png"
