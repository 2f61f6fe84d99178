"""Regenerate data/songci.txt from the npm package chinese-poetry@2.0.1.

Usage:
    python data/make_corpus.py                 # runs `npm pack chinese-poetry@2.0.1` in a temp dir
    python data/make_corpus.py --tarball PATH  # uses a tarball you already have

One ci per line: ``词牌｜作者｜正文`` where 正文 is the ci's ``paragraphs`` joined with no
separator (each paragraph already ends in punctuation). Files are read in numeric order,
ci.song.0.json … ci.song.21000.json; ci.song.2019y.json is skipped (3 items, partly in
traditional script).
"""
import argparse
import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "chinese-poetry@2.0.1"
SEP = "｜"  # U+FF5C, absent from the corpus, so a line splits back unambiguously
OUT = Path(__file__).resolve().parent / "songci.txt"


def ci_lines(tar: tarfile.TarFile):
    pattern = re.compile(r"package/dist/songci/ci\.song\.(\d+)\.json")
    members = sorted(
        (int(m.group(1)), info)
        for info in tar.getmembers()
        if (m := pattern.fullmatch(info.name))
    )
    if len(members) != 22:
        raise SystemExit(f"expected 22 ci.song.<N>.json files in the tarball, found {len(members)}")
    for _, info in members:
        for ci in json.load(tar.extractfile(info)):
            fields = [ci["rhythmic"], ci["author"], "".join(ci["paragraphs"])]
            if any(SEP in f or "\n" in f for f in fields):
                raise SystemExit(f"unexpected separator or newline in {fields!r}")
            yield SEP.join(fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tarball", type=Path, help="chinese-poetry-2.0.1.tgz from `npm pack`")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tarball = args.tarball
        if tarball is None:
            subprocess.run(["npm", "pack", PACKAGE], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
            tarball = Path(tmp) / "chinese-poetry-2.0.1.tgz"
        if not tarball.is_file():
            ap.exit(2, f"error: --tarball {tarball} is not a file\n")  # a bad argument
        with tarfile.open(tarball) as tar:
            lines = list(ci_lines(tar))
    tmp_out = OUT.with_suffix(".tmp")
    tmp_out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp_out, OUT)
    chars = sum(len(line.split(SEP, 2)[2]) for line in lines)
    print(f"wrote {OUT.name}: {len(lines)} ci, {chars} characters of text")


if __name__ == "__main__":
    main()
