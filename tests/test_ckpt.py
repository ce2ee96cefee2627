"Checkpoints (apex3.ckpt): round trips, pruning, corruption, writers killed mid-checkpoint, atomicity seen by a concurrent reader."
import logging, os, random, shutil, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest, torch
from apex3.usage import UsageError
from apex3.ckpt import (SUMS, TMP, ckpt_name, checkpoint_tokens, list_checkpoints, verify_checkpoint, save_checkpoint,
                        latest_checkpoint, load_checkpoint, prune_checkpoints, rng_state, set_rng_state)

def small_state(i=0):
    g = torch.Generator().manual_seed(i)
    return {'model': {'w': torch.randn(64, 32, generator=g), 'b': torch.zeros(32, dtype=torch.bfloat16)},
            'meta': {'i': i, 'loss': 1.5 + i, 'cursor': [i, i + 1]}}

def flip_byte(path):
    data = bytearray(path.read_bytes()); data[len(data) // 2] ^= 0xFF; path.write_bytes(bytes(data))

def names(d): return [p.name for p in list_checkpoints(d)]

# --- round trip ------------------------------------------------------------------------------------------

def test_round_trip_nested(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    net(torch.randn(4, 5)).pow(2).sum().backward(); opt.step()
    state = {'model': net.state_dict(), 'optimizer': opt.state_dict(),
             'schedule': {'step': 12, 'lr': 2.5e-4, 'phase': 'stable'},
             'router': [torch.randn(8), torch.arange(4, dtype=torch.int64)],
             'data': {'cursor': [[1, 2], [3]], 'seen': 123_456_789_012, 'weights': (0.25, 0.75)},
             'meta': 7}
    p = save_checkpoint(tmp_path, 123_456, state)
    assert p == tmp_path / ckpt_name(123_456) and checkpoint_tokens(p) == 123_456
    assert sorted(f.name for f in p.iterdir()) == sorted([SUMS] + [f'{k}.pt' for k in state])
    back = load_checkpoint(p)
    assert list(back) == list(state)
    for k, v in net.state_dict().items(): assert torch.equal(back['model'][k], v)
    s0, s1 = opt.state_dict(), back['optimizer']
    assert s0['param_groups'] == s1['param_groups']
    for i in s0['state']:
        for k in s0['state'][i]: assert torch.equal(torch.as_tensor(s0['state'][i][k]), torch.as_tensor(s1['state'][i][k]))
    assert back['schedule'] == state['schedule'] and back['data'] == state['data'] and back['meta'] == 7
    assert all(torch.equal(a, b) for a, b in zip(back['router'], state['router']))
    assert list(load_checkpoint(p, ['meta', 'schedule'])) == ['meta', 'schedule']
    assert list(load_checkpoint(p, 'data')) == ['data']
    with pytest.raises(UsageError, match='has no rng'): load_checkpoint(p, ['model', 'rng'])
    with pytest.raises(UsageError, match='not a checkpoint'): load_checkpoint(tmp_path / 'nope')

def test_offload_bf16_momentum_resumes(tmp_path):
    "The host optimizer, Muon's momentum in BF16, through a checkpoint: the dtype stays, the run goes on bit for bit."
    from apex3.config import get_config
    from apex3.model import Transformer
    from apex3.offload.host_optim import OffloadOptimizer
    from apex3.offload.memory import PinnedPool
    def built():
        torch.manual_seed(0)
        m = Transformer(get_config('tiny'))
        return m, OffloadOptimizer(m, pool=PinnedPool(2**26, pin=False), momentum_dtype=torch.bfloat16)
    def step(m, o, g):
        x = torch.randint(0, 256, (2, 33), generator=g)
        m(x[:, :-1], x[:, 1:]).backward(); o.step(); o.zero_grad()
    (m, o), g = built(), torch.Generator().manual_seed(1)
    for _ in range(2): step(m, o, g)
    back = load_checkpoint(save_checkpoint(tmp_path, 10, {'model': m.state_dict(), 'optimizer': o.state_dict()}))
    m2, o2 = built()
    m2.load_state_dict(back['model']); o2.load_state_dict(back['optimizer'])
    assert {x.dtype for s in o2.slots if 'momentum' in s.group for x in s.state} == {torch.bfloat16}
    at = g.get_state()
    step(m, o, g); g.set_state(at); step(m2, o2, g)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))

def test_sha256sum_reads_our_sums(tmp_path):
    if not shutil.which('sha256sum'): pytest.skip('no sha256sum')
    p = save_checkpoint(tmp_path, 1, small_state())
    assert subprocess.run(['sha256sum', '--check', '--quiet', SUMS], cwd=p).returncode == 0

