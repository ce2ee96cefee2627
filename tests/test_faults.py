"""Fault injection, judged from outside: the trainer meets a full disk, a read-only or unwritable directory, a file
where a folder should be, and damaged shards. Every run is a subprocess (`tiny` on CPU, a few steps); each test checks
its exit status, that stderr ends in exactly one error line with no traceback, and that the last good checkpoint still
verifies. Size-limited and read-only file systems are tmpfs mounts in a private mount namespace (`unshare -m`, as
root); where the machine does not allow one, those tests skip and say why."""
import functools, os, shlex, shutil, subprocess, sys, tempfile
from pathlib import Path
import numpy as np
import pytest
from apex3.ckpt import ckpt_name, latest_checkpoint, list_checkpoints, load_checkpoint, TMP
from apex3.train_io import byte_shards, read_log
from test_train import ROOT, TINY, data, finish, trainer   # the trainer as a user runs it, and its byte shards

STEP = 64                    # tokens a step of TINY (2 rows of 32)
EVERY = ['--ckpt-every', 2 * STEP, '--val-every', 0]
CKPT_KB = 1900               # a TINY checkpoint is about 1.93 MB: this disk holds two, not three
DISK_2 = f'{int(2.45 * CKPT_KB)}k'

def one_error(err) -> str:
    "The run's error line: the last line of stderr, the only one of its kind, and no traceback anywhere."
    assert 'Traceback' not in err, err
    errors = [l for l in err.splitlines() if l.startswith('apex3 train: error:')]
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err
    return errors[0]

def intact(ckpt_dir, tokens):
    "The newest checkpoint that verifies is the one after `tokens` tokens, it loads, and nothing half-written is left."
    last = latest_checkpoint(ckpt_dir)   # checks every checksum
    assert last == Path(ckpt_dir) / ckpt_name(tokens), (last, list_checkpoints(ckpt_dir))
    assert load_checkpoint(last, 'train')['train']['tokens'] == tokens
    assert not list(Path(ckpt_dir).glob(f'{TMP}*'))

@functools.cache
def private_tmpfs() -> str | None:
    "Why a private tmpfs cannot be mounted here, or None when it can."
    if not shutil.which('unshare'): return 'no unshare command'
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(['unshare', '-m', 'sh', '-c', f'mount -t tmpfs -o size=1m tmpfs {d} && touch {d}/x'],
                           capture_output=True, text=True)
    return None if p.returncode == 0 else f'cannot mount a private tmpfs: {p.stderr.strip()[:200]}'

