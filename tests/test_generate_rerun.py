"The chapter run again in a process that imported its module (a test runner, a re-run notebook) keeps its custom op."
from pathlib import Path
import torch
from nbdev.test import test_nb as run_notebook  # renamed so pytest does not collect it
import apex3.generate as G
from apex3.config import get_config
from apex3.model import Transformer


def test_grouped_experts_survive_a_chapter_rerun():
    ok, _ = run_notebook(Path(__file__).parents[1] / 'nbs/11_generate.ipynb', skip_flags=['slow', 'gpu', 'multigpu'])
    assert ok
    torch.manual_seed(0)
    moe = Transformer(get_config('tiny')).eval().layers[0].moe
    x = torch.randn(1, G.GATHER_TOKENS + 2, moe.router.weight.shape[1])
    with torch.no_grad(): torch.testing.assert_close(G.moe_infer(moe, x), moe(x)[0], atol=1e-5, rtol=1e-5)
