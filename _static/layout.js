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
