"The `apex3 data` command: bad input is one UsageError line; one stage runs over a folder of shards."
import json, pytest
from apex3.usage import UsageError
from apex3.data.core import Document, write_docs, read_docs, list_shards
from apex3.data.pipeline import data_main

def test_usage_errors(tmp_path):
    with pytest.raises(UsageError, match='no such config'): data_main(['run', str(tmp_path/'missing.toml')])
    (tmp_path/'bad.toml').write_text('[pipeline\n')
    with pytest.raises(UsageError): data_main(['run', str(tmp_path/'bad.toml')])
    write_docs(tmp_path/'in'/'s.jsonl.zst', [Document('a', 'x')])
    with pytest.raises(UsageError, match="unknown stage 'frobnicate'"): data_main(['frobnicate', str(tmp_path/'in'), 'out'])
    # an unknown stage is named before its arguments are looked at
    with pytest.raises(UsageError, match="unknown stage 'frobnicate'"): data_main(['frobnicate', 'a', 'b'])
    with pytest.raises(UsageError, match='no \\*.jsonl.zst shards'): data_main(['redact', str(tmp_path/'nothing'), str(tmp_path/'out')])

@pytest.mark.parametrize('flag, value', [('--workers', '0'), ('--workers', '-2'), ('--workers', '5000'),
                                         ('--max-files', '0')])
def test_flag_ranges(tmp_path, flag, value):
    "A count out of range is the flag's error, before any work: no corpus written, the config not blamed."
    with pytest.raises(UsageError, match=f'argument {flag}: must be a whole number') as e:
        data_main(['demo', str(tmp_path/'out'), flag, value])
    assert 'toml' not in str(e.value) and not (tmp_path/'out').exists()

def test_one_stage_redact(tmp_path, capsys):
    write_docs(tmp_path/'in'/'s0.jsonl.zst', [Document('a', 'mail bob.smith@example.org from 8.8.8.8'), Document('b', 'nothing here')])
    assert data_main(['redact', str(tmp_path/'in'), str(tmp_path/'out'), '--set', 'ips=false']) == 0
    docs = [d for s in list_shards(tmp_path/'out') for d in read_docs(s)]
    assert [d.text for d in docs] == ['mail <EMAIL> from 8.8.8.8', 'nothing here']
    counts = json.loads(capsys.readouterr().out)
    assert counts['redact/redacted:EMAIL'] == 1 and counts['docs_out'] == 2

def test_one_stage_dedup(tmp_path):
    text = ' '.join(f'word{i}' for i in range(200))
    write_docs(tmp_path/'in'/'s0.jsonl.zst', [Document('a', text), Document('b', 'unrelated ' * 10)])
    write_docs(tmp_path/'in'/'s1.jsonl.zst', [Document('c', text.upper())])
    assert data_main(['dedup', str(tmp_path/'in'), str(tmp_path/'out')]) == 0
    assert sorted(d.id for s in list_shards(tmp_path/'out') for d in read_docs(s)) == ['a', 'b']

def _space_config(tmp_path):
    "A one-source config over 40 KB of words (prose-like text, compressible about 3x)."
    import random
    rng = random.Random(0)
    words = [''.join(rng.choice('etaoinshrdlucmfw') for _ in range(rng.randrange(2, 8))) for _ in range(400)]
    (tmp_path/'raw').mkdir()
    (tmp_path/'raw'/'a.jsonl').write_text(''.join(json.dumps({'text': ' '.join(rng.choices(words, k=120))}) + '\n'
                                                  for _ in range(50)))
    (tmp_path/'c.toml').write_text('[pipeline]\nout = "out"\n[[source]]\nname = "s"\nkind = "jsonl"\n'
                                   'path = "raw/*.jsonl"\nshards = 2\nstages = ["redact"]\n'
                                   '[tokenize]\nvocab_size = 300\n')
    return tmp_path/'c.toml'

