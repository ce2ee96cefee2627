"""`apex3 data STAGE SRC OUT --set k=v` is checked as a config's `[params.STEP]` is (types and each parameter's range),
one line and status 2; a config's out-of-range parameter is refused before any work; a stage's reader of a
decompression bomb stays within a bounded memory. Each judged from outside (status, the stderr line, peak RSS), with a
control that shows the check can fail."""
import os, subprocess, sys, resource
from pathlib import Path
import pytest, zstandard

CLI = 'import sys; from apex3.cli import main; sys.exit(main())'

def data(*args, cwd=None):
    return subprocess.run([sys.executable, '-c', CLI, 'data', *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)

@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp('src')
    text = 'The cat sat on the mat. It was a sunny day. Birds sang loudly. We all went out. Then we came home.'
    rows = [f'{{"id": "{i}", "text": "{text}", "meta": {{}}}}' for i in range(20)]
    (d/'shard-00000.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(('\n'.join(rows) + '\n').encode()))
    return d

BAD = [('c4', 'min_words_per_line=abc', 'min_words_per_line'), ('c4', 'min_words_per_line=1e400', 'min_words_per_line'),
       ('gopher_quality', 'max_symbol_word_ratio=x', 'max_symbol_word_ratio'),
       ('decontaminate', 'humaneval=notbool', 'humaneval'), ('decontaminate', 'extra_jsonl=/etc/hostname', 'extra_jsonl'),
       ('decontaminate', 'n=0', 'an integer >= 1'), ('decontaminate', 'n=-3', 'an integer >= 1'),
       ('c4', 'min_words_per_line=-5', 'an integer >= 0'), ('c4', 'max_word_length=0', 'an integer >= 1'),
       ('repopack', 'max_pack_bytes=0', 'max_pack_bytes: 0 is not an integer from 1'),
       ('fineweb', 'line_punct_thr=-1.0', 'a number from 0 to 1'),
       # the contents of list parameters: each was a 61-line traceback in the worker, or (a plugin) taken in silence
       ('redact', 'rules=[["x", "("]]', 'rules made by `scrub.rule`'), ('redact', 'rules=[1, 2]', 'rules made by'),
       ('redact', 'plugins=["NoSuchDetector"]', 'names of detect-secrets plugins'),
       ('redact', 'plugins=[["AWSKeyDetector"]]', 'names of detect-secrets plugins')]

@pytest.mark.parametrize('stage,kv,said', BAD)
def test_set_checked_like_a_config(shards, tmp_path, stage, kv, said):
    r = data(stage, shards, tmp_path/'out', '--set', kv)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr and '--set' in r.stderr, r.stderr
    assert not (tmp_path/'out'/'.done').exists()

def test_set_in_range_runs(shards, tmp_path):
    "The control: values in range run and keep the documents that the bad ones would have lost."
    for stage, kv in (('c4', 'min_words_per_line=2'), ('decontaminate', 'n=13'), ('redact', 'plugins=["AWSKeyDetector"]')):
        r = data(stage, shards, tmp_path/stage, '--set', kv)
        assert r.returncode == 0 and '"docs_out": 20' in r.stdout, r.stderr

def test_extra_jsonl_that_is_no_benchmark_file_is_named(shards, tmp_path):
    """A decontamination file whose lines are not JSON objects with the text field: one line naming the file and its
    line, where it was a KeyError traceback (a line without the field) or a JSON error naming no file."""
    bench = tmp_path/'bench.jsonl'
    bench.write_text('{"prompt": "def add(a, b):"}\n{"question": "what is 2 + 2?"}\n')
    r = data('decontaminate', shards, tmp_path/'out', '--set', f'extra_jsonl=["{bench}"]')
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{bench} line 2: not a JSON object with a text 'prompt'" in r.stderr, r.stderr
    bench.write_text('{"prompt": "def add(a, b):"}\n')   # the control: a file of such objects runs
    assert data('decontaminate', shards, tmp_path/'ok', '--set', f'extra_jsonl=["{bench}"]').returncode == 0

def test_config_out_of_range_refused(tmp_path):
    raw = tmp_path/'raw'
    raw.mkdir()
    (raw/'a.jsonl').write_text('{"text": "hello world"}\n')
    def run(n):
        (tmp_path/'c.toml').write_text(f'[pipeline]\nout = "out"\n[tokenize]\nenabled = false\n[params.decontaminate]\n'
                                       f'n = {n}\n[[source]]\nname = "s"\nkind = "jsonl"\npath = "raw/*.jsonl"\n'
                                       'stages = ["decontaminate"]\n')
        return data('run', tmp_path/'c.toml')
    r = run(0)
    assert r.returncode == 2 and 'params.decontaminate.n: 0 is not an integer >= 1' in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path/'out'/'work').exists()
    r = run(13)   # the control: in range, it runs, and a run that removed nothing says so in a word
    assert r.returncode == 0 and 'removals:\n  none' in r.stdout and 'Empty DataFrame' not in r.stdout, r.stderr

BOMB_RSS = 1 << 30   # generous: the bounded reader peaks near its line bound (256 MiB); the whole-frame read at >3 GiB

def peak_rss_of(code) -> int:
    "Peak RSS in bytes of a fresh Python running `code` (its exit status must be 0)."
    r = subprocess.run([sys.executable, '-c', code + '\nimport resource; print(resource.getrusage('
                        'resource.RUSAGE_SELF).ru_maxrss)'], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[-1]) * 1024

def test_zst_bomb_bounded(tmp_path):
    src = tmp_path/'src'
    src.mkdir()
    z = zstandard.ZstdCompressor(level=19).compressobj()
    with open(src/'shard-00000.jsonl.zst', 'wb') as f:   # 1 GiB of NUL bytes in about 32 KB, written in pieces
        for _ in range(64): f.write(z.compress(b'\0' * (16 << 20)))
        f.write(z.flush())
    assert os.path.getsize(src/'shard-00000.jsonl.zst') < 100_000
    code = f'import sys; from apex3.cli import main; sys.argv = ["apex3", "data", "c4", "{src}", "{tmp_path/"out"}"]\n' \
           'try: main()\nexcept SystemExit as e: assert e.code == 2, e.code'
    fixed = peak_rss_of(code)
    assert fixed < BOMB_RSS, fixed
    r = data('c4', src, tmp_path/'out2')
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and 'a line longer than' in r.stderr, r.stderr
    # control: reading the same file whole, as the stage reader once did, passes the bound
    whole = peak_rss_of(f'import zstandard; d = zstandard.ZstdDecompressor().decompressobj()'
                        f'.decompress(open("{src}/shard-00000.jsonl.zst", "rb").read()); lines = d.split(b"\\n")')
    assert whole > BOMB_RSS, whole

BIG, HUGE = '9' * 400, '9' * 5000   # past a float (~1.8e308); past Python's int-from-text limit (4300 digits)
PAST = [('c4', 'min_sentences=99999999999999999999', 'an integer >= 0 and below 2**63'),
        ('c4', 'min_words_per_line=99999999999999999999', 'an integer >= 0 and below 2**63'),
        ('gopher_quality', f'max_symbol_word_ratio={BIG}', 'a number >= 0 and below 2**63'),
        ('code', f'max_mean_line_length={BIG}', 'a number >= 1 and below 2**63'),
        ('c4', f'min_words_per_line={HUGE}', '4300 digits'),
        ('gopher_repetition', 'dup_ngrams=[[10000000, 0.5]]', 'n an integer from 1 to 20'),
        ('gopher_repetition', 'top_ngrams=[[99999999999999999999, 0.5]]', 'n an integer from 1 to 20')]

@pytest.mark.parametrize('stage,kv,said', PAST)
def test_set_past_the_machine_refused(shards, tmp_path, stage, kv, said):
    "Values too large for the worker (C sizes, floats, memory per n-gram size) are one line, before any work."
    r = data(stage, shards, tmp_path/'out', '--set', kv)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr and '--set' in r.stderr, r.stderr
    assert not (tmp_path/'out'/'.done').exists()

def test_set_past_int64_crashes_the_worker_unchecked(shards):
    "The control: the same value, past the check, fails where the worker uses it (the count `islice` takes)."
    from itertools import islice
    from apex3.data.pipeline import step_errors
    with pytest.raises((ValueError, OverflowError)): list(islice(iter(()), 99999999999999999999))
    assert step_errors('c4', {'min_sentences': 2**63 - 1}, '') == []   # the last value in range still passes

FLOATS = [('gopher_quality', 'min_avg_word_len=2.5'), ('gopher_quality', 'max_avg_word_len=9.5'),
          ('code', 'max_mean_line_length=99.5'), ('gopher_repetition', 'dup_ngrams=[[20, 0.5]]')]

@pytest.mark.parametrize('stage,kv', FLOATS)
def test_set_float_where_the_rule_says_number(shards, tmp_path, stage, kv):
    "A float where the rule is `number` (the default an int) runs; the largest n-gram size allowed runs."
    r = data(stage, shards, tmp_path/'out', '--set', kv)
    assert r.returncode == 0 and (tmp_path/'out'/'.done').exists(), r.stderr

def test_set_float_where_the_rule_says_whole(shards, tmp_path):
    "The control: a float where the rule is `whole` is still refused, as is the n-gram size one past the bound."
    for stage, kv in (('c4', 'min_words_per_line=2.5'), ('gopher_repetition', 'dup_ngrams=[[21, 0.5]]')):
        r = data(stage, shards, tmp_path/stage, '--set', kv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and 'is not' in r.stderr, r.stderr

def test_config_not_a_regular_file_or_too_big(tmp_path):
    "A config that is a device, a FIFO or past 16 MiB is one line naming it, at once (not read whole, no hang)."
    fifo = tmp_path/'fifo'
    os.mkfifo(fifo)
    (tmp_path/'big.toml').write_bytes(b'# ' + b'x' * (16 << 20) + b'\n')
    (tmp_path/'digits.toml').write_text(f'[params.c4]\nmin_words_per_line = {HUGE}\n')
    for path, said in (('/dev/zero', 'not a regular file'), (fifo, 'not a regular file'),
                       (tmp_path/'big.toml', 'larger than'), (tmp_path/'digits.toml', '4300 digits')):
        r = subprocess.run([sys.executable, '-c', CLI, 'data', 'run', str(path)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
        assert said in r.stderr and str(path) in r.stderr, r.stderr
    # control: a small regular config is read and checked (its one problem named, so the reader did read it)
    (tmp_path/'ok.toml').write_text('[params.c4]\nmin_words_per_line = 2\n')
    r = data('run', tmp_path/'ok.toml')
    assert r.returncode == 2 and 'source: no [[source]] tables' in r.stderr, r.stderr
