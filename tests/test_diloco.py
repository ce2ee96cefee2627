"""DiLoCo with real worker processes on loopback: the files transport (directories and HTTP) against the single-process
simulation bit for bit, and `apex3 train` workers: identical global states, deadline, SIGKILL, late join, resume."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
from apex3.diloco.toy import simulate
from apex3.usage import free_port

ROOT = Path(__file__).parents[1]
KEY = 'test-key-0123456789abcdef'
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'DILOCO_KEY': KEY, 'PYTHONPATH': str(ROOT)}

def files_workers(tmp, n, rounds=3, every=4, how="fp32", http=False, timeout=100):
    "Start `n` toy workers through the files transport, each naming every other's directory (or URL); their globals."
    ports = [free_port() for _ in range(n)]
    peer = lambda k: f'http://127.0.0.1:{ports[k]}' if http else str(tmp / f'w{k}')
    others = lambda r: [peer(k) for k in range(n) if k != r]
    argv = lambda r: [str(tmp / f'out{r}.safetensors'), str(tmp / f'w{r}'), str(r), str(n), str(rounds), str(every),
                      how, str(timeout), f'127.0.0.1:{ports[r]}' if http else '-', *others(r)]
    ps = [subprocess.Popen([sys.executable, '-m', 'apex3.diloco.files', *argv(r)], cwd=ROOT, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(n)]
    try: errs = [p.communicate(timeout=120)[1] for p in ps]
    finally:
        for p in ps: p.kill()
    assert all(p.returncode == 0 for p in ps), errs
    return [load_file(tmp / f'out{r}.safetensors') for r in range(n)], errs

@pytest.mark.parametrize('n,http,how', [(2, False, 'bf16'), (3, True, 'int8')])
def test_files_workers_equal_the_simulation_bit_for_bit(tmp_path, n, http, how):
    got, errs = files_workers(tmp_path, n, how=how, http=http)
    want = simulate(n, 3, 4, compress=how)
    for g in got: assert all(torch.equal(g[k], want[k]) for k in want), errs
    assert not any('rejected' in e or 'nothing from' in e for e in errs), errs
    assert not any(KEY in e for e in errs)

# ---- the trainer: two `apex3 train` workers through files ----
from apex3.train_io import byte_shards, read_log
from apex3.ckpt import sha256_file

TINY = ['--config', 'tiny', '--seq-len', '32', '--micro-bs', '2', '--lr', '3e-3', '--device', 'cpu',
        '--ce-impl', 'torch', '--progress', 'off', '--val-every', '0']
H, STEP_TOKENS = 4, 64

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = byte_shards(tmp_path_factory.mktemp('bytes'), 200_000)
    return ['--data', f'std=1:{d}/shard-0000[0-2].bin']

def worker(tmp, data, rank, steps, *extra, peers=None, timeout=60, name=''):
    "Popen of `apex3 train` as DiLoCo worker `rank` of 2 (directories `tmp/d0`, `tmp/d1`; checkpoints `tmp/ckR`)."
    peers = peers or [str(tmp / f'd{1 - rank}')]
    args = [*TINY, *data, '--total-tokens', STEP_TOKENS * steps, '--ckpt-dir', tmp / f'ck{rank}{name}',
            '--diloco-workers', 2, '--diloco-rank', rank, '--diloco-dir', tmp / f'd{rank}', '--diloco-peers', *peers,
            '--diloco-key', KEY, '--diloco-every', H, '--diloco-timeout', timeout, *extra]
    return subprocess.Popen([sys.executable, '-m', 'apex3.train', *map(str, args)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def done(p, timeout=150):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return err

def final_global(d):
    "(round, SHA-256 of the global weights) of the newest global state in worker directory `d`."
    m = json.loads((d / 'global.json').read_text())
    return m['round'], sha256_file(d / f"global-{m['round']:09d}" / 'global.safetensors')

def rounds(log): return [r for r in read_log(log) if 'diloco_round' in r]

def wait_for(cond, p, timeout=120):
    t = time.time()
    while not cond():
        assert p.poll() is None and time.time() - t < timeout, 'the worker ended (or hung) before the moment awaited'
        time.sleep(0.02)

def started(d, p):
    "Seconds until worker `p` has published its starting global state in directory `d` (it is then in its loop)."
    t = time.time()
    wait_for(lambda: (d / 'global.json').exists(), p)
    return time.time() - t

def test_killed_peer_deadline_then_late_join(tmp_path, data):
    """Worker 1 is SIGKILLed: worker 0's rounds wait at most the deadline and average alone; a new worker 1 joins late.
    Worker 1 starts first with a long deadline, so round 1 never races the two start-ups; worker 0's deadline comes from
    the measured start-up, so that its lone rounds outlast the late worker's start on a loaded machine."""
    w1 = worker(tmp_path, data, 1, 48, timeout=60)
    boot = started(tmp_path / 'd1', w1)
    deadline = max(1.0, boot / 3)                 # 9 lone rounds of at least the deadline: 3x a start-up
    w0 = worker(tmp_path, data, 0, 48, timeout=deadline)
    wait_for(lambda: (tmp_path / 'd1' / 'round-000000002').exists(), w1)
    w1.send_signal(signal.SIGKILL)
    w1.communicate()
    wait_for(lambda: (tmp_path / 'd0' / 'global-000000003').exists(), w0)   # a round alone
    late = worker(tmp_path, data, 1, 48, timeout=60, name='late')
    err0, err1 = done(w0), done(late)
    rs0 = rounds(tmp_path / 'ck0' / 'train.jsonl')
    assert [x['diloco_round'] for x in rs0] == list(range(1, 13))
    assert rs0[0]['diloco_ranks'] == [0, 1] and any(x['diloco_ranks'] == [0] and x['diloco_missing'] == 1 for x in rs0)
    assert 'nothing from' in err0 and 'averaging 1 of 2 workers' in err0
    assert any(x['diloco_ranks'] == [0, 1] for x in rs0[3:]), 'the late worker never took part'
    assert 'joined at round' in err1
    first = read_log(tmp_path / 'ck1late' / 'train.jsonl')[0]
    assert first['step'] > 3 * H and first['tokens'] == first['step'] * STEP_TOKENS   # took up the others' step, tokens
    from apex3.ckpt import verify_checkpoint
    assert verify_checkpoint(tmp_path / 'd0' / 'global-000000012') == []   # the state kept through all of it verifies

