"Model and config checks beyond the notebook's own: import cost, counts, boundaries, routing state, dtypes."
import subprocess, sys
import pytest, torch
from hypothesis import given, settings, strategies as st
from apex3.usage import UsageError
from apex3.config import CONFIGS, get_config, param_counts, param_components
from apex3 import model as M


def test_config_module_does_not_import_torch():
    # the planner imports apex3.config for `apex3 plan --config C`: it must stay cheap
    code = "import sys, apex3.config as c; c.param_counts('C'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == 'False'


@pytest.mark.parametrize('name', list(CONFIGS))
def test_arithmetic_matches_meta_module(name):
    arith = {r[0]: r[1] for r in param_components(get_config(name)) if r[1]}
    assert M.module_param_counts(name) == arith


def test_config_c_counts():
    pc = param_counts('C')
    assert abs(pc['total'] / 21.0e9 - 1) < 0.02 and abs(pc['active'] / 3.36e9 - 1) < 0.03
    assert pc['active_matmul'] < pc['active'] and (pc['layers'], pc['width']) == (30, 2560)


def test_overrides_are_typed_and_unknown_keys_listed():
    c = get_config('small', ['n_layers=3', 'seq_aux_alpha=1e-4', 'qk_norm=no', 'attn=flex'])
    assert (c.n_layers, c.seq_aux_alpha, c.qk_norm, c.attn) == (3, 1e-4, False, 'flex')
    with pytest.raises(UsageError, match='valid keys: name, vocab_size'): get_config('C', ['layers=3'])
    with pytest.raises(ValueError): get_config('C', ['attn=fa4'])


def _naive_cu(tokens, eos):
    out, n = [0], 0
    for row in tokens.tolist():
        for i, t in enumerate(row):
            n += 1
            if t == eos or i == len(row) - 1: out.append(n)
    return out


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_cu_seqlens_matches_python_walk(B, S, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 4, (B, S), generator=g)            # EOS = 3: dense boundaries, incl. adjacent EOS
    cu = M.cu_seqlens(tokens, 3, max_docs=S)
    want = _naive_cu(tokens, 3)
    assert cu[:len(want)].tolist() == want and (cu[len(want):] == B * S).all() and cu.dtype == torch.int32
    ids = M.doc_ids(tokens, 3)
    assert (ids.diff(dim=-1) >= 0).all() and (ids[:, 0] == 0).all()


def test_router_bias_stays_fp32_and_is_saved():
    m = M.Transformer(get_config('tiny')).bfloat16()
    moe = m.layers[0].moe
    assert moe.router_bias.dtype == torch.float32 and moe.experts.w_down.dtype == torch.bfloat16
    assert 'layers.0.moe.router_bias' in m.state_dict() and 'layers.0.moe.expert_load' not in m.state_dict()
    assert not any('router_bias' in n for n, _ in m.named_parameters())


def test_eval_does_not_count_load_and_training_does():
    m = M.Transformer(get_config('tiny'))
    tokens = torch.randint(0, 256, (2, 32))
    with torch.no_grad(): m.eval()(tokens)
    assert m.expert_loads().sum() == 0
    m.train()(tokens, tokens).backward()
    loads = m.expert_loads()
    assert loads.shape == (2, 8) and (loads.sum(-1) == 2 * 32 * 2).all()   # every token counted top_k times
    imbalance = m.update_router_biases()
    assert imbalance.shape == (2,) and (imbalance >= 1).all() and m.expert_loads().sum() == 0


@pytest.mark.skipif(not M.CPU_GROUPED_MM, reason='no CPU torch._grouped_mm in this PyTorch')
def test_grouped_and_loop_experts_agree_in_bf16():
    torch.manual_seed(0)
    moe = M.MoE(get_config('tiny', ['n_experts=16'])).bfloat16()
    with torch.no_grad():
        for p in moe.parameters(): p.normal_(0, 0.2)
    x = torch.randn(3, 40, 64).bfloat16()
    outs = []
    for impl in ('grouped', 'loop'):
        moe.experts.impl = impl
        xi = x.clone().requires_grad_()
        out, _ = moe(xi)
        g = torch.autograd.grad(out.float().square().sum(), [xi, moe.experts.w_gate_up])
        outs.append((out.float(), *(t.float() for t in g)))
    for a, b in zip(*outs): torch.testing.assert_close(a, b, atol=0.03 * b.abs().max().item(), rtol=0.02)