def test_bad_arguments(tmp_path):
    for bad in ({'../x': 1}, {'.hidden': 1}, {SUMS: 1}, {'a b': 1}, {}):
        with pytest.raises(UsageError): save_checkpoint(tmp_path, 1, bad)
    for tokens in (-1, 2.5):
        with pytest.raises(UsageError): save_checkpoint(tmp_path, tokens, {'a': 1})
    with pytest.raises(UsageError, match='keep at least one'): save_checkpoint(tmp_path, 1, {'a': 1}, keep=0)
    assert list(tmp_path.iterdir()) == []
    assert checkpoint_tokens(save_checkpoint(tmp_path, 1e9, {'a': 1})) == 10**9   # integral floats are fine

def test_failed_save_leaves_nothing(tmp_path):
    good = save_checkpoint(tmp_path, 1, small_state())
    with pytest.raises(Exception): save_checkpoint(tmp_path, 2, {'model': {'w': torch.ones(3)}, 'bad': lambda: 0})
    assert list(tmp_path.iterdir()) == [good] and latest_checkpoint(tmp_path) == good

def test_same_tokens_replaces(tmp_path):
    save_checkpoint(tmp_path, 5, small_state(1))
    p = save_checkpoint(tmp_path, 5, small_state(2))
    assert names(tmp_path) == [ckpt_name(5)] and load_checkpoint(p)['meta']['i'] == 2
    assert not list(tmp_path.glob(f'{TMP}*'))

# --- pruning ---------------------------------------------------------------------------------------------

def test_keep_k(tmp_path):
    for t in range(1, 6): save_checkpoint(tmp_path, t * 100, small_state(t), keep=3)
    assert names(tmp_path) == [ckpt_name(t * 100) for t in (3, 4, 5)]
    save_checkpoint(tmp_path, 600, small_state(6), keep=1)
    assert names(tmp_path) == [ckpt_name(600)]
    for t in (7, 8): save_checkpoint(tmp_path, t * 100, small_state(t), keep=None)
    assert len(names(tmp_path)) == 3
    assert not list(tmp_path.glob(f'{TMP}*'))

def test_prune_never_deletes_the_new_one(tmp_path, caplog):
    "An older checkpoint written after newer ones (a run resumed from further back) survives its own pruning."
    for t in (100, 200, 300): save_checkpoint(tmp_path, t, small_state(t))
    with caplog.at_level(logging.WARNING, 'apex3.ckpt'): save_checkpoint(tmp_path, 150, small_state(150), keep=1)
    assert names(tmp_path) == [ckpt_name(150), ckpt_name(300)]
    assert 'newer checkpoints exist' in caplog.text

def test_prune_skips_directories_without_sums(tmp_path):
    for t in (1, 2, 3): save_checkpoint(tmp_path, t, small_state(t), keep=5)
    (tmp_path / ckpt_name(1) / SUMS).unlink()      # not complete: neither counted nor deleted by pruning
    assert prune_checkpoints(tmp_path, 1) == [tmp_path / ckpt_name(2)]
    assert names(tmp_path) == [ckpt_name(1), ckpt_name(3)]

# --- corruption ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('damage', ['flip', 'truncate', 'delete', 'no-sums', 'bad-sums'])
def test_corrupt_newest_falls_back(tmp_path, caplog, damage):
    good = save_checkpoint(tmp_path, 1000, small_state(1))
    bad = save_checkpoint(tmp_path, 2000, small_state(2))
    f = bad / 'model.pt'
    if damage == 'flip': flip_byte(f)
    elif damage == 'truncate': f.write_bytes(f.read_bytes()[:-100])
    elif damage == 'delete': f.unlink()
    elif damage == 'no-sums': (bad / SUMS).unlink()
    else: (bad / SUMS).write_text('garbage\n')
    assert verify_checkpoint(bad) and not verify_checkpoint(good)
    with caplog.at_level(logging.WARNING, 'apex3.ckpt'): assert latest_checkpoint(tmp_path) == good
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad.name in warnings[0].getMessage()
    with pytest.raises(UsageError, match='model.pt' if damage in ('flip', 'truncate', 'delete') else SUMS):
        load_checkpoint(bad)
    assert load_checkpoint(good)['meta']['i'] == 1

def test_all_corrupt_is_an_error(tmp_path):
    for t in (1, 2): flip_byte(save_checkpoint(tmp_path, t, small_state(t)) / 'meta.pt')
    with pytest.raises(UsageError, match='no checkpoint .* verifies'): latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / 'missing') is None
    (tmp_path / 'empty').mkdir(); assert latest_checkpoint(tmp_path / 'empty') is None

# --- writers killed mid-checkpoint -----------------------------------------------------------------------

STALLING_WRITER = '''
import sys, time, torch
from pathlib import Path
from apex3.ckpt import save_checkpoint
class Stall:
    def __reduce__(self): Path(sys.argv[3]).touch(); time.sleep(600)
save_checkpoint(sys.argv[1], int(sys.argv[2]), {'model': {'w': torch.ones(200_000)}, 'stall': Stall()})
'''

