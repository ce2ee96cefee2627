"""Bad input at scale: property-based tests (hypothesis) over the ingest readers (jsonl plain/gz/zst, text, parquet).
Arbitrary bytes never crash a reader; every malformed record is set aside with a reason; every well-formed one gets
through, in order. The reference for "well-formed" is decoding each line with Python's strict UTF-8 and json.loads."""
import gzip, io, json, os, tempfile
from pathlib import Path
import pytest, zstandard
from hypothesis import given, settings, strategies as st, HealthCheck
from apex3.data.core import Document, read_docs, read_jsonl_zst
from apex3.data.ingest import Rejected, read_jsonl, read_text_file, read_parquet, Source, IngestStage

REASONS = {'broken_json', 'invalid_utf8', 'no_text', 'line_too_long', 'truncated_archive', 'binary', 'too_large',
           'unreadable', 'corrupt_parquet', 'blank_line', 'too_deep', 'control_only'}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMPRESS = {'': lambda b: b, '.gz': gzip.compress, '.zst': lambda b: zstandard.ZstdCompressor().compress(b)}

def expected_line(raw):
    "The reference: the text of a well-formed JSONL line, or None (a blank line is set aside too)."
    try: rec = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError): return None
    return rec['text'] if isinstance(rec, dict) and isinstance(rec.get('text'), str) else None

def lines_of(data: bytes) -> list:
    "The lines a reader must account for: every newline ends one, and a last line may lack it."
    parts = data.split(b'\n')
    return parts[:-1] if data.endswith(b'\n') or not data else parts

def expected_text(t):
    "The reference repair, a character at a time: surrogates to U+FFFD, C0 controls but tab/LF/VT/FF/CR and DEL gone."
    fixed = ''.join('\ufffd' if 0xD800 <= ord(c) <= 0xDFFF else '' if (ord(c) < 32 and c not in '\t\n\x0b\x0c\r')
                    or ord(c) == 127 else c for c in t)
    return None if fixed != t and not fixed.strip() else fixed  # nothing visible left after a repair: set aside

good_line = st.text().map(lambda t: json.dumps({'text': t}).encode())
bad_line = st.one_of(st.binary(max_size=60).filter(lambda b: b'\n' not in b and b'\x00' not in b),
                     st.text(max_size=30).map(lambda t: json.dumps({'title': t}).encode()),
                     good_line.map(lambda b: b[:-2]),                       # cut in the middle
                     st.just(b'{"text": "caf\xe9"}'), st.just(b'[1, 2]'))
lines = st.lists(st.one_of(good_line, bad_line), max_size=30)

def write(tmp, name, data):
    p = Path(tmp)/name; p.write_bytes(data); return str(p)

