"""The slots kernel's two launches in C's MoE layer, each alone, for every tile of a grid: `up` (the chosen experts'
and the shared expert's gate|up, SwiGLU) and `down`, at 1 and 8 tokens, each timed as 50 launches replayed from one
CUDA graph (a launch's time is its kernel's, as in a decode step's graph). Records `slots_tile`, fastest first printed.
usage (GPU host, repo root, after `source tools/gpu_env.sh`): python3 tools/gpu_slots_sweep.py OUT.jsonl"""
import itertools, sys
import torch
import apex3.kernels.gemv as gemv
import apex3.kernels.gemv_bench as gemv_bench
from apex3.config import get_config
from apex3.model import route
from apex3.records import append_records

ROWS, COLS, WARPS, STAGES = (4, 8, 16, 32), (128, 256, 512, 1024), (4, 8), (2, 3, 4)

def launches(cfg, N):
    "The up and down launches of one MoE layer at `N` tokens, and the weight bytes each reads."
    router, bias, ex, s1, s2 = gemv_bench._moe_layer(cfg, 'cuda')
    x = torch.randn(N, cfg.d_model, device='cuda', dtype=torch.bfloat16)
    scores, idx, _ = route(x, router, bias, cfg.top_k)                # fp32 scores, as the kernel takes them
    chosen = idx.unique().numel()                                     # distinct experts the tokens choose
    S, k = cfg.top_k + 1, cfg.top_k
    a = x.new_empty(N, S, cfg.expert_ffn)
    y = x.new_empty(N, S, cfg.d_model, dtype=torch.float32)
    up = lambda: gemv._launch('up', x, ex.w_gate_up, s1, scores, bias, a, cfg.route_scale, k, True, False)
    down = lambda: gemv._launch('down', a, ex.w_down, s2, scores, bias, y, 1.0, k, False, True)
    return dict(up=(up, ex.w_gate_up[0].nbytes * chosen + s1.nbytes),
                down=(down, ex.w_down[0].nbytes * chosen + s2.nbytes))

def main(path, tokens=(1, 8)):
    cfg, recs = get_config('C'), []
    for N in tokens:
        for use, (fn, nbytes) in launches(cfg, N).items():
            rows = []
            for tile in itertools.product(ROWS, COLS, WARPS, STAGES):
                if tile[0] * tile[1] > 8192: continue   # two fp32 accumulators of that many a program: spills
                with gemv.tiles(**{use: tile}): s = gemv_bench.graph_seconds(fn)
                rows.append(dict(kind='slots_tile', config='C', tokens=N, use=use, tile=tile, seconds=s,
                                 weight_bytes=nbytes, bytes_per_s=nbytes / s, blocks_now=gemv.BLOCKS[use]))
            rows.sort(key=lambda r: r['seconds'])
            now = [r for r in rows if tuple(r['tile']) == tuple(gemv.BLOCKS[use])]
            for r in rows[:5] + now:
                print(f"N={N} {use:4s} {str(r['tile']):20s} {r['seconds'] * 1e6:6.2f} us "
                      f"{r['bytes_per_s'] / 1e12:5.2f} TB/s{'  (BLOCKS now)' if r in now else ''}", flush=True)
            recs += rows
            append_records(rows, path)
    return recs

if __name__ == '__main__': main(sys.argv[1])
