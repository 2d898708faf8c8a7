// Engine page: tok/s, latency quantiles, KV usage and slots on one shared time axis.
(function () {
  "use strict";
  const root = document.getElementById("engine-page");
  if (!root) return;
  const url = root.dataset.seriesUrl;
  let range = root.dataset.range;
  let timer = null;
  let delay = 15000;
  const AXES = { "tok/s": "y", "s": "y2", "fraction": "y3", "requests": "y4" };

  function render(data) {
    const traces = data.series.map(function (s) {
      return { x: s.x, y: s.y, name: s.label, type: "scatter", mode: "lines", connectgaps: false,
               yaxis: AXES[s.unit] };
    });
    const markers = data.events.map(function (e) {
      return { type: "line", xref: "x", yref: "paper", x0: e.at, x1: e.at, y0: 0, y1: 1,
               line: { color: "#f0a020", width: 1, dash: "dot" } };
    });
    if (data.max_num_seqs) {
      markers.push({ type: "line", xref: "paper", yref: "y4", x0: 0, x1: 1, y0: data.max_num_seqs,
                     y1: data.max_num_seqs, line: { color: "#e5534b", width: 1, dash: "dash" } });
    }
    const grid = "#26313d";
    Plotly.react("engine-charts", traces, {
      paper_bgcolor: "#0f1419", plot_bgcolor: "#18202a", font: { color: "#e6edf3" },
      margin: { l: 60, r: 20, t: 10, b: 40 }, legend: { orientation: "h" }, shapes: markers,
      grid: { rows: 4, columns: 1, pattern: "independent", roworder: "top to bottom" },
      xaxis: { type: "date", range: [data.start, data.end], gridcolor: grid, anchor: "y4" },
      yaxis: { title: "tok/s", domain: [0.76, 1], gridcolor: grid, rangemode: "tozero" },
      yaxis2: { title: "seconds", domain: [0.51, 0.74], gridcolor: grid, rangemode: "tozero" },
      yaxis3: { title: "KV used", domain: [0.26, 0.49], gridcolor: grid, range: [0, 1] },
      yaxis4: { title: "requests", domain: [0, 0.24], gridcolor: grid, rangemode: "tozero" },
    }, { displaylogo: false, responsive: true });
  }

  function load() {
    clearTimeout(timer);
    fetch(url + "?range=" + encodeURIComponent(range), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok || r.redirected) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (data) { render(data); delay = 15000; })
      .catch(function () { delay = Math.min(delay * 2, 300000); })
      .finally(function () { timer = setTimeout(load, document.hidden ? Math.max(delay * 4, 60000) : delay); });
  }

  document.querySelectorAll(".ranges button").forEach(function (button) {
    button.addEventListener("click", function () {
      range = button.dataset.range;
      document.querySelectorAll(".ranges button").forEach(function (b) { b.classList.toggle("active", b === button); });
      load();
    });
  });
  document.addEventListener("visibilitychange", function () { if (!document.hidden) load(); });
  load();
})();
