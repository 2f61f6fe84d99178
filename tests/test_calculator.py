"""Chapter 12's calculator gives exactly what `python code/budget.py` gives.

The built book is served on 127.0.0.1 and opened in headless Chromium with every other request aborted
(the calculator must work offline, from the book's own _static). For N_CONFIGS seeded random
configurations (shapes, named models and --params alone, catalog and custom GPUs, both layouts,
checkpointing, tokens or tokens per parameter, the global batch, prices, the advanced flags, and about one
in ten invalid) the test fills the form, builds the command line itself from the configuration, runs
budget.main on it here in CPython, and asserts that the page shows exactly that text (or exactly that
one-line error and no figures), that the numbers it drew are budget.page's, and that no label in the
figures overlaps another or a memory line, as the browser renders them.

Needs Debian's chromium, like tests/test_browser.py (the build-and-serve fixtures are tests/conftest.py's).
"""
import json
import random
import re
import shlex
from urllib.parse import urlparse

import pytest

import arguments
import budget
import memory
from gpus import CATALOG

N_CONFIGS = 220
SEED = 7
PAGE = "chapters/12_2_plan.html"
FLAGS = [a for a in budget.build_parser()._actions if a.option_strings and a.dest != "help"]
SWITCHES = {max(a.option_strings, key=len) for a in FLAGS if a.nargs == 0}
ORDER = [max(a.option_strings, key=len) for a in FLAGS]
SCHEMES = [memory.SCHEME_NAMES[s] for s in memory.SCHEMES]  # the rows every plan has (HSDP's: only across machines)


def argv_of(config: dict) -> list:
    """The command line of a configuration, flags in the order budget.py declares them."""
    argv = []
    for flag in ORDER:
        if flag in config:
            argv += [flag] if flag in SWITCHES else [flag, config[flag]]
    return argv


def cli(argv: list) -> tuple:
    """(exit status, stdout, stderr) of budget.main(argv), as the command line would show them."""
    return arguments.run_main(budget.main, argv)


