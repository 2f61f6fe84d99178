"""Turn UTF-8 text files into a flat file of uint16 token ids for `train_gpu.py --data`.

    python code/prepare_tokens.py corpus/*.txt --out data/big.bin              # the book's tokenizer
    python code/prepare_tokens.py corpus/*.txt --out data/big.bin --train-tokenizer --vocab-size 16384

Each non-empty line is one document: its tokens followed by the end-of-text id, as in the book's own
token files. The tokenizer is written beside the ids (data/big.tokenizer.model), where train_gpu.py
finds it for bits per byte and samples.

--train-tokenizer trains a new SentencePiece tokenizer on the reader's text first
(READER_TOKENIZER_SETTINGS): the trainer streams the lines once and keeps a random sample of
--sample-lines of them, so a corpus of many GB never has to fit in memory. Every line decodes back
to itself exactly (spaces, English, Chinese, emoji, any UTF-8), with one exception SentencePiece
cannot avoid: the character U+2581 "▁" is its space marker and decodes as a space; lines holding it
are counted and reported. Blank lines and line ends are not kept (eos marks the end of a line).

Every line is decoded again and compared with the original. The book's tokenizer was made for
全宋词 and has no ASCII space (it decodes as "▁"): text it cannot represent exactly stops the run
with how many lines and what share of the characters are affected, and nothing is written; train a
tokenizer on the text with --train-tokenizer, or write the lossy ids anyway with --allow-lossy.

The text is read line by line and encoded in chunks, and the ids are
appended to a temporary file that is renamed to --out at the end, so a corpus of many GB needs only a
chunk's worth of memory, and an interrupted run never leaves a half-written --out behind.
"""
import io
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import CorpusError, load_tokenizer, tokenizer_path_for  # noqa: E402
from script_support import Parser, atomic_write, fail, output_problem, positive_int  # noqa: E402

MAX_LINE_CHARS = 1 << 20  # a longer "line" is cut into pieces of this size rather than read whole


# A tokenizer trained on the reader's text: every line must decode to itself, ASCII spaces and
# English included. identity: no NFKC; no dummy prefix and no whitespace clean-up, so leading,
# trailing and repeated spaces survive; byte_fallback: any character the sample missed still
# encodes (as its UTF-8 bytes); required_chars "▁": the space marker is a piece even in a corpus
# sample without spaces, otherwise a space would fall back to the bytes of "▁" and decode as "▁".
READER_TOKENIZER_SETTINGS = dict(
    model_type="bpe",
    character_coverage=0.9995,  # the rarest characters go to byte fallback instead of taking ids
    byte_fallback=True,
    normalization_rule_name="identity",
    add_dummy_prefix=False,
    remove_extra_whitespaces=False,
    allow_whitespace_only_pieces=True,  # runs of spaces (indentation) can be one token
    required_chars="\u2581",
    split_digits=True,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
    max_sentence_length=1 << 14,  # longer lines are left out of the tokenizer's training sample only
    shuffle_input_sentence=True,
    hard_vocab_limit=False,  # a small corpus gets fewer ids than asked for rather than an error
)