@pytest.mark.parametrize('free, rc, lines', [(1_000, 2, 1), (60_000, 0, 1), (10**12, 0, 0)])
def test_free_space_reading(tmp_path, monkeypatch, capsys, free, rc, lines):
    "An injected free-space reading: clearly too small is refused before any work, tight warns, ample is silent."
    import shutil
    from collections import namedtuple
    from apex3.usage import run_command
    monkeypatch.setattr(shutil, 'disk_usage', lambda p: namedtuple('usage', 'total used free')(10**13, 0, free))
    assert run_command('data', data_main, ['run', str(_space_config(tmp_path))]) == rc
    err = capsys.readouterr().err
    assert err.count('\n') == lines and 'Traceback' not in err, err
    if rc: assert 'free, but the ingest copies' in err and not (tmp_path/'out'/'work').exists()
    elif lines: assert err.startswith('apex3 data: warning: ') and 'may run out of space' in err
    if not rc: assert (tmp_path/'out'/'tokens'/'s').is_dir()

def test_data_main_os_errors(monkeypatch, tmp_path):
    "A file-system failure is one line (a UsageError); any other OSError keeps its traceback (it propagates)."
    import errno, apex3.data.pipeline as pl
    def fails_with(e):
        def f(argv): raise e
        return f
    monkeypatch.setattr(pl, '_data_main', fails_with(OSError(errno.ECONNREFUSED, 'Connection refused')))
    with pytest.raises(ConnectionRefusedError): data_main(['run', 'x.toml'])  # not the file system
    monkeypatch.setattr(pl, '_data_main', fails_with(OSError(errno.EACCES, 'Permission denied', str(tmp_path/'o'))))
    with pytest.raises(UsageError, match='Permission denied'): data_main(['run', 'x.toml'])  # control: a file's error

# ---- resuming only what was done the same way; empty token shards; a step log over a data shard ----
import os, random, shutil, subprocess, sys, time
from pathlib import Path
from apex3.data.pipeline import output_files

ROOT = Path(__file__).parents[1]

def apex3(*args, seed='0'):
    "`apex3 ARGS` in a fresh process (its own string-hash seed): (exit status, stderr)."
    env = {**os.environ, 'PYTHONPATH': f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", 'PYTHONHASHSEED': seed}
    p = subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())',
                        *map(str, args)], env=env, capture_output=True, text=True)
    return p.returncode, p.stderr

def prose_shards(folder, seed=0):
    "Three shards of documents of 1 to 8 sentences: `c4`'s min_sentences decides which are kept."
    rng = random.Random(seed)
    words = ['alpha', 'beta', 'gamma', 'delta', 'omega']
    sentence = lambda: ' '.join(rng.choice(words) for _ in range(6)) + '.'
    for k in range(3):
        write_docs(Path(folder)/f's{k}.jsonl.zst', [Document(f'{k}-{j}', '\n'.join(sentence() for _ in range(
            rng.randrange(1, 9)))) for j in range(20)])

def one_line(err) -> str:
    assert err.count('\n') == 1 and 'Traceback' not in err, err[-2000:]
    return err

def test_a_changed_parameter_is_refused_then_redone_with_restart(tmp_path):
    """Finished tasks done with other parameters are not resumed: exit 2, one line naming the parameter, OUT untouched;
    `--restart` redoes them to what a fresh OUT gets. The control: the new parameter does change the output (a
    silent resume would have kept the wrong shards), and the same parameters resume in a process of another hash
    seed (the identity is stable across processes)."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out', seed='1')[0] == 0
    before = output_files(tmp_path/'out')
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--set', 'min_sentences=1', seed='2')
    assert rc == 2 and 'steps.c4.min_sentences = 5 then, 1 now' in one_line(err) and '--restart' in err, err
    assert output_files(tmp_path/'out') == before
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'fresh', '--set', 'min_sentences=1')[0] == 0
    assert output_files(tmp_path/'fresh') != before  # the control: the parameter matters
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out', seed='3') == (0, '')  # same parameters: resumed
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--set', 'min_sentences=1', '--restart')
    assert rc == 0, err
    assert output_files(tmp_path/'out') == output_files(tmp_path/'fresh')

def test_a_changed_input_shard_is_refused(tmp_path):
    """An input shard changed after its task finished is not taken as done: one line naming it, exit 2. The control:
    the same shard rewritten with the same bytes (a newer time only) resumes."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out')[0] == 0
    shard = tmp_path/'in'/'s1.jsonl.zst'
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data)
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')   # the control: same bytes, resumed
    write_docs(shard, [Document('new', 'one new document. with two sentences.')])
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
    assert rc == 2 and 'input in/s1.jsonl.zst has changed' in one_line(err), err
    assert '1 finished task of stage c4 was done' in err

