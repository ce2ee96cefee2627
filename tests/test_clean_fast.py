"""The clean chain's fast path decides exactly what its rule-by-rule definition decides.

`GopherRepetition.keep_batch` (array-wide bounds over a batch, then only the rules that can still fire) against
`GopherRepetition.keep` (every rule in order, one document at a time): the same verdict and the same reason for every
document, on generated texts full of repeated words, lines, paragraphs and stretches of words, and on the embedded
corpus's prose (the standard library's module docstrings). The whole chain (C4, repetition, Gopher quality, FineWeb)
run as `Step`s over an iterator gives the same kept texts and reject reasons as the chain of `keep` calls.

Controls: the comparison catches a threshold that is off by a little, and bounds that are too small (halved), so the
equality is not a test that cannot fail."""
import json, random, re, sysconfig
from collections import Counter
from pathlib import Path
import pytest
from hypothesis import given, settings, strategies as st
import apex3.data.clean as clean
from apex3.data.clean import C4Lines, FineWebQuality, GopherQuality, GopherRepetition
from apex3.data.core import Document, TaskContext, stdlib_files
from apex3.data.corpus import module_prose

VOCAB = ['the', 'of', 'a', 'cat', 'sat', 'on', 'mat', 'x.', 'é', 'naïve', 'data,', '--', '…', 'longerword', 'b',
         'and']
NGRAMS_ONLY = dict(dup_line_frac=1, dup_para_frac=1, dup_line_char_frac=1, dup_para_char_frac=1)

def repetitive_text(rng) -> str:
    "Lines of words from a vocabulary of 3 to 400 words, with copied stretches of words, copied lines, paragraphs."
    vocab = VOCAB[:rng.choice([3, 6, len(VOCAB)])] + [f'w{i}' for i in range(rng.choice([0, 20, 400]))]
    words = [rng.choice(vocab) for _ in range(rng.randrange(0, 300))]
    for _ in range(rng.randrange(5)):  # a repeated stretch of 2 to 12 words
        if len(words) > 12:
            s = rng.randrange(len(words) - 12)
            words[s:s] = words[s:s + rng.randint(2, 12)]
    width, lines = rng.randint(1, 15), []
    for i in range(0, len(words), width): lines.append(' '.join(words[i:i + width]))
    for _ in range(rng.randrange(4)):  # a copied line, a blank line (paragraphs)
        if lines: lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
        if lines: lines.insert(rng.randrange(len(lines) + 1), '')
    return '\n'.join(lines)

def generated_docs(n, seed) -> list: return [Document(str(i), repetitive_text(random.Random(seed * 7919 + i)))
                                              for i in range(n)]

def verdicts_ref(step, docs) -> list:
    "The reason `keep` gives each document, or 'kept'."
    return [r if isinstance(r, str) else 'kept' for r in map(step.keep, docs)]

def verdicts_fast(step, docs) -> list:
    "The reason `keep_batch` gives each document, or 'kept' (a kept document comes back as it was)."
    out = step.keep_batch(docs)
    assert all(r is d for r, d in zip(out, docs) if not isinstance(r, str))
    return [r if isinstance(r, str) else 'kept' for r in out]

@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60))
def test_repetition_batch_is_keep(seed, n):
    docs = generated_docs(n, seed)
    for step in GopherRepetition(), GopherRepetition(**NGRAMS_ONLY):  # the n-gram rules alone too
        assert verdicts_fast(step, docs) == verdicts_ref(step, docs)

@pytest.mark.parametrize('rules', [dict(top_ngrams=()), dict(dup_ngrams=()), dict(top_ngrams=(), dup_ngrams=()),
                                   dict(top_ngrams=((3, 0.1), (1, 0.3)), dup_ngrams=((7, 0.05), (4, 0.2)))])
