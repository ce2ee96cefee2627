#!/usr/bin/env bash
# Run the `#| gpu` cells of chapters on the GPU machine and bring back the records they append.
#   usage (on the GPU host, repo root): bash tools/gpu_notebooks.sh nbs/10_model.ipynb nbs/15_kernels.ipynb ...
set -uo pipefail
source tools/gpu_env.sh
export MPLBACKEND=Agg
python3 - <<'PY'
import torch, triton, importlib
print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
for m in ('torchao', 'liger_kernel', 'nbdev'):
    try: print(m, getattr(importlib.import_module(m), '__version__', 'ok'))
    except Exception as e: print(m, 'unavailable:', e)
PY
# what the records held before: only the lines the chapters append come back, in $OUT/notebook-records (so a bench
# run earlier in the same command keeps its $OUT/records, and a handful of small files travel, not every record)
# the wheels gpu_env.sh installed (a machine without nbdev), else the nbdev on the PATH
nbdev_test=/tmp/site/bin/nbdev-test; [ -x "$nbdev_test" ] || nbdev_test=nbdev-test
snap=$(mktemp -d); cp records/*.jsonl "$snap/"
status=0
for nb in "$@"; do
  echo "== $nb"; start=$(date +%s)
  "$nbdev_test" --flags gpu --n-workers 1 --do-print --verbose --timing "$nb" || status=1
  echo "   $(( $(date +%s) - start )) s"
  # after every chapter, so a run cut short by the time limit still brings back what it measured
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/notebook-records"
    for f in records/*.jsonl; do
      old="$snap/$(basename "$f")"; [ -f "$old" ] || old=/dev/null   # a record file the chapters began
      new=$(grep -vxF -f "$old" "$f")
      [ -n "$new" ] && printf '%s\n' "$new" > "$OUT/notebook-records/$(basename "$f")"
    done
  fi
done
exit $status
