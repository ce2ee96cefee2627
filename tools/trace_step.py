"""A step's last micro-batch and optimizer step on a timeline, stream by stream: when backward's kernels, the copies up
and down and the optimizer's updates ran, and when the CPU threads issued the chunks of `--step-overlap`.
    usage (GPU host, repo root): python3 tools/trace_step.py OUT.json.gz <apex3.bench flags>
Prints each stream's first/last/busy milliseconds and its idle gaps over 5 ms; writes every GPU event and the CPU ranges
named below to OUT.json.gz (milliseconds from the last micro-batch's start) for a closer look."""
import collections, gzip, json, sys, tempfile, time
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from apex3 import bench as B
from apex3.offload.host_optim import OffloadOptimizer
from apex3.offload.overlap import EarlyStream

def labelled(owner, name, label):
    "Wrap method `name` of `owner` in a profiler range `label` (a no-op outside the profiler)."
    f = getattr(owner, name)
    def wrapped(*args, **kw):
        with record_function(label): return f(*args, **kw)
    setattr(owner, name, wrapped)

for owner, name, label in ((EarlyStream, 'issue', 'issue early chunk'), (EarlyStream, 'gradient_final', 'gradient final'),
                           (OffloadOptimizer, 'step', 'optimizer step'), (EarlyStream, 'finish', 'finish early')):
    labelled(owner, name, label)

out, a = sys.argv[1], B.bench_parser().parse_args(sys.argv[2:])
settings = B.settings_from_args(a)   # the run's settings; --warmup and the rest stay the tool's
B.check_run_settings(settings)
run = B.Run(settings); gen = torch.Generator().manual_seed(a.seed)
prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device.type == 'cuda' else []))

def one_step(traced):
    "One optimizer step as the bench times it; with `traced`, its last micro-batch and optimizer step are profiled."
    marks = {}
    B._compute_done(run.device); t0 = time.perf_counter()
    for i in range(a.accum):
        x = B.random_tokens(run.cfg, a.micro_bs, gen, run.device)
        if i < a.accum - 1: B.micro_step(run, x).item(); continue
        if traced: prof.start()
        marks['last micro-batch starts'] = time.perf_counter() - t0
        B.last_micro_starts(run)
        with record_function('last micro-batch'):
            loss = B.micro_step(run, x); marks['backward returns'] = time.perf_counter() - t0
            loss.item(); marks['loss read'] = time.perf_counter() - t0
    B.optimizer_step(run); B._compute_done(run.device); marks['step done'] = time.perf_counter() - t0
    B._sync(run.device); marks['write-backs done'] = time.perf_counter() - t0   # what the step left going beside the next
    if traced: prof.stop()
    return {k: round(v * 1e3, 1) for k, v in marks.items()}

for s in range(a.warmup + 1): print('step', s, one_step(False))
print('traced', one_step(True))
with tempfile.NamedTemporaryFile(suffix='.json') as f:
    prof.export_chrome_trace(f.name); events = json.load(open(f.name))['traceEvents']
gpu = [e for e in events if e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset') and 'dur' in e]
ours = ('last micro-batch', 'issue early chunk', 'gradient final', 'optimizer step', 'finish early')
cpu = [e for e in events if e.get('name') in ours and 'dur' in e]
t0 = min(e['ts'] for e in cpu if e['name'] == 'last micro-batch')
ms = lambda us: round((us - t0) / 1e3, 2)
kind = lambda e: 'HtoD' if 'HtoD' in e['name'] else 'DtoH' if 'DtoH' in e['name'] else e['cat']
rows = [(e['args'].get('stream'), kind(e), e['name'][:80], ms(e['ts']), round(e['dur'] / 1e3, 3)) for e in gpu]
json.dump(dict(flags=sys.argv[2:], gpu=rows, cpu=[(e['tid'], e['name'], ms(e['ts']), round(e['dur'] / 1e3, 3)) for e in cpu]),
          gzip.open(out, 'wt'))
by = collections.defaultdict(list)
for r in rows: by[(r[0], r[1])].append(r)
for (stream, k), rs in sorted(by.items(), key=lambda kv: min(r[3] for r in kv[1])):
    rs.sort(key=lambda r: r[3]); gaps, end = [], rs[0][3]
    for r in rs:
        if r[3] - end > 5: gaps.append(f'{end:.0f}+{r[3] - end:.0f}')
        end = max(end, r[3] + r[4])
    print(f'stream {stream} {k:10} {len(rs):5} events, {rs[0][3]:7.1f} to {end:7.1f} ms, busy {sum(r[4] for r in rs):6.1f} ms; '
          f'gaps over 5 ms: {" ".join(gaps[:12])}')
for name in ours:
    rs = sorted((e for e in cpu if e['name'] == name), key=lambda e: e['ts'])
    if rs: print(f'cpu {name:18} x{len(rs):<4} first {ms(rs[0]["ts"]):7.1f} ms, last ends {ms(rs[-1]["ts"] + rs[-1]["dur"]):7.1f} ms, '
                 f'in it {sum(e["dur"] for e in rs) / 1e3:6.1f} ms, threads {sorted({e["tid"] for e in rs})}')
