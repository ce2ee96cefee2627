"""Run chapters in place and store the outputs of their CPU cells (`#| gpu`, `#| slow`, `#| multigpu` skipped), tidy them
(progress bars settled to what a terminal last showed, then nbdev-clean), and note in `nbs/outputs.json` which code the
outputs came from, so CI can tell stale outputs.
usage: python tools/run_nb.py nbs/NAME.ipynb [...]
       python tools/run_nb.py --tidy nbs/NAME.ipynb [...]   (tidy the stored outputs only, without running)"""
import fcntl, hashlib, json, subprocess, sys
from pathlib import Path
import matplotlib
from nbdev.test import test_nb

# Stored figures stay small enough to read on GitHub (tests/test_outputs.py holds them to it): the chapters run in this
# process, so their figures take this resolution
matplotlib.rcParams['figure.dpi'] = 60

def code_hash(path) -> str:
    "SHA-256 of a notebook's code cells, in order: what its outputs depend on besides the package."
    cells = json.loads(Path(path).read_text())['cells']
    return hashlib.sha256(json.dumps([''.join(c['source']) for c in cells if c['cell_type'] == 'code']).encode()).hexdigest()

def ledger_path(path) -> Path: return Path(path).resolve().parent / 'outputs.json'

def record(path):
    "Note that the stored outputs of `path` come from its code as it is now."
    led = ledger_path(path)
    with open(led.with_suffix('.lock'), 'w') as lock:   # several runs at once each add their own line
        fcntl.flock(lock, fcntl.LOCK_EX)
        d = json.loads(led.read_text()) if led.exists() else {}
        d[Path(path).name] = code_hash(path)
        tmp = led.with_suffix('.tmp')
        tmp.write_text(json.dumps(dict(sorted(d.items())), indent=1) + '\n')
        tmp.replace(led)

def settle_frames(text) -> str:
    """What a terminal shows of `text`: each carriage return goes back to the start of its line and the next frame
    overwrites it, so a progress bar keeps its last frame; a line that ends blank (a bar that cleared itself) goes."""
    shown = []
    for line in text.split('\n'):
        if '\r' not in line:
            shown.append(line)
            continue
        screen = ''
        for frame in line.split('\r'): screen = frame + screen[len(frame):]
        if screen.strip(): shown.append(screen.rstrip())
    return '\n'.join(shown)

def settle_outputs(nb) -> int:
    "Settle the progress-bar frames of every stream output of `nb` (a dict) in place; how many outputs changed."
    changed = 0
    for cell in nb['cells']:
        kept = []
        for o in cell.get('outputs', []):
            text = ''.join(o.get('text', '')) if o.get('output_type') == 'stream' else ''
            if '\r' in text:
                changed += 1
                text = settle_frames(text)
                if not text.strip(): continue   # nothing but cleared bars
                o['text'] = text.splitlines(keepends=True)
            kept.append(o)
        if 'outputs' in cell: cell['outputs'] = kept
    return changed

def tidy(path):
    "Settle stored progress bars, then let nbdev-clean normalise the notebook."
    nb = json.loads(Path(path).read_text())
    if settle_outputs(nb): Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    subprocess.run(['nbdev-clean', '--fname', str(path)], check=False)

def run_in_place(path) -> bool:
    "Execute the notebook at `path`, write its outputs back when every cell passed; whether it passed."
    ok, secs = test_nb(Path(path).resolve(), skip_flags=['gpu', 'slow', 'multigpu'], save=True)
    print(f"{path}: {'stored outputs' if ok else 'FAILED (left as it was)'} in {secs:.0f} s")
    if ok:
        tidy(path)
        record(path)
    return ok

if __name__ == '__main__':
    if sys.argv[1:2] == ['--tidy']:
        for p in sys.argv[2:]: tidy(p)
    else: sys.exit(0 if all([run_in_place(p) for p in sys.argv[1:]]) else 1)
