"Do an H2D and a D2H on two streams run at once, by kind of host memory and with the step's event ordering?  usage: python3 tools/alias_probe.py OUT.json"
import time, json, sys, torch
from apex3.offload.memory import _alias
n = 2**int(sys.argv[2]) if len(sys.argv) > 2 else 2**28
slab, slab2 = (torch.empty(4 * n, dtype=torch.uint8, pin_memory=True) for _ in range(2))
hosts = {'pinned': [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)],
         'one_slab_alias': [_alias(slab, 0, n), _alias(slab, n, n)], 'two_slab_alias': [_alias(slab, 2 * n, n), _alias(slab2, 0, n)],
         'one_slab_view': [slab2[n:2 * n], slab2[2 * n:3 * n]]}
big = torch.empty(2 * n, dtype=torch.uint8, device='cuda')
devs = {'separate': [torch.empty(n, dtype=torch.uint8, device='cuda') for _ in range(2)], 'one_buffer': [big[:n], big[n:]]}
up, down = torch.cuda.Stream(), torch.cuda.Stream()
def both(h, d, dep):
    "ms from the start to: the compute's end, the upload's end, the download's end."
    torch.cuda.synchronize(); ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]; ev[0].record()
    if dep == 2:  # and the upload waits for an event the download stream recorded before it waited (the step's buffer reuse)
        with torch.cuda.stream(down): h[1][:2**20].copy_(d[1][:2**20], non_blocking=True); done = torch.cuda.Event(); done.record()
    if dep: x = torch.randn(4096, 4096, device='cuda'); [x @ x for _ in range(20)]; down.wait_stream(torch.cuda.current_stream())
    ev[1].record()
    with torch.cuda.stream(down): h[1].copy_(d[1], non_blocking=True); ev[3].record()
    with torch.cuda.stream(up):
        if dep == 2: up.wait_event(done)
        d[0].copy_(h[0], non_blocking=True); ev[2].record()
    torch.cuda.synchronize(); return [round(ev[0].elapsed_time(e), 1) for e in ev[1:]]
res = {f'{hk}/{dk}/dep{dep}': both(h, d, dep) for hk, h in hosts.items() for dk, d in devs.items() for dep in (0, 1, 2)}
print(json.dumps(res, indent=1)); json.dump(res, open(sys.argv[1], 'w'), indent=1)