def on_small_disk(tmp_path, size, *runs):
    """Trainer `runs` (argument lists; 'ro' remounts the disk read-only) one after another in a private mount namespace,
    on a tmpfs of `size` at tmp_path/'disk'; its files are copied to tmp_path/'after' at the end. [(status, stderr)]."""
    if why := private_tmpfs():
        print(f'skipped: {why}')
        pytest.skip(why)
    disk, out, after = tmp_path / 'disk', tmp_path / 'out', tmp_path / 'after'
    for p in (disk, out, after): p.mkdir()
    lines = [f'mount -t tmpfs -o size={size} tmpfs {disk} || exit 97']
    for i, r in enumerate(runs):
        if r == 'ro': lines.append(f'mount -o remount,ro {disk} || exit 97')
        else: lines.append(f'{shlex.join([sys.executable, "-m", "apex3.train", *map(str, r)])} 2> {out}/err{i}; '
                           f'echo $? > {out}/rc{i}')
    lines.append(f'cp -a {disk}/. {after}/')
    p = subprocess.run(['unshare', '-m', 'sh', '-c', '\n'.join(lines)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=600)
    assert p.returncode == 0, p.stderr
    return [(int((out / f'rc{i}').read_text()), (out / f'err{i}').read_text()) for i, r in enumerate(runs) if r != 'ro']

# --- a full disk -----------------------------------------------------------------------------------------------

def test_disk_full_mid_run_is_one_line_and_keeps_the_last_checkpoint(data, tmp_path):
    "Room for two checkpoints, --keep-ckpts 3: a warning before step 1, then the third save fails; the second is kept."
    ck = tmp_path / 'disk' / 'ck'
    [(rc, err)] = on_small_disk(tmp_path, DISK_2, [*TINY, *data, '--total-tokens', 10 * STEP, *EVERY, '--keep-ckpts', 3,
                                                    '--ckpt-dir', ck])
    assert rc == 2, err
    line = one_error(err)
    assert f'{ck / ckpt_name(6 * STEP)}' in line and 'No space left on device (ENOSPC)' in line, line
    assert f'{ck / ckpt_name(4 * STEP)} is kept' in line, line
    assert 'has room for 2 of the 3 checkpoints' in err, err   # said before the first step
    intact(tmp_path / 'after' / 'ck', 4 * STEP)
    assert max(r['step'] for r in read_log(tmp_path / 'after' / 'ck' / 'train.jsonl')) == 6

def test_keep_one_runs_in_the_room_of_two(data, tmp_path):
    "The control of the test above: the same disk and run with --keep-ckpts 1 saves five times and finishes."
    [(rc, err)] = on_small_disk(tmp_path, DISK_2, [*TINY, *data, '--total-tokens', 10 * STEP, *EVERY, '--keep-ckpts', 1,
                                                    '--ckpt-dir', tmp_path / 'disk' / 'ck'])
    assert rc == 0 and 'error' not in err and err.count('checkpoint ') == 5, err
    assert [p.name for p in list_checkpoints(tmp_path / 'after' / 'ck')] == [ckpt_name(10 * STEP)]
    intact(tmp_path / 'after' / 'ck', 10 * STEP)

def test_no_room_for_one_checkpoint_stops_before_the_first_step(data, tmp_path):
    log = tmp_path / 'disk' / 'train.jsonl'
    [(rc, err)] = on_small_disk(tmp_path, '1m', [*TINY, *data, '--total-tokens', 10 * STEP, *EVERY,
                                                 '--ckpt-dir', tmp_path / 'disk' / 'ck', '--step-log', log])
    assert rc == 2 and 'no room for a checkpoint in' in one_error(err) and 'MB free' in err, err
    assert read_log(tmp_path / 'after' / 'train.jsonl') == []   # not one step ran

def test_a_resumed_run_returns_pruned_space_at_once(data, tmp_path):
    """Resume with --keep-ckpts 1 on the disk of two checkpoints: each later save needs the pruned starting
    checkpoint's space back. Were its optimizer.pt still mapped (the resumed optimizer holding the loaded tensors),
    its blocks would stay taken after the deletion, and the second save after the resume would fail."""
    ck = tmp_path / 'disk' / 'ck'
    common = [*TINY, *data, '--total-tokens', 10 * STEP, *EVERY, '--keep-ckpts', 1, '--ckpt-dir', ck]
    (rc1, err1), (rc2, err2) = on_small_disk(tmp_path, DISK_2, [*common, '--max-steps', 4], [*common, '--resume'])
    assert rc1 == 0, err1
    assert rc2 == 0 and 'resumed from' in err2 and err2.count('checkpoint ') == 3, err2
    intact(tmp_path / 'after' / 'ck', 10 * STEP)

# --- directories that cannot be written ------------------------------------------------------------------------

def test_read_only_ckpt_dir_stops_before_the_first_step(data, tmp_path):
    "A run writes two checkpoints; the disk turns read-only; the resumed run stops at once, its checkpoints intact."
    ck, log = tmp_path / 'disk' / 'ck', tmp_path / 'elsewhere.jsonl'   # the step log elsewhere: writable
    common = [*TINY, *data, '--total-tokens', 10 * STEP, *EVERY, '--ckpt-dir', ck]
    (rc1, err1), (rc2, err2) = on_small_disk(tmp_path, '64m', [*common, '--max-steps', 4], 'ro',
                                             [*common, '--resume', '--step-log', log])
    assert rc1 == 0, err1   # the control: the same directory, writable
    line = one_error(err2)
    assert rc2 == 2 and f'--ckpt-dir {ck}' in line and 'Read-only file system (EROFS)' in line, err2
    assert not log.exists() or read_log(log) == []   # not one step ran
    intact(tmp_path / 'after' / 'ck', 4 * STEP)

@pytest.mark.parametrize('flag', ['--ckpt-dir', '--step-log'])
def test_a_file_as_parent_is_one_line(data, tmp_path, flag):
    (tmp_path / 'file').write_text('not a folder')
    target = tmp_path / 'file' / ('ck' if flag == '--ckpt-dir' else 'train.jsonl')
    rc, _, err = finish(trainer(*TINY, *data, '--total-tokens', 4 * STEP, *EVERY, flag, target))
    line = one_error(err)
    assert rc == 2 and str(target) in line, err
    assert 'Not a directory (ENOTDIR)' in line or f'{tmp_path / "file"} is a file, not a folder' in line, line

def test_missing_parents_are_created(data, tmp_path):
    "The control of a bad parent: folders that do not exist yet are made, and the run writes its checkpoints."
    ck = tmp_path / 'a' / 'b' / 'ck'
    rc, _, err = finish(trainer(*TINY, *data, '--total-tokens', 4 * STEP, *EVERY, '--ckpt-dir', ck))
    assert rc == 0, err
    intact(ck, 4 * STEP)

def test_no_permission_is_one_line(tmp_path):
    """A folder the user may not write: as root, the run goes into a user namespace of its own, where it is no one
    with rights (`unshare -U`); root's rights would override the folder's mode."""
    if os.geteuid() != 0 or not shutil.which('unshare'): pytest.skip('needs root and unshare to become a plain user')
    top = Path(tempfile.mkdtemp(dir='/tmp'))   # not under pytest's private folder: the plain user must read the shards
    try:
        top.chmod(0o755)
        shards = byte_shards(top / 'bytes', 100_000)
        locked = top / 'locked'
        locked.mkdir(mode=0o555)
        args = [*TINY, '--data', f'std=1:{shards}/shard-0000[0-2].bin', '--total-tokens', 4 * STEP, *EVERY]
        def run(ck):
            cmd = ['unshare', '-U', sys.executable, '-m', 'apex3.train', *map(str, args), '--ckpt-dir', str(ck)]
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, 'OMP_NUM_THREADS': '1'})
        (top / 'open').mkdir(mode=0o777)
        control = run(top / 'open' / 'ck')
        if control.returncode != 0:
            pytest.skip(f'the trainer does not run as a plain user here: {control.stderr[-300:]}')
        p = run(locked / 'ck')
        line = one_error(p.stderr)
        assert p.returncode == 2 and str(locked / 'ck') in line and 'Permission denied (EACCES)' in line, p.stderr
    finally: shutil.rmtree(top, ignore_errors=True)

