"""Per-stage throughput of the data pipeline on the whole embedded corpus, one worker (so every
rate is one core's), and recall on the planted near-duplicates; appends records to records/data.jsonl.
usage: python records/data_bench.py [--out DIR]
(The datatrove comparison of the issue is not measured yet: see the data issue's closing note.)"""
import argparse, json, platform, subprocess, sys, time
from pathlib import Path
from apex3.data.corpus import build_corpus
from apex3.data.pipeline import load_config, run_pipeline, final_docs, all_rejects
from apex3.data.stats import throughput

def near_dup_recall(cfg, key):
    "Fraction of planted pairs where dedup removed one member (pairs a filter removed entirely are left out)."
    rej = {(r.get('id'), r['step']) for r in all_rejects(cfg)}
    hit = [((nd['original'], 'dedup') in rej) or ((nd['copy'], 'dedup') in rej) for nd in key['near_dups']]
    filtered = [any(i == nd['copy'] and s not in ('dedup',) for i, s in rej) for nd in key['near_dups']]
    n = sum(1 for h, f in zip(hit, filtered) if h or not f)
    return sum(hit) / max(n, 1), sum(hit), n

def main():
    p = argparse.ArgumentParser(); p.add_argument('--out', default='/tmp/apex3-data-bench'); a = p.parse_args()
    cfg = load_config(build_corpus(a.out, workers=1))
    t0 = time.time(); recs = run_pipeline(cfg); wall = time.time() - t0
    key = json.loads((Path(a.out)/'planted.json').read_text())
    rec, hits, n = near_dup_recall(cfg, key)
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()
    run = time.strftime('%Y-%m-%dT%H:%M:%S')
    prov = dict(run=run, command='python records/data_bench.py', commit=commit, machine=platform.processor() or platform.machine(),
                python=platform.python_version(), workers=1, pipeline_wall_s=round(wall, 1))
    with open(Path(__file__).parent/'data.jsonl', 'a') as f:
        for _, r in throughput(recs).iterrows():
            f.write(json.dumps(dict(prov, impl='apex3', stage=r.stage, docs=int(r.docs), mb=round(r.mb, 3), seconds=round(r.seconds, 3),
                                    docs_per_s_core=round(r.docs_per_s_core, 1), mb_per_s_core=round(r.mb_per_s_core, 3),
                                    recall=(round(rec, 3) if 'dedup' in r.stage else None))) + '\n')
    print(f'near-duplicate recall {hits}/{n}; pipeline {wall:.1f}s')

if __name__ == '__main__': main()