def test_other_bytes_of_the_same_size_and_time_are_seen(tmp_path):
    """An input shard given other bytes of the same size and its old modification time back (as `cp -p`, `rsync -t`
    or `touch -d` leave it) is refused in one line: the status-change time, which no user can set back, makes it read.
    The control: the same bytes with the old time back resume, and the record then holds the shard's new times (a
    later run need not read it)."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out')[0] == 0
    shard = tmp_path/'in'/'s1.jsonl.zst'
    data, st = shard.read_bytes(), shard.stat()
    def rewrite(b):
        time.sleep(0.05)   # a later status-change time on a clock of coarse steps
        shard.write_bytes(b)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        return shard.stat()
    now = rewrite(data)
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and now.st_ctime_ns != st.st_ctime_ns
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')   # the control: the same bytes
    record = next((tmp_path/'out'/'.done'/'identity').glob('*.json'))
    assert json.loads(record.read_text())['tasks']['s1']['in/s1.jsonl.zst'][:3] == [now.st_size, now.st_mtime_ns,
                                                                                    now.st_ctime_ns]
    rewrite(bytes(data[:-8]) + bytes(b ^ 1 for b in data[-8:]))
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
    assert rc == 2 and 'input in/s1.jsonl.zst has changed' in one_line(err), err

def test_markers_of_an_earlier_version_are_refused(tmp_path):
    "Markers without an identity (written before markers recorded one) are refused in one line; --restart redoes them."
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out')[0] == 0
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')   # the control: this version's markers
    for m in (tmp_path/'out'/'.done').glob('*.json'):
        rec = json.loads(m.read_text())
        m.write_text(json.dumps({k: v for k, v in rec.items() if k not in ('identity', 'record')}))
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
    assert rc == 2 and 'were done by an earlier version' in one_line(err), err
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--restart')[0] == 0

def test_damaged_markers_and_records_are_refused_in_one_line(tmp_path):
    """A marker that is not JSON, not an object or of the wrong types, and an identity record that is damaged, are
    each refused in one line, exit 2, no traceback; --restart redoes the task to what a fresh OUT holds. The control:
    the same OUT with its markers intact resumes (exit 0, nothing printed)."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'fresh')[0] == 0
    marker = tmp_path/'out'/'.done'/'s0.json'
    for damage in ('not json', '[1, 2]', '{"stage": "c4", "identity": 5, "record": [1]}'):
        shutil.rmtree(tmp_path/'out', ignore_errors=True)
        shutil.copytree(tmp_path/'fresh', tmp_path/'out')
        assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')   # the control: intact, resumed
        marker.write_text(damage)
        rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
        assert rc == 2 and 'damaged completion marker (s0.json' in one_line(err), (damage, err)
        assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--restart')[0] == 0
        assert output_files(tmp_path/'out') == output_files(tmp_path/'fresh')
    rec = json.loads(marker.read_text())
    marker.write_text(json.dumps({**rec, 'identity': 'other'}))
    for damage in ('garbage', '{"params": 5}', '{"params": {}, "inputs": {"in/s0.jsonl.zst": [1]}, "tasks": {}}',
                   '{"params": {}, "inputs": {}, "tasks": {}, "task_params": {"s0": 5}}'):
        (tmp_path/'out'/'.done'/'identity'/f"{rec['record']}.json").write_text(damage)
        rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
        assert rc == 2 and 'parameters and inputs not recorded here' in one_line(err), (damage, err)

def test_a_parameter_naming_a_file_is_no_input(tmp_path):
    """A step's parameter that names an existing file is its text, not an input of the stage: changing that file
    leaves the finished tasks finished (exit 0, nothing printed). The control: changing a real input shard is refused
    in one line."""
    prose_shards(tmp_path/'in')
    note = tmp_path/'README.md'
    note.write_text('first')
    # decontaminate's `field` is a text (the JSON key of its extra benchmark files), here one naming a file
    run = lambda: apex3('data', 'decontaminate', tmp_path/'in', tmp_path/'out', '--set', f'field="{note}"')
    assert run()[0] == 0
    note.write_text('second, longer')
    assert run() == (0, '')
    write_docs(tmp_path/'in'/'s1.jsonl.zst', [Document('new', 'one new document.')])
    rc, err = run()
    assert rc == 2 and 'input in/s1.jsonl.zst has changed' in one_line(err), err

