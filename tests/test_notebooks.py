"Run every chapter notebook (cells flagged `gpu`, `slow` or `multigpu` skipped), one pytest test each."
from pathlib import Path
import pytest
from nbdev.test import test_nb as run_notebook  # renamed so pytest does not collect it

NBS = sorted(p for p in (Path(__file__).parents[1]/'nbs').glob('*.ipynb') if not p.name.startswith('_'))

@pytest.mark.parametrize('nb', NBS, ids=lambda p: p.name)
def test_notebook(nb):
    ok, secs = run_notebook(nb, skip_flags=['slow', 'gpu', 'multigpu'])
    assert ok, f'{nb.name} failed (its traceback is above)'
