"""Run chapters in place and store the outputs of their CPU cells (`#| gpu`, `#| slow`, `#| multigpu` skipped), then tidy
them with nbdev-clean, so a reader sees plots and results without running anything.
usage: python tools/run_nb.py nbs/NAME.ipynb [...]"""
import subprocess, sys
from pathlib import Path
from nbdev.test import test_nb

def run_in_place(path) -> bool:
    "Execute the notebook at `path`, write its outputs back when every cell passed; whether it passed."
    ok, secs = test_nb(Path(path).resolve(), skip_flags=['gpu', 'slow', 'multigpu'], save=True)
    print(f"{path}: {'stored outputs' if ok else 'FAILED (left as it was)'} in {secs:.0f} s")
    return ok

if __name__ == '__main__':
    ok = all([run_in_place(p) for p in sys.argv[1:]])
    for p in sys.argv[1:]: subprocess.run(['nbdev-clean', '--fname', p], check=False)
    sys.exit(0 if ok else 1)
