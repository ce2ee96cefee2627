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
       ('fineweb', 'line_punct_thr=-1.0', 'a number from 0 to 1')]

@pytest.mark.parametrize('stage,kv,said', BAD)
def test_set_checked_like_a_config(shards, tmp_path, stage, kv, said):
    r = data(stage, shards, tmp_path/'out', '--set', kv)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr and '--set' in r.stderr, r.stderr
    assert not (tmp_path/'out'/'.done').exists()

def test_set_in_range_runs(shards, tmp_path):
    "The control: values in range run and keep the documents that the bad ones would have lost."
    for stage, kv in (('c4', 'min_words_per_line=2'), ('decontaminate', 'n=13')):
        r = data(stage, shards, tmp_path/stage, '--set', kv)
        assert r.returncode == 0 and '"docs_out": 20' in r.stdout, r.stderr

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
