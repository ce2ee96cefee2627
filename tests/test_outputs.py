"Every chapter is committed with the outputs of its current code (tools/run_nb.py), small enough to read on GitHub."
import importlib.util, json
from pathlib import Path
import pytest

ROOT = Path(__file__).parents[1]
NBS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith('_'))
_spec = importlib.util.spec_from_file_location('run_nb', ROOT / 'tools' / 'run_nb.py')
run_nb = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(run_nb)
LEDGER = json.loads((ROOT / 'nbs' / 'outputs.json').read_text())

@pytest.mark.parametrize('nb', NBS, ids=lambda p: p.name)
def test_outputs_come_from_current_code(nb):
    assert LEDGER.get(nb.name) == run_nb.code_hash(nb), \
        f'{nb.name}: its stored outputs are not from its current code: run `python tools/run_nb.py nbs/{nb.name}` and commit'

@pytest.mark.parametrize('nb', NBS, ids=lambda p: p.name)
def test_outputs_are_small(nb):
    assert nb.stat().st_size <= 1_500_000, f'{nb.name} is {nb.stat().st_size:,} bytes with its outputs'
    for c in json.loads(nb.read_text())['cells']:
        for o in c.get('outputs', []):
            png = o.get('data', {}).get('image/png', '')
            assert len(png) * 3 / 4 <= 150_000, f'{nb.name}: a {len(png) * 3 // 4:,}-byte PNG (lower its dpi or size)'
            text = ''.join(o.get('text', ''))
            assert text.count('\n') <= 200, f'{nb.name}: a {text.count(chr(10))}-line log in a stored output'

def test_readme_is_rendered_from_index():
    spec = importlib.util.spec_from_file_location('readme', ROOT / 'tools' / 'readme.py')
    readme = importlib.util.module_from_spec(spec); spec.loader.exec_module(readme)
    assert (ROOT / 'README.md').read_text() == readme.render(), 'README.md is stale: run python tools/readme.py'
