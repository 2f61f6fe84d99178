"""Turn UTF-8 text files into a flat file of uint16 token ids for `train_gpu.py --data`.

    python code/prepare_tokens.py corpus/*.txt --out data/big.bin

Each non-empty line is one document: its tokens (the book's tokenizer) followed by the end-of-text id,
as in the book's own token files. The text is read line by line and encoded in chunks, and the ids are
appended to a temporary file that is renamed to --out at the end, so a corpus of many GB needs only a
chunk's worth of memory, and an interrupted run never leaves a half-written --out behind.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import load_tokenizer  # noqa: E402
from script_support import Parser, atomic_write, fail  # noqa: E402

MAX_LINE_CHARS = 1 << 20  # a longer "line" is cut into pieces of this size rather than read whole


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


def encode_files(paths, out: Path, chunk_chars: int = 1 << 22, sp=None) -> int:
    """Encode every file into `out` (uint16 ids); return the number of tokens written."""
    sp = sp or load_tokenizer()
    eos = sp.eos_id()
    if sp.get_piece_size() > 65536:
        raise ValueError(f"the tokenizer has {sp.get_piece_size()} ids; uint16 holds 65,536")
    total = 0
    with atomic_write(out) as f:  # only a complete file ever carries the final name
        def flush(lines):
            nonlocal total
            ids = sp.encode(lines)
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
    return total


def main(argv=None):
    p = Parser(description="Encode UTF-8 text files into uint16 token ids (one document per line).")
    p.add_argument("inputs", nargs="+", help="UTF-8 text files")
    p.add_argument("--out", required=True, help="output file of uint16 ids, e.g. data/big.bin")
    p.add_argument("--chunk-chars", type=int, default=1 << 22, help="characters encoded per chunk")
    args = p.parse_args(argv)
    if args.chunk_chars <= 0:
        p.error("--chunk-chars must be positive")
    paths = [Path(x) for x in args.inputs]
    for path in paths:
        if not path.is_file():
            fail(f"input file {path} does not exist")
    out = Path(args.out)
    if out.resolve() in {x.resolve() for x in paths}:
        fail("--out must not be one of the inputs")
    try:
        n = encode_files(paths, out, args.chunk_chars)
    except ValueError as e:
        fail(str(e))
    chars = sum(path.stat().st_size for path in paths)
    print(f"wrote {n:,} tokens ({2 * n / 1e6:,.1f} MB) to {out.name} from {len(paths)} file(s), {chars / 1e6:,.1f} MB of text")


if __name__ == "__main__":
    main()
