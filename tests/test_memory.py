"""The memory ledger (code/memory.py) against its witnesses: a trace of what autograd saves, and
the allocator's measured peak on this CPU."""
import copy
import time

import pytest
import torch

import memory
from memory import Shape, activation_bytes, state_bytes, step_bytes, trace_saved_bytes
from model import GPT, GPTConfig
from shapes import mlp_hidden, param_count

SMALL_SHAPES = [Shape(128, 4, 4, 128, 2), Shape(64, 2, 2, 64, 3, vocab_size=1000),
                Shape(96, 3, 3, 32, 5, vocab_size=777)]


@pytest.mark.parametrize("d_model,n_layer,vocab", [(64, 2, 8192), (96, 3, 8192), (128, 4, 8192),
                                                    (192, 4, 8192), (512, 8, 8192), (100, 1, 77)])
def test_param_count_formula_equals_the_model(d_model, n_layer, vocab):
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=vocab, d_model=d_model, n_layer=n_layer, n_head=2, seq_len=8))
    assert param_count(d_model, n_layer, vocab) == model.num_params()
    assert model.cfg.mlp_hidden == mlp_hidden(d_model)


def test_bytes_per_param_by_layout():
    assert memory.bytes_per_param("autocast") == {"weights": 4, "grads": 4, "optimizer": 8}
    assert memory.bytes_per_param("mixed") == {"weights": 2, "grads": 2, "optimizer": 12}
    assert sum(memory.bytes_per_param("mixed", fp32_grads=True).values()) == 18
    with pytest.raises(ValueError, match="unknown layout"):
        memory.bytes_per_param("fp8")


@pytest.mark.parametrize("layout,expected", [
    # per GPU, N = 1, 8 GPUs: what ZeRO stage s shards is divided by 8
    ("autocast", {"ddp": 16, "zero1": 4 + 4 + 8 / 8, "zero2": 4 + 12 / 8, "zero3": 16 / 8}),
    ("mixed", {"ddp": 16, "zero1": 2 + 2 + 12 / 8, "zero2": 2 + 14 / 8, "zero3": 16 / 8}),
])
def test_zero_stages_shard_what_the_paper_says(layout, expected):
    for scheme, per_gpu in expected.items():
        assert sum(state_bytes(1, 8, scheme, layout).values()) == pytest.approx(per_gpu)


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=str)
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_formula_equals_trace_to_the_byte(shape, kernels, checkpoint):
    traced = trace_saved_bytes(shape, kernels, checkpoint)
    formula = activation_bytes(shape, kernels, checkpoint)
    assert {k: traced[k] for k in formula} == formula
    assert traced["total"] == sum(formula.values())


def test_seven_billion_shape_traces_in_seconds_without_memory():
    shape = Shape(4096, 32, 32, 4096, 2, vocab_size=50257)
    t0 = time.perf_counter()
    traced = trace_saved_bytes(shape)
    assert time.perf_counter() - t0 < 30
    assert traced["total"] == sum(activation_bytes(shape).values())
    assert traced["total"] > 70e9  # far more than this machine has: the trace allocated nothing


def test_flash_stand_in_saves_what_the_aten_flash_op_saves():
    """The trace's flash attention saves the same tensors (shape, dtype) as aten's own flash op."""
    def saved_by(fn):
        out = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: out.append((tuple(t.shape), t.dtype)) or t,
                                                      lambda t: t):
            fn()
        return sorted(out, key=str)

    q, k, v = (torch.empty(2, 4, 64, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    real = saved_by(lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True))
    stand_in = saved_by(lambda: memory._flash_attention(q, k, v, is_causal=True))
    assert stand_in == real


def test_autocast_by_hand_saves_what_cpu_autocast_saves():
    """On a CPU, where torch.autocast works, one block under real bf16 autocast saves the same
    bytes as the rule the meta trace applies by hand."""
    from model import Block
    cfg = GPTConfig(d_model=64, n_head=2, seq_len=32)
    block = Block(cfg)
    x = torch.randn(3, 32, 64, requires_grad=True)
    cos, sin = (t for t in GPT(cfg).buffers())
    params = {p.untyped_storage()._cdata for p in block.parameters()}

    def saved_bytes(run):
        seen = {}

        def pack(t):
            key = t.untyped_storage()._cdata
            if key not in params:
                seen[key] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
        return sum(seen.values())

    def real():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            block(x, cos, sin)

    def by_hand():
        with memory.AutocastByHand(torch.bfloat16, flash=False):
            block(x, cos, sin)

    assert saved_bytes(by_hand) == saved_bytes(real)


def test_checkpointing_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=32))
    x = torch.randint(0, 8192, (4, 32))
    grads = []
    for ck in (False, True):
        m = copy.deepcopy(model)
        m.recompute_blocks = ck
        _, loss = m(x, x)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in m.parameters()]))
    assert grads[0][0] == grads[1][0]
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_measured_cpu_peak_agrees_with_the_ledger():
    """Witness 1: the allocator's peak for one fp32 training step on this CPU."""
    from measure import peak_memory, training_step_fn
    from train import configure_optimizer
    torch.manual_seed(0)
    cfg = GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=64)
    model = GPT(cfg)
    x = torch.randint(0, 8192, (16, 64))
    opt = configure_optimizer(model, lr=1e-3)
    step = training_step_fn(model, opt, x, x)
    step()  # the optimizer state exists before the measured step, as the prediction assumes
    measured = peak_memory(step)
    predicted = memory.measured_peak_prediction(Shape(64, 2, 2, 64, 16), model.num_params())
    assert 0.95 < measured / predicted < 1.15