def test_a_stage_setting_naming_a_folder_is_no_input(tmp_path, monkeypatch):
    """The long-document stage's prefix (a source's name) is a parameter even where a folder of that name lies in the
    current directory: its files are not hashed as inputs. The control: the stage's declared inputs are."""
    from apex3.data.identity import stage_identity
    from apex3.data.long import Long
    prose_shards(tmp_path/'docs')
    (tmp_path/'tokenizer.json').write_text('{}')
    monkeypatch.chdir(tmp_path)
    ident = stage_identity(Long('docs', tmp_path/'long', 'tokenizer.json', prefix='docs'))
    assert ident['params']['prefix'] == 'docs' and list(ident['inputs']) == ['tokenizer.json'], ident['inputs']
    assert sorted(ident['tasks']) == ['docs-s0', 'docs-s1', 'docs-s2']

def test_a_folder_where_a_marker_belongs(tmp_path):
    """A folder in place of a task's completion marker is refused in one line (exit 2); --restart removes it when it
    is empty and redoes the task to what a fresh OUT holds, and refuses in one line, deleting nothing, when it holds
    files. The control: the same OUT with the marker a file resumes, nothing printed."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'fresh')[0] == 0
    shutil.copytree(tmp_path/'fresh', tmp_path/'out')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')
    marker = tmp_path/'out'/'.done'/'s0.json'
    marker.unlink()
    (marker/'notes').mkdir(parents=True)
    (marker/'notes'/'mine.txt').write_text('mine')
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
    assert rc == 2 and '(s0.json is a folder, no marker this code wrote)' in one_line(err), err
    rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--restart')
    assert rc == 2 and 's0.json is a folder with files in it' in one_line(err), err
    assert (marker/'notes'/'mine.txt').read_text() == 'mine'
    shutil.rmtree(marker/'notes')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out', '--restart')[0] == 0
    assert marker.is_file() and output_files(tmp_path/'out') == output_files(tmp_path/'fresh')

def test_identity_records_no_marker_names_are_removed(tmp_path):
    """Three runs with --restart and other parameters leave one identity record, the one the markers name. The
    control: a record that a marker still names is kept (a new shard's task, run with the others finished, names a
    second one)."""
    prose_shards(tmp_path/'in')
    out = tmp_path/'out'
    records = lambda: sorted(p.stem for p in (out/'.done'/'identity').glob('*.json'))
    named = lambda: sorted({json.loads(m.read_text())['record'] for m in (out/'.done').glob('*.json')})
    for n in (5, 3, 1):
        assert apex3('data', 'c4', tmp_path/'in', out, '--set', f'min_sentences={n}', '--restart')[0] == 0
    assert len(records()) == 1 and records() == named()
    write_docs(tmp_path/'in'/'s3.jsonl.zst', [Document('new', 'one. two. three. four. five. six.')])
    assert apex3('data', 'c4', tmp_path/'in', out, '--set', 'min_sentences=1')[0] == 0
    assert len(records()) == 2 and records() == named()

RUN_CONFIG = '''[pipeline]
out = "{out}"
[[source]]
name = "s"
kind = "jsonl"
path = "raw/*.jsonl"
shards = 2
stages = ["c4", "dedup"]
[params.c4]
min_sentences = {n}
[tokenize]
enabled = false
'''

def test_a_config_run_with_changed_params_is_refused_then_restarted(tmp_path):
    """`apex3 data run` with a step's parameter changed refuses in one line; with --restart the changed stage and the
    stages after it are redone: the outputs equal a clean run's with the new parameter (the control: they differ
    from the old one's)."""
    rng = random.Random(0)
    (tmp_path/'raw').mkdir()
    sentence = lambda: f'{rng.choice(["alpha", "beta", "gamma", "delta"])} word{rng.randrange(99)}.'
    (tmp_path/'raw'/'a.jsonl').write_text(''.join(
        json.dumps({'text': ' '.join(sentence() for _ in range(rng.randrange(1, 9)))}) + '\n' for _ in range(60)))
    def config(out, n):
        p = tmp_path/f'{out}-{n}.toml'
        p.write_text(RUN_CONFIG.format(out=out, n=n))
        return p
    assert apex3('data', 'run', config('out', 5))[0] == 0
    assert apex3('data', 'run', config('clean', 1))[0] == 0
    old = output_files(tmp_path/'out')
    rc, err = apex3('data', 'run', config('out', 1))
    assert rc == 2 and 'steps.c4.min_sentences = 5 then, 1 now' in one_line(err), err
    assert output_files(tmp_path/'out') == old
    rc, err = apex3('data', 'run', config('out', 1), '--restart')
    assert rc == 0, err
    new, clean = output_files(tmp_path/'out'), output_files(tmp_path/'clean')
    assert new == clean and new != old

