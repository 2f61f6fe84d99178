/* Chapter 12's budget calculator: code/budget.py itself, run in the browser by Pyodide.
 *
 * The form is built from budget.build_parser() (every flag, its choices, default and help), the text is
 * what budget.main(argv) prints, and the two plots draw budget.page(argv): the memory figure exactly as
 * budget.memory_figure laid it out (every bar, line and label in pixels), the time plot from its sweep.
 * Nothing here computes a figure. The runtime and the modules come from this build's _static (bookbuild/pyodide.py), never a CDN.
 * window.budgetCalculator exposes the state and the last result (tests/test_calculator.py reads it).
 */
(function () {
  "use strict";
  const STATIC = new URL(".", document.currentScript.src);  // this file lives in _static/
  // state: idle, loading, ready, unavailable, file, failed; pending: an input awaits its debounced run
  const api = (window.budgetCalculator = { state: "idle", runs: 0, pending: false, last: null });

  // ---- how the form presents the parser's flags (labels, grouping, sliders); not what they mean ----
  const LABELS = {
    "--model": "命名模型", "--params": "参数量 N", "--d-model": "宽度 d", "--n-layer": "层数 L", "--n-head": "注意力头数",
    "--vocab-size": "词表大小 V", "--gpus": "GPU 数量", "--gpu": "GPU 型号", "--peak-tflops": "自定义峰值（TFLOP/s）",
    "--memory-gb": "自定义显存（GB）", "--mfu": "MFU", "--tokens-per-param": "每个参数的 token 数",
    "--tokens": "训练 token 数 D", "--seq-len": "序列长 T", "--micro-batch": "微批次 b", "--layout": "精度布局",
    "--fp32-grads": "fp32 梯度", "--checkpoint-activations": "激活检查点", "--price-per-gpu-hour": "每 GPU 小时的价格",
    "--grad-accum": "梯度累积步数", "--link-gb-s": "卡间带宽（GB/s，单向）", "--gpus-per-node": "每台机器的 GPU 数",
    "--node-link-gbit": "机间网口（Gb/s）", "--grad-sync": "FSDP 累积时的梯度同步",
    "--global-batch-tokens": "全局批次（token/步）",
  };
  // Each flag's help in Chinese: budget.py's --help says the same in English for the command line. A {name}
  // is filled from what budget.py says (the flag's default, or describe's numbers), so no figure is typed
  // twice; a flag without an entry shows its English help (tests/test_calculator.py wants one for each).
  const HELP = {
    "--model": "命名模型：定下形状、词表和上下文长度（也是 --seq-len 的默认值）。或者用 --d-model 和 --n-layer 给出形状",
    "--params": "参数量 N（如 1.3e9 或 1.3B）；默认由形状算出",
    "--d-model": "宽度 d（和 --n-layer 一起给出形状，用来算 FLOPs 和显存）",
    "--n-layer": "层数 L",
    "--n-head": "注意力头数（默认 d-model / 64）",
    "--vocab-size": "词表大小 V：决定 logits 的大小，由形状推算 N 时也要用它。默认：命名模型自己的；形状恰是某个命名模型的，" +
      "按那个模型算（768 × 12 是 GPT-2 124M：{gpt2_vocab}）；其余形状用 {book_vocab}，即本书的分词器和 train_gpu.py 的默认值。" +
      "输出里写明用了哪个",
    "--gpus": "GPU 数量（默认 {default}）",
    "--gpu": "目录里的 GPU 型号（列表里有每种的峰值和显存）",
    "--peak-tflops": "每张 GPU 的 16 位稠密峰值，TFLOP/s（覆盖 --gpu 的）",
    "--memory-gb": "每张 GPU 的显存，GB（覆盖 --gpu 的）",
    "--mfu": "模型 FLOPs 利用率，0 到 1 之间（默认 {default}）",
    "--tokens-per-param": "训练 token 数 D = 这个数 × N（默认 {default}，Chinchilla 的比例）",
    "--tokens": "训练 token 数 D（如 20e9 或 20B）",
    "--seq-len": "序列长度 T（默认：命名模型的上下文长度，其余 {seq_len}）",
    "--micro-batch": "每张 GPU 一次前向的序列数（默认：命名模型自己的，{named_micro}；其余 {micro_batch}）",
    "--layout": "状态的精度布局：autocast（fp32 权重，和 train_gpu.py 一样；默认）或 mixed（bf16 权重和梯度加 fp32 主权重，" +
      "ZeRO 论文的每参数 16 字节；Megatron-LM 保留 fp32 梯度：再勾选 --fp32-grads）",
    "--fp32-grads": "配合 --layout mixed：fp32 梯度（每参数 18 字节）",
    "--checkpoint-activations": "按块做激活检查点（train_gpu.py --checkpoint-activations）",
    "--price-per-gpu-hour": "一张 GPU 租一小时的价格",
    "--global-batch-tokens": "所有 GPU 一个优化器步的 token 数；累积步数取最接近它的整数个微批次。默认：GPT-3 对最接近的大小用的批次" +
      "（Brown 等 2020，表 2.1），取整到 2^18 的倍数",
    "--grad-accum": "每张 GPU 每个优化器步的微批次数（默认由 --global-batch-tokens 算出）",
    "--grad-sync": "FSDP 在累积时怎么同步梯度：last = 攒着整份 fp32 梯度，最后一个微批次才 reduce-scatter（train_gpu.py 的默认）；" +
      "every = 每个微批次都 reduce-scatter（torchtitan 的做法）；auto（默认）= 放得下就 last，否则 every",
    "--link-gb-s": "一张 GPU 向其他卡发送的带宽，GB/s，单向（默认：code/gpus.py 里这种 GPU 的互连）",
    "--gpus-per-node": "一台机器里的 GPU 数（默认 {default}）；更多的 GPU 跨机器",
    "--node-link-gbit": "机器之间每张 GPU 的网口，Gb/s（默认 {default}，InfiniBand NDR）",
  };
  // Flags in no section go to the "advanced" fold, so a flag added to budget.py shows up there by itself.
  const SECTIONS = [
    ["模型", ["--model", "--params", "--d-model", "--n-layer", "--vocab-size"]],
    ["硬件", ["--gpus", "--gpu", "--peak-tflops", "--memory-gb", "--mfu"]],
    ["数据与批次", ["--tokens-per-param", "--tokens", "--seq-len", "--micro-batch", "--global-batch-tokens"]],
    ["显存与价格", ["--layout", "--checkpoint-activations", "--price-per-gpu-hour"]],
  ];
  const SLIDERS = {  // log2: the slider moves by powers of two, the box beside it takes any value
    "--gpus": { min: 0, max: 12, log2: true }, "--micro-batch": { min: 0, max: 7, log2: true },
    "--seq-len": { min: 7, max: 15, log2: true }, "--mfu": { min: 0.05, max: 0.8, step: 0.01 },
  };
  // The chapter's own example (8 × H100, a 1B model on the book's tokenizer): python code/budget.py --d-model 2048 --n-layer 20 ...
  const INITIAL = { "--d-model": "2048", "--n-layer": "20", "--gpus": "8", "--gpu": "H100", "--mfu": "0.4",
                    "--seq-len": "2048", "--micro-batch": "8" };
  // What a named --model decides itself: emptied when the reader chooses one (the micro-batch is set apart)
  const NAMED_MODEL_CLEARS = ["--params", "--d-model", "--n-layer", "--n-head", "--vocab-size", "--seq-len"];
  const PART_COLORS = ["#3b6fb6", "#6d9fd8", "#a3c4ea", "#3f8f4e", "#7fb86a", "#b5d88e", "#8e6bb8",
                       "#d9722b", "#f0ae6e", "#b04a5a", "#777777", "#c9b037"];
  const SCHEME_COLORS = ["#3b6fb6", "#d9722b", "#3f8f4e", "#b04a5a", "#8e6bb8"];
  const DEBOUNCE_MS = 150;
  // A plot is never shown narrower than this share of its drawn width: its 11-px labels stay at 10 px or
  // more (calculator.css: .calc-tick); on a phone it scrolls sideways in its box instead of shrinking.
  const LEGIBLE_SCALE = 10 / 11;

  const GLUE = `
import json, sys
sys.path.insert(0, "/calculator")
import arguments, budget, gpus, memory

def calculator_describe():
    parser = budget.build_parser()
    exclusive = {id(a): i for i, g in enumerate(parser._mutually_exclusive_groups) for a in g._group_actions}
    flags = []
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        flags.append(dict(flag=max(a.option_strings, key=len), switch=a.nargs == 0,
                          choices=[str(c) for c in a.choices] if a.choices else None,
                          default=None if a.default is None or a.nargs == 0 else str(a.default),
                          help=a.help or "", group=exclusive.get(id(a))))
    # a named model's own micro-batch where it is not the parser's plain default (budget.NamedModel):
    # --micro-batch's default for that model at the terminal too, so an empty box means the same
    plain = budget.NamedModel.micro_batch
    models = {k: dict(micro_batch=str(m.micro_batch) if m.micro_batch != plain else None)
              for k, m in budget.MODELS.items()}
    numbers = dict(gpt2_vocab=f"{budget.GPT2_VOCAB:,}", book_vocab=f"{budget.BOOK_VOCAB:,}",
                   seq_len=str(budget.DEFAULT_SEQ_LEN), micro_batch=str(plain),
                   named_micro="，".join(f"{k} {m.micro_batch}" for k, m in budget.MODELS.items()
                                        if m.micro_batch != plain))
    return json.dumps(dict(flags=flags, schemes=list(memory.SCHEME_NAMES.values()), models=models, numbers=numbers,
                           gpus=[dict(name=g.name, tflops=g.peak_flops / 1e12, memory_gb=g.memory_gb)
                                 for g in gpus.CATALOG]))

def calculator_run(argv_json):
    argv = json.loads(argv_json)
    try:
        code, out, err = arguments.run_main(budget.main, argv)
        if code != 0:  # what the command line would show on stderr: one line
            return json.dumps(dict(argv=argv, ok=False, stdout="", error=err.strip() or str(code), page=None))
        return json.dumps(dict(argv=argv, ok=True, stdout=out, error="",
                               page=budget.page(argv) if argv else None))
    except Exception as e:  # a bug in budget.py: the command line ends its traceback with this line
        return json.dumps(dict(argv=argv, ok=False, stdout="", error=f"{type(e).__name__}: {e}", page=None))
`;

  // ---- small DOM helpers ----
  const SVG = "http://www.w3.org/2000/svg";
  function h(tag, attrs, ...children) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
    return node;
  }
  const fmt = (x, digits = 3) => (x === null || x === undefined ? "?"
    : x.toLocaleString("en-US", { maximumSignificantDigits: digits }));

  function showMessage(root, text, kind) {
    const status = root.querySelector(".calc-status");
    status.textContent = text;
    status.className = "calc-status" + (kind ? " calc-status-" + kind : "");
  }

  // ---- loading: only over HTTP, only when this build carries the runtime, only when the reader gets near ----
  async function load(root) {
    api.state = "loading";
    const manifestResponse = await fetch(new URL("calculator/manifest.json", STATIC), { cache: "no-cache" }).catch(() => null);
    if (!manifestResponse || !manifestResponse.ok) {
      return unavailable(root, "这次构建没有生成计算器的文件，计算器不可用。");
    }
    const manifest = await manifestResponse.json();
    if (!manifest.available) {
      return unavailable(root, `这次构建没有带上 Pyodide，计算器不可用：${manifest.reason}。`);
    }
    showMessage(root, `正在加载 Pyodide ${manifest.pyodide}（约 13 MB，浏览器会缓存）和 code/budget.py……`);
    const base = new URL("pyodide/", STATIC);
    const { loadPyodide } = await import(new URL("pyodide.mjs", base).href);
    const py = await loadPyodide({ indexURL: base.href });
    py.FS.mkdirTree("/calculator");
    for (const name of manifest.modules) {
      const r = await fetch(new URL("calculator/code/" + name, STATIC), { cache: "no-cache" });
      if (!r.ok) throw new Error(`${name}: HTTP ${r.status}`);
      py.FS.writeFile("/calculator/" + name, await r.text());
    }
    py.runPython(GLUE);
    const describe = JSON.parse(py.globals.get("calculator_describe")());
    const run = py.globals.get("calculator_run");
    build(root, describe, (argv) => JSON.parse(run(JSON.stringify(argv))));
  }

  function unavailable(root, sentence) {
    api.state = "unavailable";
    showMessage(root, sentence, "warning");
  }

  // ---- the form ----
  function build(root, describe, run) {
    const flags = describe.flags;
    const byFlag = Object.fromEntries(flags.map((f) => [f.flag, f]));
    const form = h("form", { class: "calc-form", "aria-label": "budget.py 的参数" });
    form.addEventListener("submit", (e) => e.preventDefault());
    const placed = new Set();
    for (const [title, names] of SECTIONS) {
      const fields = names.filter((n) => byFlag[n]).map((n) => (placed.add(n), field(byFlag[n], describe)));
      form.append(h("fieldset", { class: "calc-section" }, h("legend", { text: title }), fields));
    }
    const rest = flags.filter((f) => !placed.has(f.flag));
    const advanced = h("details", { class: "calc-advanced" }, h("summary", { text: "高级参数（" + rest.map((f) => f.flag).join("、") + "）" }),
      h("fieldset", { class: "calc-section" }, rest.map((f) => field(f, describe))));
    const scheme = h("select", { id: "calc-scheme", "data-role": "scheme" },
      describe.schemes.map((s) => h("option", { value: s, text: s })));
    const schemeRow = h("div", { class: "calc-field calc-scheme" },
      h("label", { for: "calc-scheme" }, "分片方式（只在图和表中突出它；命令行打印每一种，只有一张卡时只有 DDP 一行）"), scheme);
    form.append(advanced, schemeRow);

    const command = h("pre", { class: "calc-command", "aria-label": "等价的命令行" });
    const error = h("p", { class: "calc-error", role: "alert", hidden: true });
    const output = h("pre", { class: "calc-output", "aria-label": "budget.py 的输出" });
    const plots = h("div", { class: "calc-plots" });
    const status = root.querySelector(".calc-status");
    status.replaceChildren();
    status.className = "calc-status";
    status.hidden = true;
    root.append(form, h("div", { class: "calc-results", "aria-live": "polite" }, command, error, output, plots));

    // A named model is a shape, a vocabulary and a context: choosing one empties the boxes that would
    // contradict it (the shape is refused beside --model, a typed --seq-len or --vocab-size would
    // override its own) and sets its own micro-batch, or empties the box for the parser's default.
    const model = form.querySelector('[data-flag="--model"]');
    if (model) model.addEventListener("change", () => {
      if (!model.value) return;
      for (const flag of NAMED_MODEL_CLEARS) {
        const input = form.querySelector(`[data-flag="${flag}"]`);
        if (input) input.value = "";
      }
      const batch = form.querySelector('[data-flag="--micro-batch"]');
      if (batch) {
        batch.value = (describe.models[model.value] || {}).micro_batch || "";
        batch.dispatchEvent(new Event("input", { bubbles: true }));  // its slider follows
      }
    });

    let timer = null;
    const schedule = () => { clearTimeout(timer); api.pending = true; timer = setTimeout(compute, DEBOUNCE_MS); };
    form.addEventListener("input", schedule);
    form.addEventListener("change", schedule);
    // what the debounce would run DEBOUNCE_MS later, now: for a caller that filled the whole form at once
    api.flush = () => { if (api.pending) { clearTimeout(timer); compute(); } };

    function argv() {  // in the parser's order, only the fields the reader filled
      const args = [];
      for (const f of flags) {
        const input = form.querySelector(`[data-flag="${f.flag}"]`);
        if (f.switch) { if (input.checked) args.push(f.flag); continue; }
        const value = input.value.trim();
        if (value !== "") args.push(f.flag, value);
      }
      return args;
    }

    function compute() {
      const args = argv();
      const result = run(args);
      api.runs += 1;
      api.last = result;
      api.pending = false;
      command.textContent = "python code/budget.py " + args.map(shellQuote).join(" ");
      if (!result.ok) {
        error.textContent = result.error;
        error.hidden = false;
        output.hidden = plots.hidden = true;
        output.replaceChildren();
        plots.replaceChildren();
        return;
      }
      error.hidden = true;
      output.hidden = plots.hidden = false;
      showText(output, result.stdout, scheme.value);
      plots.replaceChildren(...(result.page ? [memoryPlot(result.page, scheme.value), timePlot(result.page, scheme.value)] : [])
        .map((plot) => h("div", { class: "calc-plot-box" }, plot)));
      markScrolling(plots);
    }
    window.addEventListener("resize", () => markScrolling(plots));

    for (const [flag, value] of Object.entries(INITIAL)) {
      const input = form.querySelector(`[data-flag="${flag}"]`);
      if (input) { input.value = value; input.dispatchEvent(new Event("input", { bubbles: true })); }
    }
    clearTimeout(timer);
    compute();
    api.state = "ready";
  }

  function field(f, describe) {
    const id = "calc" + f.flag.replace(/-/g, "_");
    const label = LABELS[f.flag] || f.flag;
    const chinese = HELP[f.flag] &&
      HELP[f.flag].replace(/\{(\w+)\}/g, (m, k) => (k === "default" ? f.default : describe.numbers[k]) ?? m);
    const help = (chinese || f.help) + (f.group !== null ? "（与同组的另一项二选一）" : "");
    const caption = h("label", { for: id }, label + " ", h("code", { text: f.flag }));
    if (f.switch) {
      return h("div", { class: "calc-field calc-switch", title: help },
        h("input", { type: "checkbox", id, "data-flag": f.flag }), caption, h("small", { text: help }));
    }
    let input;
    if (f.choices) {
      input = h("select", { id, "data-flag": f.flag },
        h("option", { value: "", text: f.default === null ? "不指定" : `默认（${f.default}）` }), f.choices.map((c) => h("option", { value: c, text: c })));
    } else {  // text, not type=number: whatever the reader types reaches argparse, which judges it
      input = h("input", { type: "text", id, "data-flag": f.flag, inputmode: "decimal", autocomplete: "off",
                           spellcheck: "false", placeholder: f.default === null ? "" : `默认 ${f.default}` });
    }
    const parts = [caption];
    if (f.flag === "--gpu") {
      input.setAttribute("list", "calc-gpu-list");
      input.setAttribute("inputmode", "text");
      parts.push(h("datalist", { id: "calc-gpu-list" }, describe.gpus.map((g) =>
        h("option", { value: g.name, label: `${g.name}: ${fmt(g.tflops, 4)} TFLOP/s, ${g.memory_gb} GB` }))));
    }
    const slider = SLIDERS[f.flag];
    if (slider) {
      const range = h("input", { type: "range", min: slider.min, max: slider.max, step: slider.step || 1,
                                 "aria-label": label + "（滑块）", "data-slider-for": f.flag });
      range.addEventListener("input", () => {
        const v = Number(range.value);
        input.value = slider.log2 ? String(2 ** v) : String(Number(v.toFixed(2)));
      });
      input.addEventListener("input", () => {  // the box moves the slider when it holds a number
        const v = Number(input.value);
        if (input.value.trim() !== "" && Number.isFinite(v) && v > 0) range.value = slider.log2 ? Math.log2(v) : v;
      });
      parts.push(h("div", { class: "calc-slider" }, range, input));
    } else {
      parts.push(input);
    }
    parts.push(h("small", { text: help }));
    return h("div", { class: "calc-field", title: help }, parts);
  }

  function shellQuote(a) {
    return /^[\w@%+=:,.\/-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'";
  }

  // The text exactly as main printed it; the chosen scheme's rows are marked, not changed. A line that
  // budget.py indents is a table's header or row (.calc-row): it keeps its columns and the box scrolls
  // sideways, where the other lines (a keyword, then prose) wrap.
  function showText(pre, text, scheme) {
    pre.replaceChildren(...text.split(/(?<=\n)/).flatMap((line) => {
      if (!line.startsWith("  ")) return [line];
      const body = line.replace(/\n$/, ""), end = line.slice(body.length);
      const marked = line.startsWith("  " + scheme + " ");
      return [h(marked ? "mark" : "span", { class: marked ? "calc-row calc-hl" : "calc-row" }, body), end];
    }));
  }

  // A plot box that scrolls sideways says so (calculator.css), as the book's figures do (layout.js).
  function markScrolling(plots) {
    for (const box of plots.querySelectorAll(".calc-plot-box")) {
      box.toggleAttribute("data-scrolls", box.scrollWidth > box.clientWidth + 1);
    }
  }

  // ---- plots: plain SVG, colours from the theme's variables so that both modes read ----
  function axisTicks(lo, hi, n = 5) {
    const step0 = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(step0)), r = step0 / mag;
    const step = (r > 5 ? 10 : r > 2 ? 5 : r > 1 ? 2 : 1) * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return ticks;
  }

  function frame(width, height, label) {
    return h("svg:svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, class: "calc-plot",
                          style: `min-width: ${Math.ceil(width * LEGIBLE_SCALE)}px` }, h("svg:title", { text: label }));
  }

  // The memory figure as budget.memory_figure laid it out (pixels, y downwards): this only draws it.
  function memoryPlot(page, selected) {
    const fig = page.memory_figure;
    if (!fig) {
      const note = "没有形状（--d-model 和 --n-layer）就没有激活，所以这里不画每卡显存的分解；上面的表给出了模型状态。";
      return h("p", { class: "calc-note", text: note });
    }
    const label = "每张 GPU 的显存（GB），按部分堆叠，每种分片方式一根柱：" +
      fig.bars.map((b) => `${b.scheme} 共 ${b.label.text} GB`).join("，") +
      (page.memory_gb === null ? "；没有给出显存大小" : `；GPU 显存 ${fmt(page.memory_gb)} GB，可用的 90% 是 ${fmt(page.usable_gb)} GB`) +
      `；突出显示 ${selected}。`;
    const svg = frame(fig.width, fig.height, label);
    const text = (t, cls) => h("svg:text", { x: t.x, y: t.y, "text-anchor": t.anchor, class: cls, text: t.text });
    const [L, , R] = fig.plot;
    for (const t of fig.ticks) {
      svg.append(h("svg:line", { x1: L, x2: R, y1: t.y, y2: t.y, class: "calc-grid" }), text(t.label, "calc-tick"));
    }
    const axis = fig.axis_label;
    svg.append(h("svg:text", { x: axis.x, y: axis.y, transform: `rotate(-90 ${axis.x} ${axis.y})`,
      "text-anchor": axis.anchor, class: "calc-axis-label", text: axis.text }));
    for (const b of fig.bars) {
      const g = h("svg:g", { class: "calc-bar" + (b.scheme === selected ? " calc-selected" : ""), "data-scheme": b.scheme });
      for (const seg of b.segments) {
        g.append(h("svg:rect", { x: b.x, width: b.width, y: seg.y, height: seg.height,
          fill: PART_COLORS[seg.color % PART_COLORS.length], class: "calc-seg", "data-part": seg.part, "data-gb": seg.gb },
          h("svg:title", { text: `${b.scheme}: ${seg.part} ${fmt(seg.gb)} GB` })));
      }
      svg.append(g);
    }
    for (const row of fig.limits) {
      svg.append(h("svg:line", { x1: row.x1, x2: row.x2, y1: row.y, y2: row.y, class: "calc-limit" + (row.dashed ? " calc-dashed" : "") }),
        text(row.label, "calc-tick calc-limit-label"));
    }
    for (const b of fig.bars) {  // after the lines: a label is never under one (and never touches one)
      svg.append(h("svg:g", { class: "calc-bar-labels" + (b.scheme === selected ? " calc-selected" : ""), "data-scheme-label": b.scheme },
        text(b.label, "calc-value calc-limit-label"), text(b.tick, "calc-tick")));
    }
    const legend = h("svg:g", { class: "calc-legend" });
    for (const e of fig.legend) {
      const [x, y, w, hh] = e.swatch;
      legend.append(h("svg:rect", { x, y, width: w, height: hh, fill: PART_COLORS[e.color % PART_COLORS.length] }),
        text(e.label, "calc-tick"));
    }
    svg.append(legend);
    return svg;
  }

  function timePlot(page, selected) {
    const sw = page.sweep, xs = sw.gpus;
    const series = [{ name: "compute only", values: sw.hours, cls: "calc-compute" }];
    Object.entries(sw.hours_with_comm).forEach(([s, v], i) => {
      if (v.every((x) => x !== null)) series.push({ name: `${s} + comm`, scheme: s, values: v, color: SCHEME_COLORS[i % SCHEME_COLORS.length] });
    });
    const hasCost = sw.cost.every((c) => c !== null);
    const at = xs.indexOf(page.gpus);
    // One GPU sends nothing: every scheme's line starts at compute's point, so the key says that once
    // instead of repeating one number per scheme (budget.py prints one row there too).
    const alone = page.gpus === 1 && series.length > 1;
    const label = `训练时间（小时，对数坐标）随 GPU 数量（${xs[0]}–${xs[xs.length - 1]}）变化：` +
      `${page.gpus} 张卡只算计算 ${fmt(sw.hours[at])} 小时` +
      (alone ? "；一张卡不通信，每种分片方式加上通信也是这么多，从两张卡起才分开"
        : series.slice(1).map((s) => `，${s.scheme} 加通信 ${fmt(s.values[at])} 小时`).join("")) +
      (series.length === 1 ? "（卡间带宽未知，没有通信时间）" : "") +
      (hasCost ? `；下图是费用，${page.gpus} 张卡 ${fmt(sw.cost[at])}` : "；没有给出价格，不画费用") + `；突出显示 ${selected}。`;
    const W = 660, top = 230, gap = 48, bottom = hasCost ? 150 : 0, H = top + bottom + 40, L = 56, R = 200, T = 16;
    const svg = frame(W, H, label);
    const lx = (g) => L + (W - L - R) * (Math.log2(g) - Math.log2(xs[0])) / (Math.log2(xs[xs.length - 1]) - Math.log2(xs[0]) || 1);
    const panel = (y0, y1, values, ylabel) => {
      const finite = values.flat().filter((v) => v > 0 && Number.isFinite(v));
      let lo = Math.floor(Math.log10(Math.min(...finite))), hi = Math.ceil(Math.log10(Math.max(...finite)));
      if (hi === lo) { lo -= 1; hi += 1; }
      const y = (v) => y0 + (y1 - y0) * (1 - (Math.log10(v) - lo) / (hi - lo));
      const every = Math.ceil((hi - lo) / 6);
      for (let e = lo; e <= hi; e += every) {
        svg.append(h("svg:line", { x1: L, x2: W - R, y1: y(10 ** e), y2: y(10 ** e), class: "calc-grid" }),
          h("svg:text", { x: L - 6, y: y(10 ** e) + 4, "text-anchor": "end", class: "calc-tick", text: fmt(10 ** e, 1) }));
      }
      svg.append(h("svg:text", { x: 14, y: (y0 + y1) / 2, transform: `rotate(-90 14 ${(y0 + y1) / 2})`,
        "text-anchor": "middle", class: "calc-axis-label", text: ylabel }));
      return y;
    };
    const line = (y, values, attrs) => h("svg:polyline", { ...attrs,
      points: xs.map((g, i) => `${lx(g).toFixed(1)},${y(values[i]).toFixed(1)}`).join(" ") });
    // The legend, in the right margin, gives each line's value at this many GPUs: no label floats among the lines.
    const key = (y0, rows) => {
      rows.forEach((r, j) => {
        const ly = y0 + 10 + j * 16, cls = "calc-series " + (r.cls || "") + (r.scheme && r.scheme === selected ? " calc-selected" : "");
        svg.append(h("svg:line", { x1: W - R + 6, x2: W - R + 22, y1: ly - 4, y2: ly - 4, stroke: r.color || null, class: cls }),
          h("svg:text", { x: W - R + 26, y: ly, class: "calc-tick", text: r.text }));
      });
      if (alone) svg.append(h("svg:text", { x: W - R + 6, y: y0 + 10 + rows.length * 16, class: "calc-tick calc-key-note",
        text: "at 1 GPU: no comm, all equal" }));
    };
    const valued = (s, text) => (alone && s.scheme ? s.name : text);  // one GPU: the scheme's name alone
    const yh = panel(T, top, series.map((s) => s.values), "hours (log)");
    series.forEach((s) => svg.append(line(yh, s.values, { class: "calc-series " + (s.cls || "") + (s.scheme === selected ? " calc-selected" : ""),
      stroke: s.color || null, "data-series": s.name })));
    key(T, series.map((s) => ({ ...s, text: valued(s, `${s.name}: ${fmt(s.values[at])} h`) })));
    const dot = (y, v) => h("svg:circle", { cx: lx(page.gpus), cy: y(v), r: 3.5, class: "calc-dot" });
    svg.append(dot(yh, sw.hours[at]));
    if (hasCost) {
      const costs = series.slice(1).map((s) => ({ ...s, values: sw.cost_with_comm[s.scheme] }));
      const yc = panel(top + gap, top + bottom, [sw.cost, ...costs.map((s) => s.values)], "cost (log)");
      svg.append(line(yc, sw.cost, { class: "calc-series calc-compute", "data-series": "cost" }));
      costs.forEach((s) => svg.append(line(yc, s.values, { class: "calc-series" + (s.scheme === selected ? " calc-selected" : ""),
        stroke: s.color, "data-series": `${s.scheme} cost + comm` })));
      key(top + gap, [{ ...series[0], text: `compute only: ${fmt(sw.cost[at])}` },
        ...costs.map((s) => ({ ...s, text: valued(s, `${s.name}: ${fmt(s.values[at])}`) }))]);
      svg.append(dot(yc, sw.cost[at]));
    }
    svg.append(h("svg:line", { x1: lx(page.gpus), x2: lx(page.gpus), y1: T, y2: H - 40, class: "calc-now" }));
    // A power of two next to the chosen count (29 beside 32) gives up its label to it; its point stays on the lines.
    const halfWidth = (g) => String(g).length * 0.7 * 11 / 2;  // bold digits at 11 px (calculator.css: .calc-tick)
    xs.filter((g) => g === page.gpus || Math.abs(lx(g) - lx(page.gpus)) > halfWidth(g) + halfWidth(page.gpus) + 4)
      .forEach((g) => svg.append(h("svg:text", { x: lx(g), y: H - 24, "text-anchor": "middle", class: "calc-tick" + (g === page.gpus ? " calc-now-label" : ""), text: String(g) })));
    svg.append(h("svg:text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "calc-axis-label", text: "GPUs (log)" }));
    return svg;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const root = document.getElementById("budget-calculator");
    if (!root) return;
    if (location.protocol === "file:") {  // browsers refuse to fetch WebAssembly and modules from file://
      api.state = "file";
      showMessage(root, "这个计算器要通过 HTTP 打开：在仓库根目录运行 python -m http.server -d _build/html，" +
        "再打开 http://localhost:8000/chapters/12_2_plan.html。", "warning");
      return;
    }
    const start = () => load(root).catch((e) => {
      api.state = "failed";
      showMessage(root, "计算器加载失败：" + e.message, "warning");
      console.error(e);
    });
    if (!("IntersectionObserver" in window)) return void start();
    const seen = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) { seen.disconnect(); start(); }
    }, { rootMargin: "400px" });
    seen.observe(root);
  });
})();
