"""What a micro-batch's GEMMs save for backward, tensor by tensor: shape, dtype, GiB, and whether the activation
offload sent it to the host. The second micro-batch is listed (the first compiles).
    usage (GPU host, repo root): python3 tools/saved_tensors.py <apex3.bench flags>"""
import collections, sys
import torch
from apex3 import bench as B, run as R
from apex3.offload import memory as O

def main(argv):
    s, b = B.bench_settings(B.bench_parser().parse_args(argv))
    run = R.Run(s)
    seen, pack = [], O.ActivationOffload.pack
    def logged(self, t):
        out = pack(self, t)
        if isinstance(t, torch.Tensor): seen.append((tuple(t.shape), str(t.dtype), t.numel() * t.element_size(),
                                                     isinstance(out, O._Offloaded)))
        return out
    O.ActivationOffload.pack = logged
    gen = torch.Generator().manual_seed(0)
    for i in range(2):
        seen.clear()
        R.micro_step(run, B.random_tokens(run.cfg, s.model.micro_bs, gen, run.device))
    groups = collections.Counter()
    for shape, dtype, n, off in seen: groups[(shape, dtype, off)] += n
    print(f'{"shape":>28} {"dtype":>15} {"host":>5} {"GiB":>8}  (per micro-batch, all layers)')
    for (shape, dtype, off), n in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f'{str(shape):>28} {dtype:>15} {str(off):>5} {n / 2**30:8.3f}')
    tot = sum(n for *_, n, _ in seen) / 2**30
    host = sum(n for *_, n, off in seen if off) / 2**30
    print(f'saved {len(seen)} tensors, {tot:.2f} GiB; to the host {host:.2f} GiB')

if __name__ == '__main__': main(sys.argv[1:])