def test_step_bytes_adds_up_and_checkpointing_saves_memory():
    shape = Shape(768, 12, 12, 1024, 16, vocab_size=50257)
    n = param_count(768, 12, 50257)
    plain = step_bytes(shape, n)
    ck = step_bytes(shape, n, checkpoint=True)
    assert plain["total"] == sum(v for k, v in plain.items() if k != "total")
    assert ck["total"] < plain["total"]
    assert ck["weights"] + ck["grads"] + ck["optimizer"] == 16 * n


@pytest.mark.parametrize("bad", [dict(d_model=0), dict(n_layer=-1), dict(micro_batch=0), dict(n_head=3)])
def test_shape_rejects_nonsense(bad):
    args = dict(d_model=64, n_layer=2, n_head=2, seq_len=16, micro_batch=1) | bad
    with pytest.raises(ValueError):
        Shape(**args)


# ---- one description of a run (memory.Run) ------------------------------------------------------------

TINY = memory.Shape(32, 2, 2, 32, 2, 8192)  # code/run_witness.py's shape: 282,784 parameters


@pytest.mark.parametrize("shape", [memory.Shape(128, 4, 4, 128, 16, 8192), memory.Shape(4096, 2, 32, 4096, 1, 50257)])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_fsdp_bf16_activations_equal_the_trace_to_the_byte(shape, checkpoint):
    import torch
    traced = memory.trace_saved_bytes(shape, checkpoint=checkpoint, param_dtype=torch.bfloat16)
    run = memory.Run(shape, gpus=2, scheme="zero3", precision="bf16", checkpoint=checkpoint)
    formula = memory.run_activation_bytes(run)
    assert traced == {**formula, "total": sum(formula.values())}


def test_the_run_description_of_the_tiny_witness_run_to_the_byte():
    """The numbers code/run_witness.py counted on 2 gloo processes (tests/test_run_witness.py recounts them)."""
    n = 282_784
    ddp = memory.Run(TINY, gpus=2, scheme="ddp", precision="fp32", kernels="cpu")
    assert memory.run_messages(ddp)["all_reduce"] == [1, 4 * n]
    assert memory.run_state_bytes(ddp)["buckets"] == 0  # train_gpu.py: gradient_as_bucket_view
    assert memory.run_state_bytes(memory.Run(TINY, gpus=2, precision="fp32", bucket_view=False))["buckets"] == 4 * n
    z3 = memory.Run(TINY, gpus=2, scheme="zero3", precision="bf16", accum=4, kernels="cpu")
    # per micro-batch: the root (262,176 numbers, kept for backward) once, each block (10,304) twice, in bf16
    assert memory.run_messages(z3) == {"all_gather": [20, 2_427_136], "reduce_scatter": [3, 1_131_136],
                                       "all_reduce": [0, 0]}
    assert memory.run_state_bytes(z3) == {"weights": 565_568, "grads": 565_568, "optimizer": 1_131_136,
                                          "buckets": 0, "whole grads": 4 * n}
    every = memory.Run(TINY, gpus=2, scheme="zero3", precision="bf16", accum=4, sync_every=True, kernels="cpu")
    assert memory.run_messages(every)["reduce_scatter"] == [12, 4_524_544]
    assert memory.run_state_bytes(every)["whole grads"] == 0
    z2 = memory.Run(TINY, gpus=2, scheme="zero2", precision="fp32", kernels="cpu")
    assert memory.run_messages(z2)["all_gather"] == [3, 1_131_136] and memory.gathered_bytes(z2) == 4 * n


def test_fsdp_pads_each_parameter_to_a_multiple_of_the_gpus():
    shape = memory.Shape(48, 1, 2, 16, 1, 1001)  # 1001 rows of the embedding over 4: 251 rows a shard
    run = memory.Run(shape, gpus=4, scheme="zero3", precision="bf16")
    u = memory.unit_numels(run)
    assert u["root"]["whole"] == 1001 * 48 + 48 and u["root"]["padded"] == 1004 * 48 + 48
    assert u["root"]["shard"] == 251 * 48 + 12
    assert memory.run_state_bytes(run)["weights"] == 4 * (u["root"]["shard"] + u["block"]["shard"])


def test_fsdp_with_bf16_gathers_sends_what_ddp_sends_without_accumulation():
    """The book's FSDP policy: a block's bf16 weights are gathered twice (forward and backward) and its fp32
    gradients reduce-scattered once: (G-1)/G·(2+2+4) = DDP's 2(G-1)/G·4 bytes per parameter. The root,
    kept for backward, is gathered once: 2 bytes less per parameter. The textbook's 1.5× assumes one dtype."""
    shape = memory.Shape(4096, 32, 32, 4096, 1, 50256)  # 50256: divisible by 8, so no padding
    ddp = memory.Run(shape, gpus=8, scheme="ddp")
    z3 = memory.Run(shape, gpus=8, scheme="zero3", precision="bf16")
    root = memory.unit_numels(z3)["root"]["whole"]
    assert sum(memory.run_sent_bytes(z3).values()) == sum(memory.run_sent_bytes(ddp).values()) - 7 / 8 * 2 * root
