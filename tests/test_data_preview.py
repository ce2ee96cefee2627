"""Rejects previews hold no planted secret: every case of the planted suite, removed as a document by a stage, is
written to the stage's rejects file, and no preview there holds any 8 characters of its secret that its context does
not. The control runs the same stage with the previews scrubbed by the generic patterns alone (family rules and phone
numbers off) and finds the secrets the issue named (a Google key, a `github_pat_` token, phone numbers) in the file."""
import functools, json, random
from collections import Counter
from hypothesis import given, settings, strategies as st, HealthCheck
import apex3.data.scrub as scrub_module
from apex3.data.core import Document, MapStage, Step, TaskContext, read_jsonl_zst, run_task, write_docs
from apex3.data.redact import family_cases, leaks
from apex3.data.scrub import FAMILIES

CASES = family_cases(random.Random(11), rounds=1)

def text_of(c): return c['prefix'] + c['secret'] + c['suffix']

class RemoveAll(Step):
    "A step that removes every document (as a filter stage does with the ones it rejects)."
    name = 'remove_all'
    def keep(self, doc): return 'planted'

def rejects_of(tmp_path, cases) -> list:
    "The previews the stage's rejects file holds, one per case, in order."
    write_docs(tmp_path/'in'/'000.jsonl.zst', [Document(str(k), text_of(c)) for k, c in enumerate(cases)])
    stage = MapStage('remove_all', tmp_path/'in', tmp_path/'out', [RemoveAll()])
    rec = run_task(stage, 0)
    assert rec['counts']['remove_all/removed:planted'] == len(cases) and rec['counts']['docs_out'] == 0
    rows = [json.loads(l) for l in read_jsonl_zst(tmp_path/'out'/'rejects'/'000.jsonl.zst')]
    assert [r['id'] for r in rows] == [str(k) for k in range(len(cases))]
    return [r['text'] for r in rows]

def test_rejects_previews_hold_no_planted_secret(tmp_path):
    assert {c['family'] for c in CASES} == set(FAMILIES)
    assert sum(len(c['prefix']) < 200 for c in CASES) == len(CASES)  # every secret starts inside the 200 characters
    previews = rejects_of(tmp_path, CASES)
    leaked = [(c['kind'], p) for c, p in zip(CASES, previews) if leaks(c, p)]
    assert leaked == [], leaked[:3]

def test_control_generic_patterns_alone_leak(tmp_path, monkeypatch):
    "The same stage with previews scrubbed without the families: the secrets the families catch reach the file."
    monkeypatch.setattr(scrub_module, 'scrub', functools.partial(scrub_module.scrub, rules=(), phones=False))
    previews = rejects_of(tmp_path, CASES)
    by_kind = Counter(c['kind'] for c, p in zip(CASES, previews) if leaks(c, p))
    for kind in ('GOOGLE_API_KEY', 'GITHUB_FINE_GRAINED_TOKEN', 'PHONE'): assert by_kind[kind] > 0, by_kind
    assert len({c['family'] for c, p in zip(CASES, previews) if leaks(c, p)}) >= 6

FILLER = 'The quick brown fox, 42 times; see section 3.1 of the notes. '

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), st.integers(0, 230), st.sampled_from([60, 200, 320]))
def test_secret_at_any_offset_never_in_preview(c, k, n):
    "A secret anywhere around the cut (straddling it, just inside, just outside) leaves none of itself in the preview."
    before = (FILLER * 5)[:k] + '\n'
    ctx = TaskContext(keep_rejected_text=n)
    ctx.reject(Document('d', before + text_of(c)), 'planted', 'x')
    preview = json.loads(ctx.rejects[0])['text']
    assert len(preview) <= n
    assert not leaks(dict(c, prefix=before + c['prefix']), preview), preview
