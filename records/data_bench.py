"""The data pipeline's benchmark: per-stage throughput on the whole embedded corpus, and apex3 against
datatrove on the same input files in the same run. Appends records (with provenance) to records/data.jsonl.

usage: python records/data_bench.py [--out DIR] [--datatrove-python PYTHON] [--max-files N] [--seeds 1,2,3]

1. Build the embedded corpus (the standard library as code and prose, planted cases) and run the whole
   pipeline with one worker: one record per stage (kind `data_stage`).
2. Gather each source's ingested documents into one shard (bench/in/{prose,code}/00000.jsonl.zst): the
   input of the comparison, read by both implementations.
3. apex3, in this process: the prose filters (C4 → Gopher repetition → Gopher quality → FineWeb), the code
   filters, and MinHash dedup (signatures, clusters, filter) on each source.
4. datatrove, in its own virtual environment (records/data_bench_datatrove.py), one worker: the same prose
   filters and its four MinHash stages on the same shards, twice: stock (spaCy word splitting, `datatrove`) and
   with apex3's whitespace splitter (`datatrove-split`), so the speed ratio is not mostly the word splitter.
5. Recall on the planted near-duplicate pairs (planted.json): a pair is caught when dedup removed at least
   one of its two documents. The code pairs' true 5-gram Jaccard similarity spans about 0.66-0.86, around
   the LSH threshold (~0.72), so their recall is probabilistic for both implementations: a difference of
   one or two pairs out of 20 is noise, not a verdict (the prose pairs, 0.86-0.92, are easy). One record per (implementation, task) (kind `data_compare`).
   Recall is also measured over several MinHash seeds (apex3 and matched datatrove; stock datatrove on the first
   seed only, it is slow): one record per (implementation, source, seed) (kind `data_recall_seed`).

6. Which prose documents each filter removed and why, per implementation (kind `data_removed_by`, `removed_by`:
   {filter: {id: reason}}; datatrove's reason is its `filter_reason`): the chapter's document-by-document account.

Rates are per core: documents (MB) in over the process's CPU seconds, so other jobs on a shared machine
slow the wall clock but not the rate; wall seconds and the load average are recorded beside them."""
import argparse, json, os, shlex, shutil, subprocess, sys, time
from pathlib import Path
from apex3.data.core import LocalExecutor, MapStage, list_shards, read_docs, read_jsonl_zst, write_docs
from apex3.data.clean import C4Lines, GopherRepetition, GopherQuality, FineWebQuality, CodeQuality
from apex3.data.dedup import dedup_stages, MinHasher
from apex3.data.corpus import build_corpus
from apex3.data.pipeline import load_config, run_pipeline
from apex3.data.stats import throughput
from apex3.records import append_records

PROSE_FILTERS = lambda: [C4Lines(), GopherRepetition(), GopherQuality(), FineWebQuality()]

def gather_inputs(cfg, dest) -> dict:
    "One shard per source holding every document ingest kept (in shard order); {source: (docs, bytes)}."
    work, out = Path(cfg['pipeline']['out'])/'work', {}
    for s in ('prose', 'code'):
        docs = [d for f in list_shards(work/s/'00_ingest') for d in read_docs(f)]
        write_docs(Path(dest)/s/'00000.jsonl.zst', docs)
        out[s] = (len(docs), sum(d.nbytes for d in docs))
    return out

def run_ours(stages) -> dict:
    "Run stages in this process (one core): wall and CPU seconds over every task, documents out of the last."
    ex = LocalExecutor(1, progress=False)
    recs = [ex.run(st) for st in stages]
    cpu = [sum(r['cpu_seconds'] for r in rs) for rs in recs]
    return dict(seconds=sum(r['seconds'] for rs in recs for r in rs), cpu_seconds=sum(cpu), stage_cpu_seconds=cpu,
                docs_out=sum(r['counts'].get('docs_out', 0) for r in recs[-1]))

def removed_ids(folder) -> list: return [json.loads(l)['id'] for f in list_shards(Path(folder)/'rejects') for l in read_jsonl_zst(f)]

