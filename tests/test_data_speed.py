"records/data_speed.py: the exact nearest-kept Jaccard against a brute-force one, and runs under 1 s of CPU are no figures."
import random, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'records'))
import data_speed as ds

def naive_nearest(texts, removed, kept) -> dict:
    "Every removed document against every kept one, over sets of 5-gram strings."
    sets = {i: ds.shingles(t) for i, t in texts.items()}
    return {r: max((len(sets[r] & sets[k]) / len(sets[r] | sets[k]) for k in kept), default=0.0) for r in removed}

def test_nearest_kept_jaccard_matches_brute_force():
    rng = random.Random(0)
    vocab = [f'w{k}' for k in range(30)]
    base = [' '.join(rng.choice(vocab) for _ in range(rng.randint(0, 40))) for _ in range(12)]
    texts = {f'd{k}': t for k, t in enumerate(base)}
    for k, t in enumerate(base[:6]):  # near copies: a few words changed, some with fewer words than a shingle
        ws = t.split()
        for j in range(0, len(ws), rng.randint(3, 9)): ws[j] = rng.choice(vocab)
        texts[f'c{k}'] = ' '.join(ws) if k else 'w1 w2'
    removed = [i for i in texts if i.startswith('c')] + ['d7']
    kept = [i for i in texts if i not in removed]
    got, want = ds.nearest_kept_jaccard(texts, removed, kept), naive_nearest(texts, removed, kept)
    assert got.keys() == want.keys()
    for i in want: assert abs(got[i] - want[i]) < 1e-12, (i, got[i], want[i])
    assert any(0 < v < 1 for v in want.values())  # the check compares real partial overlaps, not only 0 and 1

def test_runs_under_one_cpu_second_are_not_figures():
    info = {'docs': 10, 'bytes': 10**6}
    run = lambda cpu: dict(docs_out=9, removed_ids=['a'], proc_cpu_s=cpu, proc_user_s=cpu, proc_sys_s=0, proc_wall_s=cpu,
                           cpu_seconds=cpu, seconds=cpu, stage_cpu_seconds=[cpu], loadavg_before=[1, 1, 1],
                           loadavg_after=[1, 1, 1])
    recs = [ds.speed_record('apex3', 'dedup:code', 20, k, 1, info, run(c)) for k, c in enumerate((0.5, 2.0, 4.0))]
    recs += [ds.speed_record('matched', 'dedup:code', 20, k, 1, info, run(c)) for k, c in enumerate((8.0, 9.0, 10.0))]
    assert [r['figure'] for r in recs[:3]] == [False, True, True]
    s = {x['impl']: x for x in ds.summary(recs)}
    assert s['apex3']['n'] == 2 and s['apex3']['cpu_median'] == 3.0  # the 0.5 s run is left out
    assert s['matched']['ratio_vs_apex3'] == 9.0 / 3.0
