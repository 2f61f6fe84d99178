"""code/scaling.py, chapter 9's experiment that its four pages share: the record is read back as it was
written, it is kept apart per kernel cap, per code and per corpus, a page that finds it does not train again, and the
two noises are what chapter 9.1 defines."""
import pytest

import scaling
from train import History


def fake_run(d, val_loss, batch_losses, seconds=1.0):
    hist = History(train_loss=[9.0] * 4, val_steps=[2, 4][:len(val_loss)], val_loss=val_loss,
                   val_batch_losses=batch_losses, val_seconds=[0.5, 1.0][:len(val_loss)], seconds=seconds)
    return {"d": d, "hist": hist, "train_fixed": val_loss[-1] - 0.1, "bpb": val_loss[-1] / 2.4}


def fake_record():
    # 4 validation batches per evaluation here would be N_EVAL = 8 in the chapter; the halves are what matter
    runs = [fake_run(64, [6.0, 5.0], [[6.0] * 8, [5.2] * 4 + [4.8] * 4]),
            fake_run(96, [5.8, 4.6], [[5.8] * 8, [4.9] * 4 + [4.3] * 4])]
    return {"probe": {"threads": 2}, "precision": "fp32", "threads": 2, "steps": 4, "expected_s": 3.0, "train_s": 2.0,
            "runs": runs, "retrain": fake_run(64, [6.1, 4.97], [[6.1] * 8, [4.97] * 8]), "made": "2026-12-07 05:00"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(scaling, "CACHE_DIR", tmp_path)
    return tmp_path


def test_the_record_reads_back_as_written(cache):
    record = fake_record()
    scaling._save(record, scaling._path())
    back = scaling._load(scaling._path())
    assert back["runs"][1]["hist"] == record["runs"][1]["hist"] and isinstance(back["retrain"]["hist"], History)
    assert back["runs"][0]["bpb"] == record["runs"][0]["bpb"] and back["precision"] == "fp32"
    assert not list(cache.glob("*.tmp"))  # written to a temporary file, then renamed


def test_a_page_that_finds_the_record_does_not_train(cache, monkeypatch, capsys):
    scaling._save(fake_record(), scaling._path())
    monkeypatch.setattr(scaling, "probe", lambda *a: pytest.fail("run() trained although the record was there"))
    record = scaling.run()
    assert record["runs"][0]["hist"].val_loss == [6.0, 5.0]
    assert capsys.readouterr().out.startswith("the record of this chapter's experiment")  # one line, no training


def test_the_record_is_kept_apart_per_kernel_cap_code_and_corpus(cache, monkeypatch):
    native = scaling._path()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the portability run's AVX2 emulation trains its own
    assert scaling._path() != native
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert scaling._path() == native
    monkeypatch.setattr(scaling, "SOURCES", scaling.SOURCES[1:])  # other code: another key
    assert scaling._path() != native
    monkeypatch.undo()
    monkeypatch.setattr(scaling, "CACHE_DIR", cache)
    other = cache / "other.txt"
    other.write_text("another corpus", encoding="utf-8")
    monkeypatch.setattr(scaling, "CORPUS_PATH", other)  # another corpus: another key
    assert scaling._path() != native


def test_the_two_noises_are_chapter_9_1s():
    record = fake_record()
    noise, level = scaling.eval_noise(record["runs"])
    # at the second evaluation: gap on half A 5.2 - 4.9 = 0.3, on half B 4.8 - 4.3 = 0.5
    assert noise == pytest.approx(0.2) and level == pytest.approx(0.6)  # 4.9 - 4.3
    assert scaling.retrain_noise(record) == pytest.approx([0.1, 0.03])
