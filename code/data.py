"""The corpus (全宋词), its train/val split, the SentencePiece tokenizer and the token ids.

The tokenizer and token ids are build artefacts: made on first use under data/cache/, keyed by a
hash of the corpus and of every setting that shapes them, so a changed input rebuilds them and an
unchanged one reuses them. Each artefact is written to a temporary folder and renamed into place,
so an interrupted build never leaves a half-written cache behind. On a fresh machine under torchrun only
local rank 0 builds it while the machine's other processes wait; machines sharing a disk each keep the
first complete folder, never removing it.

train_gpu.py's tokens, below the book's (TokenSource): the book's (int64) or a uint16 memmap of --data
(code/prepare_tokens.py), never copied into memory, whose last 5% is held out for validation; every
refusal (a missing, odd-sized or short file, an id beyond --vocab-size, a tokenizer larger than the
vocabulary) is one sentence and exit status 1 before any work. Each process scans only its part of the
file for the largest id; the parts are compared with one all-reduce once the processes have joined
(check_ids). How a step draws from them is sampler.py's; evaluation and the sample text, evaluation.py's.
"""
import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from arguments import REFUSED, fail, refuse

REPO = Path(__file__).resolve().parent.parent
CORPUS_PATH = REPO / "data" / "songci.txt"
CACHE_DIR = REPO / "data" / "cache"
SEP = "｜"
VAL_EVERY = 20  # every 20th ci goes to validation: 5%, spread over the whole corpus
TOKEN_ARRAYS = ["train", "val"]  # what tokens.npz holds; part of the cache key, as the settings are

TOKENIZER_SETTINGS = dict(
    model_type="bpe",
    vocab_size=8192,
    character_coverage=1.0,
    byte_fallback=True,  # a character never seen in training still encodes (as bytes) and decodes exactly
    normalization_rule_name="identity",  # the default NFKC turns '，' into ','
    add_dummy_prefix=False,
    remove_extra_whitespaces=False,
    split_digits=True,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
    max_sentence_length=1 << 16,
    input_sentence_size=0,
    shuffle_input_sentence=False,
    num_threads=1,  # one thread: the same tokenizer on every run
)


class CorpusError(RuntimeError):
    """The corpus file is missing or not what data/make_corpus.py writes."""


def load_corpus(path: Path = CORPUS_PATH) -> list[str]:
    """Every ci as one line, ``词牌｜作者｜正文``."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(
            f"corpus file {path.name} not found in {path.parent.name}/: "
            "restore it with `git checkout data/songci.txt` or `python data/make_corpus.py`")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise CorpusError(f"corpus file {path.name} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    for i, line in enumerate(lines, 1):
        if line.count(SEP) < 2 or not line.split(SEP, 2)[2]:
            raise CorpusError(f"corpus file {path.name}, line {i}: expected `词牌｜作者｜正文`, got {line[:30]!r}")
    if not lines:
        raise CorpusError(f"corpus file {path.name} is empty")
    return lines


def split_corpus(lines: list[str]) -> tuple[list[str], list[str]]:
    """Split by whole ci, deterministically: no ci is cut between train and val."""
    train = [c for i, c in enumerate(lines) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [c for i, c in enumerate(lines) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val


def _cache_key(corpus_path: Path) -> str:
    import sentencepiece as spm
    h = hashlib.sha256(Path(corpus_path).read_bytes())
    h.update(json.dumps([TOKENIZER_SETTINGS, VAL_EVERY, spm.__version__, TOKEN_ARRAYS], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _build(lines: list[str], out: Path) -> None:
    import sentencepiece as spm
    train, val = split_corpus(lines)
    model = io.BytesIO()  # no model_prefix: the trainer would record the (temporary) path in the model
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_writer=model, minloglevel=2, **TOKENIZER_SETTINGS)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    arrays = {}
    for name, part in (("train", train), ("val", val)):
        ids = sp.encode(part)
        arrays[name] = np.fromiter((t for seq in ids for t in (*seq, sp.eos_id())), dtype=np.uint16)
    np.savez(out / "tokens.npz", **arrays)


CACHE_WAIT_S = 1800  # how long the other processes of a machine wait for its local rank 0 to build the cache


def cache_dir(corpus_path: Path = CORPUS_PATH) -> Path:
    """Build (if needed) and return the folder holding tokenizer.model and tokens.npz.

    Under torchrun only local rank 0 of each machine builds it; the machine's other processes wait for
    the folder to be complete. A complete folder is never removed: it is renamed into place whole, and a
    rename that finds one there (another machine's, on a shared disk) keeps it."""
    lines = load_corpus(corpus_path)
    final = CACHE_DIR / _cache_key(corpus_path)
    if _complete(final):
        return final
    if int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return _wait_for(final)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE_DIR))
    try:
        _build(lines, tmp)
        try:
            os.rename(tmp, final)  # fails where a folder with files already is: never over a complete one
        except OSError:
            if not _complete(final):
                raise CorpusError(f"token cache {final} exists but lacks tokens.npz or tokenizer.model (not "
                                  "written by this code); remove that folder and run again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ours, if another process's folder was there first
    return final


def _wait_for(final: Path) -> Path:
    """The cache folder local rank 0 is building, once it is complete (polled every half second)."""
    import time
    deadline = time.monotonic() + CACHE_WAIT_S
    while not _complete(final):
        if time.monotonic() > deadline:
            raise CorpusError(f"local rank 0 did not finish the token cache {final} within {CACHE_WAIT_S} s; "
                              "look at its error, or build the cache first with one process")
        time.sleep(0.5)
    return final


def _complete(folder: Path) -> bool:
    return (folder / "tokens.npz").is_file() and (folder / "tokenizer.model").is_file()


def load_tokenizer(corpus_path: Path = CORPUS_PATH):
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(cache_dir(corpus_path) / "tokenizer.model"))


