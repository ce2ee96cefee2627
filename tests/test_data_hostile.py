"""No bytes stop a run: arbitrary bytes and arbitrary JSON values go through `apex3 data run` end to end (ingest, a
step chain, dedup's five stages, tokenizer training, token shards, long documents). The run exits 0, every ordinary
document reaches the token shards and decodes back to its text, and what is kept plus what is set aside (counted, and
written as reject records with a reason) is every line read, where the line count comes from the input bytes."""
import json, os, re, tempfile
from collections import Counter
from pathlib import Path
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from apex3.cli import run_cli
from apex3.data.core import list_shards, read_docs, read_jsonl_zst
from apex3.data.stats import load_markers
from apex3.data.tokenize import load_tokenizer, read_token_shard

KEEPING = ['redact', 'dedup']  # steps that keep every ordinary document (dedup: no two share 70% of their 5-grams)
EVERY_STEP = ['decontaminate', 'code', 'c4', 'gopher_repetition', 'gopher_quality', 'fineweb', 'redact', 'dedup']
CONFIG = '''[pipeline]
out = "out"
workers = 1
[[source]]
name = "s"
kind = "jsonl"
path = "raw/*.jsonl"
shards = 2
max_line_bytes = 4096
stages = {stages}
[tokenize]
vocab_size = 300
[long]
min_tokens = 8
'''
CONTROL = re.compile('[\x00-\x08\x0e-\x1f\x7f]')

def line_count(data: bytes) -> int: return data.count(b'\n') + (not data.endswith(b'\n')) if data else 0

def tag(k) -> str: return ' '.join(f'w{k}x{j}' for j in range(8))  # eight words no other document has

ordinary_text = st.text(st.characters(blacklist_categories=('Cs', 'Cc')) | st.sampled_from('\t\n\r '), max_size=60)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                          max_leaves=12)
meta = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ('id', 'text', 'packed')), json_value, max_size=3)
any_char_text = st.text(st.characters(blacklist_categories=()), max_size=40)  # lone surrogates and controls included
hostile_line = st.one_of(
    st.binary(max_size=120).filter(lambda b: b'\x00' not in b),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda t, m: json.dumps({**m, 'text': t}).encode(), any_char_text, meta),
    st.integers(65, 3000).map(lambda n: b'[' * n + b']' * n),
    st.integers(4301, 6000).map(lambda n: b'{"text": 1' + b'0' * n + b'}'),
    st.integers(4097, 9000).map(lambda n: b'{"text": "' + b'x' * n + b'"}'),
    st.sampled_from([b'', b'   ', b'{"text": "\\u0000\\u0001\\u001b"}', b'{"text": "\\ud800 alone"}', b'{"text": 5}']),
)
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))

def run(tmp, ordinary, hostile, blob, stages):
    "Write the inputs, run `apex3 data run`; return (exit status, stderr, lines read, ordinary records)."
    raw = Path(tmp)/'raw'
    raw.mkdir()
    docs = [{'id': f'ord-{k}', 'text': f'{tag(k)} {t}', **m} for k, (t, m) in enumerate(ordinary)]
    lines = [json.dumps(d).encode() for d in docs] + hostile
    a = b'\n'.join(sorted(lines, key=lambda l: hash(l) % 7)) + b'\n'  # ordinary and hostile lines interleaved
    (raw/'a.jsonl').write_bytes(a)
    (raw/'b.jsonl').write_bytes(blob)  # arbitrary bytes: a NUL in its first 8 KB sets it aside whole
    (Path(tmp)/'c.toml').write_text(CONFIG.format(stages=json.dumps(stages)))
    rc, out, err = run_cli('data', 'run', Path(tmp)/'c.toml')
    return rc, err, line_count(a) + line_count(blob), docs

def check_accounting(tmp, n_lines):
    "kept + set aside == lines read; the set-aside records' counts add up to the same; returns the final documents."
    out = Path(tmp)/'out'
    recs = load_markers(out)
    assert sum(r['counts']['docs_in'] for r in recs if r['stage'].startswith('ingest:')) == n_lines
    aside = sum(v for r in recs for k, v in r['counts'].items() if '/removed:' in k)
    records = [json.loads(l) for f in sorted(out.glob('work/s/*/rejects/*.jsonl.zst')) for l in read_jsonl_zst(f)]
    assert sum(r.get('count', 1) for r in records) == aside and all(r['reason'] for r in records)
    last = sorted(p for p in (out/'work'/'s').iterdir() if p.is_dir() and not p.name.endswith('_work'))[-1]
    final = [d for f in list_shards(last) for d in read_docs(f)]
    assert len(final) + aside == n_lines, (len(final), aside, n_lines)
    return final, last

