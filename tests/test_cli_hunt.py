"""What a hostile hunt of the command line found, each judged from outside (a real process: its exit status, its one
error line, and what is left on disk), each beside a control that shows the check can fail or the valid neighbour that
passes."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
import zstandard
from apex3.ckpt import ckpt_name, list_checkpoints, SUMS
from test_train import ROOT, TINY, data, finish, trainer
from test_faults import STEP, EVERY, one_error

def apex3(*args, cwd=ROOT):
    return subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())',
                           *(a if isinstance(a, bytes) else str(a) for a in args)], capture_output=True, cwd=cwd,
                          env={**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUTF8': '1'})   # argv bytes kept as such

def one_line(p, command):
    err = p.stderr.decode(errors='replace')
    assert p.returncode == 2 and err.count('\n') == 1 and err.startswith(f'apex3 {command}: error:'), err[-1500:]
    return err.strip()

def test_a_new_run_does_not_prune_another_runs_checkpoints(data, tmp_path):
    "Without --resume, a folder holding checkpoints is refused before step 1, and they stay; with --resume it goes on."
    ck = tmp_path / 'ck'
    common = [*TINY, *data, '--total-tokens', 4 * STEP, *EVERY, '--ckpt-dir', ck]
    assert finish(trainer(*common))[0] == 0
    before = list_checkpoints(ck)
    rc, _, err = finish(trainer(*common, '--seed', 3))
    assert rc == 2 and 'add --resume' in one_error(err) and list_checkpoints(ck) == before
    assert finish(trainer(*common, '--resume'))[0] == 0

def test_a_listed_but_cut_checkpoint_is_one_line(data, tmp_path):
    """A tensor file cut in half whose checksum list was written again: --resume passes it over naming the file; with
    no checkpoint left it stops in one line, the checkpoint kept."""
    ck = tmp_path / 'ck'
    common = [*TINY, *data, '--total-tokens', 4 * STEP, *EVERY, '--ckpt-dir', ck]
    assert finish(trainer(*common, '--max-steps', 2))[0] == 0
    last = list_checkpoints(ck)[-1]
    m = last / 'model.pt'
    m.write_bytes(m.read_bytes()[:m.stat().st_size // 2])
    _relist(last)
    rc, _, err = finish(trainer(*common, '--resume'))
    assert rc == 2 and 'verifies and loads' in one_error(err) and list_checkpoints(ck) == [last]
    assert 'model.pt is not a whole torch file' in err   # the line that passed it over says why

def _relist(ckpt):
    "Write a checkpoint's checksum list again for the files it holds now (what a careless or hostile edit does)."
    import hashlib
    (ckpt / SUMS).write_text(''.join(f'{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n'
                                     for f in sorted(ckpt.glob('*.pt'))))

def _resumed_from(err) -> str:
    return next(l for l in err.splitlines() if 'resumed from' in l).rsplit('/', 1)[-1]

def test_a_newest_checkpoint_that_does_not_load_is_passed_over(data, tmp_path):
    """The newest checkpoint verifies but its RNG state is `[{}]` (checksums listed again): --resume warns in one line
    and goes on from the one before, as it does for a checksum failure. Control: the same folder undamaged resumes from
    the newest. With every checkpoint damaged the run stops in one line and prunes none of them."""
    import shutil, torch
    ck, twin = tmp_path / 'ck', tmp_path / 'twin'
    common = [*TINY, *data, '--total-tokens', 8 * STEP, *EVERY, '--max-steps', 4]
    assert finish(trainer(*common, '--ckpt-dir', ck))[0] == 0
    shutil.copytree(ck, twin)
    older, newest = list_checkpoints(ck)[-2:]
    rc, _, err = finish(trainer(*common, '--ckpt-dir', twin, '--resume', '--max-steps', 5))
    assert rc == 0 and _resumed_from(err) == newest.name, err[-1500:]                    # control
    torch.save([{}], newest / 'rng.pt')
    _relist(newest)
    rc, _, err = finish(trainer(*common, '--ckpt-dir', ck, '--resume', '--max-steps', 5))
    skipped = [l for l in err.splitlines() if 'skipping checkpoint' in l]
    assert rc == 0 and _resumed_from(err) == older.name, err[-1500:]
    assert len(skipped) == 1 and newest.name in skipped[0] and 'rng is not a list of generator states' in skipped[0]
    for p in list_checkpoints(ck):
        torch.save({'step': 'three'}, p / 'train.pt')
        _relist(p)
    kept = list_checkpoints(ck)
    rc, _, err = finish(trainer(*common, '--ckpt-dir', ck, '--resume', '--max-steps', 9))
    assert rc == 2 and 'verifies and loads' in one_error(err) and list_checkpoints(ck) == kept

@pytest.mark.parametrize('lines, why', [('{"prompt": "1+1="}\n', 'not a line'), ('[1, 2]\n', 'not a line'),
                                         ('{"prompt": "1+1=", "answer": 2}\nnot json\n', ':2: not a line')])
def test_a_bad_probe_file_is_one_line_before_any_step(data, tmp_path, lines, why):
    "The control: the same run with a good probe file finishes (blank lines are skipped)."
    (tmp_path / 'probe.jsonl').write_text(lines)
    common = [*TINY, *data, '--total-tokens', 2 * STEP, '--val-every', 0, '--step-log', tmp_path / 'log.jsonl',
              '--arith-every', 1]
    rc, _, err = finish(trainer(*common, '--arith-probe', tmp_path / 'probe.jsonl'))
    assert rc == 2 and why in one_error(err) and not (tmp_path / 'log.jsonl').read_text()
    (tmp_path / 'good.jsonl').write_text('{"prompt": "1+1=", "answer": 2}\n\n')
    assert finish(trainer(*common, '--arith-probe', tmp_path / 'good.jsonl'))[0] == 0

def test_data_names_twice_and_a_device_apex3_does_not_run_on(data, tmp_path):
    shards = data[1].split(':', 1)[1]
    for extra, why in ((['--data', f'std=1:{shards}'], "two sources are named 'std'"),
                       (['--device', 'meta'], 'apex3 runs on cpu or cuda')):
        rc, _, err = finish(trainer(*TINY, *data, '--total-tokens', STEP, '--val-every', 0, *extra))
        assert rc == 2 and why in one_error(err)

def test_generate_refuses_a_prompt_that_is_not_utf8(tmp_path):
    p = apex3('generate', tmp_path, '--prompt', b'caf\xc3')
    assert 'not valid UTF-8' in one_line(p, 'generate')

def test_a_stage_never_writes_over_its_input_or_another_stages_output(tmp_path):
    src = tmp_path / 'in'
    src.mkdir()
    doc = {'id': 'd0', 'text': 'One sentence here. Another one there. And a third one now.', 'meta': {}}
    (src / 'shard-00000.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(json.dumps(doc).encode() + b'\n'))
    before = (src / 'shard-00000.jsonl.zst').read_bytes()
    assert 'SRC and OUT are one folder' in one_line(apex3('data', 'c4', src, src, '--workers', 1), 'data')
    assert (src / 'shard-00000.jsonl.zst').read_bytes() == before
    assert apex3('data', 'c4', src, tmp_path / 'o').returncode == 0                     # the control
    assert 'holds the output of stage c4' in one_line(apex3('data', 'gopher_quality', src, tmp_path / 'o'), 'data')
    assert apex3('data', 'c4', src, tmp_path / 'o').returncode == 0                     # its own stage resumes

def test_bench_json_is_the_users_path(tmp_path):
    "A bare name is a file in the working folder (it went into the package's records/), here a folder: one line."
    (tmp_path / 'adir').mkdir()
    p = apex3('bench', '--device', 'cpu', '--config', 'tiny', '--steps', 1, '--warmup', 0, '--json', 'adir',
              cwd=tmp_path)
    assert p.returncode == 2 and not (ROOT / 'records' / 'adir').exists(), p.stderr[-800:]

def test_bench_json_after_a_cut_line_keeps_its_record_whole(tmp_path):
    """A records file whose last line was cut (a run killed mid-write): the new record starts a line of its own, and
    reading the file skips the cut line with one warning. The control: the cut line is still there, unparsable."""
    from apex3.records import load_records
    (tmp_path / 'rec.jsonl').write_text('{"partial": tru')
    p = apex3('bench', '--device', 'cpu', '--config', 'tiny', '--steps', 1, '--warmup', 0, '--json', 'rec.jsonl',
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-800:]
    first, second = (tmp_path / 'rec.jsonl').read_text().splitlines()
    assert first == '{"partial": tru' and json.loads(second)['kind'] == 'bench'
    assert [r['kind'] for r in load_records(tmp_path / 'rec.jsonl')] == ['bench']
    with pytest.raises(ValueError): json.loads(first)

@pytest.mark.parametrize('line', ['{"text": "Hello. There. Now."}', 'not json', '[1, 2]', '{"id": 1, "text": 5}'])
def test_a_stage_input_that_is_not_documents_is_one_line(tmp_path, line):
    "A user's own JSONL given to a stage (ingest is what turns any JSONL into documents); the control: a document."
    src = tmp_path / 'in'
    src.mkdir()
    write = lambda text: (src / 'shard-00000.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(text + b'\n'))
    write(line.encode())
    assert 'line 1: ' in one_line(apex3('data', 'c4', src, tmp_path / 'o'), 'data')
    write(json.dumps({'id': 'a', 'text': 'One sentence here. Another one there. A third.'}).encode())
    assert apex3('data', 'c4', src, tmp_path / 'o2').returncode == 0

def test_data_flags_that_do_not_apply_are_refused(tmp_path):
    "A flag the command would ignore is one line; the control: the same command without it runs."
    src = tmp_path / 'in'
    src.mkdir()
    doc = {'id': 'a', 'text': 'One sentence here. Another one there. A third.'}
    (src / 'shard-00000.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(json.dumps(doc).encode() + b'\n'))
    for args, why in ((['c4', src, tmp_path / 'o', '--max-files', 1], '--max-files is for demo and corpus'),
                      (['dedup', src, tmp_path / 'o', '--set', 'nosuch=1'], '--set is for a stage'),
                      (['corpus', tmp_path / 'c', 'extra'], 'at most one OUT')):
        assert why in one_line(apex3('data', *args), 'data')
    assert apex3('data', 'c4', src, tmp_path / 'o').returncode == 0

def test_ctrl_c_is_one_line_and_status_130(data, tmp_path):
    "SIGINT mid-run: status 130 and one line, no traceback; a checkpoint written before it verifies."
    import signal, time
    from apex3.ckpt import latest_checkpoint
    common = [*TINY, *data, '--total-tokens', 10 ** 6 * STEP, '--ckpt-every', 20 * STEP, '--val-every', 0,
              '--ckpt-dir', tmp_path / 'ck']   # a run far longer than the test: it ends by the signal, not by itself
    # a shell's background job starts with SIGINT ignored, which Python then keeps: the default, as at a terminal
    p = trainer(*common, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not list_checkpoints(tmp_path / 'ck') and time.time() < deadline: time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    rc, _, err = finish(p)
    assert rc == 130 and 'Traceback' not in err and err.rstrip().endswith('apex3 train: interrupted'), err[-800:]
    assert latest_checkpoint(tmp_path / 'ck') is not None
