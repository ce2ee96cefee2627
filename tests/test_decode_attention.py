"""Chapter 10b's kernel inside a decode: the logits of `tiny` through it (Triton's CPU interpreter) match the torch
path's at every step, ragged rows and a second document included."""
from unittest import mock
import torch
import apex3.generate as generate
from apex3.config import get_config
from apex3.generate import CachedAttention, Generator
from apex3.kernels.ce import triton_interpret
from apex3.model import Transformer


def _model():
    torch.manual_seed(0)
    m = Transformer(get_config('tiny')).eval()
    for layer in m.layers:
        for norm in (layer.attn.q_norm, layer.attn.k_norm): norm.weight.data.normal_(1, 0.3)   # gains that matter
    return m


def _steps(m, prompts, kernel, steps=4):
    "Logits of a prefill and `steps` greedy steps, with the attention kernel on (`'triton'`) or off."
    with mock.patch.object(CachedAttention, 'kernel', kernel):
        g = Generator(m, max_len=32, compile=False)
        logits, pos, doc = g.prefill(prompts)
        out = [logits]
        for _ in range(steps):
            tok = logits.argmax(-1)
            logits = g.step(tok, pos, doc)
            pos, doc = pos + 1, generate.next_doc(tok, pos, doc, m.cfg.eos_id)
            out.append(logits)
    return torch.stack(out)


def test_decode_through_attention_kernel_matches_torch():
    m = _model()
    eos = m.cfg.eos_id
    prompts = [[5, 6, 7, 8, 9, 10], [11, eos, 12], [13]]   # ragged, and the second row starts a document at 2
    with triton_interpret():   # both interpreted: the MoE through chapter 10a's kernel in both, only attention differs
        ref = _steps(m, prompts, 'inductor')
        with mock.patch.object(generate, 'decode_attention', wraps=generate.decode_attention) as kernel:
            got = _steps(m, prompts, 'triton')
    assert kernel.call_count == 4 * len(m.layers)   # every step's every layer through the kernel, the prefill not
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
