"Generation (apex3.generate): the inductor-compiled decode step against full forwards; the CLI as a user runs it."
import subprocess, sys
from pathlib import Path
import torch
from torch._dynamo.utils import counters
from apex3.config import get_config
from apex3.model import Transformer
from apex3.generate import Generator, next_doc

def tiny_model():
    torch.manual_seed(0)
    return Transformer(get_config('tiny')).eval()

def test_compiled_step_matches_full_forward_without_recompiles():
    "Inductor-compiled steps give the full forward's logits at every position, and positions advancing never recompile."
    model = tiny_model()
    torch._dynamo.reset()
    g = Generator(model, max_len=48, max_batch=2, compile=True)
    rows = [[3, 1, 4, 1, 5, 9], [2, 6, 5]]
    logits, pos, doc = g.prefill(rows)
    seqs, worst = [list(r) for r in rows], 0.0
    for step in range(20):
        if step == 1: frames = counters['stats']['unique_graphs']
        full = torch.stack([model(torch.tensor([s]))[0, -1] for s in seqs])
        worst = max(worst, (logits - full).abs().max().item())
        tok = logits.argmax(-1)
        for s, t in zip(seqs, tok.tolist()): s.append(t)
        logits = g.step(tok, pos, doc).clone()
        pos, doc = pos + 1, next_doc(tok, pos, doc, model.cfg.eos_id)
    assert worst < 1e-5, worst
    assert counters['stats']['unique_graphs'] == frames

def apex3(*args):
    "Run `apex3 *args` as a user does, in a fresh process."
    main = 'import sys; from apex3.cli import main; sys.exit(main(sys.argv[1:]))'
    return subprocess.run([sys.executable, '-c', main, *map(str, args)], capture_output=True, text=True, timeout=300)

def test_cli_refuses_bad_and_crafted_checkpoints(tmp_path):
    "A missing or crafted checkpoint is one stderr line and status 2; the crafted pickle's side effect never happens."
    from apex3.ckpt import save_checkpoint
    marker = tmp_path / 'pwned'
    save_checkpoint(tmp_path / 'evil', 0, {'model': {}, 'args': {'config': 'tiny', 'x': _Touch(marker)}})
    for ckpt in (tmp_path / 'missing', tmp_path / 'evil'):
        r = apex3('generate', ckpt, '--prompt', 'hi')
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and 'Traceback' not in r.stderr, r.stderr
    assert 'refused' in r.stderr and not marker.exists()

class _Touch:
    "Pickles as a call of `Path.touch`."
    def __init__(self, path): self.path = path
    def __reduce__(self): return (Path.touch, (self.path,))

def test_compiled_int8_step_tracks_fp32():
    "Inductor-compiled int8 steps (the fused int8 reductions) stay within 3% of the fp32 full forward's logits."
    from apex3.generate import quantize_int8
    model = tiny_model()
    torch._dynamo.reset()
    g = Generator(quantize_int8(model), max_len=48, max_batch=2, compile=True)
    rows = [[3, 1, 4, 1, 5, 9], [2, 6, 5]]
    logits, pos, doc = g.prefill(rows)
    seqs, rel, agree = [list(r) for r in rows], [], []
    for step in range(8):
        full = torch.stack([model(torch.tensor([s]))[0, -1] for s in seqs])
        rel.append(((logits - full).norm() / full.norm()).item())
        agree += (logits.argmax(-1) == full.argmax(-1)).tolist()
        tok = full.argmax(-1)   # teacher-forced on the fp32 greedy tokens
        for s, t in zip(seqs, tok.tolist()): s.append(t)
        logits = g.step(tok, pos, doc).clone()
        pos, doc = pos + 1, next_doc(tok, pos, doc, model.cfg.eos_id)
    assert max(rel) < 0.03, rel
    assert sum(agree) >= 0.9 * len(agree), agree
