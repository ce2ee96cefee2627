"Fresh-process checks of apex3.kernels.ce that a notebook cannot make: what a user sees on stderr, with and without Triton/torchao."
import os, subprocess, sys, textwrap
import pytest

BLOCK = '''
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    "Make `import triton` / `import torchao` fail, as on a machine without them."
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('triton', 'torchao'): raise ImportError(f'blocked: {name}')
sys.meta_path.insert(0, Block())
'''

CASE = '''
import torch, torch.nn as nn
from apex3.kernels.ce import fused_linear_cross_entropy, ce_reference, apply_fp8
torch.manual_seed(0)
h, w = torch.randn(20, 16, requires_grad=True), torch.randn(50, 16, requires_grad=True)
t = torch.randint(0, 50, (20,))
for _ in range(2):
    loss = fused_linear_cross_entropy(h, w, t, z_loss=0.01, chunk=8)
    loss.backward()
assert torch.allclose(loss, ce_reference(h, w, t, 0.01), atol=1e-5), (loss, ce_reference(h, w, t, 0.01))
'''


def _run(code, **env):
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'PYTHONWARNINGS': 'ignore', **env})
    assert r.returncode == 0, r.stderr
    return r.stderr.splitlines()


def test_without_triton_or_torchao_one_line_each():
    "No Triton: the loss still works and says so once; no torchao: FP8 declines in one line."
    err = _run(BLOCK + CASE + '''
layers = nn.Module(); layers.wq = nn.Linear(16, 16)
assert apply_fp8(layers, 'fp8_rowwise') == 'bf16'
assert apply_fp8(layers, 'fp8_tensorwise') == 'bf16'
''', TRITON_INTERPRET='1')
    assert err == ['Triton CE unavailable: using the PyTorch loss',
                   'FP8 unavailable (torchao >= 0.17 is not installed): training in bf16'], err


def test_interpreter_from_the_environment():
    "TRITON_INTERPRET=1 set before Python starts: the Triton kernel runs on the CPU, with no warning."
    pytest.importorskip('triton')
    err = _run(CASE, TRITON_INTERPRET='1')
    assert not any('unavailable' in l for l in err), err


def test_cpu_without_interpreter_falls_back():
    "Triton installed but CPU tensors and no interpreter: one warning line, same loss."
    pytest.importorskip('triton')
    err = _run(CASE, TRITON_INTERPRET='0')
    assert [l for l in err if 'unavailable' in l] == ['Triton CE unavailable: using the PyTorch loss'], err


def test_interpreter_switched_on_after_triton_was_imported():
    "Triton imported first (as torch.compile or torchao do), the interpreter turned on later: the kernel still runs."
    pytest.importorskip('triton')
    err = _run('import triton, triton.language\nfrom apex3.kernels.ce import triton_interpret\nwith triton_interpret():\n'
               + textwrap.indent(CASE, '    '), TRITON_INTERPRET='0')
    assert not any('unavailable' in l for l in err), err
