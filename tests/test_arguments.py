"""The scripts' shared exit statuses and messages (code/arguments.py), and what a corpus problem does to a
script (data.load_tokens_or_exit)."""
import pytest

import arguments
import data


def test_fail_is_one_line_and_exit_2_for_a_bad_argument(capsys):
    with pytest.raises(SystemExit) as e:
        arguments.fail("--steps must be positive")
    assert e.value.code == arguments.BAD_ARGUMENT == 2
    assert capsys.readouterr() == ("", "error: --steps must be positive\n")
    with pytest.raises(SystemExit) as e:
        arguments.fail("this machine has no GPU", arguments.REFUSED)
    assert e.value.code == 1 and capsys.readouterr().err == "error: this machine has no GPU\n"


def demo_main(argv):
    parser = arguments.Parser(prog="demo")
    parser.add_argument("--n", type=arguments.positive_int, required=True)
    args = parser.parse_args(argv)
    if args.n == 13:
        arguments.fail("13 is refused", arguments.REFUSED)
    if args.n == 7:
        raise SystemExit("a text exit")  # what sys.exit("...") does: the text on stderr, status 1
    print("n =", args.n)


def test_run_main_shows_what_the_command_line_would():
    assert arguments.run_main(demo_main, ["--n", "2k"]) == (0, "n = 2000\n", "")
    assert arguments.run_main(demo_main, ["--n", "0"]) == (
        2, "", "demo: error: argument --n: '0' must be positive (see --help)\n")
    assert arguments.run_main(demo_main, ["--n", "13"]) == (1, "", "error: 13 is refused\n")
    assert arguments.run_main(demo_main, ["--n", "7"]) == (1, "", "a text exit\n")


def test_a_corpus_problem_ends_a_script_with_one_sentence_and_exit_1(tmp_path, capsys):
    broken = tmp_path / "corpus.txt"
    broken.write_bytes(b"\xff\xfe not UTF-8\n")
    with pytest.raises(SystemExit) as e:
        data.load_tokens_or_exit(broken)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("error: corpus file corpus.txt") and err.count("\n") == 1
