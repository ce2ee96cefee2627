"""datatrove's side of the data benchmark; run by records/data_bench.py in datatrove's own virtual environment
(datatrove is not an apex3 dependency). One worker, so every rate is one core's.

usage: DATATROVE_PYTHON records/data_bench_datatrove.py IN OUT [spacy|split] [SEEDS]
       DATATROVE_PYTHON records/data_bench_datatrove.py --task {stock|matched} {clean|dedup} IN OUT  (one task)
SPLITTER `spacy` is stock datatrove (spaCy word splitting); `split` swaps in apex3's splitter (`str.split`), the
matched comparison. SEEDS (comma-separated, default 1) are MinHash seeds: dedup runs once per seed, the first timed.
IN holds `prose/*.jsonl.zst` and `code/*.jsonl.zst` (the shards apex3 reads too). For prose it runs
C4QualityFilter → GopherRepetitionFilter → GopherQualityFilter → FineWebQualityFilter (apex3's order and
thresholds); for each source it runs the four MinHash stages (5-grams, 14 buckets × 8 hashes). Every stage
writes its removals with an exclusion writer (apex3 writes rejects files). Prints one JSON object:
{task: {seconds, cpu_seconds, docs_in, docs_out, removed_ids}, 'seeds': {source: {seed: removed_ids}}}."""
import json, shutil, sys, time
from pathlib import Path
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.pipeline.filters import C4QualityFilter, GopherRepetitionFilter, GopherQualityFilter, FineWebQualityFilter
from datatrove.pipeline.dedup import MinhashDedupSignature, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.utils.hashing import HashConfig
from datatrove.utils.word_tokenizers import load_word_tokenizer, WhitespaceTokenizer

class SplitTokenizer(WhitespaceTokenizer):
    "apex3's word splitter (whitespace, `str.split`) inside datatrove; sentences as datatrove's fallback splits them."
    def word_tokenize(self, text) -> list: return text.split()

def timed(pipeline, logs, tasks=1):
    "(wall seconds, CPU seconds of this process) of one executor run with one worker."
    t0, c0 = time.perf_counter(), time.process_time()
    LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(logs), skip_completed=False).run()
    return time.perf_counter() - t0, time.process_time() - c0

def reader(src): return JsonlReader(str(src), glob_pattern='*.jsonl.zst', compression='zstd', text_key='text', id_key='id')
def writer(out): return JsonlWriter(str(out), compression='zstd')

def ids_in(folder) -> list:
    "Document ids in the zstd JSONL files a writer left in `folder`."
    import io, zstandard
    out = []
    for f in sorted(Path(folder).rglob('*.zst')):
        with open(f, 'rb') as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            out += [json.loads(l)['id'] for l in io.TextIOWrapper(r, encoding='utf-8') if l.strip()]
    return out

def reasons_in(folder) -> dict:
    "{document id: datatrove's `filter_reason` (or '')} of the documents an exclusion writer left in `folder`."
    import io, zstandard
    out = {}
    for f in sorted(Path(folder).rglob('*.zst')):
        with open(f, 'rb') as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            for l in io.TextIOWrapper(r, encoding='utf-8'):
                if l.strip():
                    d = json.loads(l)
                    out[d['id']] = (d.get('metadata') or {}).get('filter_reason') or ''
    return out

FILTERS = ('c4', 'gopher_repetition', 'gopher_quality', 'fineweb')

def clean(src, out, lang='eng'):
    "The prose filter chain, with each filter's removals written to out/removed/<filter>."
    w = lambda k: writer(out/'removed'/k)
    fs = [C4QualityFilter(exclusion_writer=w('c4'), filter_curly_bracket=False, language=lang),  # apex3's C4 keeps braces
          GopherRepetitionFilter(exclusion_writer=w('gopher_repetition'), language=lang),
          GopherQualityFilter(exclusion_writer=w('gopher_quality'), language=lang),
          FineWebQualityFilter(exclusion_writer=w('fineweb'), language=lang)]
    s, c = timed([reader(src), *fs, writer(out/'kept')], out/'logs')
    return dict(seconds=s, cpu_seconds=c, docs_out=len(ids_in(out/'kept')), removed_ids=ids_in(out/'removed'),
                removed_by={k: reasons_in(out/'removed'/k) for k in FILTERS})

