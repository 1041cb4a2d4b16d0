#!/usr/bin/env bash
# A/B of the load generator between two checkouts, alternating, against the zero server:
#   git worktree add /tmp/old <commit>; RATES="400 800 1600 3200" bash benchmarks/client_overhead/ab.sh /tmp/old .
# Prints: tree, rate, schedule lag p50 and p99 (ms), achieved req/s, TTFT p50 (ms).
set -euo pipefail
OLD=${1:?old checkout}; NEW=${2:-.}; PORT=${PORT:-8150}; PY=${PY:-.venv/bin/python}
PYTHONPATH=$NEW/operator $PY -m accelbench.workers.bench.nullserver --port "$PORT" & SRV=$!
trap 'kill $SRV' EXIT
sleep 2
for rate in ${RATES:-400 800 1600 3200}; do
  for tree in "$OLD" "$NEW"; do
    PYTHONPATH=$tree/operator $PY -m accelbench.workers.bench --endpoint "http://127.0.0.1:$PORT" \
      --health-path /health --no-server-tokenizer --rates "$rate" --requests $((rate * 4)) \
      --input-lengths 32 --output-length 64 --warmup 8 --no-capacity-search --out /tmp/ab.json >/dev/null 2>&1
    $PY -c "import json; c = json.load(open('/tmp/ab.json'))['cells'][0]; l = c['scheduleLagMs']; \
print('$tree', $rate, round(l['p50'], 3), round(l['p99'], 3), round(c['achievedRequestsPerSecond']), round(c['ttftMs']['p50'], 3))"
  done
done
