/* layout.css: mark each figure of a cell's output that is wider than its box (it scrolls sideways there),
   so that its caption can say so. Jupyter Book loads every .js in _static/. */
(function () {
  "use strict";
  function mark() {
    for (const figure of document.querySelectorAll("div.cell_output figure")) {
      if (figure.scrollWidth > figure.clientWidth + 1) figure.dataset.scrolls = "";
      else delete figure.dataset.scrolls;
    }
  }
  window.addEventListener("load", mark);  // images have their size by then
  window.addEventListener("resize", mark);
})();

/* The theme's zh_CN catalog says 列印 (Traditional usage) for its print button; this book says 打印. */
(function () {
  "use strict";
  function simplify() {
    for (const e of document.querySelectorAll("[title], [data-bs-title], [aria-label]")) {
      for (const a of ["title", "data-bs-title", "aria-label", "data-bs-original-title"]) {
        const v = e.getAttribute(a);
        if (v && v.includes("列印")) e.setAttribute(a, v.replaceAll("列印", "打印"));
      }
    }
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode())
      if (n.nodeValue.includes("列印")) n.nodeValue = n.nodeValue.replaceAll("列印", "打印");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", simplify);
  else simplify();
})();

/* Printing (or "print to PDF"): what the screen folds away, hidden code and the exercises' answers,
   is printed open; after printing, what was folded folds again. */
(function () {
  "use strict";
  let opened = [];
  window.addEventListener("beforeprint", function () {
    opened = [...document.querySelectorAll("main details:not([open])")];
    for (const d of opened) d.open = true;
  });
  window.addEventListener("afterprint", function () {
    for (const d of opened) d.open = false;
    opened = [];
  });
})();