def token_bytes(sp, eos_bytes: int = 1) -> torch.Tensor:
    """UTF-8 bytes each token id stands for in the text: a byte-fallback piece is one byte, a normal
    piece the bytes of its characters ('▁' is a space), control pieces none; eos ends a line of the
    corpus file, so it stands for the newline (eos_bytes=1)."""
    counts = torch.zeros(sp.get_piece_size(), dtype=torch.int64)
    for i in range(sp.get_piece_size()):
        if sp.is_byte(i):
            counts[i] = 1
        elif i == sp.eos_id():
            counts[i] = eos_bytes
        elif not (sp.is_control(i) or sp.is_unknown(i)):
            counts[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return counts


@dataclass
class Tokens:
    train: torch.Tensor  # int64 token ids, each ci followed by eos
    val: torch.Tensor
    vocab_size: int
    eos_id: int


def load_tokens(corpus_path: Path = CORPUS_PATH) -> Tokens:
    folder = cache_dir(corpus_path)
    try:
        with np.load(folder / "tokens.npz") as z:
            arrays = {k: z[k] for k in TOKEN_ARRAYS}
    except (OSError, ValueError, KeyError) as e:
        shutil.rmtree(folder, ignore_errors=True)  # corrupt: the next call rebuilds it
        raise CorpusError(f"token cache {folder.name} was unreadable ({type(e).__name__}) and has been "
                          "removed; run again to rebuild it") from None
    return Tokens(
        train=torch.from_numpy(arrays["train"].astype(np.int64)),
        val=torch.from_numpy(arrays["val"].astype(np.int64)),
        vocab_size=TOKENIZER_SETTINGS["vocab_size"], eos_id=TOKENIZER_SETTINGS["eos_id"])


def load_tokens_or_exit(corpus_path: Path = CORPUS_PATH) -> Tokens:
    """load_tokens() for a script: a missing or broken corpus ends it with one sentence on stderr and
    exit status 1, not a traceback."""
    try:
        return load_tokens(corpus_path)
    except CorpusError as e:
        fail(str(e), REFUSED)


def get_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator,
              rows: slice | None = None):
    """Random windows of seq_len+1 tokens: inputs x and next-token targets y, each (batch, seq_len).

    Draw one global batch from a generator seeded the same way on every process and let each process
    take its own slice of rows: then one process with the whole batch and N processes with a slice
    each see exactly the same data. rows: the slice this process keeps; only those windows are read
    (every process draws all batch_size start positions, a few integers, so the generators stay equal).
    """
    if len(tokens) <= seq_len + 1:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of {seq_len + 1}")
    starts = torch.randint(len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    if rows is not None:
        starts = starts[rows]
    windows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def fixed_batches(tokens: torch.Tensor, n_batches: int, batch_size: int, seq_len: int, seed: int = 1234):
    """The same n_batches batches every time: for evaluation curves that compare like with like."""
    g = torch.Generator().manual_seed(seed)
    return [get_batch(tokens, batch_size, seq_len, g) for _ in range(n_batches)]


# ---- the reader's own corpus (code/prepare_tokens.py writes it, with its tokenizer) ----

def tokenizer_path_for(token_file) -> Path:
    """Where prepare_tokens.py puts the tokenizer of a token file: data/big.bin -> data/big.tokenizer.model."""
    return Path(token_file).with_suffix(".tokenizer.model")


# ---- train_gpu.py's tokens: the book's or the reader's --data ----

HOLDOUT = 0.05  # the last 5% of a --data file is validation


class TokenSource:
    """Training and validation tokens as 1-D tensors: the book's (int64) or a uint16 memmap (no copy
    into memory) whose last 5% is held out; and the tokenizer if it is known (else None)."""

    def __init__(self, path, vocab_size: int, seq_len: int, tokenizer=None, rank: int = 0, world: int = 1):
        need = seq_len + 2  # one window of seq_len + 1 tokens, and room to draw it
        self.vocab_size, self.top, self.name = vocab_size, 0, "the book's 全宋词 tokens"
        if path is None:
            book = load_tokens_or_exit()
            self.train, self.val = book.train, book.val
            default_tok = "book"
        else:
            path = Path(path)
            if not path.is_file():
                refuse(f"--data {path} does not exist or is not a file (make one with code/prepare_tokens.py)")
            size = path.stat().st_size
            if size % 2 or size == 0:
                refuse(f"--data {path.name} is not a uint16 token file (its size is odd or zero)")
            if size // 2 < need:
                refuse(f"--data {path.name} holds {size // 2:,} tokens, fewer than one sequence "
                       f"(--seq-len {seq_len} + 2); use a longer file or a shorter --seq-len")
            # copy-on-write: a writable view for torch that never writes back to the file
            arr = np.memmap(path, dtype=np.uint16, mode="c")
            part = -(-len(arr) // world)  # each process scans its own part for the largest id (check_ids)
            mine = arr[rank * part:(rank + 1) * part]
            self.top = max([int(mine[i:i + (1 << 26)].max()) for i in range(0, len(mine), 1 << 26)] or [0])
            if world == 1 and self.top >= vocab_size:
                self._too_large(path.name)
            tokens = torch.from_numpy(arr)
            n_val = int(len(tokens) * HOLDOUT)
            if n_val < need or len(tokens) - n_val < need:
                refuse(f"--data {path.name} holds {len(tokens):,} tokens: its last 5% ({n_val:,}) held out for "
                       f"validation is shorter than one sequence (--seq-len {seq_len} + 2); use a longer file")
            self.train, self.val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
            self.name = f"{path.name} (uint16 memmap; last 5%, {n_val:,} tokens, held out)"
            default_tok = tokenizer_path_for(path) if tokenizer_path_for(path).is_file() else None
        self.path = path
        self.tokenizer, self.tokenizer_name = self._tokenizer(tokenizer or default_tok, vocab_size)

    def _too_large(self, name):
        refuse(f"--data {name} holds token id {self.top}, beyond --vocab-size {self.vocab_size}")

    def check_ids(self, device) -> None:
        """The largest id over every process's part of the file (one all-reduce), against --vocab-size."""
        if self.path is not None and dist.is_initialized():
            top = torch.tensor(self.top, device=device)
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            self.top = int(top.item())
            if self.top >= self.vocab_size:
                self._too_large(Path(self.path).name)

    @staticmethod
    def _tokenizer(source, vocab_size):
        if source is None:
            return None, "unknown (no bits per byte, no sample text)"
        if source == "book":
            sp, name = load_tokenizer(), "the book's"
        else:
            import sentencepiece as spm
            path = Path(source)
            if not path.is_file():
                refuse(f"--tokenizer {path} does not exist")
            try:
                sp, name = spm.SentencePieceProcessor(model_file=str(path)), path.name
            except (RuntimeError, OSError):
                refuse(f"--tokenizer {path.name} is not a SentencePiece model")
        if sp.get_piece_size() > vocab_size:  # ids past the embedding: IndexError on a CPU, an assert on a GPU
            refuse(f"--vocab-size {vocab_size:,} is smaller than {name} tokenizer's {sp.get_piece_size():,} ids; "
                   f"use --vocab-size {sp.get_piece_size()}")
        return sp, name

    def __len__(self):
        return len(self.train)