def kill_mid_file(ckpt_dir, tokens, ready):
    p = subprocess.Popen([sys.executable, '-c', STALLING_WRITER, str(ckpt_dir), str(tokens), str(ready)])
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert p.poll() is None and time.monotonic() - t0 < 60, 'the writer never reached the stall'
            time.sleep(0.02)
        p.kill()
    finally: p.wait()

def test_writer_killed_mid_file(tmp_path, caplog):
    d = tmp_path / 'ckpt'
    good = save_checkpoint(d, 1000, small_state(1))
    kill_mid_file(d, 2000, tmp_path / 'ready')
    (left,) = d.glob(f'{TMP}*')
    assert (left / 'model.pt').exists() and (left / 'stall.pt').exists() and not (left / SUMS).exists()
    assert names(d) == [good.name]
    with caplog.at_level(logging.WARNING, 'apex3.ckpt'): assert latest_checkpoint(d) == good
    assert 'unfinished' in caplog.text
    new = save_checkpoint(d, 2000, small_state(2))
    assert not left.exists() and latest_checkpoint(d) == new and load_checkpoint(new)['meta']['i'] == 2
    assert names(d) == [good.name, new.name]

LOOPING_WRITER = '''
import sys, torch
from pathlib import Path
from apex3.ckpt import save_checkpoint
d, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    save_checkpoint(d, i * 1000, {'model': {'w': torch.full((300_000,), float(i))}, 'meta': {'i': i}}, keep=2)
    if i == 1: Path(sys.argv[3]).touch()
'''

def check_all_verify(d, seen):
    "Every tokens-* directory verifies, or was pruned away while we looked (then it no longer exists)."
    for p in list_checkpoints(d):
        if problems := verify_checkpoint(p):
            assert not p.exists(), f'{p.name} exists but does not verify: {problems}'
        else: seen.add(p.name)

def test_no_unverified_checkpoint_is_ever_visible(tmp_path):
    "A reader polling while a writer saves (and prunes) 25 checkpoints never sees a tokens-* directory that fails to verify."
    d, ready, seen = tmp_path / 'ckpt', tmp_path / 'ready', set()
    p = subprocess.Popen([sys.executable, '-c', LOOPING_WRITER, str(d), '25', str(ready)])
    try:
        while p.poll() is None: check_all_verify(d, seen)
    finally: p.kill(); p.wait()
    assert p.returncode == 0
    check_all_verify(d, seen)
    assert len(seen) >= 5, seen            # the reader did watch the writer at work
    assert names(d) == [ckpt_name(24_000), ckpt_name(25_000)] and not list(d.glob(f'{TMP}*'))

@pytest.mark.parametrize('seed', [0, 1])
def test_writer_killed_at_a_random_moment(tmp_path, seed):
    "SIGKILL anywhere in the save loop (mid-file, mid-rename, mid-prune): what is left verifies, and the next save works."
    d, ready = tmp_path / 'ckpt', tmp_path / 'ready'
    p = subprocess.Popen([sys.executable, '-c', LOOPING_WRITER, str(d), '1000', str(ready)])
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert p.poll() is None and time.monotonic() - t0 < 60
            time.sleep(0.01)
        time.sleep(random.Random(seed).uniform(0.05, 1.0))
        p.kill()
    finally: p.wait()
    for c in list_checkpoints(d): assert not verify_checkpoint(c), c
    last = latest_checkpoint(d)
    i = load_checkpoint(last)['meta']['i']
    new = save_checkpoint(d, (i + 1) * 1000, {'meta': {'i': i + 1}}, keep=2)
    assert latest_checkpoint(d) == new and not list(d.glob(f'{TMP}*'))

# --- random number generators ----------------------------------------------------------------------------

def test_rng_round_trip(tmp_path):
    random.seed(1); np.random.seed(2); torch.manual_seed(3)
    random.random(); np.random.rand(5); torch.randn(7)           # move off the seeds
    p = save_checkpoint(tmp_path, 0, {'rng': rng_state()})
    draws = lambda: (random.random(), np.random.rand(4).tolist(), torch.randn(4).tolist(), torch.randint(0, 100, (3,)).tolist())
    first = draws()
    draws(); draws()                                             # the generators move on
    set_rng_state(load_checkpoint(p)['rng'])
    assert draws() == first
    set_rng_state(load_checkpoint(p, map_location='cpu')['rng'])
    assert draws() == first

@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA')
def test_rng_cuda(tmp_path):
    torch.cuda.init(); torch.cuda.manual_seed_all(5)
    s = rng_state(); assert len(s['cuda']) == torch.cuda.device_count()
    a = torch.randn(4, device='cuda').tolist()
    set_rng_state(s)
    assert torch.randn(4, device='cuda').tolist() == a