def test_empty_token_shards_are_named_as_empty(tmp_path):
    """Token shards that match but hold no tokens (every document filtered out) are one line saying so and naming
    one, exit 2; the control: a pattern matching no shard says no shard matches, naming none."""
    from apex3.data.tokenize import write_token_shard
    (tmp_path/'t').mkdir()
    for k in range(2): write_token_shard(tmp_path/'t'/f'shard-{k:05d}', [], 257)
    (tmp_path/'t'/'meta.json').write_text(json.dumps(dict(dtype='uint16', vocab_size=257, eos_id=256)))
    rc, err = apex3('train', '--data', f'b=1:{tmp_path}/t/shard-*.bin', '--total-tokens', '1000', '--device', 'cpu')
    assert rc == 2 and 'matches 2 token shards, but all are empty' in one_line(err), err
    assert str(tmp_path/'t'/'shard-00000.bin') in err
    rc, err = apex3('train', '--data', f'b=1:{tmp_path}/none/shard-*.bin', '--total-tokens', '1000', '--device', 'cpu')
    assert rc == 2 and 'no token shards' in one_line(err) and 'are empty' not in err and 'shard-00000' not in err, err

def test_a_step_log_on_a_data_shard_is_refused(tmp_path):
    """`apex3 train --step-log X` where X is one of its --data shards: exit 2, one line, the shard's bytes unchanged
    (and --ckpt-dir on a shard too). The control: the step log, given that path, does change a shard's bytes."""
    from types import SimpleNamespace
    from apex3.train_io import byte_shards, StepLog
    sh = byte_shards(tmp_path/'sh', 20_000, n_shards=2)
    shard = sh/'shard-00000.bin'
    data = shard.read_bytes()
    for flag in ('--step-log', '--ckpt-dir'):
        rc, err = apex3('train', '--data', f'b=1:{sh}/shard-*.bin', flag, shard, '--total-tokens', '1000',
                        '--device', 'cpu')
        assert rc == 2 and f'{flag} {shard} is a file of the data' in one_line(err), err
        assert shard.read_bytes() == data
    copy = tmp_path/'copy.bin'
    copy.write_bytes(data)
    log = StepLog(copy, SimpleNamespace(main=True), progress='off')
    log.write({'step': 1, 'loss': 2.0})
    log.close()
    assert copy.read_bytes() != data   # the control: what the refusal prevents

def test_a_folder_another_run_is_writing_is_refused(tmp_path):
    """While another run holds a stage's folder (its lock, as a run does for as long as it writes), `apex3 data`
    into it stops in one line, exit 2, and leaves the folder as it was. The control: the same command once the lock is
    free finishes, with a fresh run's bytes."""
    import fcntl
    from apex3.data.core import LOCK
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'fresh')[0] == 0
    (tmp_path/'out'/'.done').mkdir(parents=True)
    with open(tmp_path/'out'/'.done'/LOCK, 'a') as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        rc, err = apex3('data', 'c4', tmp_path/'in', tmp_path/'out')
        assert rc == 2 and 'is being written by another run now' in one_line(err), err
        assert sorted(p.name for p in (tmp_path/'out').rglob('*')) == ['.done', LOCK]
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out') == (0, '')
    assert output_files(tmp_path/'out') == output_files(tmp_path/'fresh')

