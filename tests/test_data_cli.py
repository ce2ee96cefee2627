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
