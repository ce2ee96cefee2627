"""The one-GPU offload plan's figures are possible (hypothesis over configs, GPUs, hosts and flags): the optimizer state
it keeps on the GPU is at most the model's whole state, counted here from the trainer's own optimizer groups; that
state lies inside the GPU memory it prints, which lies inside the GPU's budget; its `--offload-gpu-gib` holds what it
planned to keep. From the outside too: `apex3 plan --config tiny --host-gib 128` as a stranger types it."""
import dataclasses, re, subprocess, sys
from functools import lru_cache
import pytest, torch
from hypothesis import assume, given, settings, strategies as st
from apex3.config import CONFIGS, get_config
from apex3.plan import GPUS
from apex3.usage import UsageError
from apex3.offload.plan import offload_plan

GiB = 2**30

@lru_cache(maxsize=None)
def _state_at(config, layers, momentum):
    "GiB of FP32 master and FP32 accumulator (4 + 4 bytes) and state of every parameter the trainer's optimizer takes."
    from apex3.model import Transformer
    from apex3.optim import build_optimizer
    c = dataclasses.replace(get_config(config), n_layers=layers)
    dtype = torch.bfloat16 if momentum == 'bf16' else None
    with torch.device('meta'): groups = build_optimizer(Transformer(c), momentum_dtype=dtype).param_groups
    state = lambda g: (g['momentum_dtype'] or torch.float32).itemsize if 'momentum' in g else 8   # AdamW: 2 moments
    return sum(p.numel() * (8 + state(g)) for g in groups for p in g['params']) / GiB

def state_gib(config, layers, momentum='master'):
    "The whole optimizer state at `layers` layers: parameters grow linearly with depth, so two depths give any."
    one, two = _state_at(config, 1, momentum), _state_at(config, 2, momentum)
    return one + (layers - 1) * (two - one)

def test_state_by_depth_is_the_optimizers():
    "The linear shortcut against a model built at its full depth (tiny: 2 layers; small: 12)."
    for name in ('tiny', 'small'):
        full = get_config(name).n_layers
        assert state_gib(name, full) == pytest.approx(_state_at(name, full, 'master'), rel=1e-12)

def figures_possible(kept, gpu, budget, mem, whole):
    "What a plan's memory figures must satisfy: kept <= whole state, kept <= GPU memory <= budget <= the GPU."
    return kept <= whole * (1 + 1e-9) and kept <= gpu and gpu <= budget <= mem

def test_the_red_teams_figures_are_caught():
    "Control: the figures the red team saw (tiny on an H200: 23.0 of 127, 116 kept) fail the check."
    assert not figures_possible(116, 23.0, 127, 141, state_gib('tiny', 2))
    assert figures_possible(0.0025, 5.0, 127, 141, state_gib('tiny', 2))

gpus_with_bf16 = [g for g, spec in GPUS.items() if spec.bf16]

@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(CONFIGS)), st.sampled_from(gpus_with_bf16), st.floats(8, 1024),
       st.sampled_from([None, 'gpu', 'cpu']), st.sampled_from(['master', 'bf16']), st.sampled_from(['split', 'fp32']),
       st.one_of(st.none(), st.floats(0, 1)))
def test_every_figure_is_possible(config, gpu, host_gib, accum, momentum, masters, keep_share):
    mem = GPUS[gpu].mem_gib
    keep = None if keep_share is None else keep_share * mem
    try: p = offload_plan(config, gpu, host_gib, offload_accum=accum, muon_momentum=momentum, offload_masters=masters,
                          offload_gpu_gib=keep)
    except UsageError: assume(False)   # does not fit even one layer: no plan to judge
    whole = state_gib(config, p.layers, momentum)
    assert figures_possible(p.resident_gib, p.gpu_gib, p.gpu_budget_gib, mem, whole), p
    flag = float(re.search(r'--offload-gpu-gib (\S+)', p.flags())[1])
    assert p.resident_gib <= flag <= p.resident_gib * 1.01   # rounded up, so the budget holds what was planned
    if p.resident_gib >= whole * (1 - 1e-9): assert flag >= whole   # all of it: the trainer keeps every parameter
    again = offload_plan(config, gpu, host_gib, layers=p.layers, offload_accum=p.accum_on, muon_momentum=momentum,
                         offload_masters=masters, offload_gpu_gib=flag, recompute=p.recompute,
                         act_offload=p.act_offload, act_budget=p.act_budget)
    assert again.resident_gib == pytest.approx(p.resident_gib, rel=0.01)   # the flag line plans the same state

def _cli(*args):
    return subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', *args],
                          capture_output=True, text=True, timeout=120)

@pytest.mark.parametrize('config,gpu', [('tiny', 'H200'), ('small', 'H200'), ('tiny', 'H100'), ('medium', 'B200')])
def test_plan_command_prints_possible_figures(config, gpu):
    r = _cli('plan', '--config', config, '--gpu', gpu, '--host-gib', '128')
    assert r.returncode == 0, r.stderr
    m = re.search(r'GPU memory +([\d.]+) of (\d+) GiB budget \(optimizer state kept: ([\d.e-]+) GiB', r.stdout)
    layers = int(re.search(r'with (\d+) layers', r.stdout)[1])
    gpu_gib, budget, kept = float(m[1]), float(m[2]), float(m[3])
    assert figures_possible(kept, gpu_gib, budget, GPUS[gpu].mem_gib, state_gib(config, layers)), r.stdout