def test_an_input_reached_through_a_link_is_the_same_input(tmp_path):
    """The same shards given through a symlink to their folder resume (they are named where they really are). The
    control: a copy of them in another folder is another input, refused in one line."""
    prose_shards(tmp_path/'in')
    assert apex3('data', 'c4', tmp_path/'in', tmp_path/'out')[0] == 0
    (tmp_path/'link').symlink_to(tmp_path/'in', target_is_directory=True)
    assert apex3('data', 'c4', tmp_path/'link', tmp_path/'out') == (0, '')
    shutil.copytree(tmp_path/'in', tmp_path/'copy')
    rc, err = apex3('data', 'c4', tmp_path/'copy', tmp_path/'out')
    assert rc == 2 and 'input copy/s0.jsonl.zst is new' in one_line(err), err

# ---- the task identity of download and repository sources ----
import gzip, http.server, threading
from apex3.data.core import Stage

class _Files(http.server.BaseHTTPRequestHandler):
    "Serves `files` ({path: bytes}) and logs every path asked for: the count of fetches."
    files, log = {}, []
    def log_message(self, *a): pass
    def do_GET(self):
        type(self).log.append(self.path)
        if self.path not in self.files: return self.send_error(404)
        data = self.files[self.path]
        self.send_response(200)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

@pytest.fixture
def web():
    "A local HTTP server of `_Files.files`, in a thread: its base URL."
    _Files.files, _Files.log = {}, []
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Files)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{srv.server_address[1]}'
    srv.shutdown()
    srv.server_close()

def download_config(tmp_path, base, paths) -> Path:
    "A config of one source downloaded from `base` + each of `paths`, ingested into one shard, not tokenized."
    p = tmp_path/'dl.toml'
    p.write_text('[pipeline]\nout = "out"\n[[source]]\nname = "web"\nkind = "jsonl"\nshards = 1\n'
                 f'urls = {json.dumps([base + x for x in paths])}\n[tokenize]\nenabled = false\n')
    return p

def jsonl(*texts) -> bytes: return ''.join(json.dumps({'text': t}) + '\n' for t in texts).encode()
def ingested(out) -> list:
    "The texts of the download source's ingested documents, sorted."
    return sorted(d.text for s in list_shards(Path(out)/'work'/'web'/'00_ingest') for d in read_docs(s))

def marker_times(out) -> dict:
    "{marker: mtime_ns} of every completion marker under `out`."
    return {Path(d, f): os.stat(Path(d, f)).st_mtime_ns for d, _, fs in os.walk(out) if Path(d).name == '.done'
            for f in fs if f.endswith('.json')}

def test_a_changed_url_redoes_its_download_alone(tmp_path, web):
    """Another URL for one file of a download source: refused in one line naming that task's URL then and now (exit
    2); with --restart that file alone is fetched again (the server's log), the other downloads' markers untouched,
    and the corpus holds its new text. The controls: the log does count fetches (the first run's three), and the new
    text is not the old one (a silent resume would have kept it)."""
    _Files.files = {'/a.jsonl': jsonl('alpha'), '/b.jsonl': jsonl('beta'), '/v2/b.jsonl': jsonl('beta two'),
                    '/c.jsonl': jsonl('gamma')}
    assert apex3('data', 'run', download_config(tmp_path, web, ['/a.jsonl', '/b.jsonl', '/c.jsonl']))[0] == 0
    assert sorted(_Files.log) == ['/a.jsonl', '/b.jsonl', '/c.jsonl'] and ingested(tmp_path/'out')[1] == 'beta'
    downloads = tmp_path/'out'/'downloads'/'web'
    before = marker_times(downloads)
    cfg = download_config(tmp_path, web, ['/a.jsonl', '/v2/b.jsonl', '/c.jsonl'])
    rc, err = apex3('data', 'run', cfg)
    assert rc == 2 and '1 finished task of stage web:download was done' in one_line(err), err
    assert f'(urls of b.jsonl = "{web}/b.jsonl" then, "{web}/v2/b.jsonl" now)' in err, err
    _Files.log.clear()
    assert apex3('data', 'run', cfg, '--restart')[0] == 0
    assert _Files.log == ['/v2/b.jsonl']
    after = marker_times(downloads)
    same = lambda t: {m: t[m] for m in t if m.name != 'b.jsonl.json'}
    assert same(after) == same(before) and len(same(before)) == 2 and after.keys() == before.keys()
    assert ingested(tmp_path/'out') == ['alpha', 'beta two', 'gamma']

