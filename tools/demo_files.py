"""Check what the README promises `apex3 demo` leaves behind: the files under its folder and, given its printed log,
the lines a person reads. `python tools/demo_files.py apex3-demo [--log LOG]` names each missing one and exits 1.
`.ci/run` runs it after the README's first command; `tools/time_demo.py` after each timed run. Standard library only:
it runs before the development tools are installed."""
import argparse, glob, json, sys
from pathlib import Path

# (what the README says, glob under the demo folder, how many at least)
FILES = [
    ("the headline plan's plots, as PNG files", 'memory.png', 1),
    ("the headline plan's plots, as PNG files", 'days.png', 1),
    ("the headline plan's plots, as PNG files", 'layouts.png', 1),
    ('the data pipeline config of the embedded corpus', 'data/corpus.toml', 1),
    ('token shards of code under data/', 'data/out/tokens/code/shard-*.bin', 2),
    ('token shards of prose under data/', 'data/out/tokens/prose/shard-*.bin', 2),
    ('the training log of the tiny model', 'train/ckpt/train.jsonl', 1),
    ('a checkpoint of the tiny model', 'train/ckpt/*/*', 1),
    ('train/loss.png', 'train/loss.png', 1),
    ('train/memory.png', 'train/memory.png', 1),
    ('the figures of training, with the decoded sample', 'train/demo.json', 1),
    ('the agent model taught the tool, a checkpoint apex3 serve loads', 'agent/ckpt/*/*', 1),
    ('the agent demo figures', 'agent/agent_demo.json', 1),
    ('the agent JSONL trace of a question answered through the tool', 'agent/traces/tool-*.jsonl', 1),
    ('the phase timings of the job', 'timings.json', 1),
]
# (what the README says the job prints, a line fragment)
LINES = [
    ('the headline plan', 'Training plan: 1T params (32B active), 15T tokens'),
    ('what each stage removed', 'removals:'),
    ('the throughput of each stage', 'throughput (per core):'),
    ('training and validation loss', 'validation code:'),
    ('a decoded sample', 'sample: '),
    ('the agent answering with the tool', 'with the python tool: answers'),
    ('the agent trace', 'trace: '),
]


def missing_files(out) -> list:
    "What the README promises under `out` and is not there (or is empty)."
    bad = []
    for what, pattern, least in FILES:
        found = [p for p in glob.glob(str(Path(out) / pattern)) if Path(p).is_file() and Path(p).stat().st_size]
        if len(found) < least: bad.append(f'{what}: {Path(out) / pattern} ({len(found)} found, {least} wanted)')
    return bad


def missing_lines(log_text) -> list:
    "What the README promises the job prints and the log lacks."
    return [f'{what}: no line with {frag!r}' for what, frag in LINES if frag not in log_text]


def broken_promises(out) -> list:
    "What the figures contradict: training loss and validation loss fall, the decoded sample is not empty."
    bad, demo = [], Path(out) / 'train' / 'demo.json'
    if not demo.is_file(): return bad
    res = json.loads(demo.read_text())
    if not res['loss_last'] < res['loss_first']: bad.append(f"training loss did not fall: {res['loss_first']:.3f} -> "
                                                            f"{res['loss_last']:.3f}")
    for k in (k[:-len('_first')] for k in res if k.startswith('val_') and k.endswith('_first')):
        if not res[k + '_last'] < res[k + '_first']: bad.append(f'{k} did not fall')
    if not res.get('sample', '').strip(): bad.append('the decoded sample is empty')
    return bad


def broken(out, log_text=None) -> list:
    "Every promise of the README the demo folder `out` (and its printed output `log_text`, when given) does not keep."
    return missing_files(out) + broken_promises(out) + (missing_lines(log_text) if log_text is not None else [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split(':')[0])
    p.add_argument('out', nargs='?', default='apex3-demo', help='the demo folder (default: %(default)s)')
    p.add_argument('--log', help="the demo's printed output, to check the lines it promises")
    a = p.parse_args(argv)
    bad = broken(a.out, Path(a.log).read_text(errors='replace') if a.log else None)
    for b in bad: print(f'missing: {b}', file=sys.stderr)
    if not bad: print(f'{a.out}: every file and line the README promises is there')
    return 1 if bad else 0


if __name__ == '__main__': sys.exit(main())
