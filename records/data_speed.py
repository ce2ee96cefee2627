"""Data speed against datatrove at sizes that matter: whole processes and in-process stage sums, interleaved repeats,
the machine's load around every run. Appends records (with provenance) to records/data_speed.jsonl.

usage: python records/data_speed.py [--sizes 20,200] [--repeats 3] [--tasks dedup:code,dedup:prose,clean:prose]
                                    [--impls apex3,matched,stock] [--workers 1[,2]] [--datatrove-python PYTHON]
       python records/data_speed.py --disagree [--sizes 20]      (point 2: what each removes that the other keeps)

Inputs are records/data_speed_inputs.py's (built here when missing). Each run is a fresh process (apex3: this
script's `--child`; datatrove: records/data_bench_datatrove.py `--task`, in datatrove's own virtual environment),
so its whole cost is measured: CPU user + sys and wall of the process from `os.wait4`, as `/usr/bin/time` reports
them, beside the stage sums the process measures itself (`stage_cpu_s`: apex3's task CPU seconds, datatrove's
per-stage `process_time`). The implementations alternate within each repeat (A B C A B C ...), so a change of load
on this shared machine falls on all of them; `os.getloadavg()` before and after is in every record.

Implementations: `apex3` (one worker, or each count of --workers in turn: scaling), `matched` (datatrove with apex3's whitespace word splitter
and apex3's MinHash shape: 5-grams, 25 bands × 5 rows, 32-bit hashes; datatrove has no verification threshold),
`stock` (datatrove as it ships: spaCy words, 14 × 8, 64-bit). datatrove's environment: `pip install datatrove==0.10.1
orjson zstandard regex nltk tokenizers spacy "xxhash<4"` (0.10.1 hashes `str`, which xxhash 4 refuses). A record whose process used under 1 s of CPU is
not a figure: it is written with `figure: false` and the summary leaves it out.

Repeats may run as separate jobs (`--first-repeat K --repeats 1`, each with its own APEX3_DATA_SPEED_WORK folder):
the two implementations still alternate within each repeat. Each run's removed document ids go to WORK/removed/; `--disagree` reads them (first repeat) and records, for each
implementation and each document it removed that the other kept, the exact 5-gram Jaccard similarity of the
document to its nearest document the remover kept (word 5-grams of the lower-cased `\\w+` words, as sets of
strings: independent of both tools' MinHash) — kind `data_speed_disagree`."""
import argparse, functools, json, os, re, resource, shlex, statistics, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))

MIN_CPU_S = 1.0
HERE = Path(__file__).parent
WORK = Path(os.environ.get('APEX3_DATA_SPEED_WORK', '/tmp/apex3-data-speed'))  # one per concurrent run

# ---- the apex3 side, run as `--child TASK SRC OUT WORKERS` in a fresh process (importing only the task's module)
def dedup_stages(src, out):
    from apex3.data.dedup import dedup_stages
    return dedup_stages(src, out/'work', out/'kept')

def clean_stages(src, out):
    from apex3.data.core import MapStage
    from apex3.data.clean import C4Lines, GopherRepetition, GopherQuality, FineWebQuality
    return [MapStage('clean', src, out/'kept', [C4Lines(), GopherRepetition(), GopherQuality(), FineWebQuality()])]

def child(task, src, out, workers=1):
    "Run one apex3 task on the shards in `src`; print its stage sums and removals as JSON."
    import shutil
    from apex3.data.core import LocalExecutor, list_shards, read_jsonl_zst
    src, out = Path(src), Path(out)
    with LocalExecutor(int(workers), progress=False) as ex:   # first, as `apex3 data` makes it: its pool starts now
        if out.exists(): shutil.rmtree(out)   # the last run's output, while the pool's processes start
        t0 = time.perf_counter()
        stages = (dedup_stages if task.split(':')[0] == 'dedup' else clean_stages)(src, out)
        recs = [ex.run(st) for st in stages]
    wall = time.perf_counter() - t0
    removed = [json.loads(l)['id'] for f in list_shards(out/'kept'/'rejects') for l in read_jsonl_zst(f)]
    docs_out = sum(r['counts'].get('docs_out', 0) for r in recs[-1])
    print(json.dumps(dict(seconds=wall, cpu_seconds=sum(r['cpu_seconds'] for rs in recs for r in rs),
                          stage_cpu_seconds=[sum(r['cpu_seconds'] for r in rs) for rs in recs],
                          docs_out=docs_out, removed_ids=removed)))

