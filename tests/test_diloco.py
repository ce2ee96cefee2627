"DiLoCo with real worker processes on loopback: the files transport (directories and HTTP) and dist (gloo) against the single-process simulation, faults, and the trainer's flags."
import os, signal, socket, subprocess, sys, time
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
from apex3.diloco import simulate

ROOT = Path(__file__).parents[1]
KEY = 'test-key-0123456789abcdef'
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'DILOCO_KEY': KEY, 'PYTHONPATH': str(ROOT)}

def free_port():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def files_workers(tmp, n, rounds=3, every=4, how="fp32", http=False, timeout=100):
    "Start `n` toy workers through the files transport, each naming every other's directory (or URL); their final globals."
    ports = [free_port() for _ in range(n)]
    peer = lambda k: f'http://127.0.0.1:{ports[k]}' if http else str(tmp / f'w{k}')
    ps = [subprocess.Popen([sys.executable, '-m', 'apex3.diloco_files', str(tmp / f'out{r}.safetensors'), str(tmp / f'w{r}'),
                            str(r), str(n), str(rounds), str(every), how, str(timeout),
                            f'127.0.0.1:{ports[r]}' if http else '-', *[peer(k) for k in range(n) if k != r]],
                           cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(n)]
    try: errs = [p.communicate(timeout=120)[1] for p in ps]
    finally:
        for p in ps: p.kill()
    assert all(p.returncode == 0 for p in ps), errs
    return [load_file(tmp / f'out{r}.safetensors') for r in range(n)], errs

@pytest.mark.parametrize('n,http,how', [(2, False, 'fp32'), (3, True, 'int8'), (3, False, 'bf16')])
def test_files_workers_equal_the_simulation_bit_for_bit(tmp_path, n, http, how):
    got, errs = files_workers(tmp_path, n, how=how, http=http)
    want = simulate(n, 3, 4, compress=how)
    for g in got: assert all(torch.equal(g[k], want[k]) for k in want), errs
    assert not any('rejected' in e or 'nothing from' in e for e in errs), errs
    assert not any(KEY in e for e in errs)

def test_dist_two_and_three_workers(tmp_path):
    from apex3.diloco import spawn_dist_toy
    for n in (2, 3):
        got, want = spawn_dist_toy(tmp_path, n, 3, 4), simulate(n, 3, 4)
        for g in got:
            assert all(torch.equal(g[k], got[0][k]) for k in want)
            assert all(torch.allclose(g[k], want[k], atol=1e-6) for k in want)