def shape_config(rng: random.Random) -> dict:
    head = rng.choice([32, 64, 64, 128])
    d_model = head * rng.choice([2, 4, 6, 8, 12, 16, 24, 32, 40, 64])
    c = {"--d-model": str(d_model), "--n-layer": str(rng.choice([2, 4, 12, 24, 32, 48, 80]))}
    if rng.random() < 0.35:
        c["--n-head"] = str(d_model // head)
    if rng.random() < 0.15:
        c["--params"] = rng.choice(["1.3B", "7e9", "350M"])  # the nominal size overrides the shape's count
    if rng.random() < 0.3:
        c["--checkpoint-activations"] = True
    return c


def random_config(rng: random.Random) -> dict:
    """One form filling: flag -> text typed into its box (True for a ticked switch)."""
    r = rng.random()
    if r < 0.65:
        c = shape_config(rng)
    elif r < 0.8:  # a named model: its shape, vocabulary and sequence length
        c = {"--model": rng.choice(list(budget.MODELS))}
        if rng.random() < 0.3:
            c["--checkpoint-activations"] = True
    else:
        c = {"--params": rng.choice(["124M", "1.3B", "7e9", "350000000", "13B", f"{rng.uniform(0.1, 70):.2f}B"])}
    if rng.random() < 0.35:
        c["--vocab-size"] = str(rng.choice([8192, 32000, 50257, 128256]))
    c["--gpus"] = str(rng.choice([1, 2, 4, 8, 8, 16, 64, 256, 1024, rng.randint(1, 300)]))
    r = rng.random()
    if r < 0.7:
        c["--gpu"] = rng.choice(CATALOG).name
    elif r < 0.78:
        c["--gpu"] = rng.choice(CATALOG).name.lower()  # the catalog ignores case
    else:
        c["--peak-tflops"] = rng.choice(["312", "989", "1979", "165.2", "2.5k"])
        if rng.random() < 0.6:
            c["--memory-gb"] = rng.choice(["24", "40", "80", "141"])
        if rng.random() < 0.5:
            c["--gpu"] = "MyGPU"  # a name outside the catalog is fine when the peak is given
    if "--memory-gb" not in c and rng.random() < 0.1:
        c["--memory-gb"] = "48"
    if rng.random() < 0.85:
        c["--mfu"] = rng.choice(["0.4", "0.35", "0.5", "45%", "0.2", "0.6"])
    r = rng.random()
    if r < 0.3:
        c["--tokens"] = rng.choice(["300B", "2e10", "1T", "5e9"])
    elif r < 0.6:
        c["--tokens-per-param"] = rng.choice(["20", "100", "200", "1.5"])
    if rng.random() < 0.9:
        c["--seq-len"] = str(rng.choice([128, 512, 1024, 2048, 4096, 8192]))
    if rng.random() < 0.9:
        c["--micro-batch"] = str(rng.choice([1, 2, 4, 8, 16, 32, 3]))
    layout = rng.choice(["", "autocast", "mixed"])
    if layout:
        c["--layout"] = layout
    if layout == "mixed" and rng.random() < 0.4:
        c["--fp32-grads"] = True
    if rng.random() < 0.4:
        c["--price-per-gpu-hour"] = rng.choice(["2.5", "0.6", "1.99", "4"])
    for flag, values in (("--grad-accum", ["1", "2", "8", "32"]), ("--link-gb-s", ["25", "64", "450"]),
                         ("--gpus-per-node", ["4", "8", "16"]), ("--node-link-gbit", ["100", "200", "400"])):
        if rng.random() < 0.2:
            c[flag] = rng.choice(values)
    if "--grad-accum" not in c and rng.random() < 0.25:  # the two are one choice (a mutually exclusive pair)
        c["--global-batch-tokens"] = rng.choice(["524288", "1M", "2e6", "300000", "4096"])
    return c


def invalid_config(rng: random.Random) -> dict:
    """A configuration the command line refuses, each with its own one-line message."""
    c = random_config(rng)
    kind = rng.randrange(12)
    if kind == 0:
        c["--mfu"] = rng.choice(["-0.3", "1.5", "150%", "abc"])
    elif kind == 1:  # a head count that does not divide d-model (or leaves odd heads)
        c.update({"--d-model": "768", "--n-layer": "12", "--n-head": rng.choice(["5", "7", "256"])})
    elif kind == 2:
        c.pop("--n-layer", None)
        c["--d-model"] = "1024"
    elif kind == 3:
        c["--fp32-grads"] = True
        c["--layout"] = "autocast"
    elif kind == 4:
        c.update({"--tokens": "1e9", "--tokens-per-param": "20"})
    elif kind == 5:
        c["--gpus"] = rng.choice(["0", "2.5", "-8"])
    elif kind == 6:
        c.pop("--peak-tflops", None)
        c["--gpu"] = "H300"
    elif kind == 7:
        for flag in ("--d-model", "--n-layer", "--n-head"):
            c.pop(flag, None)
        c.update({"--params": "1B", "--checkpoint-activations": True})
    elif kind == 8:
        c["--micro-batch"] = rng.choice(["-4", "0", "x"])
    elif kind == 9:  # a named model is a shape already
        c.update({"--model": rng.choice(list(budget.MODELS)), "--d-model": "768", "--n-layer": "12"})
    elif kind == 10:
        c.update({"--grad-accum": "4", "--global-batch-tokens": "1M"})
    else:
        c["--params"] = "1.3X"
    return c


def configurations(n: int = N_CONFIGS, seed: int = SEED) -> list:
    rng = random.Random(seed)
    return [(invalid_config(rng) if rng.random() < 0.1 else random_config(rng), rng.choice(SCHEMES))
            for _ in range(n)]


def test_the_configurations_cover_what_the_brief_asks():
    configs = [c for c, _ in configurations()]
    codes = [cli(argv_of(c))[0] for c in configs]
    assert len(configs) >= 200
    assert 0.06 < codes.count(2) / len(configs) < 0.2, "about one in ten should be refused"
    ok = [c for c, code in zip(configs, codes) if code == 0]
    for wanted in ("--d-model", "--n-head", "--peak-tflops", "--memory-gb", "--tokens", "--tokens-per-param",
                   "--price-per-gpu-hour", "--checkpoint-activations", "--fp32-grads", "--grad-accum",
                   "--link-gb-s", "--gpus-per-node", "--node-link-gbit", "--vocab-size", "--model",
                   "--global-batch-tokens"):
        assert sum(wanted in c for c in ok) >= 5, wanted
    assert sum("--d-model" not in c for c in ok) >= 10, "--params alone"
    assert {c.get("--layout", "") for c in ok} == {"", "autocast", "mixed"}


# ---- the page ----

FILL = """([config, scheme]) => {
  const form = document.querySelector('#budget-calculator form');
  for (const input of form.querySelectorAll('[data-flag]')) {
    const flag = input.dataset.flag;
    if (input.type === 'checkbox') input.checked = config[flag] === true;
    else input.value = flag in config ? config[flag] : '';
    input.dispatchEvent(new Event(input.tagName === 'SELECT' || input.type === 'checkbox' ? 'change' : 'input', {bubbles: true}));
  }
  const select = form.querySelector('[data-role=scheme]');
  select.value = scheme;
  select.dispatchEvent(new Event('change', {bubbles: true}));
  window.budgetCalculator.flush();  // the whole form at once: no need to wait out the typing debounce
}"""

SHOWN = """() => {
  const root = document.getElementById('budget-calculator');
  const out = root.querySelector('pre.calc-output'), err = root.querySelector('.calc-error');
  const svgs = [...root.querySelectorAll('.calc-plots svg')];
  return {
    last: window.budgetCalculator.last,
    command: root.querySelector('pre.calc-command').textContent,
    output: out.hidden ? null : out.textContent,
    error: err.hidden ? null : err.textContent,
    svgs: svgs.length,
    labelled: svgs.every(s => s.getAttribute('role') === 'img' && s.getAttribute('aria-label').length > 20),
    segments: [...root.querySelectorAll('.calc-plots rect[data-part]')].map(r =>
      [r.closest('[data-scheme]').dataset.scheme, r.dataset.part, Number(r.dataset.gb)]),
    series: [...root.querySelectorAll('.calc-plots polyline[data-series]')].map(p => p.dataset.series),
    selectedBar: [...root.querySelectorAll('.calc-bar.calc-selected')].map(g => g.dataset.scheme),
    marked: [...root.querySelectorAll('mark.calc-hl')].map(m => m.textContent),
    overlaps: svgs.flatMap(svg => {  // rendered text (its box's middle 70 %, about the ink) against text and lines
      const boxes = [...svg.querySelectorAll('text')].filter(t => !t.hasAttribute('transform')).map(t => {
        const b = t.getBBox();
        return [b.x, b.y + 0.15 * b.height, b.x + b.width, b.y + 0.85 * b.height, t.textContent];
      });
      const lines = [...svg.querySelectorAll('line.calc-limit')].map(l =>
        [Number(l.getAttribute('x1')), Number(l.getAttribute('x2')), Number(l.getAttribute('y1'))]);
      return boxes.flatMap((a, i) => [
        ...boxes.slice(i + 1).filter(b => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]).map(b => `${a[4]} / ${b[4]}`),
        ...lines.filter(([x1, x2, y]) => a[0] < x2 && x1 < a[2] && a[1] < y + 0.65 && y - 0.65 < a[3]).map(l => `${a[4]} / line at ${l[2]}`)]);
    }),
  };
}"""


def open_calculator(site, browser, width, height):
    """The chapter's page with the calculator loaded; every request that is not to the local server fails."""
    context = browser.new_context(viewport={"width": width, "height": height})
    blocked, errors = [], []
    local = urlparse(site).netloc

    def route(r):
        if urlparse(r.request.url).netloc == local:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site}/{PAGE}")
    page.locator("#budget-calculator").scroll_into_view_if_needed()  # it loads as the reader gets near
    page.wait_for_function("['ready', 'unavailable', 'failed'].includes(window.budgetCalculator.state)",
                           timeout=120_000)
    state = page.evaluate("window.budgetCalculator.state")
    assert state == "ready", page.locator("#budget-calculator .calc-status").inner_text()
    yield page
    context.close()
    assert not errors, f"console errors: {errors}"
    assert not blocked, f"the page asked for something outside the book: {blocked}"


