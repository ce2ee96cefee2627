"""Lines over 120 characters, `;`-chained statements and undefined names (pyflakes) in the generated modules (not
`_modidx.py`). The `__all__` list nbdev writes is skipped: nbdev wraps it at 120 characters, then prefixes `__all__ = `.
A notebook runs its cells in one namespace, so a name that only a test cell imports works there and fails in the module.

    python tools/style.py [MODULE.py ...]   # prints `path:line: reason`, exits 1 when any
"""
import ast, io, sys, tokenize
from pathlib import Path

MAX_LINE = 120

def style_problems(path):
    "`(line, reason)` for each line over `MAX_LINE`, each `;` that chains two statements and each undefined name."
    text = Path(path).read_text()
    tree = ast.parse(text)
    skip = _all_lines(tree)
    out = [(i, f'{len(l)} characters') for i, l in enumerate(text.splitlines(), 1)
           if len(l) > MAX_LINE and i not in skip]
    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    out += [(t.start[0], '; chain') for t in toks if t.type == tokenize.OP and t.string == ';']
    return sorted(out + undefined_names(tree, str(path)))

def undefined_names(tree, filename='<module>'):
    "`(line, reason)` for each name pyflakes finds used and never defined in the module `tree`."
    from pyflakes.checker import Checker
    from pyflakes.messages import UndefinedName
    msgs = Checker(tree, filename=filename).messages
    return [(m.lineno, f'undefined name {m.message_args[0]!r}') for m in msgs if isinstance(m, UndefinedName)]

def _all_lines(tree):
    "Line numbers of the module-level `__all__ = [...]` statement (nbdev's, not ours)."
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
            return set(range(node.lineno, node.end_lineno + 1))
    return set()

def module_paths(root='apex3'):
    return sorted(p for p in Path(root).rglob('*.py') if p.name != '_modidx.py')

if __name__ == '__main__':
    paths = sys.argv[1:] or module_paths()
    found = [(p, i, r) for p in paths for i, r in style_problems(p)]
    for p, i, r in found:
        print(f'{p}:{i}: {r}')
    sys.exit(1 if found else 0)
