"""code/script_support.py: one-line argument errors, atomic saves, rank means, gradient accumulation."""
import contextlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from data import REPO
from model import GPT, GPTConfig
from script_support import (
    Parser,
    accumulate_gradients,
    atomic_write,
    mean_across_ranks,
    positive_int,
    process_group,
    save_atomic,
    set_lr,
)

CODE = REPO / "code"


def test_parser_error_is_one_line_and_exit_2():
    code = (f"import sys; sys.path.insert(0, {str(CODE)!r}); from script_support import Parser, positive_int; "
            "p = Parser(prog='tool'); p.add_argument('--n', type=positive_int); p.parse_args(sys.argv[1:])")
    for args, message in ((["--n", "2.5"], "tool: error: argument --n: '2.5' must be a whole number (see --help)"),
                          (["--nope"], "tool: error: unrecognized arguments: --nope (see --help)")):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr == message + "\n"


def test_parser_error_in_process(capsys):
    p = Parser(prog="tool")
    p.add_argument("--n", type=positive_int)
    assert p.parse_args(["--n", "2k"]).n == 2000
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "-3"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "tool: error: argument --n: '-3' is negative; it must be positive (see --help)\n"


def test_save_atomic_round_trips_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "sub" / "ckpt.pt"  # the folder is made
    save_atomic({"w": torch.arange(3)}, path)
    save_atomic({"w": torch.arange(4)}, path)  # replaces
    assert torch.equal(torch.load(path)["w"], torch.arange(4))
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]


def test_an_error_mid_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_write(path) as f:
            f.write(b"half of the new")
            raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_set_lr_sets_every_group():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=1.0)
    set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]


def test_mean_across_ranks_in_one_process(tmp_path, monkeypatch):
    t = torch.tensor([1.0, 3.0])
    assert mean_across_ranks(t) is t and t.tolist() == [1.0, 3.0]  # no group: unchanged
    # a gloo group of one process: the sum-then-divide path, which must give the value back
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert mean_across_ranks(torch.tensor([1.0, 3.0])).tolist() == [1.0, 3.0]
    finally:
        dist.destroy_process_group()


def test_process_group_without_torchrun_is_one_plain_process(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with process_group("gloo") as ranks:
        assert ranks == (0, 0, 1) and not dist.is_initialized()


def _batch():
    cfg = GPTConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, seq_len=16)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (8, 16), generator=gen)
    y = torch.randint(0, 64, (8, 16), generator=gen)
    torch.manual_seed(0)
    return GPT(cfg), x, y


def test_accumulation_equals_the_big_batch_gradient():
    model, x, y = _batch()
    _, loss = model(x, y)
    loss.backward()
    big = [p.grad.clone() for p in model.parameters()]
    for k in (2, 4):
        model.zero_grad(set_to_none=True)
        mean = accumulate_gradients(model, list(zip(x.chunk(k), y.chunk(k))))
        assert mean.item() == pytest.approx(loss.item(), rel=1e-6) and not mean.requires_grad
        for g, p in zip(big, model.parameters()):
            assert (p.grad - g).abs().max() < 1e-6


def test_no_sync_encloses_forward_and_backward_of_all_but_the_last():
    model, x, y = _batch()
    inside, seen = [False], []

    @contextlib.contextmanager
    def no_sync():
        inside[0] = True
        yield
        inside[0] = False

    class Recorder(torch.nn.Module):
        def forward(self, xb, yb):
            _, loss = model(xb, yb)
            seen.append(("forward", inside[0]))
            loss.register_hook(lambda g: seen.append(("backward", inside[0])))
            return None, loss

    accumulate_gradients(Recorder(), list(zip(x.chunk(4), y.chunk(4))), no_sync=no_sync)
    assert seen == [("forward", True), ("backward", True)] * 3 + [("forward", False), ("backward", False)]
