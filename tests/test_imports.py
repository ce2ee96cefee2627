"The package's import graph has no cycle, module-level or inside functions: each chapter builds only on earlier floors."
import ast
from pathlib import Path

PKG = Path(__file__).parents[1] / 'apex3'

def _module(path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix('')
    parts = rel.parts[:-1] if rel.name == '__init__' else rel.parts
    return '.'.join(parts)

def import_graph() -> dict:
    "module -> the apex3 modules it imports anywhere in its source (lazy imports inside functions included)."
    graph = {}
    for f in PKG.rglob('*.py'):
        mod, deps = _module(f), set()
        package = mod if f.name == '__init__.py' else mod.rpartition('.')[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split('.')[:len(package.split('.')) - node.level + 1] if node.level else []
                target = '.'.join(base + ([node.module] if node.module else []))
                names = [f'{target}.{a.name}' for a in node.names]   # `from . import x` names a module
                deps |= {n for n in names if (PKG.parent / (n.replace('.', '/') + '.py')).exists()} or {target}
            elif isinstance(node, ast.Import): deps |= {a.name for a in node.names}
        graph[mod] = {d for d in deps if d.startswith('apex3') and d != mod}
    return graph

def find_cycle(graph):
    "A list of modules that import each other in a circle, or None."
    state, stack = {}, []
    def visit(m):
        state[m] = 'open'; stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 'open': return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)): return c
        state[m] = 'done'; stack.pop()
    for m in sorted(graph):
        if m not in state and (c := visit(m)): return c

def test_find_cycle_sees_one():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None

def test_no_import_cycle():
    graph = import_graph()
    assert 'apex3.usage' in graph and graph['apex3.usage'] == set(), 'the bottom module imports nothing of apex3'
    assert (c := find_cycle(graph)) is None, ' -> '.join(c)

def test_cli_only_dispatches():
    assert import_graph()['apex3.cli'] <= {'apex3.usage'}

def test_trainer_and_benchmark_share_the_run_module():
    "Both build their run from `apex3.run`; the trainer does not depend on the benchmark."
    graph = import_graph()
    assert 'apex3.bench' not in graph['apex3.train'], graph['apex3.train']
    assert 'apex3.run' in graph['apex3.train'] and 'apex3.run' in graph['apex3.bench']
