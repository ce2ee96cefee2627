"The trainer as a user runs it, in subprocesses on CPU: flags, kill-and-resume equality, non-finite steps, FSDP2 on two ranks."
import json, math, os, shutil, signal, subprocess, sys, time
from functools import partial
from pathlib import Path
import pytest, torch
from apex3.train_io import byte_shards, read_log
from apex3.usage import free_port

ROOT = Path(__file__).parents[1]
TINY = ['--config', 'tiny', '--seq-len', '32', '--micro-bs', '2', '--lr', '3e-3', '--device', 'cpu', '--ce-impl', 'torch',
        '--progress', 'off']

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = byte_shards(tmp_path_factory.mktemp('bytes'), 200_000)
    return ['--data', f'std=1:{d}/shard-0000[0-2].bin', '--val-data', f'std={d}/shard-00003.bin']

def trainer(*args, torchrun=None, **kw):
    "Popen of `python -m apex3.train ARGS` (or under torchrun with N ranks), one thread per process."
    pre = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(torchrun), '--master_port', str(free_port())] if torchrun else [sys.executable]
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    return subprocess.Popen([*pre, '-m', 'apex3.train', *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

def finish(p, timeout=300):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err

def test_bad_flag_is_one_line_and_status_2():
    rc, out, err = finish(trainer('--total-tokens', '1e6', '--recompute', 'some'))
    assert rc == 2 and err.strip().count('\n') == 0 and err.startswith('apex3 train: error:'), err

def test_unknown_config_is_named_before_missing_data():
    from apex3.train import main
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err): rc = main(['--config', 'nope', '--total-tokens', '1e6'])
    assert rc == 2 and "unknown config 'nope'" in err.getvalue(), err.getvalue()

def test_published_line_parses():
    from apex3.train import train_parser
    line = ('--config C --eos-id 203776 --data a=1:A/*.bin --data b=2:B/*.bin --val-data a=V/*.bin --set n_layers=2 '
            'seq_aux_alpha=1e-3 --offload --offload-accum cpu --compile-blocks --recompute none --act-budget 0.15 '
            '--moe-chunk 0 --micro-bs 6 --attn fa3 --ce-impl triton --ce-chunk 4096 --gemm-offload hooks --act-offload 72 '
            '--precision fp8_rowwise --fp8-recipe tensorwise --total-tokens 1.1e12 --stop-at-tokens 0.51e12 --ckpt-dir CKPT '
            '--ckpt-every 1e9 --keep-ckpts 2 --arith-probe PROBE --arith-every 50 --resume --accum 8 --seq-len 8192 --seed 0')
    a = train_parser().parse_args(line.split())
    assert (a.total_tokens, a.stop_at_tokens, a.ckpt_every, a.accum, a.seq_len, a.resume) == (1.1e12, 0.51e12, 1e9, 8, 8192, True)
    assert a.data == ['a=1:A/*.bin', 'b=2:B/*.bin'] and a.set == ['n_layers=2', 'seq_aux_alpha=1e-3']

def _losses(log): return {r['step']: r['loss'] for r in read_log(log)}

@pytest.mark.parametrize('extra', [[], ['--offload']], ids=['optimizer', 'offload'])   # offload: split masters
def test_kill_and_resume_is_bit_identical(data, tmp_path, extra):
    "SIGKILL a run after its first checkpoint, resume it, and compare every step's loss with an uninterrupted run."
    steps = 40   # 64 tokens a step; a checkpoint every 4 steps
    common = [*TINY, *data, '--total-tokens', 64 * steps, '--ckpt-every', 256, '--val-every', 10, *extra]
    ref = trainer(*common, '--ckpt-dir', tmp_path / 'ref')
    run = trainer(*common, '--ckpt-dir', tmp_path / 'cut')
    deadline = time.time() + 120
    while not list((tmp_path / 'cut').glob('tokens-*')) and run.poll() is None and time.time() < deadline: time.sleep(0.01)
    run.send_signal(signal.SIGKILL); run.communicate()
    assert run.returncode == -signal.SIGKILL
    cut = _losses(tmp_path / 'cut' / 'train.jsonl')
    assert max(cut) < steps, 'the run finished before it was killed'
    rc, _, err = finish(trainer(*common, '--ckpt-dir', tmp_path / 'cut', '--resume'))
    assert rc == 0, err
    assert 'resumed from' in err
    rc, _, err = finish(ref); assert rc == 0, err
    want, got = _losses(tmp_path / 'ref' / 'train.jsonl'), _losses(tmp_path / 'cut' / 'train.jsonl')
    assert sorted(got) == list(range(1, steps + 1)) == sorted(want)
    assert got == want   # exact float equality, every step
    assert want[steps] < want[1] - 1.0   # and it learned something
    z = [r['z_loss'] for r in read_log(tmp_path / 'cut' / 'train.jsonl')]   # the z-loss part, logged apart, resumed exactly
    assert z == [r['z_loss'] for r in read_log(tmp_path / 'ref' / 'train.jsonl')] and all(0 < v < 1e-2 for v in z), z

def test_nonfinite_steps_are_skipped_then_stop_the_run(data, tmp_path):
    from apex3.ckpt import latest_checkpoint, load_checkpoint
    common = [*TINY, *data, '--total-tokens', 64 * 20, '--ckpt-every', 128, '--val-every', 0, '--max-bad-steps', 3]
    one = trainer(*common, '--ckpt-dir', tmp_path / 'one', '--inject-nan-at', 3)
    streak = trainer(*common, '--ckpt-dir', tmp_path / 'streak', '--inject-nan-at', 5, 6, 7, 8)
    rc, _, err = finish(one); assert rc == 0, err
    recs = read_log(tmp_path / 'one' / 'train.jsonl')
    assert [r['step'] for r in recs if r['skipped']] == [3] and math.isnan(recs[2]['loss'])
    assert all(math.isfinite(r['loss']) for r in recs if r['step'] != 3) and len(recs) == 20
    rc, _, err = finish(streak)
    assert rc == 3 and 'consecutive non-finite steps' in err, err
    recs = read_log(tmp_path / 'streak' / 'train.jsonl')
    assert [r['step'] for r in recs if r['skipped']] == [5, 6, 7] and max(r['step'] for r in recs) == 7
    last = latest_checkpoint(tmp_path / 'streak')   # verifies its checksums
    ck = load_checkpoint(last, ['train', 'model'])
    assert ck['train']['step'] == 4 and ck['train']['tokens'] == 256 and ck['train']['bad_streak'] == 0
    assert all(torch.isfinite(v).all() for v in ck['model'].values() if v.is_floating_point())

def test_a_second_run_onto_a_checkpoint_folder_in_use_is_refused(data, tmp_path):
    """Two runs on one --ckpt-dir at once would interleave their steps in one step log and prune each other's
    checkpoints: while the first trains, a second one onto its folder (or onto its step log from another folder) is
    refused in one line, status 2, and the first ends well with its own steps only. The control: the same second run
    once the first has ended goes on from its checkpoint."""
    ck, log = tmp_path / 'ck', tmp_path / 'ck' / 'train.jsonl'
    common = [*TINY, *data, '--total-tokens', 64 * 10_000, '--ckpt-every', 1024, '--val-every', 0, '--resume']
    first = trainer(*common, '--ckpt-dir', ck, '--max-minutes', 1)   # it trains for 60 s, then saves and ends
    deadline = time.time() + 120
    while not (log.exists() and log.read_text()) and first.poll() is None and time.time() < deadline: time.sleep(0.05)
    # one step each: one that is not refused ends soon, and fails the test below
    seconds = [trainer(*common, '--ckpt-dir', ck, '--max-steps', 1),
               trainer(*common, '--ckpt-dir', tmp_path / 'other', '--step-log', log, '--max-steps', 1)]
    seconds = [finish(p) for p in seconds]
    assert first.poll() is None, 'the first run ended before the second ones were refused'
    for (rc, _, err), flag in zip(seconds, ('--ckpt-dir', '--step-log')):
        assert rc == 2 and err.count('\n') == 1 and err.startswith(f'apex3 train: error: {flag} '), err
        assert 'is being written by another run now' in err, err
    rc, _, err = finish(first); assert rc == 0, err
    steps = [json.loads(l)['step'] for l in log.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)), steps   # one run's steps, each once
    rc, _, err = finish(trainer(*common, '--ckpt-dir', ck, '--max-steps', len(steps) + 2))   # the control: free now
    assert rc == 0 and 'resumed from' in err, err
    assert [r['step'] for r in read_log(log)][-1] == len(steps) + 2

