"""Where a decode step of full config C (bf16, one H200) spends its time: the step with and without CUDA graphs,
kernels per step, device time per step, the top kernels, and whether inductor skipped CUDA graphs (and why).
usage (GPU host, repo root, after `source tools/gpu_env.sh`): python3 tools/gpu_decode_profile.py OUT.json [BATCH ...]"""
import json, logging, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from apex3.config import get_config
from apex3.generate import Generator, build_model, decode_bytes, hbm_bytes_per_s


class Hints(logging.Handler):
    "Collects inductor's perf hints (e.g. 'skipping cudagraphs due to ...')."
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, r): self.lines.append(r.getMessage()[:300])


def step_seconds(step, n=50):
    "Median seconds of one `step()`, each timed alone between synchronisations."
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2]


def kernel_table(step, steps=10, top=25):
    "Kernels launched per step, device seconds per step, and the top kernels (name, calls/step, us/step)."
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(steps): step()
        torch.cuda.synchronize()
    ev = [e for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total]
    ev.sort(key=lambda e: -e.self_device_time_total)
    total_us = sum(e.self_device_time_total for e in ev) / steps
    return dict(kernels_per_step=sum(e.count for e in ev) / steps, device_s_per_step=total_us / 1e6,
                top=[(e.key[:100], e.count / steps, round(e.self_device_time_total / steps, 1)) for e in ev[:top]])


@torch.no_grad()
def time_step(g, rows):
    "A `Generator`'s decode step after prefilling `rows`: seconds to warm up (compile), one step, kernels, logits."
    logits, pos, doc = g.prefill(rows)
    tok = logits.argmax(-1)
    step = lambda: g.step(tok, pos, doc)
    t0 = time.perf_counter()
    for _ in range(3): step()
    torch.cuda.synchronize()
    warmup_s, logits = time.perf_counter() - t0, step().float().clone()   # a graph's output is its next replay's
    return dict(warmup_s=warmup_s, step_s=step_seconds(step), kernels=kernel_table(step), logits=logits)


def profile_batch(model, cfg, B, context=64):
    out = dict(batch=B, bound_step_s=decode_bytes(cfg, B, context) / hbm_bytes_per_s())
    variants = (('cudagraphs', True), ('inductor', 'inductor'))[:2 if B == 1 else 1]   # launches matter most at B=1
    for name, compile in variants:
        torch._dynamo.reset()
        g = Generator(model, max_len=context + 64, max_batch=B, compile=compile)
        fig = time_step(g, [list(range(1, context + 1))] * B)
        out.update({f'{name}_{k}': v for k, v in fig.items()})
        print(B, name, f"step {out[f'{name}_step_s'] * 1e3:.2f} ms", f"bound {out['bound_step_s'] * 1e3:.2f} ms",
              f"kernels/step {out[f'{name}_kernels']['kernels_per_step']:.0f}",
              f"device {out[f'{name}_kernels']['device_s_per_step'] * 1e3:.2f} ms", flush=True)
        del g
    return out


def main(path, batches=(1, 8)):
    hints = Hints()
    torch._logging.set_logs(perf_hints=True)
    for name in ('torch._inductor', 'torch._inductor.cudagraph_trees', 'torch._inductor.cudagraph_utils'):
        logging.getLogger(name).addHandler(hints)
    cfg = get_config('C')
    torch.manual_seed(0)
    model = build_model(cfg, 'cuda', torch.bfloat16)
    res = dict(config='C', dtype='bfloat16', gpu=torch.cuda.get_device_name(0), torch=torch.__version__, runs=[])
    for B in batches:
        res['runs'].append(profile_batch(model, cfg, B))
        res['hints'] = [h for h in hints.lines if 'cudagraph' in h.lower()][:20]
        json.dump(res, open(path, 'w'), indent=1)
    for h in res['hints']: print('hint:', h)
    for r in res['runs']:
        for k in [k for k in ('cudagraphs_kernels', 'inductor_kernels') if k in r]:
            print('==', r['batch'], k)
            for row in r[k]['top'][:18]: print('  ', row)


if __name__ == '__main__': main(sys.argv[1], tuple(int(b) for b in sys.argv[2:]) or (1, 8))
