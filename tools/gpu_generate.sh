#!/usr/bin/env bash
# Decode speed of full config C in bf16 on the GPU machine (11_generate's `bench_generate`), each part in its own process
# so a part that fails or runs out of time keeps the records of the others: ours at batch 1, the transformers twin
# (its own process: two 42 GB models do not fit beside each other's batch-8 caches), ours at batch 8.
# Records go to $OUT/generate.jsonl.  usage (GPU host, repo root): APEX3_GIT_COMMIT=<git rev-parse HEAD> bash tools/gpu_generate.sh
set -uo pipefail
source tools/gpu_env.sh || exit 2
out=${OUT:-/tmp/out}/generate.jsonl
part() {   # part SECONDS BATCHES METHOD
  timeout "$1" python3 -c "
import torch
from apex3.model_bench import bench_generate
bench_generate(('C',), batches=$2, runs=((torch.bfloat16, ('$3',)),), device='cuda', records='$out')" 2>&1 |
    grep -v -E '^\s*$|Warning|warn\(' | tail -25
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
part 140 "(1,)" compiled
part 55 "(1,)" transformers
part 55 "(8,)" transformers
part 110 "(8,)" compiled