@SETTINGS
@given(lines, st.sampled_from(list(COMPRESS)))
def test_jsonl_every_record_accounted_for(ls, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        data = b'\n'.join(ls) + b'\n'
        out = list(read_jsonl(write(tmp, 'x.jsonl' + suffix, COMPRESS[suffix](data)), 'src'))
    docs = [r.text for r in out if isinstance(r, Document)]
    rejects = [r for r in out if isinstance(r, Rejected)]
    assert all(r.reason in REASONS for r in rejects)
    if b'\x00' in data[:8192]:
        assert docs == [] and [(r.reason, r.count) for r in rejects] == [('binary', len(lines_of(data)))]; return
    assert docs == [t for t in map(expected_line, lines_of(data)) if t is not None]
    assert len(rejects) == sum(expected_line(l) is None for l in lines_of(data))  # one per line: blank lines too

@SETTINGS
@given(st.binary(max_size=2000), st.sampled_from(list(COMPRESS)))
def test_jsonl_arbitrary_bytes_never_crash(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        out = list(read_jsonl(write(tmp, 'x.jsonl' + suffix, data), 'src'))
    assert all(isinstance(r, Document) or r.reason in REASONS for r in out)

@SETTINGS
@given(st.lists(good_line, min_size=1, max_size=20), st.sampled_from(['.gz', '.zst']), st.floats(0, 1))
def test_truncated_archive_keeps_a_prefix(ls, suffix, frac):
    whole = COMPRESS[suffix](b'\n'.join(ls) + b'\n')
    with tempfile.TemporaryDirectory() as tmp:
        out = list(read_jsonl(write(tmp, 'x.jsonl' + suffix, whole[:int(len(whole) * frac)]), 'src'))
    docs = [r.text for r in out if isinstance(r, Document)]
    assert docs == [expected_line(l) for l in ls][:len(docs)]       # what gets through is the file's start, in order
    assert all(r.reason in REASONS for r in out if isinstance(r, Rejected))

@SETTINGS
@given(st.one_of(st.binary(max_size=3000), st.text(max_size=500).map(str.encode)))
def test_text_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        r = read_text_file(write(tmp, 'a.txt', data), 'src', 'a')
    try: ref = data.decode('utf-8') if b'\x00' not in data[:8192] else None
    except UnicodeDecodeError: ref = None
    assert (r.text == ref) if ref is not None else (r.reason in ('binary', 'invalid_utf8'))

@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.none(), st.integers()), max_size=20), st.binary(max_size=200))
def test_parquet(texts, junk):
    pa, pq = pytest.importorskip('pyarrow'), pytest.importorskip('pyarrow.parquet')
    with tempfile.TemporaryDirectory() as tmp:
        col = pa.array([t if isinstance(t, str) else None for t in texts], pa.string())
        pq.write_table(pa.table({'text': col}), Path(tmp)/'a.parquet')
        out = list(read_parquet(str(Path(tmp)/'a.parquet'), 'src'))
        assert [r.text for r in out if isinstance(r, Document)] == [t for t in texts if isinstance(t, str)]
        assert sum(isinstance(r, Rejected) for r in out) == sum(not isinstance(t, str) for t in texts)
        bad = list(read_parquet(write(tmp, 'b.parquet', junk), 'src'))   # arbitrary bytes: one reject, no crash
        assert all(isinstance(r, Rejected) and r.reason == 'corrupt_parquet' for r in bad)

@settings(max_examples=15, deadline=None)
@given(st.lists(lines, min_size=1, max_size=4))
def test_ingest_stage_counts_and_sets_aside(files):
    with tempfile.TemporaryDirectory() as tmp:
        for k, ls in enumerate(files): write(tmp, f'f{k}.jsonl', b'\n'.join(ls) + b'\n')
        rec = IngestStage(Source('s', 'jsonl', f'{tmp}/*.jsonl', shards=2), f'{tmp}/out').run(0)
        rec1 = IngestStage(Source('s', 'jsonl', f'{tmp}/*.jsonl', shards=2), f'{tmp}/out').run(1)
        docs = [d.text for i in (0, 1) for d in read_docs(f'{tmp}/out/shard-{i:05d}.jsonl.zst')]
        rejects = [json.loads(l) for i in (0, 1) for l in read_jsonl_zst(f'{tmp}/out/rejects/shard-{i:05d}.jsonl.zst')]
    kept = [l for ls in files for l in lines_of(b'\n'.join(ls) + b'\n')]
    texts = [expected_line(l) for l in kept]
    want = [expected_text(t) for t in texts if t is not None]
    assert sorted(docs) == sorted(t for t in want if t is not None)
    n_bad = sum(r.get(k, 0) for r in (rec, rec1) for k in r if k.startswith('ingest/removed:'))
    assert n_bad == len(rejects) == len(kept) - sum(t is not None for t in want)
    assert rec['docs_in'] + rec1['docs_in'] == len(kept) == n_bad + rec['docs_out'] + rec1['docs_out']
    assert all(r['reason'] in REASONS for r in rejects)
