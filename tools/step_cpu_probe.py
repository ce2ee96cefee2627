"Which CPU calls of one offloaded optimizer step take long (a hidden synchronisation)?  usage: python3 tools/step_cpu_probe.py OUT.json"
import json, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from apex3.config import get_config
from apex3.model import Transformer
from apex3.offload import OffloadOptimizer
cfg = get_config('C', ['n_layers=2', 'max_docs=1'])
with torch.device('cuda'): m = Transformer(cfg).to(torch.bfloat16)
x = torch.randint(0, cfg.vocab_size - 1, (1, 513), device='cuda')
opt = OffloadOptimizer(m, accum='cpu')
for _ in range(2): m(x[:, :-1], x[:, 1:]).backward(); opt.step(); opt.zero_grad()
m(x[:, :-1], x[:, 1:]).backward(); opt.wait(); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    opt.step(); torch.cuda.synchronize()
ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
t0 = min(e.time_range.start for e in ev)
slow = sorted((round((e.time_range.start - t0) / 1e3, 2), round((e.time_range.end - e.time_range.start) / 1e3, 2), e.name)
              for e in ev if e.time_range.end - e.time_range.start > 2000)
for r in slow: print(r)
json.dump(slow, open(sys.argv[1], 'w'))
