/* layout.css: mark each figure of a cell's output that is wider than its box (it scrolls sideways there),
   so that its caption can say so. Jupyter Book loads every .js in _static/. */
(function () {
  "use strict";
  // what may be wider than its box, and the element that scrolls: a figure, a printed table (its <pre>),
  // an HTML table (the theme's scrolling container) and display math; each that scrolls is marked
  // data-scrolls, and layout.css adds a line under it that says so
  const SCROLLERS = [["div.cell_output figure", (e) => e], ["div.cell_output .book-columns", (e) => e.querySelector("pre")],
                     ["article .pst-scrollable-table-container", (e) => e],
                     ['article mjx-container[display="true"]', (e) => e]];
  function mark() {
    for (const [selector, box] of SCROLLERS) {
      for (const e of document.querySelectorAll(selector)) {
        const b = box(e);
        if (b && b.scrollWidth > b.clientWidth + 1) e.dataset.scrolls = "";
        else delete e.dataset.scrolls;
      }
    }
  }
  window.addEventListener("load", mark);  // images have their size by then
  window.addEventListener("load", () => window.MathJax?.startup?.promise?.then(mark));  // typeset math too
  window.addEventListener("resize", mark);
  window.bookMarkScrolling = mark;
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
