"""Which part of the offloaded optimizer step keeps its uploads and downloads apart? Unprofiled step wall with parts swapped out.
usage: python3 tools/step_bisect.py OUT.json [VARIANT ...]"""
import json, sys, time, torch
import apex3.offload as off, apex3.optim as optim
from apex3.config import get_config
from apex3.model import Transformer
cfg = get_config('C', ['n_layers=2', 'max_docs=1'])
with torch.device('cuda'): m = Transformer(cfg).to(torch.bfloat16)
x = torch.randint(0, cfg.vocab_size - 1, (1, 513), device='cuda')
opt = off.OffloadOptimizer(m, accum='cpu')
real_update, real_orth = off._update, optim._orthogonalise
variants = {'real': {}, 'no_update': dict(_update=lambda chunk, ms, st, gr: torch._foreach_add_(ms, 0.0)),
            'no_newton_schulz': dict(_orthogonalise=lambda upd, *a: upd)}
res = {}
for name, patch in ((k, variants[k]) for k in (sys.argv[2:] or variants)):
    off._update = patch.get('_update', real_update); optim._orthogonalise = patch.get('_orthogonalise', real_orth)
    walls = []
    for _ in range(3):
        m(x[:, :-1], x[:, 1:]).backward(); opt.wait(); torch.cuda.synchronize()
        t0 = time.perf_counter(); opt.step(); torch.cuda.synchronize(); walls.append(round(time.perf_counter() - t0, 3)); opt.zero_grad()
    res[name] = walls; print(name, walls, flush=True)
json.dump(res, open(sys.argv[1], 'w'))
