"""How fast one bf16 matrix-vector product reads its weight on this GPU, by the weight's size: cuBLAS (`F.linear`)
and inductor's multiply-and-sum, each timed as 100 calls replayed from one CUDA graph (a call's time is its kernel's,
as in a decode step's graph). A decode step of C at batch 1 reads its weights in GEMVs of 5 to 52 MB a layer and the
1 GB LM head: the curve says what each costs.
usage (GPU host, repo root, after `source tools/gpu_env.sh`): python3 tools/gpu_gemv_sweep.py OUT.jsonl"""
import sys
import torch, torch.nn.functional as F
from apex3.kernels.gemv import mul_sum_linear
from apex3.kernels.gemv_bench import graph_seconds
from apex3.records import append_records

def main(path, d=2560):
    mul_sum = torch.compile(mul_sum_linear, dynamic=False)   # the decode step's one-row linear, compiled
    recs = []
    for n in (256, 1024, 2560, 5120, 10240, 20480, 51200, 204800):
        w = torch.randn(n, d, device='cuda', dtype=torch.bfloat16)
        x = torch.randn(1, d, device='cuda', dtype=torch.bfloat16)
        for impl, fn in (('cublas', lambda: F.linear(x, w)), ('inductor', lambda: mul_sum(x, w))):
            s = graph_seconds(fn, calls=100)
            recs.append(dict(kind='gemv_sweep', impl=impl, rows=n, cols=d, dtype='bfloat16', weight_bytes=w.nbytes,
                             seconds=s, bytes_per_s=w.nbytes / s))
            print(f'{impl:9s} {w.nbytes / 2**20:8.1f} MiB {s * 1e6:8.2f} us {w.nbytes / s / 1e12:5.2f} TB/s',
                  flush=True)
    append_records(recs, path)

if __name__ == '__main__': main(sys.argv[1])
