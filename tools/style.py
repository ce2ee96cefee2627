"""Lines over 120 characters and `;`-chained statements in the generated modules (not `_modidx.py`).

    python tools/style.py [MODULE.py ...]   # prints `path:line: reason`, exits 1 when any
"""
import io, sys, tokenize
from pathlib import Path

MAX_LINE = 120

def style_problems(path):
    "`(line, reason)` for each line over `MAX_LINE` and each `;` that chains two statements."
    text = Path(path).read_text()
    out = [(i, f'{len(l)} characters') for i, l in enumerate(text.splitlines(), 1) if len(l) > MAX_LINE]
    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    out += [(t.start[0], '; chain') for t in toks if t.type == tokenize.OP and t.string == ';']
    return sorted(out)

def module_paths(root='apex3'):
    return sorted(p for p in Path(root).rglob('*.py') if p.name != '_modidx.py')

if __name__ == '__main__':
    paths = sys.argv[1:] or module_paths()
    found = [(p, i, r) for p in paths for i, r in style_problems(p)]
    for p, i, r in found: print(f'{p}:{i}: {r}')
    sys.exit(1 if found else 0)