def check_tokens(tmp, last):
    "Every kept document is in its shard's token file, in order, and decodes back to its text."
    out = Path(tmp)/'out'
    tok = load_tokenizer(out/'tokenizer'/'tokenizer.json')
    for f in list_shards(last):
        docs = list(read_docs(f))
        stem = out/'tokens'/'s'/Path(f).name.removesuffix('.jsonl.zst')
        ids, ends = read_token_shard(stem) if docs else ([], [])
        assert len(ends) == len(docs)
        for d, lo, hi in zip(docs, [0, *ends[:-1]], ends):
            assert tok.decode(ids[int(lo):int(hi) - 1].tolist(), skip_special_tokens=False) == d.text

@SETTINGS
@given(st.lists(st.tuples(ordinary_text, meta), max_size=6), st.lists(hostile_line, max_size=10), st.binary(max_size=300))
def test_no_bytes_stop_a_run(ordinary, hostile, blob):
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, n_lines, docs = run(tmp, ordinary, hostile, blob, KEEPING)
        assert rc == 0 and 'Traceback' not in err, err[-2000:]
        final, last = check_accounting(tmp, n_lines)
        assert {d['id'] for d in docs} <= {d.id for d in final}  # every ordinary document
        check_tokens(tmp, last)
        with pytest.raises(Exception):  # the control: the tokenizer itself refuses the unrepaired text
            load_tokenizer(Path(tmp)/'out'/'tokenizer'/'tokenizer.json').encode('lone \ud800 surrogate')

@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(ordinary_text, meta), max_size=4), st.lists(hostile_line, max_size=8), st.binary(max_size=200))
def test_every_step_holds(ordinary, hostile, blob):
    "The quality filters and decontamination may remove ordinary documents, but nothing stops the run or goes uncounted."
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, n_lines, _ = run(tmp, ordinary, hostile, blob, EVERY_STEP)
        assert rc == 0 and 'Traceback' not in err, err[-2000:]
        check_tokens(tmp, check_accounting(tmp, n_lines)[1])

def test_the_hostile_lines_of_the_issue():
    "The cases that stopped runs, by name: each is set aside (or repaired) with its reason, and the run goes on."
    lines = [b'[' * 2000 + b']' * 2000,  # under the line cap: the nesting is what must be caught
             b'{"text": "lone \\ud800 surrogate"}', b'{"text": "\\u0000\\u0001\\u0002"}',
             b'{"text": "nul\\u0000 inside"}', b'{"text": "fine"}']
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, n_lines, _ = run(tmp, [], lines, b'', ['redact'])
        assert rc == 0, err
        final, last = check_accounting(tmp, n_lines)
        assert sorted(d.text for d in final) == sorted(['fine', 'lone \ufffd surrogate', 'nul inside'])
        counts = sum((Counter(r['counts']) for r in load_markers(Path(tmp)/'out')), Counter())
        assert counts['ingest/removed:too_deep'] == 1 and counts['ingest/removed:control_only'] == 1
        assert counts['ingest/changed:lone_surrogate'] == 1 and counts['ingest/changed:control_chars'] == 2
        check_tokens(tmp, last)
        with pytest.raises(Exception):  # the control: the tokenizer itself refuses the unrepaired text
            load_tokenizer(Path(tmp)/'out'/'tokenizer'/'tokenizer.json').encode('lone \ud800 surrogate')


def _odd_inputs_run(tmp, odd):
    "`apex3 data c4 src out` over one good shard and, if given, `odd(path)` made beside it: (status, stderr, seconds)."
    import subprocess, sys, time
    from apex3.data.core import write_docs, Document
    src = Path(tmp)/'src'
    src.mkdir()
    write_docs(src/'a.jsonl.zst', [Document(f'd{i}', f'{tag(i)} a line of text') for i in range(5)])
    if odd: odd(src/'b.jsonl.zst')
    t0 = time.monotonic()
    code = 'import sys; from apex3.cli import main; sys.exit(main(sys.argv[1:]))'
    r = subprocess.run([sys.executable, '-c', code, 'data', '--workers', '1', 'c4', str(src), str(Path(tmp)/'out')],
                       capture_output=True, text=True, timeout=120, cwd=tmp)
    return r.returncode, r.stderr, time.monotonic() - t0


@pytest.mark.parametrize('odd', ['fifo', 'dev_zero'])
def test_a_shard_that_is_no_file_is_refused_in_one_line(odd):
    """A shard that is a FIFO no one writes hung the stage (its input digest read forever), and a link to /dev/zero
    read without end: each is now refused at once, in one line naming it, status 2."""
    import os
    make = {'fifo': os.mkfifo, 'dev_zero': lambda p: os.symlink('/dev/zero', p)}[odd]
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, secs = _odd_inputs_run(tmp, make)
    assert rc == 2 and secs < 60, (rc, secs, err[-800:])
    assert err.count('\n') == 1 and 'b.jsonl.zst: not a regular file' in err and 'Traceback' not in err, err


