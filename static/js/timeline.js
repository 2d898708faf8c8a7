// SparkOps page helpers, shared by the overview and the engine page:
//  * SparkOps.timeline: the overview's one timeline, stacked panels on one shared time axis
//    (every panel's x axis "matches" the first, so zooming or panning one moves all). A node
//    with a GPU adds four GPU panels (one line per device); the figure grows to fit them.
(function () {
  "use strict";
  const SparkOps = (window.SparkOps = window.SparkOps || {});

  const axisTime = SparkOps.clock.axis;  // the viewer's wall-clock time (clock.js)

  // --- the timeline --------------------------------------------------------------------------------
  // Okabe–Ito colours: distinguishable with the common colour-vision deficiencies; every series
  // also differs by name, and KV pools by dash, so nothing relies on colour alone.
  const ENGINE_COLORS = ["#56b4e9", "#e69f00", "#009e73", "#f0e442", "#cc79a7", "#d55e00", "#0072b2"];
  const GPU_COLORS = ["#76b900", "#58a6ff", "#e69f00", "#cc79a7", "#f0e442", "#d55e00", "#009e73", "#0072b2"];
  const HOST_STYLE = {
    mem_available: { color: "#76b900", width: 2, dash: "solid" },
    mem_available_min: { color: "#ff7b72", width: 1, dash: "dot" },
    mem_free: { color: "#58a6ff", width: 1.5, dash: "solid" },
    page_cache_reclaimable: { color: "#d2a8ff", width: 1.5, dash: "dash" },
    swap_used: { color: "#f0a020", width: 1.5, dash: "dashdot" },
    psi_some_avg10: { color: "#9da7b3", width: 1, dash: "dot" },
    free_in_huge_blocks: { color: "#e69f00", width: 1, dash: "longdash" },
  };
  const SEVERITY_COLORS = { critical: "#ff7b72", error: "#ff7b72", warning: "#f0a020", info: "#58a6ff" };
  const MARKER_SYMBOLS = {
    "restart-planned": "diamond", "restart-unplanned": "x", "alert-fired": "triangle-up",
    "alert-resolved": "triangle-down-open", "phase-change": "circle-open",
    "prefill-stall": "hourglass", "engine-exited": "square", "engine-gone": "square-x-open",
    "gpu-lost": "star", "unexpected-reboot": "x-thin-open", "host-rebooted": "circle-cross-open",
    "sparkops-unclean-stop": "x-open", "kernel-oom-kill": "x", "kernel-nvidia-xid": "star-diamond",
    "kernel-no-memory": "bowtie", "kernel-hung-task": "hourglass-open",
    "kernel-allocation-failure": "hexagon-open", "kernel-log-gap": "line-ew-open",
  };
  const LANES = { restarts: "restarts", alerts: "alerts", engines: "engines" };
  const WEIGHTS = { markers: 0.55, headroom: 1.4, ledger: 1.4, kv: 0.8, prefill: 0.9, decode: 0.9 };
  const GPU_WEIGHT = 0.6;  // each GPU panel (utilisation, temperature, power, SM clock)
  // The panels the stylesheet's height is made for; more panels make the figure taller.
  const BASE_WEIGHT = Object.keys(WEIGHTS).reduce(function (sum, k) { return sum + WEIGHTS[k]; }, 0);
  const GAP = 0.035;
  const GRID = "#26313d";

  function axisName(index, letter) { return letter + (index === 0 ? "" : index + 1); }

  function weight(panel) {
    if (WEIGHTS[panel.key]) return WEIGHTS[panel.key];
    return panel.key.indexOf("gpu_") === 0 ? GPU_WEIGHT : 1;
  }

  function totalWeight(panels) {
    return panels.reduce(function (sum, p) { return sum + weight(p); }, 0);
  }

  function domains(panels) {
    const total = totalWeight(panels);
    const usable = 1 - GAP * (panels.length - 1);
    let top = 1;
    return panels.map(function (p) {
      const height = usable * weight(p) / total;
      const domain = [Math.max(top - height, 0), top];
      top -= height + GAP;
      return domain;
    });
  }

  function engineColor(data, name) {
    const index = data.engines.indexOf(name);
    return ENGINE_COLORS[(index < 0 ? 0 : index) % ENGINE_COLORS.length];
  }

  function seriesTrace(data, s, axes) {
    const axis = axes[s.panel];
    const stepwise = s.exactness === "stepwise";
    const trace = {
      x: s.x.map(axisTime), y: s.y, type: "scatter", mode: "lines", connectgaps: false, meta: s.key,
      xaxis: axis.x, yaxis: axis.y, name: s.label,
      hovertemplate: s.label + (stepwise ? " (stepwise)" : "") + ": %{y:,.2f} " + s.unit + "<extra></extra>",
      line: { width: 1.5, shape: stepwise ? "hv" : "linear" },
    };
    if (s.device !== null && s.device !== undefined) {
      trace.name = "GPU " + s.device;
      trace.legendgroup = "gpu:" + s.device;
      trace.line.color = GPU_COLORS[s.device % GPU_COLORS.length];
    } else if (s.engine) {
      trace.name = s.engine;
      trace.legendgroup = "engine:" + s.engine;
      trace.line.color = engineColor(data, s.engine);
      trace.line.dash = stepwise ? "dash" : "solid";
      trace.line.width = stepwise ? 2 : 1.5;
    } else if (s.panel === "ledger") {
      trace.name = "other processes";
      trace.legendgroup = "processes";
      trace.line.color = "#9da7b3";
      trace.line.dash = "dot";
    } else {
      const style = HOST_STYLE[s.key] || {};
      trace.line = { color: style.color, width: style.width || 1.5, dash: style.dash || "solid" };
      if (s.key === "psi_some_avg10") trace.yaxis = "y" + (data.panels.length + 1);
    }
    return trace;
  }

  function markerTraces(data) {
    const byKind = {};
    data.markers.forEach(function (m) { (byKind[m.kind] = byKind[m.kind] || []).push(m); });
    return Object.keys(byKind).map(function (kind) {
      const list = byKind[kind];
      return {
        x: list.map(function (m) { return axisTime(m.at); }),
        y: list.map(function (m) { return LANES[m.lane] || m.lane; }),
        hovertext: list.map(function (m) { return m.text; }),
        hoverinfo: "x+text", type: "scatter", mode: "markers", meta: "marker:" + kind,
        name: list[0].label, xaxis: "x", yaxis: "y",
        marker: {
          symbol: MARKER_SYMBOLS[kind] || "circle", size: 11,
          color: list.map(function (m) { return SEVERITY_COLORS[m.severity] || "#e6edf3"; }),
          line: { width: 1.5, color: list.map(function (m) { return SEVERITY_COLORS[m.severity] || "#e6edf3"; }) },
        },
      };
    });
  }

  function markerShapes(data) {
    const shapes = [];
    data.markers.forEach(function (m) {
      const color = SEVERITY_COLORS[m.severity] || "#e6edf3";
      const at = axisTime(m.at);
      if (m.lane === "restarts" && m.until) {
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: at, x1: axisTime(m.until), y0: 0, y1: 1,
                      fillcolor: "rgba(240,160,32,0.10)", line: { width: 0 }, layer: "below" });
      }
      if (m.lane === "restarts" || m.kind === "alert-fired") {
        shapes.push({ type: "line", xref: "x", yref: "paper", x0: at, x1: at, y0: 0, y1: 1,
                      line: { color: color, width: 1, dash: "dot" }, layer: "below" });
      }
    });
    return shapes;
  }

  function legendOnce(traces) {
    const seen = {};
    traces.forEach(function (t) {
      const group = t.legendgroup || t.meta;
      t.showlegend = !seen[group];
      seen[group] = true;
    });
  }

  function layoutFor(data, state) {
    const panels = data.panels;
    const doms = domains(panels);
    const layout = {
      paper_bgcolor: "#0f1419", plot_bgcolor: "#18202a", font: { color: "#e6edf3" },
      margin: { l: 70, r: 56, t: 24, b: 36 }, showlegend: true, hovermode: "closest",
      legend: { orientation: "h", y: -0.04, yanchor: "top", x: 0 },
      uirevision: data.range, shapes: markerShapes(data), annotations: [], dragmode: "zoom",
    };
    // A new install's axis starts at its first collection (shown_start), not an empty range.
    const range = state.userRange || [axisTime(data.shown_start || data.start), axisTime(data.end)];
    panels.forEach(function (panel, i) {
      const x = axisName(i, "xaxis");
      const y = axisName(i, "yaxis");
      const last = i === panels.length - 1;
      layout[x] = { type: "date", range: range.slice(), anchor: axisName(i, "y"), gridcolor: GRID,
                    showticklabels: last, domain: [0, 1], hoverformat: SparkOps.clock.HOVER };
      if (last) layout[x].title = { text: SparkOps.clock.axisTitle(range), standoff: 4 };
      if (i > 0) layout[x].matches = "x";
      layout[y] = { domain: doms[i], anchor: axisName(i, "x"), gridcolor: GRID, fixedrange: true,
                    title: { text: panel.unit, standoff: 4 }, rangemode: "tozero", zeroline: false };
      if (panel.key === "markers") {
        layout[y] = { domain: doms[i], anchor: "x", type: "category", fixedrange: true,
                      categoryorder: "array", categoryarray: ["engines", "alerts", "restarts"],
                      range: [-0.6, 2.6], gridcolor: GRID };
      }
      if (panel.key === "kv") layout[y].range = [0, 100];
      if (panel.range) layout[y].range = panel.range;
      layout.annotations.push({ text: "<b>" + panel.title + "</b>", xref: "paper", yref: "paper",
                                x: 0, y: doms[i][1], xanchor: "left", yanchor: "bottom",
                                showarrow: false, font: { size: 12, color: "#c9d1d9" } });
      if (!state.filled[panel.key]) {
        layout.annotations.push({ text: emptyText(data, panel), xref: "paper", yref: "paper",
                                  x: 0.5, y: (doms[i][0] + doms[i][1]) / 2, showarrow: false,
                                  font: { size: 12, color: "#9da7b3" } });
      }
    });
    const headroom = panels.findIndex(function (p) { return p.key === "headroom"; });
    layout["yaxis" + (panels.length + 1)] = {
      overlaying: axisName(headroom, "y"), side: "right", anchor: axisName(headroom, "x"),
      range: [0, 100], tickmode: "auto", fixedrange: true, showgrid: false,
      title: { text: "PSI %", standoff: 4 },
    };
    return layout;
  }

  function emptyText(data, panel) {
    const key = panel.key;
    if (panel.empty) return panel.empty;  // the server's words (a GPU panel: why no line)
    if (key === "markers") return "no restarts, alerts or engine events in this range";
    if (key !== "headroom" && !data.engines.length) return "no engines seen on this node in this range";
    return "no figures in this range";
  }

  function filledPanels(data) {
    const filled = {};
    data.series.forEach(function (s) {
      if (s.y.some(function (v) { return v !== null; })) filled[s.panel] = true;
    });
    if (data.markers.length) filled.markers = true;
    return filled;
  }

  function watchZoom(el, data, state) {
    if (el.dataset.zoomWatched) return;
    el.dataset.zoomWatched = "1";
    el.on("plotly_relayout", function () {
      const axis = el._fullLayout.xaxis;
      if (!axis || !axis.range) return;
      const current = state.data;
      const near = function (a, b) { return Math.abs(axis.r2l(a) - axis.r2l(axisTime(b))) < 1000; };
      const full = near(axis.range[0], current.shown_start || current.start) &&
        near(axis.range[1], current.end);
      state.userRange = full ? null : axis.range.slice();
    });
  }

  // Taller than the stylesheet's height by the share of the panels beyond the usual ones.
  function fitHeight(el, panels) {
    el.style.height = "";
    const total = totalWeight(panels);
    if (total > BASE_WEIGHT) el.style.height = Math.round(el.clientHeight * total / BASE_WEIGHT) + "px";
  }

  function render(id, data, state) {
    const el = document.getElementById(id);
    fitHeight(el, data.panels);
    state.data = data;
    state.filled = filledPanels(data);
    const axes = {};
    data.panels.forEach(function (p, i) { axes[p.key] = { x: axisName(i, "x"), y: axisName(i, "y") }; });
    const traces = data.series.map(function (s) { return seriesTrace(data, s, axes); })
      .concat(markerTraces(data));
    legendOnce(traces);
    return Plotly.react(el, traces, layoutFor(data, state),
                        { displaylogo: false, responsive: true,
                          modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] })
      .then(function () { watchZoom(el, data, state); return el; });
  }

  SparkOps.timeline = { render: render, state: function () { return { userRange: null, filled: {} }; } };
})();
