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

# --- bounds a stranger's input meets before anything large is built: judged from outside, under an address-space limit

from test_out_of_memory import HOST, apex3 as limited, one_line, tiny_ckpt   # the checkpoint fixture, and its runner

def test_a_prompt_past_max_len_is_refused_before_the_cache(tiny_ckpt):
    """`--prompt "$(cat file.py)"`, 100,000 bytes: refused against `--max-len` (2048 by default) in one line. The
    control lifts `--max-len` over it: the prefill's attention, quadratic in the prompt, then asks for 10 GB and the
    host refuses; a prompt that fits continues."""
    prompt = 'x' * 100_000
    one_line(limited('generate', tiny_ckpt, '--prompt', prompt), 'need 100064 positions; --max-len is 2048')
    one_line(limited('generate', tiny_ckpt, '--prompt', prompt[:2000], '--max-new', 100),
             'need 2100 positions; --max-len is 2048')
    control = limited('generate', tiny_ckpt, '--prompt', prompt, '--max-len', 1 << 20, '--max-new', 1)
    one_line(control, *HOST)
    fits = limited('generate', tiny_ckpt, '--prompt', prompt[:2000], '--max-new', 48)
    assert fits.returncode == 0 and fits.stdout.startswith(prompt[:2000]), fits.stderr[-2000:]

def test_flags_that_lie_are_refused_before_the_model_is_built(tiny_ckpt, tmp_path):
    """A checkpoint whose `args` say config C beside a tiny model.pt: the shapes, compared on the meta device, refuse it
    in one line. The control, without that comparison, builds config C (21B parameters) and runs out of memory."""
    from apex3.ckpt import load_checkpoint, save_checkpoint
    ck = load_checkpoint(next(tiny_ckpt.iterdir()), ['model', 'args'], mmap=False)
    args = {k: v for k, v in ck['args'].items() if k != 'set'} | {'config': 'C'}
    save_checkpoint(tmp_path / 'lie', 0, {'model': ck['model'], 'args': args})
    lie = next((tmp_path / 'lie').iterdir())
    one_line(limited('generate', lie, '--prompt', 'hi'), 'tok_emb.weight is (257, 64), the flags make (204800, 2560)')
    unchecked = 'import apex3.train as t; t.shape_misfit = lambda *a: None'
    control = limited('generate', lie, '--prompt', 'hi', switch=unchecked)
    one_line(control, *HOST)
    honest = limited('generate', tiny_ckpt, '--prompt', 'hi', '--max-new', 2)
    assert honest.returncode == 0 and honest.stdout.startswith('hi'), honest.stderr[-2000:]

def test_a_tokenizer_not_found_says_what_was_looked_for_and_where(tiny_ckpt, tmp_path):
    """The data a checkpoint was trained on moved away, or the tokenizer file its meta.json names gone: one line naming
    what was looked for and where, and `--tokenizer`. The controls: the data in place, the file back, or `--tokenizer`
    naming one, and the checkpoint decodes."""
    import json, shutil
    from tokenizers import Tokenizer, models
    from apex3.ckpt import load_checkpoint, save_checkpoint
    ck = load_checkpoint(next(tiny_ckpt.iterdir()), ['model', 'args'], mmap=False)
    data = shutil.copytree(tiny_ckpt.parent / 'bytes', tmp_path / 'DATA')
    args = ck['args'] | {'data': [f'{data}/shard-*.bin']}
    save_checkpoint(tmp_path / 'ckpt', 0, {'model': ck['model'], 'args': args})
    decodes = lambda *flags: apex3('generate', tmp_path / 'ckpt', '--prompt', 'w1', '--max-new', 2, *flags)
    assert decodes().returncode == 0
    data.rename(tmp_path / 'DATAmoved')
    one_line(decodes(), f'no token shards with a meta.json match its data {data}/shard-*.bin', '--tokenizer FILE')
    (tmp_path / 'DATAmoved').rename(data)
    meta = json.loads((data / 'meta.json').read_text())
    (data / 'meta.json').write_text(json.dumps(meta | {'tokenizer': '../tok/tokenizer.json'}))
    one_line(decodes(), "names the tokenizer '../tok/tokenizer.json'",
             f'and there is no file {tmp_path}/tok/tokenizer.json; pass --tokenizer FILE')
    words = Tokenizer(models.WordLevel({f'w{i}': i for i in range(257)}, unk_token='w0'))
    words.save(str(tmp_path / 'words.json'))
    given = decodes('--tokenizer', tmp_path / 'words.json')
    assert given.returncode == 0 and given.stdout.startswith('w1'), given.stderr
    (tmp_path / 'tok').mkdir()
    shutil.copy(tmp_path / 'words.json', tmp_path / 'tok/tokenizer.json')
    assert decodes().stdout == given.stdout