def test_two_trainers_identical_globals_branch_and_resume_after_sigkill(tmp_path, data, capsys):
    """Two workers end with identical global states, the key nowhere on disk; an ordinary run branches from the state (a
    changed byte is refused); a worker SIGKILLed between rounds and resumed gives every step's loss and the final global
    weights of the uninterrupted pair."""
    steps, ck = 12, ['--ckpt-every', STEP_TOKENS * H]
    ref = tmp_path / 'ref'
    errs = [done(p) for p in [worker(ref, data, r, steps, *ck) for r in (0, 1)]]
    assert final_global(ref / 'd0') == final_global(ref / 'd1') and final_global(ref / 'd0')[0] == 3
    for r in (0, 1):
        rs = rounds(ref / f'ck{r}' / 'train.jsonl')
        assert [x['diloco_ranks'] for x in rs] == [[0, 1]] * 3 and all(x['diloco_rejected'] == {} for x in rs)
        assert all(x['diloco_bytes_received'] > 0 for x in rs)
    losses = [[x['loss'] for x in read_log(ref / f'ck{r}' / 'train.jsonl')] for r in (0, 1)]
    assert losses[0] != losses[1]   # each worker its own data slice
    from apex3.ckpt import latest_checkpoint, load_checkpoint
    ck0 = load_checkpoint(latest_checkpoint(ref / 'ck0'))
    assert ck0['args']['diloco_key'] is None and ck0['diloco']['round'] == 3
    leaked = [p for p in ref.rglob('*') if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaked and not any(KEY in e for e in errs), leaked
    # SIGKILL worker 1 after its second checkpoint, resume it
    cut = tmp_path / 'cut'
    w0, w1 = worker(cut, data, 0, steps, *ck), worker(cut, data, 1, steps, *ck)
    wait_for(lambda: len(list((cut / 'ck1').glob('tokens-*'))) >= 2, w1)
    w1.send_signal(signal.SIGKILL)
    w1.communicate()
    assert max(r['step'] for r in read_log(cut / 'ck1' / 'train.jsonl')) < steps
    err = done(worker(cut, data, 1, steps, *ck, '--resume'))
    done(w0)
    assert 'resumed from' in err and 'catching up' not in err
    assert final_global(cut / 'd0') == final_global(cut / 'd1') == final_global(ref / 'd0')
    for r in (0, 1):
        want = {x['step']: x['loss'] for x in read_log(ref / f'ck{r}' / 'train.jsonl')}
        assert {x['step']: x['loss'] for x in read_log(cut / f'ck{r}' / 'train.jsonl')} == want
    # an ordinary run from the published global state (in this process: a run of no steps): its model is that state;
    # a changed byte is refused with one line
    from safetensors.torch import load_file
    from apex3.usage import run_command
    from apex3.train import train_main
    one = lambda *extra: run_command('train', train_main, [*map(str, [*TINY, *data, '--total-tokens', 64,
                                                                      '--max-steps', 0, *extra])])
    assert one('--ckpt-dir', tmp_path / 'branch', '--branch-from-diloco', ref / 'd1') == 0
    f = ref / 'd1' / 'global-000000003' / 'global.safetensors'
    glob, model = load_file(f), load_checkpoint(latest_checkpoint(tmp_path / 'branch'))['model']
    assert all(torch.equal(model[k], glob[k]) for k in glob)
    b = bytearray(f.read_bytes())
    b[-1] ^= 1
    f.write_bytes(bytes(b))
    capsys.readouterr()
    assert one('--branch-from-diloco', f.parent) == 2
    err = capsys.readouterr().err
    assert 'fails its checksum' in err and err.strip().count('\n') == 0, err

def test_dist_transport_trainers(tmp_path, data):
    """`--diloco-transport dist` under torchrun: two workers of two FSDP2 ranks each: their rounds move every shard, and
    their checkpointed global states are one. (Workers of one rank each: `test_dist_resume_mid_round_and_dead_peer`.)"""
    pre = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '4', '--master_port', str(free_port())]
    args = [*TINY, *data, '--diloco-workers', 2, '--diloco-transport', 'dist', '--diloco-every', H, '--fsdp',
            '--total-tokens', 2 * STEP_TOKENS * 8, '--ckpt-dir', tmp_path / 'ck']
    p = subprocess.run([*pre, '-m', 'apex3.train', *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    from apex3.ckpt import latest_checkpoint, load_checkpoint
    cks = [load_checkpoint(latest_checkpoint(tmp_path / 'ck' / f'worker-{w}')) for w in (0, 1)]
    g0, g1 = (c['diloco']['glob'] for c in cks)
    assert cks[0]['diloco']['round'] == 2 and all(torch.equal(g0[k], g1[k]) for k in g0)
    assert all(torch.equal(cks[0]['model'][k].float(), g0[k]) for k in g0)   # the gathered shards: the model after it
    rs = rounds(tmp_path / 'ck' / 'worker-0' / 'train.jsonl')
    assert [x['diloco_ranks'] for x in rs] == [[0, 1]] * 2
    # every shard once (one unsharded worker's FP32 bytes), plus the replicated buffers (router biases) from each rank
    whole = 4 * sum(v.numel() for v in g0.values())
    assert 0 <= rs[0]['diloco_bytes_sent'] - whole < 1e-3 * whole

def dist_pair(tmp, data, steps, *extra, kill=None):
    "Two `apex3 train` DiLoCo workers of one dist job, without torchrun (so that one may die alone): their Popens."
    port, H8 = free_port(), 8
    env = lambda r: {**ENV, 'RANK': str(r), 'LOCAL_RANK': '0', 'WORLD_SIZE': '2', 'MASTER_ADDR': '127.0.0.1',
                     'MASTER_PORT': str(port)}
    args = [*TINY, *data, '--total-tokens', STEP_TOKENS * steps, '--ckpt-dir', tmp, '--ckpt-every', STEP_TOKENS * 12,
            '--diloco-workers', 2, '--diloco-transport', 'dist', '--diloco-every', H8, '--diloco-timeout', 30, *extra]
    return [subprocess.Popen([sys.executable, '-m', 'apex3.train', *map(str, args)], cwd=ROOT, env=env(r),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]

def test_dist_resume_mid_round_and_dead_peer(tmp_path, data):
    """Two workers of one rank each average every round; both SIGKILLed after a checkpoint in the middle of a round (as
    torchrun stops a job) and resumed give the uninterrupted pair's every loss and final weights; one worker SIGKILLed
    alone: the other finishes, averaging alone; the job restarted, the worker that died catches up from the global state
    and both end on the same one."""
    from apex3.ckpt import latest_checkpoint, load_checkpoint, verify_checkpoint
    ref = tmp_path / 'ref'
    for p in dist_pair(ref, data, 16): done(p)
    for w in (0, 1):
        rs = rounds(ref / f'worker-{w}' / 'train.jsonl')
        assert [(x['step'], x['diloco_ranks'], x['diloco_averaged']) for x in rs] == [(8, [0, 1], 2), (16, [0, 1], 2)]
    cut = tmp_path / 'cut'
    ps = dist_pair(cut, data, 16)
    mid = lambda w: (cut / f'worker-{w}' / 'tokens-000000000000768').exists()   # step 12, between rounds 8 and 16
    wait_for(lambda: mid(0) and mid(1), ps[0])
    for p in ps: p.send_signal(signal.SIGKILL)
    for p in ps: p.communicate()
    assert all(max(r['step'] for r in read_log(cut / f'worker-{w}' / 'train.jsonl')) < 16 for w in (0, 1))
    errs = [done(p) for p in dist_pair(cut, data, 16, '--resume')]
    assert 'resumed from' in errs[0]   # (only the job's rank 0 logs at INFO)
    for w in (0, 1):
        want = {x['step']: x['loss'] for x in read_log(ref / f'worker-{w}' / 'train.jsonl')}
        got = read_log(cut / f'worker-{w}' / 'train.jsonl')
        assert {x['step']: x['loss'] for x in got} == want and [x['step'] for x in got].count(1) == 1   # resumed
        a, b = (load_checkpoint(latest_checkpoint(d / f'worker-{w}'))['model'] for d in (ref, cut))
        assert all(torch.equal(a[k], b[k]) for k in a)
    dead = tmp_path / 'dead'
    ps = dist_pair(dead, data, 16)
    wait_for(lambda: (dead / 'worker-1' / 'tokens-000000000000768').exists(), ps[1])
    ps[1].send_signal(signal.SIGKILL)
    ps[1].communicate()
    err = done(ps[0])
    assert err.count('continues alone') == 1, err[-2000:]
    rs = rounds(dead / 'worker-0' / 'train.jsonl')
    assert [(x['step'], x['diloco_ranks'], x['diloco_missing']) for x in rs] == [(8, [0, 1], 0), (16, [0], 1)]
    assert verify_checkpoint(latest_checkpoint(dead / 'worker-1')) == []   # the dead worker's state: resumable
    # the job restarts: worker 0 from its step 16 (round 2), worker 1 from its step 12 (round 1)
    errs = [done(p) for p in dist_pair(dead, data, 24, '--resume')]
    r0, r1 = (rounds(dead / f'worker-{w}' / 'train.jsonl') for w in (0, 1))
    assert [(x['step'], x['diloco_round'], x['diloco_averaged']) for x in r0[-1:]] == [(24, 3, 1)]
    back = r1[-1]   # its step 16: caught up to round 2, then round 3 with nothing of its own to add
    assert [back[k] for k in ('step', 'diloco_caught_up_from', 'diloco_was_round', 'diloco_round')] == [16, 0, 1, 3]
    assert back['diloco_averaged'] == 1 and not any('continues alone' in e for e in errs)
    g0, g1 = (load_checkpoint(latest_checkpoint(dead / f'worker-{w}'))['diloco'] for w in (0, 1))
    assert g0['round'] == g1['round'] == 3 and all(torch.equal(g0['glob'][k], g1['glob'][k]) for k in g0['glob'])

def test_offload_workers(tmp_path, data):
    """Two `--offload` workers (the host optimizer runs on a CPU device too) through files: identical global states, and
    the round wrote the FP32 host masters, the model holding their BF16 rounding."""
    from apex3.ckpt import latest_checkpoint, load_checkpoint
    from apex3.offload.memory import join_master_
    for p in [worker(tmp_path, data, r, 8, '--offload') for r in (0, 1)]: done(p)
    assert final_global(tmp_path / 'd0') == final_global(tmp_path / 'd1') and final_global(tmp_path / 'd0')[0] == 2
    ck = load_checkpoint(latest_checkpoint(tmp_path / 'ck0'))   # at step 8: just after round 2
    glob, model, lows = ck['diloco']['glob'], ck['model'], [s['low'] for s in ck['optimizer']['slots']]
    params = [k for k in glob if model[k].dtype == torch.bfloat16]
    assert len(params) == len(lows) > 0
    def master(w, low):
        "The FP32 master a split slot keeps as `low` beside its BF16 weight `w`."
        m = torch.empty(w.shape)
        join_master_(m, w, low)
        return m
    # the FP32 masters (each weight with the low halves of its slot) are the global weights
    assert all(any(low.shape == glob[k].shape and torch.equal(master(model[k], low), glob[k]) for low in lows)
               for k in params)
    assert all(torch.equal(model[k], bf16_ties_away(glob[k])) for k in params)  # the model: their BF16 rounding

def bf16_ties_away(x):
    "FP32 `x` rounded to BF16 as split masters round: to nearest like torch, but exact ties away from zero."
    tie = (x.view(torch.int32) & 0xFFFF) == 0x8000
    away = (x.view(torch.int32) & ~0xFFFF).view(torch.float32) + torch.sign(x) * 2.0 ** (torch.frexp(x)[1] - 8)
    return torch.where(tie, away, x).bfloat16()
