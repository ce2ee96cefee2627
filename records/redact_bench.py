"""Redaction by family: recall on the planted suite (apex3's step and detect-secrets, side by side), false positives
per MB on the embedded corpus (the standard library) and the step's speed. Appends records (with provenance) to
records/redact.jsonl; chapter 55 tabulates and plots them.

usage: python records/redact_bench.py [--seeds 0,1,2] [--repeats 3] [--max-files N] [--no-record]

1. Recall (kind `redact_recall`): `family_cases` for each seed; a case is found by apex3 when the redacted text is
   its prefix, one placeholder and its suffix, by detect-secrets (default plugins and filters) when it reports a
   secret overlapping the planted one on the case's lines. One record per (impl, family, seed).
2. False positives (kind `redact_fp`): every replacement the step and `scrub` without the families (impl `scrub`:
   `rules=()`, `phones=False`, leaving detect-secrets' plugins and the scrubber's own patterns) make in the standard
   library's files, counted per kind and per MB. One record per (impl, kind).
3. Speed (kind `redact_speed`): CPU seconds of this process for one pass over every file, the median of
   `--repeats` passes, for the same two."""
import argparse, functools, os, platform, random, shlex, statistics, sys, sysconfig, time
from collections import Counter
from pathlib import Path
from apex3.data.core import stdlib_files
from apex3.data.redact import (Redact, family_cases, whole_replaced, PLACEHOLDER_RE, detect_secrets_found, finds,
                               FAMILIES)
from apex3.data.scrub import scrub
from apex3.records import append_records

def recall_records(seeds) -> list:
    "One record per (impl, family, seed): cases and how many were found."
    step, out = Redact(), []
    for seed in seeds:
        cases = family_cases(random.Random(seed))
        outs = [step.redact(c['prefix'] + c['secret'] + c['suffix'], Counter()) for c in cases]
        found = {'apex3': [whole_replaced(c, o, PLACEHOLDER_RE) for c, o in zip(cases, outs)],
                 'detect-secrets': detect_secrets_found(cases)}
        for impl, fs in found.items():
            for fam in FAMILIES:
                hits = [f for c, f in zip(cases, fs) if c['family'] == fam]
                out.append(dict(kind='redact_recall', impl=impl, family=fam, seed=seed, cases=len(hits),
                                found=int(sum(hits)), recall=round(sum(hits) / len(hits), 4)))
    return out

def corpus(max_files=None) -> list:
    root = Path(sysconfig.get_paths()['stdlib'])
    return [(root/f).read_text(errors='replace') for f in stdlib_files(max_files=max_files)]

IMPLS = {'scrub': functools.partial(scrub, rules=(), phones=False), 'redact': Redact().redact}

def fp_records(texts, mb) -> list:
    "Finds per kind and per MB of each implementation on the corpus."
    out = []
    for impl, fn in IMPLS.items():
        n = Counter(k for t in texts for k, _ in finds(t, redact=fn))
        out += [dict(kind='redact_fp', impl=impl, find_kind=k, finds=v, mb=round(mb, 3), per_mb=round(v / mb, 3))
                for k, v in sorted(n.items())]
    return out

def speed_records(texts, mb, repeats) -> list:
    "Median CPU seconds of one pass over the corpus per implementation."
    out = []
    for impl, fn in IMPLS.items():
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            for t in texts: fn(t, Counter())
            times.append(time.process_time() - t0)
        s = statistics.median(times)
        out.append(dict(kind='redact_speed', impl=impl, mb=round(mb, 3), cpu_s=round(s, 3),
                        cpu_s_all=[round(x, 3) for x in times], mb_per_s=round(mb / s, 3)))
    return out

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--seeds', default='0,1,2')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--max-files', type=int, default=None, help='only the first N library files (a quick check)')
    p.add_argument('--no-record', action='store_true')
    a = p.parse_args()
    texts = corpus(a.max_files)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    prov = dict(command='python records/redact_bench.py ' + ' '.join(map(shlex.quote, sys.argv[1:])),
                machine=f'{platform.machine()}, {os.cpu_count()} cpus', files=len(texts), loadavg_start=os.getloadavg())
    recs = recall_records([int(s) for s in a.seeds.split(',')]) + fp_records(texts, mb)
    recs += speed_records(texts, mb, a.repeats)
    for r in recs:
        if r['kind'] == 'redact_recall' and r['seed'] == int(a.seeds.split(',')[0]):
            print(f"recall {r['impl']:>14} {r['family']:<12} {r['found']:>4}/{r['cases']:<4} {r['recall']:.3f}")
        elif r['kind'] != 'redact_recall': print({k: v for k, v in r.items() if k != 'cpu_s_all'})
    if not a.no_record:
        print('appended to', append_records([dict(r, **prov) for r in recs], Path(__file__).parent/'redact.jsonl'))

if __name__ == '__main__': main()
