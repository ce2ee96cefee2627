"Property tests for apex3.optim against PyTorch's own Newton–Schulz, over random shapes and batch sizes."
import pytest, torch
from hypothesis import given, settings, strategies as st
from apex3.optim import newton_schulz, muon_update_chunk, shape_buckets, WSD

torch_ns = pytest.importorskip('torch.optim._muon')._zeropower_via_newtonschulz

@settings(max_examples=25, deadline=None)
@given(E=st.integers(1, 4), m=st.integers(2, 48), n=st.integers(2, 48), seed=st.integers(0, 2**16))
def test_batched_ns_matches_torch_per_matrix(E, m, n, seed):
    "Our batched NS on [E, m, n] equals torch.optim.Muon's NS applied to each [m, n] slice."
    G = torch.randn(E, m, n, generator=torch.Generator().manual_seed(seed))
    ref = torch.stack([torch_ns(g, (3.4445, -4.7750, 2.0315), 5, 1e-7) for g in G]).float()
    torch.testing.assert_close(newton_schulz(G).float(), ref, atol=2e-2, rtol=2e-2)

@settings(max_examples=25, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([(8, 4), (4, 8), (6, 6)])), min_size=1, max_size=8),
       cap=st.integers(16, 400))
def test_shape_buckets_partition(shapes, cap):
    "Buckets cover every tensor once, hold one matrix shape each, and respect the cap unless a tensor alone exceeds it."
    ts = [torch.empty(e, *mn) if e > 1 else torch.empty(*mn) for e, mn in shapes]
    bs = shape_buckets(ts, max_numel=cap)
    assert sorted(i for b in bs for i in b) == list(range(len(ts)))
    for b in bs:
        assert len({ts[i].shape[-2:] for i in b}) == 1
        assert len(b) == 1 or sum(ts[i].numel() for i in b) <= cap

def test_zero_grad_only_decays():
    "With a zero gradient and zero momentum the update is exactly the decoupled weight decay."
    p = torch.randn(16, 8); p0 = p.clone()
    muon_update_chunk([p], [torch.zeros_like(p)], [torch.zeros_like(p)], lr=0.1, weight_decay=0.5)
    torch.testing.assert_close(p, p0 * (1 - 0.05))

@given(t=st.floats(0, 2e6))
def test_wsd_bounded_and_monotone_after_warmup(t):
    s = WSD(1e6, 1e5, decay_frac=0.3, decay='cosine', floor=0.05)
    assert 0 <= s(t) <= 1
    if t >= 1e5: assert s(t) >= s(t + 1e3) - 1e-12
