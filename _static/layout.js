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