def test_repetition_batch_is_keep_for_other_rule_sets(rules):
    "No top-n-gram rules, no duplicated-n-gram rules, n in any order: still `keep`'s verdicts."
    docs = generated_docs(300, 4) + [Document('e', ''), Document('s', ' \n '), Document('w', 'one')]
    step = GopherRepetition(**NGRAMS_ONLY, **rules)
    assert verdicts_fast(step, docs) == verdicts_ref(step, docs)

def test_generated_docs_reach_every_kind_of_rule():
    "The generated texts are removed by line, top-n-gram and duplicated-n-gram rules, and some are kept."
    v = Counter(verdicts_ref(GopherRepetition(), generated_docs(600, 1)))
    kinds = {k.split('_')[0] for k in v}
    assert {'kept', 'dup', 'top', 'duplicated'} <= kinds, v

def test_control_a_wrong_threshold_is_caught():
    "The same comparison, against a reference whose 10-gram threshold is 0.09 instead of 0.1: it differs."
    docs = generated_docs(600, 2)
    wrong = GopherRepetition(dup_ngrams=((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.09)))
    assert verdicts_fast(GopherRepetition(), docs) != verdicts_ref(wrong, docs)

def test_control_too_small_bounds_are_caught(monkeypatch):
    "Bounds halved (so rules that fire are skipped as silent): the fast path no longer matches `keep`."
    docs, bounds = generated_docs(600, 3), clean.repetition_bounds
    def halved(*a):
        top, dup = bounds(*a)
        return [b / 2 for b in top], dup / 2
    step = GopherRepetition(**NGRAMS_ONLY)
    assert verdicts_fast(step, docs) == verdicts_ref(step, docs)
    monkeypatch.setattr(clean, 'repetition_bounds', halved)
    assert verdicts_fast(step, docs) != verdicts_ref(step, docs)

@pytest.fixture(scope='module')
def corpus_docs() -> list:
    "The embedded corpus's prose: each standard-library module's unwrapped docstrings, one document per module."
    root = Path(sysconfig.get_paths()['stdlib'])
    texts = (module_prose((root/f).read_text(encoding='utf-8', errors='replace')) for f in stdlib_files(root))
    return [Document(str(i), t) for i, t in enumerate(texts) if t]

def run_chain(docs, fast) -> dict:
    "id -> kept text or `step/reason`, through C4, repetition, Gopher quality and FineWeb."
    steps = [C4Lines(), GopherRepetition(), GopherQuality(), FineWebQuality()]
    if fast:
        ctx = TaskContext()
        it = iter(docs)
        for s in steps: it = s(it, ctx)
        out = {d.id: d.text for d in it}
        out.update({r['id']: f"{r['step']}/{r['reason']}" for r in map(json.loads, ctx.rejects)})
        return out
    out = {}
    for d in docs:
        for s in steps:
            r = s.keep(d)
            if isinstance(r, str): out[d.id] = f'{s.name}/{r}'; break
            d = r
        else: out[d.id] = d.text
    return out

def test_chain_on_the_embedded_corpus_is_keep(corpus_docs):
    assert len(corpus_docs) > 400
    fast, ref = run_chain(corpus_docs, True), run_chain(corpus_docs, False)
    assert fast == ref
    assert sum(v.startswith('gopher_repetition/') for v in ref.values()) > 0  # the repetition rules remove some

def test_repetition_batch_on_the_embedded_corpus_is_keep(corpus_docs):
    step = GopherRepetition(**NGRAMS_ONLY)
    for b in clean.batches(corpus_docs, 64): assert verdicts_fast(step, b) == verdicts_ref(step, b)

# ---- the per-document shortcuts of C4 and Gopher quality against their plain forms
def c4_plain(r, text):
    "C4's verdict written plainly: every line's words listed, every sentence end found."
    low = text.lower()
    if 'lorem ipsum' in low: return 'c4_lorem_ipsum'
    kept = []
    for line in text.splitlines():
        l = line.strip()
        ws = l.split()
        if not l.endswith(clean.TERMINAL) or len(ws) < r.min_words_per_line: continue
        if any(p in l.lower() for p in ('javascript',) + clean.POLICY): continue
        if ws and max(map(len, ws)) > r.max_word_length: continue
        kept.append(l)
    out = '\n'.join(kept)
    return 'c4_too_few_sentences' if len(re.findall(r'[.!?]+(?:\s|$)', out)) < r.min_sentences else out