def test_a_removed_url_takes_its_file_out_of_the_corpus(tmp_path, web):
    """A URL removed from a download source: refused in one line (exit 2); with --restart its file leaves the folder
    ingest reads, and its documents the corpus, while another URL's file whose name begins with that name stays and
    is not fetched again. The controls: the removed URL's file and documents were there before, and that other file
    is what the rule for a map's outputs (the files named `TASK.*`) would have deleted, leaving the removed one."""
    _Files.files = {'/a.jsonl': jsonl('alpha'), '/a.jsonl.gz': gzip.compress(jsonl('packed')),
                    '/b.jsonl': jsonl('beta')}
    assert apex3('data', 'run', download_config(tmp_path, web, ['/a.jsonl', '/a.jsonl.gz', '/b.jsonl']))[0] == 0
    downloads = tmp_path/'out'/'downloads'/'web'
    assert (downloads/'a.jsonl').is_file() and ingested(tmp_path/'out') == ['alpha', 'beta', 'packed']
    generic = Stage()
    generic.out = str(downloads)
    assert [p.name for p in generic.task_outputs('a.jsonl')] == ['a.jsonl.gz']
    cfg = download_config(tmp_path, web, ['/a.jsonl.gz', '/b.jsonl'])
    rc, err = apex3('data', 'run', cfg)
    assert rc == 2 and f'(urls of a.jsonl = "{web}/a.jsonl" then, "unset" now)' in one_line(err), err
    _Files.log.clear()
    assert apex3('data', 'run', cfg, '--restart')[0] == 0
    assert sorted(p.name for p in downloads.iterdir() if p.is_file()) == ['a.jsonl.gz', 'b.jsonl'] and _Files.log == []
    assert ingested(tmp_path/'out') == ['beta', 'packed']

def test_a_repository_source_is_stale_only_for_files_ingest_reads(tmp_path):
    """A repository source's finished stages resume (exit 0, no marker rewritten) after files that ingest never reads
    change: an image, a vendored package, a README. The control: a module in a hidden folder, which ingest reads,
    changed is refused in one line naming it (exit 2)."""
    repo = tmp_path/'repos'/'r1'
    files = {'pkg/mod.py': 'import pkg.util\nx = 1\n', 'pkg/util.py': 'y = 2\n', '.github/ci.py': 'run()\n',
             'node_modules/dep/index.py': 'v = 1\n', 'assets/logo.png': '\x89PNG', 'README.md': 'hello'}
    for f, text in files.items():
        (repo/f).parent.mkdir(parents=True, exist_ok=True)
        (repo/f).write_text(text)
    cfg = tmp_path/'repo.toml'
    cfg.write_text('[pipeline]\nout = "out"\n[[source]]\nname = "code"\nkind = "repo"\npath = "repos"\nshards = 1\n'
                   'stages = ["repopack"]\n[tokenize]\nenabled = false\n')
    assert apex3('data', 'run', cfg)[0] == 0
    before = marker_times(tmp_path/'out')
    for f in ('assets/logo.png', 'node_modules/dep/index.py', 'README.md'): (repo/f).write_text(files[f] + ' changed')
    rc, err = apex3('data', 'run', cfg)
    assert rc == 0 and marker_times(tmp_path/'out') == before and len(before) == 2, err
    (repo/'.github'/'ci.py').write_text('run(fast=True)\n')
    rc, err = apex3('data', 'run', cfg)
    assert rc == 2 and 'input ../../../repos/r1/.github/ci.py has changed' in one_line(err), err

