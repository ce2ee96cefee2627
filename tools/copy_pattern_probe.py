"""The offloaded step's copy pattern alone (no update), with its stream orderings removed one at a time: which one keeps
the two directions apart?   usage: python3 tools/copy_pattern_probe.py OUT.json"""
import json, sys, time, torch
from apex3.offload.memory import PinnedPool
K, n = 8, 2**26   # chunks, FP32 elements per tensor (256 MiB)
pool = PinnedPool(K * 3 * n * 4 + 2**30)
host = [[pool.alloc((n,), torch.float32) for _ in range(3)] for _ in range(K)]   # master, state, gradient
bufs = [torch.empty(3 * n, device='cuda') for _ in range(2)]
h2d, d2h, cur = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.current_stream()
def step(back_wait=True, via_current=True, host_src=True):
    torch.cuda.synchronize(); t0 = time.perf_counter(); back = [None, None]
    for i, (m, s, g) in enumerate(host):
        b = i % 2; v = bufs[b].view(3, n)
        with torch.cuda.stream(h2d):
            if back_wait and back[b] is not None: h2d.wait_event(back[b])
            for d, h in zip(v, (m, s, g)): d.copy_(h, non_blocking=True)
            up = torch.cuda.Event(); up.record()
        if via_current: cur.wait_event(up); v[0].add_(0.0); d2h.wait_stream(cur)
        else: d2h.wait_event(up)
        with torch.cuda.stream(d2h):
            for h, d in zip((m, s), v[:2]): h.copy_(d, non_blocking=True)
            back[b] = torch.cuda.Event(); back[b].record()
    torch.cuda.synchronize(); return round(time.perf_counter() - t0, 4)
res = {'serial_estimate_s': round(K * 5 * n * 4 / 55e9, 4)}
for name, kw in {'step': {}, 'no_back_wait': dict(back_wait=False), 'no_current': dict(via_current=False),
                 'neither': dict(back_wait=False, via_current=False)}.items():
    res[name] = [step(**kw) for _ in range(3)]; print(name, res[name], flush=True)
json.dump(res, open(sys.argv[1], 'w'))