@pytest.fixture(scope="module")
def calculator(site, browser):
    yield from open_calculator(site, browser, 1280, 900)


def test_the_form_explains_each_flag_in_chinese(calculator):
    """Each field's help is calculator.js's Chinese (HELP), not budget.py's English --help, with every
    {placeholder} filled."""
    helps = calculator.eval_on_selector_all(
        "#budget-calculator .calc-field", "fs => fs.map(f => [f.querySelector('[data-flag]')?.dataset.flag, "
        "f.querySelector(':scope > small')?.textContent || ''])")
    assert {flag for flag, _ in helps} >= set(ORDER), helps
    english = [(flag, text) for flag, text in helps if flag and (not re.search("[\u4e00-\u9fff]", text) or "{" in text)]
    assert not english, f"fields whose help is not Chinese: {english}"


def shows(page, config, scheme, by_hand=False):
    """Fill the form with a configuration, wait for its result, return what the page shows."""
    argv = argv_of(config)
    if by_hand:  # as a reader does it, field by field (slower: one round trip per field)
        if not page.evaluate("document.querySelector('#budget-calculator details').open"):
            page.locator("#budget-calculator details summary").click()  # the advanced fold
        for flag in ORDER:
            box = page.locator(f'#budget-calculator [data-flag="{flag}"]')
            if flag in SWITCHES:
                box.set_checked(config.get(flag) is True)
            elif box.evaluate("e => e.tagName") == "SELECT":
                box.select_option(config.get(flag, ""))
            else:
                box.fill(config.get(flag, ""))
        page.locator("#budget-calculator [data-role=scheme]").select_option(scheme)
    else:
        page.evaluate(FILL, [config, scheme])
    page.wait_for_function("argv => { const c = window.budgetCalculator; return !c.pending && c.last"
                           " && JSON.stringify(c.last.argv) === argv; }", arg=json.dumps(argv, separators=(",", ":")), timeout=30_000)
    return page.evaluate(SHOWN)