def train_reader_tokenizer(lines, vocab_size: int, sample_lines: int = 1_000_000, num_threads: int = 1) -> bytes:
    """Train a SentencePiece tokenizer on an iterator of text lines; return the model's bytes.

    The trainer reads the iterator once and keeps a uniform random sample of sample_lines lines
    (input_sentence_size), so a corpus of many GB is streamed, never loaded whole."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, minloglevel=2, vocab_size=vocab_size,
        input_sentence_size=sample_lines, num_threads=num_threads, **READER_TOKENIZER_SETTINGS)
    return model.getvalue()


def iter_lines(path: Path):
    """Lines of a UTF-8 file without their newline, each at most MAX_LINE_CHARS characters."""
    with open(path, encoding="utf-8", newline="") as f:
        lineno = 0
        while True:
            try:
                line = f.readline(MAX_LINE_CHARS)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path.name} is not valid UTF-8 (after line {lineno}: {e.reason})") from None
            if not line:
                return
            lineno += 1
            yield line.rstrip("\r\n")


class Lossy(ValueError):
    """The tokenizer cannot represent some of the text exactly."""


def encode_files(paths, out: Path, chunk_chars: int = 1 << 22, sp=None, allow_lossy: bool = False) -> tuple:
    """Encode every file into `out` (uint16 ids); return (tokens written, lines that do not decode back
    to themselves, their characters, an example). Unless allow_lossy, a lossy line stops it: nothing is
    written, and the Lossy error says how much of the text is affected."""
    sp = sp or load_tokenizer()
    eos = sp.eos_id()
    if sp.get_piece_size() > 65536:
        raise ValueError(f"the tokenizer has {sp.get_piece_size()} ids; uint16 holds 65,536")
    total = 0
    lossy = {"lines": 0, "chars": 0, "example": None, "all_lines": 0, "all_chars": 0}
    with atomic_write(out) as f:  # only a complete file ever carries the final name
        def flush(lines):
            nonlocal total
            ids = sp.encode(lines)
            for line, back in zip(lines, sp.decode(ids)):  # what training on these ids could ever produce
                lossy["all_lines"] += 1
                lossy["all_chars"] += len(line)
                if back != line:
                    lossy["lines"] += 1
                    lossy["chars"] += len(line)
                    lossy["example"] = lossy["example"] or first_difference(line, back)
            flat = np.fromiter((t for seq in ids for t in (*seq, eos)), dtype=np.uint16,
                               count=sum(len(s) + 1 for s in ids))
            f.write(flat.tobytes())
            total += len(flat)

        for path in paths:
            pending, size = [], 0
            for line in iter_lines(Path(path)):
                if not line.strip():
                    continue
                pending.append(line)
                size += len(line)
                if size >= chunk_chars:  # encode and write a chunk, then forget it
                    flush(pending)
                    pending, size = [], 0
            if pending:
                flush(pending)
        if total == 0:  # raised inside the block: no empty --out is left behind
            raise ValueError("the input has no text (every line is blank)")
        if lossy["lines"] and not allow_lossy:
            raise Lossy(f"the tokenizer cannot represent {lossy['lines']:,} of {lossy['all_lines']:,} lines exactly "
                        f"({lossy['chars'] / lossy['all_chars']:.1%} of the characters are in lines that decode "
                        f"differently; e.g. {lossy['example']}); nothing was written: train a tokenizer on your text "
                        "with --train-tokenizer, or pass --allow-lossy to write the ids anyway")
    return total, lossy


def first_difference(line: str, back: str) -> str:
    """'a space decodes as '▁'': where a decoded line first differs from the original."""
    i = next((i for i, (a, b) in enumerate(zip(line, back)) if a != b), min(len(line), len(back)))
    return f"{line[i:i + 1]!r} at character {i + 1} decodes as {back[i:i + 1]!r}"


def text_lines(paths):
    """The non-blank lines of every file, streamed: what the tokenizer trains on."""
    for path in paths:
        for line in iter_lines(Path(path)):
            if line.strip():
                yield line


def train_tokenizer(paths, model_path: Path, vocab_size: int, sample_lines: int):
    """Train the reader's tokenizer on the inputs and write it (atomically) to model_path."""
    import sentencepiece as spm
    threads = min(8, os.cpu_count() or 1)
    try:
        model = train_reader_tokenizer(text_lines(paths), vocab_size, sample_lines, threads)
    except RuntimeError as e:  # the trainer's own complaint, e.g. a vocabulary too small for the characters
        raise ValueError(f"SentencePiece could not train the tokenizer: {str(e).strip().splitlines()[-1]}") from None
    with atomic_write(model_path) as f:
        f.write(model)
    return spm.SentencePieceProcessor(model_proto=model)


