#!/usr/bin/env bash
# Issue-7 evidence on the GPU machine, on the embedded corpus carried in gpu-data/ (built by `apex3 data demo gpu-data`;
# its out/tokens and out/tokenizer are enough). Step logs become records/train.jsonl in $OUT.
#   bash tools/gpu_train.sh one STEPS    one GPU, offload + FP8: the benchmark of the same flags, then training
#                                        SIGKILLed after its first checkpoint and resumed
#   bash tools/gpu_train.sh fsdp STEPS   every GPU under torchrun --fsdp: half the steps, then --resume for the rest
set -uo pipefail
MODE=${1:-one} STEPS=${2:-300} CONFIG=${CONFIG:-small} SEQ=${SEQ:-2048}
source tools/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/records" "$OUT/logs"; CK=/tmp/ckpt-$MODE; rm -rf $CK "$OUT/logs/train-$MODE.jsonl"
NPROC=1; [ "$MODE" = fsdp ] && NPROC=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
read -r VOCAB EOS <<<"$(python3 -c "import json; m=json.load(open('gpu-data/out/tokens/code/meta.json')); print(m['vocab_size'], m['eos_id'])")"
# the same attention kernel for both: the benchmark's rows are single documents, the corpus's are not
RUN="--config $CONFIG --set vocab_size=$VOCAB eos_id=$EOS --seq-len $SEQ --micro-bs 4 --accum 2 --lr 1e-3 --ce-impl triton --ce-chunk 4096 --attn flex"
if [ "$MODE" = one ]; then
  RUN="$RUN --compile-blocks --offload --offload-accum cpu --act-budget 0.15 --gemm-offload hooks --act-offload 24 --precision fp8_rowwise --fp8-recipe tensorwise"
else RUN="$RUN --fsdp"; fi
DATA=$(python3 -c "from apex3.train_io import demo_specs; t, v = demo_specs('gpu-data'); print('--data', *t, '--val-data', *v)")
TOKENS=$(( STEPS * 4 * 2 * SEQ * NPROC ))
python3 -c "from apex3.train import arith_probe_file; arith_probe_file('$CK-probe.jsonl', 16)"
TRAIN="$RUN $DATA --total-tokens $TOKENS --ckpt-dir $CK --step-log $OUT/logs/train-$MODE.jsonl --ckpt-every $(( TOKENS / 3 )) --val-every 50 --progress off
       --arith-probe $CK-probe.jsonl --arith-every 100"
LAUNCH="python3 -m torch.distributed.run --standalone --nproc_per_node $NPROC -m apex3.train"   # a free port each time
start=$(date +%s)
if [ "$MODE" = one ]; then
  [ -n "${NO_BENCH:-}" ] || { echo "== bench"; timeout 200 python3 -m apex3.bench $RUN --steps 6 --warmup 2 --json $OUT/logs/bench-$MODE.jsonl > $OUT/logs/bench-$MODE.log 2>&1
  echo "   rc $?"; grep "micro_s_median=" $OUT/logs/bench-$MODE.log; }
  echo "== train, SIGKILLed after its first checkpoint"
  $LAUNCH $TRAIN > $OUT/logs/train-$MODE-1.log 2>&1 & pid=$!
  until compgen -G "$CK/tokens-*" >/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.5; done
  # the launcher and its rank (torchrun starts ranks in their own sessions): every process of this run, by its --ckpt-dir
  sleep 3; pkill -9 -f "apex3.train .*--ckpt-dir $CK "; wait $pid; echo "   killed (rc $?) after $(( $(date +%s) - start )) s at step $(wc -l < $OUT/logs/train-$MODE.jsonl)"
else
  echo "== train $NPROC ranks, half the steps"; timeout 250 $LAUNCH $TRAIN --max-steps $(( STEPS / 2 )) > $OUT/logs/train-$MODE-1.log 2>&1
  echo "   rc $? after $(( $(date +%s) - start )) s"
fi
echo "== resume"; timeout 300 $LAUNCH $TRAIN --resume > $OUT/logs/train-$MODE-2.log 2>&1; echo "   rc $? after $(( $(date +%s) - start )) s"
grep -hE "resumed from|WARNING|warning|Error" $OUT/logs/train-$MODE-*.log | sort | uniq -c | head
python3 - "$OUT" "$MODE" "$CONFIG" "$NPROC" <<'PY'
import json, sys
from pathlib import Path
from apex3.records import append_records
from apex3.train_io import read_log
out, mode, config, nproc = sys.argv[1:]
name = f'{config}-{"offload-fp8" if mode == "one" else "fsdp"}-{nproc}gpu-corpus'
log = Path(f'{out}/logs/train-{mode}.jsonl')
steps = read_log(log) if log.exists() else []
if not steps: sys.exit('no step was logged: see the logs')
bench = Path(f'{out}/logs/bench-{mode}.jsonl')
bench = [json.loads(l) for l in bench.read_text().splitlines()] if bench.exists() else []
lines = []
for l in log.read_text().splitlines():   # a line cut short by the SIGKILL is not a step
    try: lines.append(json.loads(l))
    except json.JSONDecodeError: pass
# the steps logged twice (before the kill, after the resume): the evidence that the resume is exact
cut = next((i for i in range(1, len(lines)) if lines[i]['step'] <= lines[i - 1]['step']), None)
resume = []
if cut:
    first = {r['step']: r for r in lines[:cut]}
    resume = [dict(kind='train_resume', run=name, killed_after_step=lines[cut - 1]['step'], resumed_at_step=lines[cut]['step'],
                   redone=[dict(step=r['step'], loss_before=first[r['step']]['loss'], loss_after=r['loss'])
                           for r in lines[cut:] if r['step'] in first])]
append_records([{**r, 'kind': 'train_step', 'run': name, 'gpus': int(nproc)} for r in steps] +
               [{**b, 'kind': 'train_bench', 'run': name} for b in bench] + resume, f'{out}/records/train.jsonl')
if resume and resume[0]['redone']:
    k = resume[0]
    print(f"killed after step {k['killed_after_step']}, resumed at {k['resumed_at_step']}: {len(k['redone'])} steps redone, loss rel. diff <=",
          max(abs(d['loss_after'] - d['loss_before']) / max(abs(d['loss_before']), 1e-12) for d in k['redone']))
print(f'{name}: {len(steps)} steps ({len(lines) - len(steps)} redone after the restart), loss {steps[0]["loss"]:.3f} -> {steps[-1]["loss"]:.3f}')
print({k: v for k, v in steps[-1].items() if k.startswith(('val_', 'arith_acc', 'z_loss', 'step_s', 'mfu', 'tokens_per'))})
if bench:
    from apex3.train_evidence import train_vs_bench
    print('train vs bench:', train_vs_bench(steps, bench[-1]))
PY
