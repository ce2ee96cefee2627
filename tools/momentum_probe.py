"""Does Muon's momentum in BF16 shorten the offloaded step by the bytes it saves? Probe on the GPU machine: the step of
C with two layers (gradients on the GPU, split masters) with FP32 and BF16 momentum, its copy seconds each way and its
bytes; and raw pinned copies up, aligned and 2 bytes off.   usage: python3 tools/momentum_probe.py OUT.json"""
import json, sys, time
import torch
from apex3.bench import copy_gbs, kernel_spans, overlap_s
from apex3.config import get_config
from apex3.model import Transformer
from apex3.offload.host_optim import OffloadOptimizer, _crossing_bytes

def _step_bytes(opt):
    "Bytes one step moves each way: every offloaded slot's kept master and its state."
    return sum(s.master.numel() * _crossing_bytes(s) for s in opt.slots if not s.resident)

def step_probe(momentum_dtype, n_layers=2):
    "Walls of three steps, then one profiled: copy seconds each way, both at once, and GB/s each way."
    from torch.profiler import profile, ProfilerActivity
    cfg = get_config('C', [f'n_layers={n_layers}', 'max_docs=1'])
    with torch.device('cuda'): m = Transformer(cfg).to(torch.bfloat16)
    x = torch.randint(0, cfg.vocab_size - 1, (1, 513), device='cuda')
    opt = OffloadOptimizer(m, accum='gpu', momentum_dtype=momentum_dtype)
    def backward(): m(x[:, :-1], x[:, 1:]).backward(); opt.wait(); torch.cuda.synchronize()
    walls = []
    for _ in range(4):
        backward()
        t0 = time.perf_counter(); opt.step(); torch.cuda.synchronize(); walls.append(time.perf_counter() - t0)
        opt.zero_grad()
    backward()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        opt.step(); torch.cuda.synchronize()
    spans = kernel_spans(prof)
    secs = {k: sum(e - s for s, e in v) / 1e6 for k, v in spans.items()}
    nbytes = _step_bytes(opt)
    out = dict(momentum=str(momentum_dtype), walls_s=[round(w, 4) for w in walls[1:]], bytes_each_way=nbytes,
               htod_s=secs['HtoD'], dtoh_s=secs['DtoH'], compute_s=secs['compute'],
               duplex_s=overlap_s(spans['HtoD'], spans['DtoH']) / 1e6,
               htod_gbs=nbytes / secs['HtoD'] / 1e9, dtoh_gbs=nbytes / secs['DtoH'] / 1e9)
    del opt, m
    torch.cuda.empty_cache()
    return out

def raw_copies(n=2**30):
    "GB/s of one pinned copy up of `n` bytes: as bytes, as BF16, and as BF16 starting 2 bytes into the buffers."
    host = torch.empty(n + 64, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n + 64, dtype=torch.uint8, device='cuda')
    s = torch.cuda.Stream()
    lane = lambda d, h: [(s, [(d, h)])]
    hb, db = host.view(torch.bfloat16), dev.view(torch.bfloat16)
    k = n // 2
    return dict(bytes=copy_gbs(lane(dev[:n], host[:n])), bf16=copy_gbs(lane(db[:k], hb[:k])),
                bf16_off2=copy_gbs(lane(db[1:k + 1], hb[1:k + 1])))

def main(path):
    res = dict(raw=raw_copies(), steps=[step_probe(None), step_probe(torch.bfloat16)])
    json.dump(res, open(path, 'w'), indent=1); print(json.dumps(res, indent=1))

if __name__ == '__main__': main(*sys.argv[1:])