def main(argv=None):
    p = Parser(description="Encode UTF-8 text files into uint16 token ids (one document per line).")
    p.add_argument("inputs", nargs="+", help="UTF-8 text files")
    p.add_argument("--out", required=True, help="output file of uint16 ids, e.g. data/big.bin; the tokenizer "
                   "goes beside it (data/big.tokenizer.model)")
    p.add_argument("--chunk-chars", type=int, default=1 << 22, help="characters encoded per chunk")
    p.add_argument("--train-tokenizer", action="store_true", help="train a new tokenizer on the inputs "
                   "instead of using the book's")
    p.add_argument("--vocab-size", type=positive_int, default=16384, help="ids of the new tokenizer (at most "
                   "65,536 for uint16; at least the 256 byte pieces plus the corpus's characters)")
    p.add_argument("--allow-lossy", action="store_true", help="write the ids even where the tokenizer cannot "
                   "represent the text exactly (by default that stops with how much of the text is affected)")
    p.add_argument("--sample-lines", type=positive_int, default=1_000_000,
                   help="lines the tokenizer trainer samples from the corpus (bounds its memory)")
    args = p.parse_args(argv)
    if args.chunk_chars <= 0:
        p.error("--chunk-chars must be positive")
    if args.vocab_size > 65536:
        p.error(f"--vocab-size {args.vocab_size:,} does not fit uint16 ids (at most 65,536)")
    if args.sample_lines <= 100:
        p.error("--sample-lines must be above 100 (SentencePiece's minimum sample)")
    if args.vocab_size < 300:
        p.error(f"--vocab-size {args.vocab_size} is too small: byte fallback alone takes 256 ids")
    paths = [Path(x) for x in args.inputs]
    for path in paths:
        if not path.is_file():
            fail(f"input file {path} does not exist or is not a file")
    out = Path(args.out)
    for target in (out, None):
        target = target or tokenizer_path_for(out)  # only once --out is known to name a file
        problem = output_problem(target, "file")
        if problem:
            fail(f"--out {problem}")
        if target.resolve() in {x.resolve() for x in paths}:
            fail(f"--out would overwrite the input {target}")
    model_path = tokenizer_path_for(out)
    if all(path.stat().st_size == 0 for path in paths):
        fail("the input is empty: there is no text to encode")
    try:
        if args.train_tokenizer:
            sp = train_tokenizer(paths, model_path, args.vocab_size, args.sample_lines)
            print(f"trained a tokenizer of {sp.get_piece_size():,} ids on a sample of at most "
                  f"{args.sample_lines:,} lines: {model_path.name}")
        else:
            sp = load_tokenizer()
        n, lossy = encode_files(paths, out, args.chunk_chars, sp=sp, allow_lossy=args.allow_lossy)
        if not args.train_tokenizer:  # the book's tokenizer, beside the ids, so train_gpu.py finds it
            with atomic_write(model_path) as f:
                f.write(sp.serialized_model_proto())
    except (ValueError, CorpusError) as e:
        fail(str(e))
    chars = sum(path.stat().st_size for path in paths)
    print(f"wrote {n:,} tokens ({2 * n / 1e6:,.1f} MB) to {out.name} from {len(paths)} file(s), "
          f"{chars / 1e6:,.1f} MB of text")
    marked = sum("\u2581" in line for line in text_lines(paths)) if args.train_tokenizer else 0
    if marked:
        print(f"note: {marked:,} line(s) hold the character U+2581 '▁', which SentencePiece decodes as a space")
    if lossy["lines"]:
        print(f"warning: --allow-lossy: {lossy['lines']:,} of {lossy['all_lines']:,} lines "
              f"({lossy['chars'] / lossy['all_chars']:.1%} of the characters) do not decode back to themselves")


if __name__ == "__main__":
    main()
