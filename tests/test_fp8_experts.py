"FP8 routed experts (emulated on the CPU) train like bf16 ones: 50 steps of a reduced `small`, side by side."
import copy, os, statistics, subprocess, sys, textwrap
import pytest, torch
from apex3.config import get_config
from apex3.model import Transformer
from apex3.kernels.fp8_experts import FP8Experts, convert_experts

# `small`'s shape (12 -> 2 layers, top-4 of 32 -> 8 experts, ...), shrunk until 2 x 50 steps take seconds on a CPU
REDUCED_SMALL = ['d_model=64', 'n_layers=2', 'n_heads=4', 'n_kv_heads=2', 'head_dim=16', 'n_experts=8',
                 'expert_ffn=32', 'shared_ffn=32', 'seq_len=32', 'vocab_size=512', 'eos_id=500']


def _train(model, steps=50, batch=4, lr=3e-3):
    "Loss per step of AdamW on arithmetic runs of tokens (learnable), bf16 autocast, the router biases updated."
    cfg, g = model.cfg, torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        start = torch.randint(0, 400, (batch, 1), generator=g)
        seq = (start + torch.arange(cfg.seq_len + 1) * torch.randint(1, 4, (batch, 1), generator=g)) % 400
        with torch.autocast('cpu', torch.bfloat16): loss = model(seq[:, :-1], seq[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.update_router_biases()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope='module')
def bf16_run():
    torch.manual_seed(0)
    model = Transformer(get_config('small', REDUCED_SMALL))
    ref = copy.deepcopy(model)
    for layer in ref.layers: layer.moe.experts.impl = 'loop'   # bf16 `F.linear`s: the CPU's bf16 grouped GEMM is slow
    return model, _train(ref)


@pytest.mark.parametrize('backward', ['mixed', 'fp8'])
def test_fp8_tracks_bf16_for_50_steps(bf16_run, backward):
    """Tolerance: every step's loss within 5% of bf16's, the last 10 steps' mean within 2%; both runs learn (the last
    10 below 75% of the first loss) and the FP8 run is not bf16 in disguise (some step differs)."""
    model, ref = bf16_run
    fp8 = copy.deepcopy(model)
    assert convert_experts(fp8, backward) == ['layers.0.moe.experts', 'layers.1.moe.experts']
    got = _train(fp8)
    assert all(isinstance(l.moe.experts, FP8Experts) for l in fp8.layers)
    assert max(abs(a - b) / b for a, b in zip(got, ref)) < 0.05
    last, last_ref = statistics.mean(got[-10:]), statistics.mean(ref[-10:])
    assert abs(last - last_ref) / last_ref < 0.02, (last, last_ref)
    assert last_ref < 0.75 * ref[0] and last < 0.75 * got[0], (ref[0], last_ref, got[0], last)
    assert any(a != b for a, b in zip(got, ref))


def test_emulation_warns_once():
    "On a machine without CUDA the FP8 GEMMs are emulated, and stderr says so in exactly one line."
    code = textwrap.dedent('''
        import torch
        from apex3.model import Experts
        from apex3.kernels.fp8_experts import convert_experts
        ex = Experts(2, 16, 16)
        torch.nn.init.normal_(ex.w_gate_up); torch.nn.init.normal_(ex.w_down)
        convert_experts(ex)
        x = torch.randn(6, 16, requires_grad=True)
        for _ in range(3): ex(x, torch.tensor([2, 4])).sum().backward()
    ''')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'PYTHONWARNINGS': 'ignore', 'CUDA_VISIBLE_DEVICES': ''})
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines == ['FP8 grouped GEMM emulated (dequantise + fp32 matmul): no CUDA device'], lines


def test_offload_step_recasts_the_weights():
    """The host-offload optimizer writes the new weights through `.data` (no version bump, no torch.optim hook), so the
    FP8 cache would serve the old weights; the benchmark's and trainer's `optimizer_step` announces the step."""
    from types import SimpleNamespace
    from apex3.bench import optimizer_step
    from apex3.offload.host_optim import OffloadOptimizer
    from apex3.offload.memory import PinnedPool
    from apex3.kernels.fp8_experts import quantized_weights, weights_stepped
    torch.manual_seed(0)
    model = Transformer(get_config('tiny'))
    convert_experts(model)
    opt = OffloadOptimizer(model, pool=PinnedPool(2**26, pin=False))
    ex = model.layers[0].moe.experts
    tok = torch.randint(0, 256, (2, 33))
    model(tok[:, :-1], tok[:, 1:]).backward()
    before, w_before = quantized_weights(ex), ex.w_gate_up.detach().clone()
    optimizer_step(SimpleNamespace(opt=opt, z_parts=[], model=model))
    assert not torch.equal(ex.w_gate_up.detach(), w_before)           # the step did change the weights
    after = quantized_weights(ex)
    assert after is not before
    q, s = after[0]['fwd']
    w = ex.w_gate_up.detach().float()
    torch.testing.assert_close(q.float() * s[..., None], w, atol=w.abs().max().item() / 16, rtol=0)
    model(tok[:, :-1], tok[:, 1:]).backward()
    opt.step()                                                         # the same step, not announced: stale
    assert quantized_weights(ex) is after
    weights_stepped()
    assert quantized_weights(ex) is not after
