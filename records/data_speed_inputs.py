"""Inputs for the data speed benchmark at sizes that matter, built from this interpreter's standard library (no
downloads), deterministic for a seed.

usage: python records/data_speed_inputs.py [--out records/data_speed_inputs] [--sizes 20,200] [--seed 0]

Writes OUT/{code,prose}-{SIZE}mb/NNNNN.jsonl.zst (shards of about 10 MB of text, the files both apex3 and datatrove
read) and OUT/{code,prose}-{SIZE}mb/planted.json (the planted near-duplicate pairs).

- code: each document is 2-6 runs of 20-300 consecutive lines, each run from a random standard-library source file
  (files as `apex3.data.core.stdlib_files` lists them), joined by blank lines: real Python, with documents of the
  sizes of real files (a few KB to ~60 KB), and no two documents alike beyond a shared run.
- prose: each document is 3-15 paragraphs drawn from the pool of the library's unwrapped docstrings (the embedded
  corpus's prose, `apex3.data.corpus.module_prose`), in random order.
- planted near duplicates: 2% of the documents are followed (at a random later position, often in another shard)
  by a copy made by `apex3.data.dedup.near_copy`: half with one word in 100 replaced (5-gram Jaccard about 0.9),
  half with one word in 30 (about 0.7, at the dedup threshold).
The generated folder is ignored by git (`/records/data_speed_inputs/`): rebuild it with this script."""
import argparse, json, random, sysconfig
from pathlib import Path
from apex3.data.core import Document, write_docs, stdlib_files
from apex3.data.corpus import module_prose
from apex3.data.dedup import near_copy

DEFAULT_OUT = Path(__file__).parent/'data_speed_inputs'
SHARD_BYTES = 10_000_000
DUP_RATE, DUP_EVERY = 0.02, (100, 30)

def library_texts() -> list:
    "The text of every standard-library source file the embedded corpus uses, in sorted order."
    root = Path(sysconfig.get_paths()['stdlib'])
    return [(root/f).read_text(encoding='utf-8', errors='replace') for f in stdlib_files(root)]

def code_doc(rng, lines) -> str:
    "2-6 runs of 20-300 consecutive lines, each from a random file's `lines`."
    runs = []
    for _ in range(rng.randint(2, 6)):
        ls = rng.choice(lines)
        n = rng.randint(20, 300)
        start = rng.randrange(max(len(ls) - n, 0) + 1)
        runs.append('\n'.join(ls[start:start + n]))
    return '\n\n'.join(runs)

def prose_doc(rng, paras) -> str:
    "3-15 random paragraphs of the docstring pool."
    return '\n\n'.join(rng.choice(paras) for _ in range(rng.randint(3, 15)))

def make_docs(kind, target_bytes, seed=0) -> tuple:
    "(documents of `kind` ('code' or 'prose') totalling about `target_bytes` of UTF-8, planted pairs)."
    rng, texts = random.Random(seed), library_texts()
    if kind == 'code':
        lines = [t.splitlines() for t in texts if t.count('\n') >= 20]
        make = lambda: code_doc(rng, lines)
    else:
        paras = [p for t in texts for p in module_prose(t).split('\n\n') if len(p.split()) >= 8]
        make = lambda: prose_doc(rng, paras)
    docs, total = [], 0
    while total < target_bytes:
        t = make()
        docs.append(Document(f'{kind}-{len(docs):07d}', t))
        total += len(t.encode('utf-8', 'surrogatepass'))
    pairs, before = [], {}  # before[j]: the copies placed just before document j (j = len(docs): at the end)
    for k, i in enumerate(sorted(rng.sample(range(len(docs)), int(DUP_RATE * len(docs))))):
        every = DUP_EVERY[k % len(DUP_EVERY)]
        copy = Document(f'{docs[i].id}-copy', near_copy(docs[i].text, rng, every))
        before.setdefault(rng.randint(i + 1, len(docs)), []).append(copy)
        pairs.append(dict(original=docs[i].id, copy=copy.id, every=every))
    return [x for j, d in enumerate(docs + [None]) for x in before.get(j, []) + [d] if x is not None], pairs

def write_input(folder, docs, pairs) -> dict:
    "Shards of about `SHARD_BYTES` in `folder`, and planted.json; returns {docs, bytes, shards}."
    folder = Path(folder)
    shard, size, n, total = [], 0, 0, 0
    for d in docs + [None]:
        if d is None or (shard and size + d.nbytes > SHARD_BYTES):
            write_docs(folder/f'{n:05d}.jsonl.zst', shard)
            n, shard, size = n + 1, [], 0
        if d is not None:
            shard.append(d); size += d.nbytes; total += d.nbytes
    (folder/'planted.json').write_text(json.dumps(pairs))
    return dict(docs=len(docs), bytes=total, shards=n)

def input_dir(out, kind, mb) -> Path: return Path(out)/f'{kind}-{mb}mb'

def build_inputs(out=DEFAULT_OUT, sizes=(20, 200), seed=0, kinds=('code', 'prose')) -> dict:
    "Build every (kind, size) input not already built; {folder name: its summary}."
    res = {}
    for mb in sizes:
        for kind in kinds:
            d = input_dir(out, kind, mb)
            if not (d/'planted.json').exists():
                res[d.name] = write_input(d, *make_docs(kind, mb * 1_000_000, seed + mb))
    return res

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--out', default=str(DEFAULT_OUT))
    p.add_argument('--sizes', default='20,200')
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()
    print(json.dumps(build_inputs(a.out, [int(x) for x in a.sizes.split(',')], a.seed)))
