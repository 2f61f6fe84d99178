import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, vocab_cross_entropy

SPEC_TABLE = [  # d_model, n_layer, n_head, params of the sizes the book trains
    (64, 2, 2, 618_816),
    (96, 3, 3, 1_118_880),
    (128, 4, 4, 1_803_392),
    (192, 4, 6, 3_344_064),
    (512, 8, 8, 29_106_688),
]


@pytest.mark.parametrize("d_model,n_layer,n_head,expected", SPEC_TABLE)
def test_parameter_counts_match_spec(d_model, n_layer, n_head, expected):
    model = GPT(GPTConfig(d_model=d_model, n_layer=n_layer, n_head=n_head))
    assert model.num_params() == expected


def test_default_config_is_the_books_model():
    cfg = GPTConfig()
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.seq_len) == (8192, 128, 4, 4, 128)
    assert cfg.mlp_hidden == 320


def test_embeddings_are_tied_and_no_biases():
    model = GPT(GPTConfig())
    assert model.lm_head.weight is model.tok_emb.weight
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_loss_at_init_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    x = torch.randint(0, 8192, (8, 128))
    y = torch.randint(0, 8192, (8, 128))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(8192)) < 0.1


def test_logits_do_not_depend_on_later_tokens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=32)).eval()
    x = torch.randint(0, 8192, (2, 32))
    x2 = x.clone()
    x2[:, 20:] = torch.randint(0, 8192, (2, 12))
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(x2)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_forward_shapes_and_too_long_input():
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=16))
    logits, loss = model(torch.zeros(3, 16, dtype=torch.long))
    assert logits.shape == (3, 16, 8192) and loss is None
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_bad_head_count_is_a_clear_error():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=100, n_head=3)


def _plain_and_blocked(n, block, autocast=False):
    torch.manual_seed(0)
    h0, w0 = torch.randn(n, 32), torch.randn(500, 32) * 0.1
    t = torch.randint(0, 500, (n,))
    out = []
    for blocked in (False, True):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = (vocab_cross_entropy(h, w, t, block) if blocked else
                    F.cross_entropy(torch.mm(h, w.t()).float(), t))
        (3.0 * loss).backward()  # a non-unit incoming gradient must scale both stored gradients
        out.append((loss.detach(), h.grad, w.grad))
    return out


@pytest.mark.parametrize("n, block", [(64, 16), (70, 16), (64, 256)])
def test_blocked_cross_entropy_equals_plain(n, block):
    (l0, gh0, gw0), (l1, gh1, gw1) = _plain_and_blocked(n, block)
    assert l1.dtype == torch.float32 and torch.allclose(l0, l1, rtol=1e-6, atol=1e-6)
    assert torch.allclose(gh0, gh1, rtol=1e-5, atol=1e-7)
    assert torch.allclose(gw0, gw1, rtol=1e-5, atol=1e-7)


def test_blocked_cross_entropy_under_bf16_autocast():
    (l0, gh0, gw0), (l1, gh1, gw1) = _plain_and_blocked(64, 16, autocast=True)
    assert gh1.dtype == gw1.dtype == torch.float32  # gradients land in the parameters' dtype
    assert torch.allclose(l0, l1, rtol=1e-2) and torch.allclose(gw0, gw1, rtol=0.05, atol=1e-3)


def test_model_loss_equals_cross_entropy_of_its_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=32))
    x, y = torch.randint(0, 8192, (4, 32)), torch.randint(0, 8192, (4, 32))
    logits, _ = model(x)
    plain = F.cross_entropy(logits.reshape(-1, 8192), y.reshape(-1))
    none, loss = model(x, y)  # with targets the full logits are never made
    assert none is None and torch.allclose(loss, plain, rtol=1e-6)
    with torch.no_grad():  # evaluation takes the no-gradient path
        assert torch.allclose(model(x, y)[1], plain, rtol=1e-6)
    g_plain = torch.autograd.grad(plain, model.tok_emb.weight)[0]
    g_model = torch.autograd.grad(loss, model.tok_emb.weight)[0]
    assert torch.allclose(g_plain, g_model, rtol=1e-4, atol=1e-8)


# ---- generation with a KV cache (model.KVCache, script_support.generate) ----

def test_a_kv_cache_gives_the_logits_of_the_whole_context():
    """The prompt through the cache, then one token at a time: each step's logits equal those of the whole
    sequence run again (float rounding apart), so the cache changes the cost, not the model."""
    from model import KVCache
    torch.manual_seed(0)
    m = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=32)).eval()
    idx = torch.randint(0, 8192, (2, 20))
    with torch.no_grad():
        full, _ = m(idx)
        cache = KVCache(2)
        first, _ = m(idx[:, :8], cache=cache)
        steps = [first] + [m(idx[:, t:t + 1], cache=cache)[0] for t in range(8, 20)]
    assert len(cache) == 20
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one new token at a time"):
        m(idx[:, :2], cache=cache)
    with pytest.raises(ValueError, match="exceeds the model's seq_len"):
        m(idx[:, :1], cache=_full(m, idx))


def _full(m, idx):
    from model import KVCache
    cache = KVCache(len(m.blocks))
    with torch.no_grad():
        m(torch.cat([idx, idx[:, :12]], dim=1), cache=cache)  # 32 tokens: the whole context
    return cache


@pytest.mark.parametrize("n_new", [10, 30])  # 30 runs past the 32-token context: the cache starts again
def test_generation_with_and_without_the_cache_is_the_same_text(n_new):
    from script_support import generate
    torch.manual_seed(0)
    m = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=32))
    prompt = torch.randint(0, 8192, (1, 5))
    plain = generate(m, prompt, n_new, temperature=0, context=32)
    cached = generate(m, prompt, n_new, temperature=0, context=32, kv_cache=True)
    assert torch.equal(plain, cached) and plain.size(1) == 5 + n_new
    sampled = [generate(m, prompt, n_new, temperature=0.8, generator=torch.Generator().manual_seed(1), context=32,
                        kv_cache=kv) for kv in (False, True)]
    assert torch.equal(*sampled)