def check(shown, config, scheme):
    argv = argv_of(config)
    code, stdout, stderr = cli(argv)
    assert shown["last"]["argv"] == argv
    assert shown["command"] == "python code/budget.py " + shlex.join(argv)  # a reader can paste it
    if code:
        assert shown["error"] == stderr.strip() and "\n" not in stderr.strip()
        assert shown["output"] is None and shown["svgs"] == 0 and not shown["segments"], "figures beside an error"
        return "error"
    assert shown["error"] is None
    assert shown["output"] == stdout
    expected = json.loads(json.dumps(budget.page(argv)))
    assert shown["last"]["page"] == expected
    drawn = [[s, part, gb] for s, parts in expected["memory"].items() for part, gb in parts.items() if gb > 0]
    assert sorted(shown["segments"]) == sorted(drawn)
    comm = [f"{s} + comm" for s, v in expected["sweep"]["hours_with_comm"].items() if None not in v]
    costs = ["cost"] + [f"{s} cost + comm" for s, v in expected["sweep"]["cost_with_comm"].items() if None not in v]
    assert shown["series"] == ["compute only", *comm] + (costs if None not in expected["sweep"]["cost"] else [])
    assert shown["labelled"] and shown["svgs"] == 2 - (not drawn)  # without a shape: no memory plot
    if drawn:  # one GPU has DDP's bar alone (budget.budget_schemes)
        assert shown["selectedBar"] == ([scheme] if scheme in expected["memory"] else [])
    marked = [m.removesuffix("\n") for m in shown["marked"]]  # a mark may hold its line's newline or not
    assert marked == [line for line in stdout.splitlines() if line.startswith(f"  {scheme} ")]
    assert not shown["overlaps"], "labels overlap in the figures"  # budget.memory_figure's promise, rendered
    return "text"


def test_the_page_equals_the_command_line(calculator):
    kinds = []
    for i, (config, scheme) in enumerate(configurations()):
        shown = shows(calculator, config, scheme, by_hand=i % 20 == 0)
        try:
            kinds.append(check(shown, config, scheme))
        except AssertionError as e:
            raise AssertionError(f"configuration {i}: python code/budget.py {' '.join(argv_of(config))}") from e
    assert len(kinds) >= 200 and kinds.count("error") >= 10 and kinds.count("text") >= 180