def test_a_folder_of_regular_shards_runs():
    "The control: the same folder without the odd shard runs to the end."
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, _ = _odd_inputs_run(tmp, None)
    assert rc == 0, err[-800:]


REPO_CONFIG = '[pipeline]\nout = "out"\nworkers = 1\n[[source]]\nname = "code"\nkind = "repo"\npath = "in"\nshards = 1\n'
ODD_ENTRIES = {  # the red team's entries beside a plain a.py: (name, what makes it, the reason it is set aside)
    'dangling': ('x.py', lambda p: os.symlink('/nonexistent', p), 'dangling_link'),
    'fifo': ('fifo.py', os.mkfifo, 'not_regular_file'),
    'dev_zero': ('zero.py', lambda p: os.symlink('/dev/zero', p), 'link_outside'),
    'passwd': ('passwd.py', lambda p: os.symlink('/etc/passwd', p), 'link_outside'),
}

def _repo_run(tmp):
    "`apex3 data run` of a repository source over `tmp`/in: (status, stderr, seconds)."
    import subprocess, sys, time
    (Path(tmp)/'c.toml').write_text(REPO_CONFIG)
    t0 = time.monotonic()
    code = 'import sys; from apex3.cli import main; sys.exit(main(sys.argv[1:]))'
    r = subprocess.run([sys.executable, '-c', code, 'data', 'run', 'c.toml'], capture_output=True, text=True,
                       timeout=120, cwd=tmp)
    return r.returncode, r.stderr, time.monotonic() - t0

def _output_text(out) -> bytes:
    "Every output file's bytes, compressed ones decompressed: what the run wrote, to search."
    import zstandard
    files = [p for p in Path(out).rglob('*') if p.is_file()]
    return b''.join(zstandard.ZstdDecompressor().stream_reader(p.open('rb')).read() if p.suffix == '.zst'
                    else p.read_bytes() for p in files)

def _docs_and_rejects(out):
    ingest = Path(out)/'work'/'code'/'00_ingest'
    docs = {d.id: d.text for f in list_shards(ingest) for d in read_docs(f)}
    rejects = [json.loads(l) for f in sorted(ingest.glob('rejects/*.zst')) for l in read_jsonl_zst(f)]
    return docs, {r['file']: r['reason'] for r in rejects}

@pytest.mark.parametrize('odd', sorted(ODD_ENTRIES))
def test_a_repositorys_odd_entry_is_set_aside(odd):
    """A repository holding a.py and one entry that is no regular file inside it (a dangling link, a FIFO, a link to
    /dev/zero, a link to /etc/passwd): the run exits 0 in bounded time, a.py is a document, the entry is a reject
    with its reason, and nothing of what a link leads to outside is in any output. A second run resumes (exit 0)."""
    name, make, reason = ODD_ENTRIES[odd]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)/'in'/'repo1'
        repo.mkdir(parents=True)
        (repo/'a.py').write_text('print("a plain file")\n')
        make(repo/name)
        rc, err, secs = _repo_run(tmp)
        assert rc == 0 and secs < 60 and 'Traceback' not in err, (rc, secs, err[-800:])
        docs, rejects = _docs_and_rejects(Path(tmp)/'out')
        assert docs == {'repo1/a.py': 'print("a plain file")\n'} and rejects == {f'repo1/{name}': reason}, rejects
        if odd == 'passwd': assert open('/etc/passwd', 'rb').readline().strip() not in _output_text(Path(tmp)/'out')
        assert _repo_run(tmp)[0] == 0   # the user can finish: a rerun resumes


def test_a_repositorys_files_and_inner_links_are_read():
    """The controls: a plain file and a link to a file inside the repository are read (the link under its own path),
    and the output search finds a text when a plain file of the repository holds it."""
    marker = open('/etc/passwd', 'rb').readline().strip()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)/'in'/'repo1'
        repo.mkdir(parents=True)
        (repo/'a.py').write_text('print("a plain file")\n')
        os.symlink('a.py', repo/'same.py')
        (repo/'copy.py').write_bytes(marker + b'\n')
        rc, err, _ = _repo_run(tmp)
        assert rc == 0, err[-800:]
        docs, rejects = _docs_and_rejects(Path(tmp)/'out')
        assert docs == {'repo1/a.py': 'print("a plain file")\n', 'repo1/same.py': 'print("a plain file")\n',
                        'repo1/copy.py': marker.decode() + '\n'} and rejects == {}
        assert marker in _output_text(Path(tmp)/'out')
