"""Which part of the offloaded optimizer step keeps its uploads and downloads apart? Unprofiled step walls of C with two
layers with parts of the update swapped out.   usage: python3 tools/step_bisect.py OUT.json [VARIANT ...]"""
import json, os, sys, torch
import apex3.offload.host_optim as off, apex3.optim as optim   # off._update: where the step calls it
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from link_probe import step_walls, two_layer_offload

VARIANTS = {'real': {}, 'no_update': dict(_update=lambda chunk, ms, st, gr: torch._foreach_add_(ms, 0.0)),
            'no_newton_schulz': dict(_orthogonalise=lambda upd, *a: upd)}

def main(path, *names):
    m, x, opt = two_layer_offload('C', 'cuda')
    real = dict(_update=off._update, _orthogonalise=optim._orthogonalise)
    res = {}
    for name in names or VARIANTS:
        patch = real | VARIANTS[name]
        off._update, optim._orthogonalise = patch['_update'], patch['_orthogonalise']
        res[name] = step_walls(m, x, opt); print(name, res[name], flush=True)
    json.dump(res, open(path, 'w'))

if __name__ == '__main__': main(*sys.argv[1:])