def test_the_sliders_move_the_figures(calculator):
    """Dragging the GPU slider rewrites the box beside it and the command line, by powers of two."""
    calculator.evaluate(FILL, [{"--d-model": "2048", "--n-layer": "20", "--gpus": "8", "--micro-batch": "8"}, "DDP"])
    calculator.locator('#budget-calculator [data-slider-for="--gpus"]').fill("6")
    calculator.locator('#budget-calculator [data-slider-for="--micro-batch"]').fill("2")
    config = {"--d-model": "2048", "--n-layer": "20", "--gpus": "64", "--micro-batch": "4"}
    calculator.wait_for_function("() => !window.budgetCalculator.pending && window.budgetCalculator.last.argv"
                                 ".join(' ') === '--d-model 2048 --n-layer 20 --gpus 64 --micro-batch 4'")
    assert check(calculator.evaluate(SHOWN), config, "DDP") == "text"


# ---- a named model on the form as it loads ----
# The form opens on the chapter's example (a shape, --seq-len 2048, --micro-batch 8). Choosing a named
# --model there must give what that model gives on the command line: its own shape and context, and
# its own micro-batch where the reference table gives one (7B: 2), not what the example left in the boxes.

LOADED = {"--d-model": "2048", "--n-layer": "20", "--gpus": "8", "--gpu": "H100", "--mfu": "0.4",
          "--seq-len": "2048", "--micro-batch": "8"}  # calculator.js's INITIAL


def choose_model(page, model, then=()):
    """The loaded form, then --model chosen as a reader does, then the (flag, value) pairs typed."""
    page.evaluate(FILL, [LOADED, "DDP"])
    page.locator('#budget-calculator [data-flag="--model"]').select_option(model)
    for flag, value in then:
        page.locator(f'#budget-calculator [data-flag="{flag}"]').fill(value)
    page.wait_for_function("() => !window.budgetCalculator.pending")
    return page.evaluate(SHOWN)


def test_a_named_model_on_the_loaded_form_is_the_command_lines(calculator):
    shown = choose_model(calculator, "124M", [("--gpus", "1"), ("--gpu", "RTX3060")])
    argv = shown["last"]["argv"]
    assert argv == ["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--mfu", "0.4"], argv
    code, stdout, _ = cli(argv)  # the form's command line (its note names it, --mfu 0.4 included)
    assert code == 0 and shown["output"] == stdout and "11.41" in stdout
    bare = cli(["--model", "124M", "--gpus", "1", "--gpu", "RTX3060"])[1]  # the same run, typed bare
    assert bare.replace(" --mfu 0.4", "") == stdout.replace(" --mfu 0.4", "")
    config = {argv[i]: argv[i + 1] for i in range(0, len(argv), 2)}
    assert check(shown, config, "DDP") == "text"


@pytest.mark.parametrize("model", ["7B", "1.3B", "350M", "book-29M"])
def test_a_named_model_sets_its_own_micro_batch(calculator, model):
    shown = choose_model(calculator, model)
    argv = shown["last"]["argv"]
    own = budget.MODELS[model].micro_batch
    own = str(own) if own != budget.NamedModel.micro_batch else None
    expected = ["--model", model, "--gpus", "8", "--gpu", "H100", "--mfu", "0.4"]
    assert argv == expected + (["--micro-batch", own] if own else []), argv
    if model == "7B":
        assert own == "2"
    typed = cli(["--model", model, "--gpus", "8", "--gpu", "H100", "--mfu", "0.4"])[1]  # no --micro-batch typed
    same = [line for line in typed.splitlines() if "code/budget.py" not in line]  # notes echo the argv
    assert same == [line for line in cli(argv)[1].splitlines() if "code/budget.py" not in line]
    config = {argv[i]: argv[i + 1] for i in range(0, len(argv), 2)}
    assert check(shown, config, "DDP") == "text"


# ---- one GPU: one row and one bar; the time plot's key does not repeat one number per scheme ----