# ---- the parent: timed, interleaved runs
def run_one(impl, task, src, out, dt_python, workers=1) -> dict:
    "One timed run: whole-process and in-process figures, load before and after."
    kind = task.split(':')[0]
    argv = ([sys.executable, __file__, '--child', task, str(src), str(out), str(workers)] if impl == 'apex3' else
            [dt_python, str(HERE/'data_bench_datatrove.py'), '--task', impl, kind, str(src), str(out)])
    os.sync()  # the last run's files reach the disk now: their writeback must not fall inside this run's timing
    load0, r0 = os.getloadavg(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the process and every child it waited for
    if p.returncode: sys.exit(f'{impl} {task} failed ({p.returncode}):\n{p.stderr[-3000:]}')
    res = json.loads(p.stdout.strip().splitlines()[-1])
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return dict(res, proc_wall_s=wall, proc_user_s=user, proc_sys_s=sys_, proc_cpu_s=user + sys_,
                loadavg_before=list(load0), loadavg_after=list(os.getloadavg()))

def speed_record(impl, task, size, rep, workers, info, r) -> dict:
    "The record of one run (its removed ids are kept apart)."
    rec = dict(kind='data_speed', impl=impl, task=task, size_mb=size, repeat=rep, workers=workers,
               docs_in=info['docs'], mb_in=info['bytes'] / 1e6, docs_out=r['docs_out'], removed=len(r['removed_ids']),
               proc_cpu_s=r['proc_cpu_s'], proc_user_s=r['proc_user_s'], proc_sys_s=r['proc_sys_s'],
               proc_wall_s=r['proc_wall_s'], stage_cpu_s=r['cpu_seconds'], stage_wall_s=r['seconds'],
               stage_cpu_seconds=r['stage_cpu_seconds'], mb_per_cpu_s=info['bytes'] / 1e6 / r['proc_cpu_s'],
               loadavg_before=r['loadavg_before'], loadavg_after=r['loadavg_after'],
               figure=r['proc_cpu_s'] >= MIN_CPU_S)
    if not rec['figure']: print(f'  NOT A FIGURE: {impl} {task} {size} MB used {r["proc_cpu_s"]:.2f} s of CPU (< {MIN_CPU_S})')
    return rec

@functools.cache
def input_info(size, task) -> tuple:
    "(folder, {docs, bytes}) of the input a task reads."
    from data_speed_inputs import DEFAULT_OUT, input_dir  # here: a child and its workers need none of it
    d = input_dir(DEFAULT_OUT, task.split(':')[1], size)
    files = sorted(d.glob('*.jsonl.zst'))
    from apex3.data.core import read_docs
    n = b = 0
    for f in files:
        for doc in read_docs(f): n += 1; b += doc.nbytes
    return d, dict(docs=n, bytes=b)

def summary(recs) -> list:
    "Median and min-max of whole-process CPU per (size, task, impl), and the ratio of medians to apex3."
    out, key = [], lambda r: (r['size_mb'], r['task'], r['workers'])
    groups = {}
    for r in recs:
        if r['figure']: groups.setdefault(key(r), {}).setdefault(r['impl'], []).append(r)
    for k, by in sorted(groups.items()):
        med = {i: statistics.median(x['proc_cpu_s'] for x in rs) for i, rs in by.items()}
        for i, rs in by.items():
            cpu = [x['proc_cpu_s'] for x in rs]
            st = [x['stage_cpu_s'] for x in rs]
            out.append(dict(size_mb=k[0], task=k[1], workers=k[2], impl=i, n=len(rs), cpu_median=med[i],
                            cpu_min=min(cpu), cpu_max=max(cpu), stage_cpu_median=statistics.median(st),
                            ratio_vs_apex3=med[i] / med['apex3'] if 'apex3' in med else None))
    return out

def bench(a):
    from apex3.records import append_records
    sizes, tasks, impls = [int(x) for x in a.sizes.split(',')], a.tasks.split(','), a.impls.split(',')
    workers = [int(x) for x in a.workers.split(',')]  # apex3 runs once per count, in turn within each repeat
    from data_speed_inputs import DEFAULT_OUT, build_inputs
    build_inputs(DEFAULT_OUT, sizes)
    prov = dict(command='python records/data_speed.py ' + ' '.join(map(shlex.quote, sys.argv[1:])), cpus=os.cpu_count(),
                datatrove=subprocess.run([a.datatrove_python, '-c', 'import importlib.metadata as m; print(m.version("datatrove"))'],
                                         capture_output=True, text=True).stdout.strip())
    recs = []
    for size in sizes:
        for rep in range(a.first_repeat, a.first_repeat + a.repeats):
            for task in tasks:
                src, info = input_info(size, task)
                for impl, w in [(i, w) for i in impls for w in (workers if i == 'apex3' else [1])]:
                    out = WORK/f'{impl}-{task.replace(":", "-")}-{size}'
                    r = run_one(impl, task, src, out, a.datatrove_python, w)
                    rm = WORK/'removed'/f'{impl}-{task.replace(":", "-")}-{size}-w{w}-r{rep}.json'
                    rm.parent.mkdir(parents=True, exist_ok=True); rm.write_text(json.dumps(r['removed_ids']))
                    rec = speed_record(impl, task, size, rep, w, info, r)
                    print(f"{size:>4} MB rep {rep} {task:<12} {impl:>8} w{w}: cpu {rec['proc_cpu_s']:7.2f} s (stages "
                          f"{rec['stage_cpu_s']:7.2f}) wall {rec['proc_wall_s']:7.2f} s removed {rec['removed']:>5} "
                          f"load {rec['loadavg_before'][0]:.1f}->{rec['loadavg_after'][0]:.1f}", flush=True)
                    if not a.no_record: append_records([dict(rec, **prov)], HERE/'data_speed.jsonl')
                    recs.append(rec)
    for s in summary(recs):
        ratio = f"x{s['ratio_vs_apex3']:.2f} of apex3" if s['ratio_vs_apex3'] else 'no apex3 figure (under 1 s)'
        print(f"{s['size_mb']:>4} MB {s['task']:<12} w{s['workers']} {s['impl']:>8}: median {s['cpu_median']:7.2f} s "
              f"[{s['cpu_min']:.2f}-{s['cpu_max']:.2f}] n={s['n']}  {ratio}")

# ---- point 2: what each removes that the other keeps, with its exact similarity to what the remover kept
WORD = re.compile(r'\w+')

def shingles(text, n=5) -> set:
    "Word n-grams of the lower-cased text (one n-gram of all the words when there are fewer than n)."
    w = WORD.findall(text.lower())
    return {' '.join(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))}

