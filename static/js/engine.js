// Engine page: prefill and decode tok/s, latency quantiles, KV usage and slots, stacked on one
// shared time axis, with the engine's events as hoverable markers; for an engine that decodes
// speculatively, a last panel with its draft acceptance (%) and tokens per step.
(function () {
  "use strict";
  const root = document.getElementById("engine-page");
  if (!root) return;
  const url = root.dataset.seriesUrl;
  let range = root.dataset.range;
  let timer = null;
  let delay = 15000;
  const axisTime = window.SparkOps.clock.axis;  // the viewer's wall-clock time (clock.js)
  const GRID = "#26313d";

  // Panels top to bottom: [axis, title, unit]; their heights share the figure (panelDomains).
  // Each series goes to its panel by key. Tokens per step has an axis of its own on the right of
  // the speculative panel (y7, overlaying y6).
  const PANELS = [
    ["y", "Prefill", "tok/s"],
    ["y2", "Decode", "tok/s"],
    ["y3", "Time to first token and inter-token latency", "s"],
    ["y4", "KV-cache usage", "%"],
    ["y5", "Requests running and waiting", "requests"],
  ];
  const SPEC_PANEL = ["y6", "Speculative decoding: draft acceptance and tokens per step", "%"];
  const PANEL_OF = {
    prefill_tps: "y", decode_tps: "y2", ttft_p50: "y3", ttft_p95: "y3", itl_p50: "y3",
    itl_p95: "y3", kv_usage: "y4", running: "y5", waiting: "y5", spec_acceptance: "y6",
    spec_tokens_per_step: "y7",
  };
  const PERCENT = { kv_usage: true, spec_acceptance: true };
  // Quantiles are dashed, waiting and tokens per step dotted: they differ by more than colour.
  const DASH = { ttft_p95: "dash", itl_p95: "dash", waiting: "dot", spec_tokens_per_step: "dot" };

  function panelDomains(count) {
    const gap = 0.04;
    const height = (1 - gap * (count - 1)) / count;
    const domains = [];
    for (let i = 0; i < count; i++) {
      const top = 1 - i * (height + gap);
      domains.push([Math.max(top - height, 0), top]);
    }
    return domains;
  }

  function seriesTraces(data) {
    return data.series.map(function (s) {
      const percent = PERCENT[s.key] === true;
      return {
        x: s.x.map(axisTime), y: percent ? s.y.map(function (v) { return v === null ? null : v * 100; }) : s.y,
        name: s.label, type: "scatter", mode: "lines", connectgaps: false, meta: s.key,
        yaxis: PANEL_OF[s.key] || "y", line: { dash: DASH[s.key] || "solid", width: 1.5 },
      };
    });
  }

  function eventTrace(data) {
    // Hoverable markers at the foot of the decode panel: what happened, not only when.
    return {
      x: data.events.map(function (e) { return axisTime(e.at); }),
      y: data.events.map(function () { return 0; }),
      hovertext: data.events.map(function (e) { return e.kind + ": " + e.message; }),
      hoverinfo: "x+text", name: "events", type: "scatter", mode: "markers", yaxis: "y2",
      meta: "events", marker: { symbol: "triangle-up", size: 10, color: "#f0a020" },
    };
  }

  function render(data) {
    const traces = seriesTraces(data);
    if (data.events.length) traces.push(eventTrace(data));
    const shapes = data.events.map(function (e) {
      return { type: "line", xref: "x", yref: "paper", x0: axisTime(e.at), x1: axisTime(e.at), y0: 0, y1: 1,
               line: { color: "#f0a020", width: 1, dash: "dot" } };
    });
    if (data.max_num_seqs) {
      shapes.push({ type: "line", xref: "paper", yref: "y5", x0: 0, x1: 1, y0: data.max_num_seqs,
                    y1: data.max_num_seqs, line: { color: "#ff7b72", width: 1, dash: "dash" } });
    }
    const panels = data.speculative ? PANELS.concat([SPEC_PANEL]) : PANELS;
    const domains = panelDomains(panels.length);
    const layout = {
      paper_bgcolor: "#0f1419", plot_bgcolor: "#18202a", font: { color: "#e6edf3" },
      margin: { l: 64, r: data.speculative ? 56 : 20, t: 24, b: 40 }, legend: { orientation: "h" },
      shapes: shapes, annotations: [], uirevision: range,
      xaxis: { type: "date", range: [axisTime(data.start), axisTime(data.end)], gridcolor: GRID,
               anchor: panels[panels.length - 1][0],
               hoverformat: window.SparkOps.clock.HOVER,
               title: { text: window.SparkOps.clock.axisTitle([data.start, data.end]), standoff: 4 } },
    };
    panels.forEach(function (panel, index) {
      const name = "yaxis" + panel[0].slice(1);
      layout[name] = { title: { text: panel[2], standoff: 4 }, domain: domains[index], gridcolor: GRID,
                       rangemode: "tozero", fixedrange: true };
      layout.annotations.push({ text: "<b>" + panel[1] + "</b>", xref: "paper", yref: "paper", x: 0,
                                y: domains[index][1], xanchor: "left", yanchor: "bottom", showarrow: false,
                                font: { size: 12, color: "#c9d1d9" } });
    });
    layout.yaxis4.range = [0, 100];
    if (data.speculative) {
      layout.yaxis6.range = [0, 100];
      layout.yaxis7 = { title: { text: "tokens per step", standoff: 4 }, overlaying: "y6", side: "right",
                        rangemode: "tozero", fixedrange: true, showgrid: false };
    }
    if (data.max_num_seqs) layout.yaxis5.range = [0, data.max_num_seqs * 1.15];
    Plotly.react("engine-charts", traces, layout, { displaylogo: false, responsive: true });
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
      document.querySelectorAll(".ranges button").forEach(function (b) {
        b.classList.toggle("active", b === button);
        b.setAttribute("aria-pressed", b === button ? "true" : "false");
      });
      load();
    });
  });
  document.addEventListener("visibilitychange", function () { if (!document.hidden) load(); });
  load();
})();
