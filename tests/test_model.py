import math

import pytest
import torch

from model import GPT, GPTConfig

SPEC_TABLE = [  # d_model, n_layer, n_head, params — ../shared/BOOK.md
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