def quality_plain(r, text):
    "Gopher quality's verdict written plainly: one generator per word, every word lower-cased for the stop words."
    words = [w for w in (t.strip(clean._PUNCT) for t in text.split()) if w]
    n = len(words)
    if n < max(r.min_words, 1): return 'gopher_short_doc'   # no words: no ratios
    avg = sum(map(len, words)) / n
    if avg < r.min_avg_word_len: return 'gopher_below_avg_word_len'
    if avg > r.max_avg_word_len: return 'gopher_above_avg_word_len'
    if (text.count('#') + text.count('...') + text.count('…')) / n > r.max_symbol_word_ratio:
        return 'gopher_symbol_ratio'
    lines = [l for l in text.splitlines() if l.strip()] or ['']
    if sum(l.lstrip().startswith(('•', '-', '*', '‣', '◦')) for l in lines) / len(lines) > r.max_bullet_lines_ratio:
        return 'gopher_bullet_lines'
    if sum(l.rstrip().endswith(('...', '…')) for l in lines) / len(lines) > r.max_ellipsis_lines_ratio:
        return 'gopher_ellipsis_lines'
    if sum(any(c.isalpha() for c in w) for w in words) / n < r.min_alpha_words_ratio:
        return 'gopher_alpha_words'
    if len(clean.STOP_WORDS.intersection(w.lower() for w in words)) < r.min_stop_words:
        return 'gopher_stop_words'
    return text

LINE_WORDS = ['The', 'THE', 'of', 'Of', 'and', 'with', 'a', 'cat.', 'sat!', 'Is it?', 'x' * 12, '…', '--', '"quoted."',
              'house', 'garden', 'stood', 'beside', 'trees', 'Wİth', 'naïve',
              'javascript', 'privacy policy', 'lorem', '123', 'ǅ', 'İt', 'e.g. this', '...', '#']

@st.composite
def line_text(draw) -> str:
    "Lines of 0 to 12 words and sentence marks, some long, some blank, some indented."
    vocab = draw(st.lists(st.sampled_from(LINE_WORDS), min_size=1, max_size=8))  # some lack stop words or marks
    lines = draw(st.lists(st.lists(st.sampled_from(vocab), max_size=12), max_size=25))
    pad = draw(st.sampled_from(['', ' ', '\t']))
    return '\n'.join(pad + ' '.join(ws) for ws in lines)

@settings(max_examples=300, deadline=None)
@given(line_text(), st.integers(1, 4), st.integers(1, 6), st.sampled_from([5, 1000]))
def test_c4_is_plain(text, min_words, min_sentences, max_word):
    r = C4Lines(min_words_per_line=min_words, min_sentences=min_sentences, max_word_length=max_word)
    got = r.keep(Document('a', text))
    assert (got if isinstance(got, str) else got.text) == c4_plain(r, text)

@settings(max_examples=300, deadline=None)
@given(line_text(), st.integers(1, 60), st.integers(1, 3))
def test_gopher_quality_is_plain(text, min_words, min_stop):
    r = GopherQuality(min_words=min_words, min_stop_words=min_stop)
    got = r.keep(Document('a', text))
    assert (got if isinstance(got, str) else got.text) == quality_plain(r, text)

def test_control_plain_forms_can_disagree():
    "The plain forms are not the same code: a C4 with one more sentence, a quality with one more stop word, differ."
    text = 'The cat sat on the mat. It was warm. It purred. It slept. It woke.\nthe of and.'
    assert c4_plain(C4Lines(), text) != c4_plain(C4Lines(min_sentences=7), text)
    r = GopherQuality(min_words=1)
    assert quality_plain(r, text) == text and quality_plain(GopherQuality(min_words=1, min_stop_words=4), text) != text