# --- damaged shards ---------------------------------------------------------------------------------------------

@pytest.fixture
def shards(tmp_path):
    "A private copy of byte shards to damage (four shards of about 50,000 tokens each)."
    return byte_shards(tmp_path / 'bytes', 200_000)

def _train_on(folder, ckpt, steps=10):
    return finish(trainer(*TINY, '--data', f'std=1:{folder}/shard-0000[0-2].bin', '--val-data',
                          f'std={folder}/shard-00003.bin', '--total-tokens', steps * STEP, *EVERY, '--ckpt-dir', ckpt))

def test_token_id_beyond_the_vocabulary_mid_run(shards, tmp_path):
    """An id of 300 (vocab_size 257) at position 300 of the first shard, outside the sample checked at open: the
    batch of step 5 reads it (64 tokens a step), and the run stops there with the file and position named; the
    checkpoint of step 4 is kept."""
    bad = shards / 'shard-00000.bin'
    ids = np.fromfile(bad, '<u2')
    ids[300] = 300
    ids.tofile(bad)
    rc, _, err = _train_on(shards, tmp_path / 'ck')
    line = one_error(err)
    assert rc == 2 and f'{bad}: token id 300 at position 300' in line, err
    assert f'the checkpoint at {4 * STEP} tokens is kept' in line, line
    assert max(r['step'] for r in read_log(tmp_path / 'ck' / 'train.jsonl')) == 4
    intact(tmp_path / 'ck', 4 * STEP)

