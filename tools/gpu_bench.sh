#!/usr/bin/env bash
# Run `apex3.bench` variants of the published flag line on the GPU machine; records go to $OUT/records/bench.jsonl,
# each variant's log to $OUT/logs/NAME.log.   usage: bash tools/gpu_bench.sh NAME "EXTRA FLAGS" [NAME "EXTRA FLAGS" ...]
# NAME=base-* variants drop the offload flags (the no-offload baseline of the overhead ratio).
set -uo pipefail
source tools/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/records" "$OUT/logs"
MODEL="--config C --set n_experts=64 expert_ffn=1280 top_k=4 router_bias_rate=0.01 router_bias_update=proportional"
RUNTIME="--compile-blocks --recompute none --moe-chunk 0 --micro-bs 6 --attn fa3 --accum 8 --ce-impl triton --ce-chunk 4096 --steps 4 --warmup 2 --precision fp8_rowwise --fp8-recipe tensorwise --profile"
OFFLOAD="--offload --offload-accum cpu --act-budget 0.15 --gemm-offload hooks --act-offload 72"
while [ $# -ge 2 ]; do
  name=$1 extra=$2; shift 2
  flags="$MODEL $RUNTIME $OFFLOAD"; [[ $name == base-* ]] && flags="$MODEL $RUNTIME"
  echo "== $name: $extra"; start=$(date +%s)
  # the host's used/available GiB every 5 s: what is left of a run the kernel kills for memory. Kept beside $OUT and
  # appended to the variant's log, because at most 8 files come back from the device machine
  mem=$(mktemp); (while sleep 5; do echo "$(( $(date +%s) - start )) s $(free -g | awk '/Mem/{print "used", $3, "available", $7}')"; done) > "$mem" & mon=$!
  timeout ${VARIANT_TIMEOUT:-240} python3 -m apex3.bench $flags $extra --json "$OUT/records/bench.jsonl" > "$OUT/logs/$name.log" 2>&1
  echo "   rc $? in $(( $(date +%s) - start )) s; host peak: $(sort -k4 -n "$mem" | tail -1)"; kill $mon
  { echo "== host memory every 5 s"; cat "$mem"; } >> "$OUT/logs/$name.log"; rm -f "$mem"
  grep -E "micro_s_median=|^step |Error|error:|Traceback|exhausted" "$OUT/logs/$name.log" | tail -12
done