def dedup(src, out, lang='eng', seed=1, buckets=14, rows=8, precision=64):
    "datatrove's four MinHash stages (5-grams, `buckets` × `rows`); the bucket stage runs one task per bucket."
    cfg = MinhashConfig(n_grams=5, num_buckets=buckets, hashes_per_bucket=rows, seed=seed,
                        hash_config=HashConfig(precision=precision))
    runs = [([reader(src), MinhashDedupSignature(str(out/'sigs'), config=cfg, language=lang)], 1),
            ([MinhashDedupBuckets(str(out/'sigs'), str(out/'buckets'), config=cfg)], cfg.num_buckets),
            ([MinhashDedupCluster(str(out/'buckets'), str(out/'remove'), config=cfg)], 1),
            ([reader(src), MinhashDedupFilter(str(out/'remove'), exclusion_writer=writer(out/'removed')), writer(out/'kept')], 1)]
    times = [timed(p, out/'logs'/f'stage{k + 1}', tasks) for k, (p, tasks) in enumerate(runs)]
    return dict(seconds=sum(t[0] for t in times), cpu_seconds=sum(t[1] for t in times),
                stage_seconds=[t[0] for t in times], stage_cpu_seconds=[t[1] for t in times],
                docs_out=len(ids_in(out/'kept')), removed_ids=ids_in(out/'removed'))

def main(src, out, splitter='spacy', seeds='1'):
    src, out, seeds = Path(src), Path(out), [int(x) for x in seeds.split(',')]
    if out.exists(): shutil.rmtree(out)
    lang = 'eng' if splitter == 'spacy' else SplitTokenizer()
    load_word_tokenizer(lang).word_tokenize('warm up')  # spaCy loads once per process, not per document
    res = {'clean:prose': clean(src/'prose', out/'clean_prose', lang), 'seeds': {}}
    for s in ('prose', 'code'):
        runs = {seed: dedup(src/s, out/f'dedup_{s}_{seed}', lang, seed) for seed in seeds}
        res[f'dedup:{s}'] = runs[seeds[0]]
        res['seeds'][s] = {seed: r['removed_ids'] for seed, r in runs.items()}
    print(json.dumps(res))

# One task for the speed benchmark (records/data_speed.py): `stock` is datatrove as it ships (spaCy words, 14 × 8
# bands, 64-bit); `matched` has apex3's word splitter and apex3's MinHash shape (5-grams, 25 × 5, 32-bit).
# datatrove 0.10.1 hashes `str` with xxhash, which xxhash 4 refuses: its environment needs xxhash < 4.
VARIANTS = {'stock': dict(lang='eng', buckets=14, rows=8, precision=64),
            'matched': dict(lang=None, buckets=25, rows=5, precision=32)}

def one_task(variant, task, src, out):
    "Run `task` ('clean' or 'dedup') of `variant` on the shards in `src`; print its timings and removals as JSON."
    v, src, out = VARIANTS[variant], Path(src), Path(out)
    if out.exists(): shutil.rmtree(out)
    lang = v['lang'] or SplitTokenizer()
    load_word_tokenizer(lang).word_tokenize('warm up')
    if task == 'clean': r = clean(src, out, lang)
    else: r = dedup(src, out, lang, 1, v['buckets'], v['rows'], v['precision'])
    r.setdefault('stage_cpu_seconds', [r['cpu_seconds']])
    print(json.dumps(r))

if __name__ == '__main__':
    if sys.argv[1] == '--task': one_task(*sys.argv[2:6])
    else: main(*sys.argv[1:5])
