#!/usr/bin/env bash
# FP8 routed experts on the GPU machine: the `#| gpu` cells of nbs/16_fp8_experts.ipynb (the Triton cast and
# `torch._scaled_grouped_mm` against their emulation) and nbs/18_fp8_experts_bench.ipynb (the benchmark against
# bf16 `_grouped_mm` at C's shapes).
# Its records come back in $OUT/notebook-records/fp8_experts.jsonl; a summary line per variant is printed.
#   usage (on the GPU host, repo root): APEX3_GIT_COMMIT=<git rev-parse HEAD> bash tools/gpu_fp8.sh
set -uo pipefail
bash tools/gpu_notebooks.sh nbs/16_fp8_experts.ipynb nbs/18_fp8_experts_bench.ipynb
status=$?
recs=${OUT:-/tmp/out}/notebook-records/fp8_experts.jsonl
if [ -f "$recs" ]; then
  python3 - "$recs" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get('kind') != 'fp8_experts': continue
    name = r['impl'] + (f" {r['backward']} backward, fast_accum={r['fast_accum']}" if r['impl'] == 'fp8' else '')
    ok = r['status'] == 'ok'
    print(f"{name:<38} {r['status']:<4}" + (f" {r['seconds'] * 1e3:6.2f} ms  x{r['speedup_vs_bf16']:.2f}" if ok else ''))
PY
fi
exit $status