def ours(inp, out) -> dict:
    "apex3's side: prose filters, code filters, and dedup per source, on the gathered shards."
    res = {}
    res['clean:prose'] = run_ours([MapStage('clean:prose', inp/'prose', out/'clean_prose', PROSE_FILTERS())])
    res['clean:prose']['removed_ids'] = removed_ids(out/'clean_prose')
    res['clean:code'] = run_ours([MapStage('clean:code', inp/'code', out/'clean_code', [CodeQuality()])])
    res['clean:code']['removed_ids'] = removed_ids(out/'clean_code')
    for s in ('prose', 'code'):
        res[f'dedup:{s}'] = run_ours(dedup_stages(inp/s, out/f'dedup_{s}_work', out/f'dedup_{s}'))
        res[f'dedup:{s}']['removed_ids'] = removed_ids(out/f'dedup_{s}')
    return res

def ours_seeds(inp, out, seeds) -> dict:
    "{source: {seed: removed ids}} of apex3's dedup with each MinHash seed."
    res = {}
    for s in ('prose', 'code'):
        for seed in seeds:
            run_ours(dedup_stages(inp/s, out/f'seed{seed}_{s}_work', out/f'seed{seed}_{s}', MinHasher(seed=seed)))
            res.setdefault(s, {})[seed] = removed_ids(out/f'seed{seed}_{s}')
    return res

def datatrove(python, inp, out, splitter='spacy', seeds=(1,)) -> dict:
    "datatrove's side, in its own interpreter; its log goes to OUT.log."
    script = Path(__file__).parent/'data_bench_datatrove.py'
    with open(f'{out}.log', 'w') as log:
        p = subprocess.run([python, str(script), str(inp), str(out), splitter, ','.join(map(str, seeds))],
                           stdout=subprocess.PIPE, stderr=log, text=True)
    if p.returncode: sys.exit(f'datatrove run failed ({p.returncode}): see {out}.log')
    return json.loads(p.stdout.strip().splitlines()[-1])

def recall(pairs, removed) -> dict:
    """Planted pairs caught (at least one member removed), pairs with both removed (each near a third document
    that was kept, e.g. two codec tables), and removals outside the pairs (the library's own near-duplicates)."""
    rm, planted = set(removed), {i for p in pairs for i in (p['original'], p['copy'])}
    return dict(planted_pairs=len(pairs), caught=sum(p['original'] in rm or p['copy'] in rm for p in pairs),
                both_removed=sum(p['original'] in rm and p['copy'] in rm for p in pairs), other_removed=len(rm - planted))

def compare_records(inputs, results, key) -> list:
    "One record per (implementation, task): per-core rates, documents out, and recall for dedup."
    recs = []
    for impl, res in results.items():
        for task, r in res.items():
            src = task.split(':')[1]; docs, nbytes = inputs[src]
            rec = dict(kind='data_compare', impl=impl, task=task, docs_in=docs, mb_in=nbytes / 1e6, seconds=r['seconds'],
                       cpu_seconds=r['cpu_seconds'], docs_per_s_core=docs / r['cpu_seconds'], mb_per_s_core=nbytes / 1e6 / r['cpu_seconds'],
                       docs_out=r['docs_out'], removed=len(r['removed_ids']), stage_cpu_seconds=r.get('stage_cpu_seconds'))
            if task.startswith('dedup:'):
                rec.update(recall([p for p in key['near_dups'] if p['source'] == src], r['removed_ids']))
                rec['recall'] = rec['caught'] / max(rec['planted_pairs'], 1)
            recs.append(rec)
        if 'clean:prose' in res and 'dedup:prose' in res:  # the target: clean + dedup, per core
            cpu = res['clean:prose']['cpu_seconds'] + res['dedup:prose']['cpu_seconds']
            docs, nbytes = inputs['prose']
            recs.append(dict(kind='data_compare', impl=impl, task='clean+dedup:prose', docs_in=docs, mb_in=nbytes / 1e6,
                             seconds=res['clean:prose']['seconds'] + res['dedup:prose']['seconds'], cpu_seconds=cpu,
                             docs_per_s_core=docs / cpu, mb_per_s_core=nbytes / 1e6 / cpu))
    return recs

def agreement(results, other='datatrove') -> dict:
    "Jaccard similarity of what apex3 and datatrove removed, per task both ran."
    a, d = results['apex3'], results.get(other, {})
    return {t: len(set(a[t]['removed_ids']) & set(d[t]['removed_ids'])) / max(len(set(a[t]['removed_ids']) | set(d[t]['removed_ids'])), 1)
            for t in a if t in d}

