"""Decode speed of C with chapter 10a_gemv's slots kernel: its benchmark against inductor (`bench_gemv`), then a decode
step of C in bf16 per variant BATCH:MOE:ROW[:ATTN[:LAUNCH]], each appended as a `decode_kernels` record as it
finishes, with its logits against an eager step's (the reference: not compiled, no Triton kernel) and against the
first variant's of its batch. MOE: `slots` or `off`. ROW, the attention's one-row linears: `slots`, `inductor`, or
`norm_qkv` (q, k, v and the norm before them in one launch, wo inductor's). ATTN, the attention between them: chapter
10b's kernel `triton` or `inductor`. LAUNCH: one CUDA graph `graph`, inductor's CUDA graph trees `trees`, kernel by
kernel `kernels`, or not compiled `eager`. Left out: generate's defaults.
usage (GPU host, repo root, after `source tools/gpu_env.sh`):
  python3 tools/gpu_decode_gemv.py OUT.jsonl [bench] VARIANT..."""
import sys
import torch
sys.path.insert(0, 'tools')
from gpu_decode_profile import time_step
import apex3.kernels.gemv as gemv
import apex3.kernels.gemv_bench as gemv_bench
from apex3.config import get_config
from apex3.generate import CachedAttention, Generator, RowLinear, build_model, decode_bytes, hbm_bytes_per_s
from apex3.records import append_records

LAUNCH_NAMES = dict(trees='cudagraphs', graph='step_graph', kernels='inductor', eager='eager')   # as records name them

def variant(model, cfg, B, moe, row, attn=CachedAttention.kernel, launch=Generator.launch):
    "One decode step of `model` at batch `B` with each kernel on or off: the MoE's, the attention's linears', its own."
    saved = gemv.triton, RowLinear.kernel, CachedAttention.kernel, Generator.launch
    RowLinear.kernel, CachedAttention.kernel = row, attn
    Generator.launch = 'kernels' if launch == 'eager' else launch   # not compiled, the launch is never read
    if moe == 'off': gemv.triton = None            # gemv_ok says no: the step compiles as it did without the kernel
    try:
        torch._dynamo.reset()
        g = Generator(model, max_len=128, max_batch=B, compile=launch != 'eager')
        fig = time_step(g, prompts(cfg, B))
    finally: gemv.triton, RowLinear.kernel, CachedAttention.kernel, Generator.launch = saved
    k = fig['kernels']
    rec = dict(kind='decode_kernels', config='C', batch=B, on='cuda', dtype='bfloat16', launch=LAUNCH_NAMES[launch],
               moe_kernel=moe, row_kernel=row if moe != 'off' else 'inductor', attn_kernel=attn,
               warmup_s=fig['warmup_s'],
               step_s=fig['step_s'], bound_step_s=decode_bytes(cfg, B, 64) / hbm_bytes_per_s(),
               kernels_per_step=k['kernels_per_step'], device_s_per_step=k['device_s_per_step'],
               top_kernels=str(k['top'][:20]), blocks=str(gemv.BLOCKS), source='tools/gpu_decode_gemv.py')
    print(f"B={B} moe={moe} row={row} attn={attn} launch={launch}: step {rec['step_s'] * 1e3:.3f} ms "
          f"bound {rec['bound_step_s'] * 1e3:.3f} ms "
          f"({rec['bound_step_s'] / rec['step_s']:.3f}) kernels {rec['kernels_per_step']:.0f} "
          f"device {rec['device_s_per_step'] * 1e3:.3f} ms warm-up {rec['warmup_s']:.0f} s", flush=True)
    for t in k['top'][:14]: print('   ', t, flush=True)
    return rec, fig['logits']

def prompts(cfg, B):
    torch.manual_seed(1)
    return torch.randint(1, cfg.eos_id, (B, 64)).tolist()

@torch.no_grad()
def reference_logits(model, cfg, B):
    "The step's logits with nothing compiled and no Triton kernel: what every variant should give."
    saved, gemv.triton = gemv.triton, None
    try:
        g = Generator(model, max_len=128, max_batch=B, compile=False)
        logits, pos, doc = g.prefill(prompts(cfg, B))
        return g.step(logits.argmax(-1), pos, doc).float()
    finally: gemv.triton = saved

def agreement(logits, ref):
    same = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return dict(rel_err=gemv_bench._rel_err(logits, ref), same_argmax=same)

def main(out, *args):
    if 'bench' in args: gemv_bench.bench_gemv(path=out)
    runs = [a.split(':') for a in args if a != 'bench']
    if not runs: return
    cfg = get_config('C')
    torch.manual_seed(0)
    model = build_model(cfg, 'cuda', torch.bfloat16)
    first, eager = {}, {}   # batch -> the first variant's logits, the reference's
    for B, *kernels in runs:
        rec, logits = variant(model, cfg, int(B), *kernels)
        vs_first = agreement(logits, first.setdefault(B, logits))
        if B not in eager: eager[B] = reference_logits(model, cfg, int(B))   # one eager step a batch
        vs_eager = agreement(logits, eager[B])
        rec.update(logits_rel_err=vs_first['rel_err'], same_argmax=vs_first['same_argmax'],
                   eager_rel_err=vs_eager['rel_err'], eager_same_argmax=vs_eager['same_argmax'])
        print(f"   logits against the batch's first variant: rel err {vs_first['rel_err']:.1e}, same argmax "
              f"{vs_first['same_argmax']:.0%}; against eager: {vs_eager['rel_err']:.1e}, {vs_eager['same_argmax']:.0%}",
              flush=True)
        append_records([rec], out)

if __name__ == '__main__': main(*sys.argv[1:])