def test_a_partial_file_of_a_removed_url_is_not_ingested(tmp_path, web):
    """The partial file a cut-off transfer left, its URL then removed from the source: the next run deletes it before
    ingest reads the download folder, so the run resumes (exit 0) and the corpus holds none of its text. The control:
    the file was there, with a whole document in it, when the run began."""
    _Files.files = {'/a.jsonl': jsonl('alpha')}
    cfg = download_config(tmp_path, web, ['/a.jsonl'])
    assert apex3('data', 'run', cfg)[0] == 0
    part = tmp_path/'out'/'downloads'/'web'/'b.jsonl.part'
    part.write_bytes(jsonl('beta', 'gamma')[:-5])   # as a transfer cut off mid-line leaves it
    assert json.loads(part.read_bytes().splitlines()[0]) == {'text': 'beta'}
    rc, err = apex3('data', 'run', cfg)
    assert rc == 0 and not part.exists(), err
    assert ingested(tmp_path/'out') == ['alpha']


def test_a_closed_stdout_ends_the_run_quietly(tmp_path):
    """`apex3 data demo OUT | head -1`: the reader goes after the first line, while the pool's workers are still
    starting. The run ends with the closed pipe's status (141) and writes nothing to stderr: the pool is closed before
    this process exits, so no worker, still unpickling what the parent shares, finds it gone and prints a traceback.
    The control: with its stdout read to the end the same run exits 0."""
    cmd = [sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', 'data', 'demo',
           str(tmp_path / 'o'), '--max-files', '20']
    env = {**os.environ, 'PYTHONPATH': f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for _ in range(3):   # (before the fix: a 12-line traceback in 3 runs of 3)
        shutil.rmtree(tmp_path / 'o', ignore_errors=True)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        assert (p.wait(60), err) == (141, ''), err
    shutil.rmtree(tmp_path / 'o')
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and 'stage' in done.stdout, done.stderr

LOST_CONFIG = '''[pipeline]
out = "out"
[[source]]
name = "p"
kind = "jsonl"
path = "raw/*.jsonl"
shards = 4
stages = ["redact", "dedup"]
[tokenize]
vocab_size = 300
[long]
enabled = false
'''

def token_docs(folder) -> int:
    "Documents in the token shards of `folder` (each `.idx` holds one uint64 end per document)."
    return sum(p.stat().st_size // 8 for p in Path(folder).glob('*.idx'))

def markers_written(out) -> dict:
    return {str(m): m.stat().st_mtime_ns for m in Path(out).rglob('.done/*.json')}

@pytest.mark.parametrize('harm', ['delete', 'truncate'])
def test_a_task_whose_output_was_removed_is_redone(tmp_path, harm):
    """A finished task whose output file was deleted (or cut short) by hand is not finished: a rerun redoes it, with one
    warning line naming the file, exit 0, and the token shards hold every input document again. The control: a rerun
    with nothing touched does no work (no marker written again, no line on stderr)."""
    rng = random.Random(0)
    (tmp_path/'raw').mkdir()
    for f in range(8):   # 8 files of 30 documents no two alike: redact and dedup keep all 240
        (tmp_path/'raw'/f'f{f}.jsonl').write_text(''.join(json.dumps(
            {'text': ' '.join(f'w{rng.randrange(5000)}' for _ in range(30)) + f' doc{f}x{j}'}) + '\n'
            for j in range(30)))
    (tmp_path/'c.toml').write_text(LOST_CONFIG)
    assert apex3('data', 'run', tmp_path/'c.toml')[0] == 0
    out = tmp_path/'out'
    assert token_docs(out/'tokens'/'p') == 240
    before = markers_written(out)
    assert apex3('data', 'run', tmp_path/'c.toml') == (0, '')   # the control: nothing to do, nothing redone
    assert markers_written(out) == before
    shard = out/'work'/'p'/'01_redact'/'shard-00001.jsonl.zst'
    if harm == 'delete': shard.unlink()
    else: shard.write_bytes(shard.read_bytes()[:100])
    rc, err = apex3('data', 'run', tmp_path/'c.toml')
    assert rc == 0 and 'shard-00001.jsonl.zst' in one_line(err) and 'stage p:redact redone' in err, err
    assert token_docs(out/'tokens'/'p') == 240
    redact = [r for r in json.loads((out/'markers.json').read_text()) if r['stage'] == 'p:redact']
    assert sum(r['counts']['docs_out'] for r in redact) == 240
    assert apex3('data', 'run', tmp_path/'c.toml') == (0, '')   # and once redone, it is finished