def stage_records(recs) -> list:
    "Per-stage throughput of the pipeline run (kind `data_stage`)."
    return [dict(kind='data_stage', impl='apex3', **{k: (v.item() if hasattr(v, 'item') else v) for k, v in r.items()})
            for r in throughput(recs).to_dict('records')]

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='/tmp/apex3-data-bench')
    p.add_argument('--datatrove-python', default='/tmp/dtenv/bin/python')
    p.add_argument('--max-files', type=int, default=None, help='only the first N library files (a quick check; not for records)')
    p.add_argument('--no-record', action='store_true')
    p.add_argument('--seeds', default='1,2,3,4,5', help='MinHash seeds for recall (the first is timed)')
    a = p.parse_args()
    out, load0 = Path(a.out), os.getloadavg()
    if (out/'corpus.toml').exists(): shutil.rmtree(out)  # a previous run: its markers would make this one skip every task
    cfg = load_config(build_corpus(out, max_files=a.max_files, workers=1))
    t0 = time.time(); recs = run_pipeline(cfg); wall = time.time() - t0
    key = json.loads((out/'planted.json').read_text())
    inputs = gather_inputs(cfg, out/'bench'/'in')
    seeds = [int(x) for x in a.seeds.split(',')]
    results = {'apex3': ours(out/'bench'/'in', out/'bench'/'apex3')}
    by_seed = {'apex3': ours_seeds(out/'bench'/'in', out/'bench'/'apex3_seeds', seeds)}
    for impl, splitter, ss in (('datatrove', 'spacy', seeds[:1]), ('datatrove-split', 'split', seeds)):
        results[impl] = datatrove(a.datatrove_python, out/'bench'/'in', out/'bench'/impl, splitter, ss)
        by_seed[impl] = results[impl].pop('seeds')
    dt_version = subprocess.run([a.datatrove_python, '-c', 'import datatrove, importlib.metadata as m; print(m.version("datatrove"))'],
                                capture_output=True, text=True).stdout.strip()
    cmp = compare_records(inputs, results, key)
    agree = {impl: agreement(results, impl) for impl in results if impl != 'apex3'}
    seed_recs = [dict(kind='data_recall_seed', impl=impl, source=s, seed=int(seed), **recall(
                     [p for p in key['near_dups'] if p['source'] == s], ids))
                 for impl, per in by_seed.items() for s, runs in per.items() for seed, ids in runs.items()]
    removed_by = {impl: r['clean:prose'].get('removed_by') for impl, r in results.items() if impl != 'apex3'}
    prov = dict(command='python records/data_bench.py ' + ' '.join(map(shlex.quote, sys.argv[1:])), workers=1, max_files=a.max_files,
                pipeline_wall_s=wall, datatrove=dt_version, loadavg_start=load0, loadavg_end=os.getloadavg(), cpus=os.cpu_count(),
                uptime=subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip())
    apex_by = {}  # apex3's prose removals per filter, {step: {id: reason}}, read from the rejects
    for f in list_shards(out/'bench'/'apex3'/'clean_prose'/'rejects'):
        for r in map(json.loads, read_jsonl_zst(f)): apex_by.setdefault(r['step'], {})[r['id']] = r['reason']
    removed_by['apex3'] = apex_by
    allrecs = ([dict(r, **prov) for r in stage_records(recs)]
               + [dict(r, removed_jaccard=agree.get(r['impl'], {}).get(r['task']), **prov) for r in cmp]
               + [dict(r, **prov) for r in seed_recs]
               + [dict(kind='data_removed_by', impl=impl, removed_by=v, **prov) for impl, v in removed_by.items() if v])
    for r in cmp:
        print(f"{r['impl']:>15} {r['task']:<18} {r['docs_in']:>5} docs {r['mb_in']:6.2f} MB  cpu {r['cpu_seconds']:6.2f}s wall {r['seconds']:6.2f}s"
              f"  {r['docs_per_s_core']:8.1f} docs/s/core {r['mb_per_s_core']:6.2f} MB/s/core  out {r.get('docs_out', '-')}"
              + (f"  recall {r['caught']}/{r['planted_pairs']} both {r['both_removed']} other {r['other_removed']}" if 'recall' in r else ''))
    rounded = {i: {k: round(v, 3) for k, v in g.items()} for i, g in agree.items()}
    print('removed-set agreement with apex3 (Jaccard):', json.dumps(rounded))
    for r in seed_recs:
        print(f"recall {r['impl']:>15} {r['source']:<5} seed {r['seed']}: {r['caught']}/{r['planted_pairs']}")
    print(f'pipeline {wall:.1f}s; load {load0} -> {os.getloadavg()}')
    if not a.no_record: print('appended to', append_records(allrecs, Path(__file__).parent/'data.jsonl'))

if __name__ == '__main__': main()