SEED_12GB = {"--model": "124M", "--gpus": "1", "--gpu": "RTX3060", "--seq-len": "1024", "--micro-batch": "8"}
KEY = """() => [...[...document.querySelectorAll('#budget-calculator .calc-plots svg')].pop()
  .querySelectorAll('text.calc-tick')].map(t => t.textContent)"""  # the time plot's key and ticks


def test_one_gpu_shows_one_row_one_bar_and_says_why(calculator):
    shown = shows(calculator, SEED_12GB, "ZeRO-2")  # a scheme one GPU has no row of: nothing is marked
    assert check(shown, SEED_12GB, "ZeRO-2") == "text"
    assert {scheme for scheme, _, _ in shown["segments"]} == {"DDP"} and budget.ONE_GPU_LINE in shown["output"]
    key = calculator.evaluate(KEY)
    assert "at 1 GPU: no comm, all equal" in key and "ZeRO-1 + comm" in key, " / ".join(key)
    assert not [t for t in key if " + comm: " in t], f"one number per scheme, all the same: {key}"
    shown = shows(calculator, {**SEED_12GB, "--gpus": "2"}, "ZeRO-2")  # two GPUs: a row and a value each
    assert {scheme for scheme, _, _ in shown["segments"]} == set(SCHEMES)
    assert "ZeRO-2 + comm: " in " ".join(calculator.evaluate(KEY))


# ---- a phone (390 px): the tables keep their columns, the plots' labels stay legible ----

PHONE = """() => {
  const root = document.getElementById('budget-calculator'), out = root.querySelector('pre.calc-output');
  // each printed line, found in the text however the page wraps it in elements: the lines it is laid out on
  const walker = document.createTreeWalker(out, NodeFilter.SHOW_TEXT), lines = [];
  for (let node; (node = walker.nextNode());) {
    let at = 0;
    for (const part of node.data.split('\\n')) {
      if (part.startsWith('  ')) {
        const r = document.createRange(); r.setStart(node, at); r.setEnd(node, at + part.length);
        const tops = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        lines.push([part, tops.size]);
      }
      at += part.length + 1;
    }
  }
  const boxes = [...root.querySelectorAll('.calc-plots svg')].map(svg => svg.parentElement);
  return {
    page: document.documentElement.scrollWidth, viewport: window.innerWidth,
    right: root.getBoundingClientRect().right,
    rows: lines, outputScrolls: out.scrollWidth > out.clientWidth,
    // the size a label is seen at: its font size times the plot's shown width over its drawn width
    labels: [...root.querySelectorAll('.calc-plots svg')].flatMap(svg => {
      const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
      return [...svg.querySelectorAll('text')].map(t => [t.textContent, parseFloat(getComputedStyle(t).fontSize) * scale]);
    }),
    hints: boxes.map(b => [b.scrollWidth > b.clientWidth + 1, getComputedStyle(b, '::before').content]),
  };
}"""


@pytest.fixture(scope="module")
def phone(site, browser):
    yield from open_calculator(site, browser, 390, 844)


@pytest.mark.parametrize("config", [
    SEED_12GB,
    {"--model": "7B", "--gpus": "64", "--gpu": "H100", "--micro-batch": "2", "--price-per-gpu-hour": "2"},
])
def test_on_a_phone_the_tables_keep_their_columns_and_the_labels_stay_legible(phone, config):
    shown = shows(phone, config, "DDP")
    assert check(shown, config, "DDP") == "text"
    m = phone.evaluate(PHONE)
    assert m["page"] <= m["viewport"] and m["right"] <= m["viewport"], "the calculator is wider than the phone"
    wrapped = [row for row, shown_on in m["rows"] if shown_on != 1]
    assert len(m["rows"]) >= 2 and not wrapped, f"table rows wrapped onto more than one line at 390 px: {wrapped}"
    small = [(t, round(px, 1)) for t, px in m["labels"] if px < 10 - 1e-6]
    assert m["labels"] and not small, f"plot labels shown below 10 px at 390 px: {small[:5]}"
    assert m["outputScrolls"]  # the rows are wider than a phone: their box scrolls, the page does not
    assert all(scrolls and "滑动" in hint for scrolls, hint in m["hints"]), m["hints"]