def nearest_kept_jaccard(texts, removed, kept) -> dict:
    "{id in `removed`: max exact Jaccard to any id in `kept`}, through an index of the removed documents' shingles."
    sets = {i: shingles(texts[i]) for i in removed}
    index = {}
    for i, s in sets.items():
        for g in s: index.setdefault(g, []).append(i)
    best = dict.fromkeys(removed, 0.0)
    for k in kept:
        s, hits = shingles(texts[k]), {}
        for g in s:
            for i in index.get(g, ()): hits[i] = hits.get(i, 0) + 1
        for i, inter in hits.items():
            best[i] = max(best[i], inter / (len(sets[i]) + len(s) - inter))
    return best

def disagree(a):
    from apex3.records import append_records
    from apex3.data.core import read_docs
    from data_speed_inputs import DEFAULT_OUT, input_dir
    recs = []
    for size in [int(x) for x in a.sizes.split(',')]:
        for src in ('code', 'prose'):
            d = input_dir(DEFAULT_OUT, src, size)
            texts = {doc.id: doc.text for f in sorted(d.glob('*.jsonl.zst')) for doc in read_docs(f)}
            rm = {i: set(json.loads((WORK/'removed'/f'{i}-dedup-{src}-{size}-w1-r0.json').read_text()))
                  for i in ('apex3', 'matched', 'stock') if (WORK/'removed'/f'{i}-dedup-{src}-{size}-w1-r0.json').exists()}
            for other in [i for i in rm if i != 'apex3']:
                for remover, keeper in (('apex3', other), (other, 'apex3')):
                    only = sorted(rm[remover] - rm[keeper])
                    j = nearest_kept_jaccard(texts, only, [i for i in texts if i not in rm[remover]])
                    recs.append(dict(kind='data_speed_disagree', size_mb=size, source=src, remover=remover,
                                     keeper=keeper, removed_by_remover=len(rm[remover]), removed_by_keeper=len(rm[keeper]),
                                     both_removed=len(rm[remover] & rm[keeper]), only=len(only),
                                     jaccard=[round(j[i], 4) for i in only], ids=only, threshold=0.7))
                    print(f'{size} MB {src}: {remover} removes {len(only)} that {keeper} keeps; nearest kept J < 0.7: '
                          f'{sum(j[i] < 0.7 for i in only)}')
    if not a.no_record: append_records(recs, HERE/'data_speed.jsonl')

def main():
    if sys.argv[1:2] == ['--child']: return child(*sys.argv[2:6])
    p = argparse.ArgumentParser()
    p.add_argument('--sizes', default='20,200')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--first-repeat', type=int, default=0, help='number of the first repeat (repeats may run as separate jobs)')
    p.add_argument('--tasks', default='dedup:code,dedup:prose,clean:prose')
    p.add_argument('--impls', default='apex3,matched,stock')
    p.add_argument('--workers', default='1', help="apex3's local workers, e.g. 1,2 (datatrove always runs one)")
    p.add_argument('--datatrove-python', default='/work/venvs/datatrove/bin/python')
    p.add_argument('--disagree', action='store_true')
    p.add_argument('--no-record', action='store_true')
    a = p.parse_args()
    disagree(a) if a.disagree else bench(a)

if __name__ == '__main__': main()
