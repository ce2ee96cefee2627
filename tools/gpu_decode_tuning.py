"""A decode step of C in bf16 on the H200 compiled with inductor's defaults and with coordinate-descent tuning of its
kernels' block sizes, in one process: step time, kernels and device time per step, top kernels.
usage (GPU host, repo root, after `source tools/gpu_env.sh`): python3 tools/gpu_decode_tuning.py OUT.json [BATCH ...]"""
import json, sys
import torch
sys.path.insert(0, 'tools')
from gpu_decode_profile import time_step
from apex3.config import get_config
from apex3.generate import Generator, build_model, decode_bytes, hbm_bytes_per_s

out, batches = sys.argv[1], [int(b) for b in sys.argv[2:]]
cfg = get_config('C')
torch.manual_seed(0)
model = build_model(cfg, 'cuda', torch.bfloat16)
res = []
for B in batches:
    for cdt in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(1)
        rows = torch.randint(1, cfg.eos_id, (B, 64)).tolist()
        with torch._inductor.config.patch(coordinate_descent_tuning=cdt):
            g = Generator(model, max_len=128, max_batch=B)
            fig = time_step(g, rows)
        warm, s, k = fig['warmup_s'], fig['step_s'], fig['kernels']
        bound = decode_bytes(cfg, B, 64) / hbm_bytes_per_s()
        r = dict(batch=B, cdt=cdt, warmup_s=warm, step_s=s, bound_step_s=bound, **k)
        res.append(r)
        print(B, cdt, f"warm {warm:.0f} s step {s * 1e3:.3f} ms bound {bound * 1e3:.3f} ms",
              f"kernels {k['kernels_per_step']:.0f} device {k['device_s_per_step'] * 1e3:.3f} ms", flush=True)
        for t in k['top'][:12]: print('   ', t)
        json.dump(res, open(out, 'w'), indent=1)
        del g