def test_a_tokenizer_flag_that_names_no_tokenizer_is_refused(data, tmp_path):
    """--tokenizer is read only by the probe: one naming no tokenizer file (none there, a folder, a file that is no
    tokenizer) is refused in one line, status 2, before a step, with or without a probe. The control: a tokenizer file
    that loads trains."""
    from tokenizers import Tokenizer, models
    good = tmp_path / 'tok.json'
    Tokenizer(models.WordLevel({'[UNK]': 0, 'a': 1}, unk_token='[UNK]')).save(str(good))
    (tmp_path / 'not.json').write_text('{"partial": tru')
    common = [*TINY, *data, '--total-tokens', 64 * 4, '--val-every', 0, '--max-steps', 1]
    for bad in (tmp_path / 'none.json', tmp_path, tmp_path / 'not.json'):
        log = tmp_path / f'{bad.name}.jsonl'
        rc, _, err = finish(trainer(*common, '--tokenizer', bad, '--step-log', log))
        assert rc == 2 and err.count('\n') == 1 and err.startswith(f'apex3 train: error: --tokenizer {bad}'), err
        assert not log.exists() or not log.read_text()   # no step
    rc, _, err = finish(trainer(*common, '--tokenizer', good, '--step-log', tmp_path / 'good.jsonl'))
    assert rc == 0, err
    assert [r['step'] for r in read_log(tmp_path / 'good.jsonl')] == [1]

