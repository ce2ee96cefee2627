"""Ray scale-out on real stages: dedup signatures and the prose filter chain over the standard library's source.

usage: python records/data_bench_ray.py [--cpus 8] [--shards 32] [--copies 2] [--out DIR] [--record PATH]

One local Ray cluster of CPUS slots (started once, so the runs do not pay for its start), warmed with one task per
slot; then each stage runs with 1, 2, 4, ... tasks at once (a task holds CPUS // k slots). Every run's outputs are
compared with the local executor's (a process pool of CPUS workers, the other way to use the cores): byte for byte,
completion markers aside. Wall seconds and the tasks' summed CPU seconds per run; one record per (stage, executor,
workers), kind `ray_scaleout`, appended to records/data_ray.jsonl (or PATH)."""
import argparse, os, shutil, sys, time
from pathlib import Path
from apex3.data.core import Document, LocalExecutor, MapStage, RayExecutor, Step, stdlib_files, write_docs
from apex3.data.clean import C4Lines, GopherRepetition, GopherQuality, FineWebQuality
from apex3.data.dedup import Signatures
from apex3.data.pipeline import output_files
from apex3.records import append_records

STAGES = {'dedup:signatures': lambda src, out: Signatures(src, out),
          'clean:prose': lambda src, out: MapStage('clean:prose', src, out,
                                                   [C4Lines(), GopherRepetition(), GopherQuality(), FineWebQuality()])}

def write_inputs(dest, shards, copies) -> float:
    "The standard library's source files, `copies` times (each copy its own ids), in `shards` shards; MB written."
    import sysconfig
    root = Path(sysconfig.get_paths()['stdlib'])
    docs = [Document(f'{c}:{f}', (root/f).read_text(errors='replace')) for c in range(copies) for f in stdlib_files()]
    for k in range(shards): write_docs(Path(dest)/f'{k:05d}.jsonl.zst', docs[k::shards])
    return sum(d.nbytes for d in docs) / 1e6

def timed(executor, stage) -> tuple:
    "(wall seconds, summed task CPU seconds) of one run."
    t0 = time.perf_counter()
    recs = executor.run(stage)
    return time.perf_counter() - t0, sum(r['cpu_seconds'] for r in recs)

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--cpus', type=int, default=8)
    p.add_argument('--shards', type=int, default=32)
    p.add_argument('--copies', type=int, default=2)
    p.add_argument('--out', default='/tmp/apex3-ray-bench')
    p.add_argument('--record', default=str(Path(__file__).parent/'data_ray.jsonl'))
    a = p.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    mb = write_inputs(out/'in', a.shards, a.copies)
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= a.cpus]
    ref, recs, load0 = {}, [], os.getloadavg()
    with LocalExecutor(a.cpus, progress=False) as pool:
        pool.run(MapStage('warm', out/'in', out/'warm-pool', [Step()]))  # the pool's processes start and import
        for name, make in STAGES.items():
            s, c = timed(pool, make(out/'in', out/'local'/name))
            ref[name] = output_files(out/'local'/name)
            recs.append(dict(stage=name, executor='local-pool', workers=a.cpus, seconds=s, cpu_seconds=c))
    RayExecutor(num_cpus=a.cpus, progress=False).run(MapStage('warm', out/'in', out/'warm', [Step()]))  # a worker per slot
    for name, make in STAGES.items():
        for k in ks:
            st = make(out/'in', out/'ray'/f'{name}-{k}')
            s, c = timed(RayExecutor(progress=False, task_cpus=a.cpus // k), st)
            if output_files(out/'ray'/f'{name}-{k}') != ref[name]: sys.exit(f'{name} with {k} Ray workers: outputs differ')
            recs.append(dict(stage=name, executor='ray', workers=k, seconds=s, cpu_seconds=c))
    base = {r['stage']: r['seconds'] for r in recs if r['executor'] == 'ray' and r['workers'] == 1}
    prov = dict(command='python records/data_bench_ray.py ' + ' '.join(sys.argv[1:]), tasks=a.shards, mb_in=mb,
                cluster_cpus=a.cpus, host_cpus=os.cpu_count(), loadavg_start=load0, loadavg_end=os.getloadavg(),
                outputs_identical=True)
    recs = [dict(kind='ray_scaleout', **r, speedup=base[r['stage']] / r['seconds'], **prov) for r in recs]
    for r in recs:
        print(f"{r['stage']:<17} {r['executor']:<10} {r['workers']:>2} workers {r['seconds']:6.2f}s wall "
              f"{r['cpu_seconds']:6.2f}s cpu  speedup {r['speedup']:.2f}x")
    print('appended to', append_records(recs, a.record))

if __name__ == '__main__': main()
