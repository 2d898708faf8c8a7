// The ledger bar's prefill-need labels: each engine's name hangs under its need mark, and two
// needs close together would print one name over the other. After every render (first paint,
// each refresh of the fragment, a resize) every label goes on the first line under the bar where
// it clears the label before it on that line, and the bar makes room for the lines it used.
(function () {
  "use strict";
  const GAP_PX = 6;  // the least space between two labels on one line
  const LINE_GAP_PX = 2;  // between two lines of labels

  function layoutBar(bar) {
    const labels = Array.from(bar.querySelectorAll(".need-mark span"));
    labels.forEach(function (label) { label.style.removeProperty("margin-top"); });
    const placed = labels
      .map(function (label) { return { label: label, rect: label.getBoundingClientRect() }; })
      .sort(function (a, b) { return a.rect.left - b.rect.left; });
    const lineHeight = Math.max(0, ...placed.map(function (item) { return item.rect.height; }))
      + LINE_GAP_PX;
    const lineEnds = [];  // the right edge of the last label on each line
    for (const item of placed) {
      let line = lineEnds.findIndex(function (end) { return item.rect.left >= end + GAP_PX; });
      if (line < 0) { line = lineEnds.length; lineEnds.push(0); }
      lineEnds[line] = item.rect.right;
      item.label.dataset.line = String(line);
      if (line > 0) item.label.style.marginTop = (line * lineHeight) + "px";
    }
    const lines = Math.max(lineEnds.length, 1);
    bar.dataset.labelLines = String(lines);
    // The bar's own bottom margin holds one line; below more lines it grows to clear them all.
    bar.style.removeProperty("margin-bottom");
    if (lines > 1) {
      const barBottom = bar.getBoundingClientRect().bottom;
      const lowest = Math.max(...labels.map(function (l) { return l.getBoundingClientRect().bottom; }));
      const margin = parseFloat(getComputedStyle(bar).marginBottom);
      // What follows may pull itself up under the bar (the legend does): clear that too.
      const next = bar.nextElementSibling;
      const pull = next ? Math.min(parseFloat(getComputedStyle(next).marginTop) || 0, 0) : 0;
      bar.style.marginBottom = Math.max(margin, lowest - barBottom + 2 * LINE_GAP_PX - pull) + "px";
    }
  }

  function layout(scope) {
    (scope || document).querySelectorAll(".ledger-bar").forEach(layoutBar);
  }

  window.SparkOps = window.SparkOps || {};
  window.SparkOps.ledgerBar = { layout: layout };
  let pending = null;
  window.addEventListener("resize", function () {
    if (pending) cancelAnimationFrame(pending);
    pending = requestAnimationFrame(function () { pending = null; layout(document); });
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { layout(document); });
  } else {
    layout(document);
  }
})();