def _reference_losses(specs, steps, seq, mb, lr, total, world=2, accum=1):
    "One process, no FSDP: each micro-batch the concatenation of every rank's rows, the trainer's model, optimizer, loss and schedule."
    from apex3.config import get_config
    from apex3.model import Transformer
    from apex3.optim import build_optimizer, WSD
    from apex3.kernels.ce import fused_linear_cross_entropy
    from apex3.data.loader import MixtureLoader
    torch.manual_seed(0)
    model = Transformer(get_config('tiny', [f'seq_len={seq}']))
    opt = build_optimizer(model, lr=lr)
    sched, loss_fn = WSD(total, 0.01 * total, 0.2, '1-sqrt'), partial(fused_linear_cross_entropy, impl='torch')
    loaders = [MixtureLoader(specs, seq, mb, 0, r, world) for r in range(world)]
    tokens, out = 0, []
    for _ in range(steps):
        opt.set_lr_factor(sched(tokens)); losses = []
        for _ in range(accum):
            x = torch.from_numpy(__import__('numpy').concatenate([l.next_batch() for l in loaders]))
            loss = model(x[:, :-1], x[:, 1:], loss_fn=loss_fn); (loss / accum).backward(); losses.append(loss.item())
        opt.step(); opt.zero_grad(); model.update_router_biases()
        out.append(sum(losses) / accum); tokens += world * accum * mb * seq
    return out

def _fsdp_run(ckpt, *extra):
    "Two gloo ranks under torchrun; gloo's process group can abort at start-up on a starved 2-core machine (seen once,"
    "SIGABRT of a rank): that is the launcher, not the training, so it gets one more start."
    for attempt in range(2):
        if attempt and '--resume' not in extra: shutil.rmtree(ckpt, ignore_errors=True)   # a new run, not the old one's
        rc, _, err = finish(trainer(*TINY, '--fsdp', '--val-every', 0, '--ckpt-dir', ckpt, *extra, torchrun=2))
        if rc == 0 or not ('SIGABRT' in err or 'Signal 6' in err or 'gloo' in err.lower()): break
    assert rc == 0, err[-3000:]
    return err

def test_fsdp_two_ranks_match_one_process_resume_and_probe(data, tmp_path):
    "FSDP2 on two ranks, two micro-batches a step (gradients reduced after the second only): losses match one process on"
    "the concatenated batches; resuming a sharded checkpoint gives the uninterrupted run's losses; the probe decodes"
    "under FSDP exactly what the unsharded checkpoint decodes."
    from apex3.train import ByteTokenizer, arith_probe_file, checkpoint_model, load_probe, probe_answers
    from apex3.ckpt import latest_checkpoint
    import shutil
    steps, spec = 6, data[1]
    probe = arith_probe_file(tmp_path / 'probe.jsonl', 5)
    common = ['--data', spec, '--accum', 2, '--total-tokens', 4 * 64 * steps, '--ckpt-every', 4 * 64 * 3, '--keep-ckpts', 2,
              '--arith-probe', probe, '--arith-every', 3, '--arith-max-new', 4]
    _fsdp_run(tmp_path / 'fsdp', *common)
    recs = read_log(tmp_path / 'fsdp' / 'train.jsonl')
    got = [r['loss'] for r in recs]
    want = _reference_losses([spec], steps, 32, 2, 3e-3, 4 * 64 * steps, accum=2)
    assert len(got) == steps
    assert max(abs(g - w) for g, w in zip(got, want)) < 2e-3, (got, want)
    # the probe at step 6 ran on the weights the step-6 checkpoint holds: decode them unsharded, in one process
    last = latest_checkpoint(tmp_path / 'fsdp')
    answers = probe_answers(checkpoint_model(last), ByteTokenizer(), load_probe(probe), 4, 'cpu')
    assert recs[-1]['arith_answers'] == answers and len(answers) == 5, (recs[-1]['arith_answers'], answers)
    # resume the sharded run from its step-3 checkpoint in a fresh directory: steps 4-6 as before
    first = sorted((tmp_path / 'fsdp').glob('tokens-*'))[0]
    (tmp_path / 'resumed').mkdir(); shutil.copytree(first, tmp_path / 'resumed' / first.name)
    err = _fsdp_run(tmp_path / 'resumed', *common, '--resume')
    assert 'resumed from' in err
    again = {r['step']: r['loss'] for r in read_log(tmp_path / 'resumed' / 'train.jsonl')}
    assert sorted(again) == [4, 5, 6] and all(again[k] == got[k - 1] for k in again), (again, got)
    # the GPU's policy (bf16 gathers, fp32 reduction), here on gloo: the same curve within bf16's rounding
    _fsdp_run(tmp_path / 'bf16', *common, '--fsdp-param-dtype', 'bf16')
    low = [r['loss'] for r in read_log(tmp_path / 'bf16' / 'train.jsonl')]
    assert len(low) == steps and max(abs(g - w) for g, w in zip(low, want)) < 2e-2 and low != got, (low, want)
