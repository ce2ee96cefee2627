"The slots kernel inside a decode: greedy tokens of `tiny` through it (Triton's CPU interpreter) match the torch path."
from unittest import mock
import torch
import apex3.generate as generate
from apex3.config import get_config
from apex3.generate import Generator, RowLinear, moe_infer, row_linears
from apex3.kernels.ce import triton_interpret
from apex3.model import Transformer


def _model():
    torch.manual_seed(0)
    m = Transformer(get_config('tiny')).eval()
    for layer in m.layers: layer.moe.router_bias.normal_()   # choices that are not the top scores
    return m


def test_moe_infer_through_slots_matches_torch():
    m = _model()
    x = torch.randn(1, 3, m.cfg.d_model)
    moe = m.layers[0].moe
    ref = moe_infer(moe, x)
    with triton_interpret(), mock.patch.object(generate, 'moe_gemv', wraps=generate.moe_gemv) as slots:
        got = moe_infer(moe, x)
    assert slots.call_count == 1   # the kernel ran, not the torch path it is compared with
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_greedy_decode_through_slots_matches_torch():
    m = _model()
    prompts = [[5, 6, 7]]
    ref = Generator(m, max_len=32, compile=False).generate(prompts, max_new=5)
    with triton_interpret(), mock.patch.object(RowLinear, 'kernel', 'slots'), \
            mock.patch.object(generate, 'row_gemv', wraps=generate.row_gemv) as rows:
        g = Generator(m, max_len=32, compile=False)
        g.step_model = row_linears(m)   # as on CUDA: the one-row linears through `row_gemv` too
        assert g.generate(prompts, max_new=5) == ref
    assert rows.call_count == 4 * 4 * len(m.layers)   # 4 steps after the prefill, 4 attention linears a layer


def test_greedy_decode_through_norm_qkv_matches_torch():
    m = _model()
    prompts = [[5, 6, 7]]   # one token a step: the kernel's case
    ref = Generator(m, max_len=32, compile=False).generate(prompts, max_new=5)
    with triton_interpret(), mock.patch.object(RowLinear, 'kernel', 'norm_qkv'), \
            mock.patch.object(generate, 'norm_qkv', wraps=generate.norm_qkv) as qkv:
        g = Generator(m, max_len=32, compile=False)
        g.step_model = row_linears(m)
        assert g.generate(prompts, max_new=5) == ref
    assert qkv.call_count == 4 * len(m.layers)   # 4 steps after the prefill, one launch a layer for q, k and v
