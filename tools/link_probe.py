"""Why do host<->device copies in the offload step rarely run both ways at once? Probe the link on the GPU machine.
usage: python3 tools/link_probe.py OUT.json [CONFIG]   (without CUDA: a dry run of the optimizer part only)"""
import json, sys, time
import torch
from apex3.bench import copy_gbs, kernel_spans, overlap_s
from apex3.config import get_config
from apex3.model import Transformer
from apex3.offload.host_optim import OffloadOptimizer

def _sync():
    if torch.cuda.is_available(): torch.cuda.synchronize()

def link_pairs(n=2**28, n_streams=6):
    "Both-ways GB/s of one H2D and one D2H of `n` bytes: for every ordered pair of streams, on one stream, and cut in pieces."
    host, back = (torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2))
    dev, out = (torch.empty(n, dtype=torch.uint8, device='cuda') for _ in range(2))
    streams = [torch.cuda.Stream() for _ in range(n_streams)]
    rate = lambda up, down, pieces=1: copy_gbs([(up, list(zip(dev.chunk(pieces), host.chunk(pieces)))),
                                                (down, list(zip(back.chunk(pieces), out.chunk(pieces))))])
    return dict(pairs={f'{a}->{b}': rate(streams[a], streams[b]) for a in range(n_streams) for b in range(n_streams) if a != b},
                same_stream=rate(streams[0], streams[0]), pieces={k: rate(streams[0], streams[1], k) for k in (1, 8, 64)})

def two_layer_offload(config, device, **opt_kw):
    "`config` with two layers, a batch of one sequence, and its OffloadOptimizer after two warm-up steps."
    cfg = get_config(config, ['n_layers=2', 'max_docs=1'])
    with torch.device(device): m = Transformer(cfg).to(torch.bfloat16)
    x = torch.randint(0, cfg.vocab_size - 1, (1, 513), device=device)
    opt = OffloadOptimizer(m, accum='cpu', **opt_kw)
    for _ in range(2): m(x[:, :-1], x[:, 1:]).backward(); opt.step(); opt.zero_grad()
    return m, x, opt

def backward(m, x, opt):
    "One backward pass, every gradient landed: what the next optimizer step starts from."
    m(x[:, :-1], x[:, 1:]).backward(); opt.wait(); _sync()

def step_walls(m, x, opt, n=3):
    "Seconds of `n` optimizer steps, each after its own backward pass, without the profiler."
    walls = []
    for _ in range(n):
        backward(m, x, opt)
        t0 = time.perf_counter(); opt.step(); _sync(); walls.append(round(time.perf_counter() - t0, 4)); opt.zero_grad()
    return walls

def optimizer_step_probe(config, device, chunk_mib):
    """One offloaded optimizer step of `config` with two layers under the profiler: wall, copy seconds each way, both ways at
    once, the copy timeline, and the CPU calls over 2 ms (a hidden synchronisation); beside the wall without the profiler."""
    from torch.profiler import profile, ProfilerActivity
    m, x, opt = two_layer_offload(config, device, chunk_bytes=chunk_mib * 2**20)
    plain = step_walls(m, x, opt)   # CUPTI could serialise the copies it traces: the wall without it
    backward(m, x, opt)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        opt.step(); _sync()
    wall = time.perf_counter() - t0
    spans = {k: v for k, v in kernel_spans(prof).items() if k != 'compute'}
    t0 = min((s for v in spans.values() for s, _ in v), default=0)
    timeline = sorted((round((s - t0) / 1e3, 2), round((e - s) / 1e3, 2), k) for k, v in spans.items() for s, e in v)   # ms
    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    c0 = min((e.time_range.start for e in cpu), default=0)
    slow = sorted((round((e.time_range.start - c0) / 1e3, 2), round(e.time_range.elapsed_us() / 1e3, 2), e.name)
                  for e in cpu if e.time_range.elapsed_us() > 2000)
    return dict(wall_s=wall, unprofiled_wall_s=plain, **{f'{k}_s': sum(e - s for s, e in v) / 1e6 for k, v in spans.items()},
                duplex_s=overlap_s(*spans.values()) / 1e6, timeline_ms=timeline, slow_cpu_calls_ms=slow)

def main(path, config='C'):
    cuda = torch.cuda.is_available()
    res = link_pairs() if cuda else {}
    for chunk_mib in (512, 128):
        res[f'opt_chunk{chunk_mib}'] = optimizer_step_probe(config, 'cuda' if cuda else 'cpu', chunk_mib)
        torch.cuda.empty_cache() if cuda else None
    json.dump(res, open(path, 'w'), indent=1); print(json.dumps(res, indent=1))

if __name__ == '__main__': main(*sys.argv[1:])