def test_undamaged_shards_train(shards, tmp_path):
    "The control of the shard tests: the same shards, undamaged, train to the end."
    rc, _, err = _train_on(shards, tmp_path / 'ck')
    assert rc == 0, err
    intact(tmp_path / 'ck', 10 * STEP)

@pytest.mark.parametrize('damage,says', [
    ('short', 'but its index'),                        # a .bin cut short: its index says more tokens
    ('odd', 'is not a whole number of uint16 tokens'),  # half a token at the end
    ('vocab', 'token id 65535 at position 0'),         # ids beyond the vocabulary where the sample looks
    ('val', 'token id 999 at position 0'),             # the validation shard too
])
def test_damaged_shard_stops_before_the_first_step(shards, tmp_path, damage, says):
    bad = shards / ('shard-00003.bin' if damage == 'val' else 'shard-00001.bin')
    b = bad.read_bytes()
    if damage == 'short': bad.write_bytes(b[:-200])
    if damage == 'odd': bad.write_bytes(b + b'\x01')
    if damage in ('vocab', 'val'):
        ids = np.frombuffer(b, '<u2').copy()
        ids[:8] = 65535 if damage == 'vocab' else 999
        ids.tofile(bad)
    rc, _, err = _train_on(shards, tmp_path / 'ck')
    line = one_error(err)
    assert rc == 2 and str(bad) in line and says in line, err
    assert not list_checkpoints(tmp_path / 'ck') and read_log(tmp_path / 'ck' / 'train.jsonl') == []

# --- a resumed run holds no mapping of its checkpoint --------------------------------------------------------------

@pytest.mark.parametrize('extra', [[], ['--offload']], ids=['optimizer', 'offload'])
def test_resume_keeps_no_checkpoint_file_mapped(data, tmp_path, extra):
    """After `restore_state`, /proc/self/maps names no file of the checkpoint it loaded, so pruning it returns its
    space. The control: a PyTorch optimizer given the mapped tensors (`load_checkpoint`'s default) keeps the file
    mapped."""
    import gc, torch
    from apex3.data.loader import MixtureLoader
    from apex3.run import micro_step, optimizer_step
    from apex3.train import Dist, TrainState, build_run, train_parser, trainer_settings
    from apex3.train_ckpt import restore_state, save_state
    maps = Path('/proc/self/maps')
    if not maps.exists(): pytest.skip('no /proc/self/maps here')
    a = train_parser().parse_args([*map(str, TINY), *data, '--total-tokens', '640', '--ckpt-dir', str(tmp_path),
                                   *extra])
    def fresh():
        return build_run(trainer_settings(a), Dist()), MixtureLoader(a.data, 32, 2)
    run, loader = fresh()
    micro_step(run, torch.from_numpy(loader.next_batch()))
    optimizer_step(run)
    path = save_state(run, loader, TrainState(step=1, tokens=STEP), Dist()).resolve()
    resumed, loader2 = fresh()
    assert restore_state(resumed, loader2, Dist()).tokens == STEP
    gc.collect()
    assert str(path) not in maps.read_text()
    if extra: return
    resumed.opt.load_state_dict(load_checkpoint(path, 'optimizer')['optimizer'])
    gc.collect()
    assert str(path / 'optimizer.pt') in maps.read_text()
