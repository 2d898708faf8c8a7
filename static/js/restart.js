// Restart pages: live runbook progress from restart-json, and the startup-time chart.
//
// Every element with data-restart-url is one restart: its [data-field] children are filled from
// the JSON (and [data-steps] rebuilt). It is polled every few seconds while running, slowly while
// scheduled, and not at all once finished; a hidden tab polls rarely, and errors back off.
// When a restart changes status the page reloads once, so the server-rendered parts follow.
(function () {
  "use strict";
  const RUNNING_MS = 3000;
  const SCHEDULED_MS = 15000;
  const HIDDEN_MS = 60000;
  const MAX_ERROR_MS = 120000;
  const LIVE = ["running", "scheduled"];

  function duration(seconds) {
    if (seconds === null || seconds === undefined || seconds === "") return "—";
    const total = Math.max(0, Math.round(Number(seconds)));
    const h = Math.floor(total / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = String(total % 60).padStart(2, "0");
    return h ? h + ":" + String(m).padStart(2, "0") + ":" + s : m + ":" + s;
  }

  function clockCell(iso) {
    const cell = text("td", "", "nowrap");
    cell.append(window.SparkOps.clock.element(iso));
    return cell;
  }

  function text(tag, value, className) {
    const cell = document.createElement(tag);
    cell.textContent = value;
    if (className) cell.className = className;
    return cell;
  }

  function renderSteps(body, steps) {
    if (!body) return;
    body.replaceChildren();
    if (!steps.length) {
      const row = document.createElement("tr");
      const cell = text("td", "No step has run yet.", "muted");
      cell.colSpan = 5;
      row.append(cell);
      body.append(row);
      return;
    }
    steps.forEach(function (step) {
      const row = document.createElement("tr");
      const result = step.ok === null ? text("span", "…") :
        text("span", step.ok ? "ok" : "failed", step.ok ? "step-ok" : "step-failed");
      const resultCell = document.createElement("td");
      resultCell.append(result);
      row.append(text("td", step.step), clockCell(step.started_at), clockCell(step.finished_at),
                 resultCell,
                 text("td", step.message));
      body.append(row);
    });
  }

  function render(root, data) {
    root.querySelectorAll("[data-field]").forEach(function (el) {
      const key = el.dataset.field;
      const value = data[key];
      if (key.endsWith("_seconds")) el.textContent = duration(value);
      else if (key.endsWith("_at") || key === "deadline") el.replaceChildren(window.SparkOps.clock.element(value));
      else el.textContent = value || "—";
      if (key === "status") el.className = "state state-" + value;
    });
    renderSteps(root.querySelector("[data-steps]"), data.steps || []);
  }

  function watch(root) {
    const url = root.dataset.restartUrl;
    const initial = root.dataset.status;
    let timer = null;
    let failures = 0;
    let status = initial;
    let inFlight = false;  // a tab shown again mid-request must not start a second chain

    root.querySelectorAll("[data-seconds]").forEach(function (el) { el.textContent = duration(el.dataset.seconds); });
    if (LIVE.indexOf(initial) < 0) return;

    function next() {
      clearTimeout(timer);
      let delay = status === "running" ? RUNNING_MS : SCHEDULED_MS;
      if (failures) delay = Math.min(delay * Math.pow(2, failures), MAX_ERROR_MS);
      if (document.hidden) delay = Math.max(delay, HIDDEN_MS);
      timer = setTimeout(poll, delay);
    }

    function poll() {
      clearTimeout(timer);
      if (inFlight) return;
      inFlight = true;
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok || r.redirected) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (data) {
          inFlight = false;
          failures = 0;
          status = data.status;
          render(root, data);
          if (status !== initial) { window.location.reload(); return; }
          next();
        })
        .catch(function () { inFlight = false; failures += 1; next(); });
    }

    document.addEventListener("visibilitychange", function () { if (!document.hidden) poll(); });
    next();
  }

  function chart() {
    const box = document.getElementById("startup-chart");
    const source = document.getElementById("startup-data");
    if (!box || !source || typeof Plotly === "undefined") return;
    const data = JSON.parse(source.textContent);
    if (!data.traces.length) {
      box.classList.add("hidden");
      return;
    }
    const traces = data.traces.map(function (t) {
      return {
        x: t.x.map(window.SparkOps.clock.axis), y: t.y, name: t.name, type: "scatter", mode: "lines+markers", customdata: t.id,
        text: t.kind.map(function (kind, i) { return "#" + t.id[i] + " " + kind; }),
        hovertemplate: "%{text}<br>%{y:.1f} min<extra>%{fullData.name}</extra>",
        marker: { size: 9, symbol: t.kind.map(function (kind) { return kind === "unplanned" ? "x" : "circle"; }) },
      };
    });
    const grid = "#26313d";
    Plotly.react(box, traces, {
      paper_bgcolor: "#0f1419", plot_bgcolor: "#18202a", font: { color: "#e6edf3" },
      margin: { l: 60, r: 20, t: 10, b: 56 }, legend: { orientation: "h" },
      xaxis: { type: "date", gridcolor: grid, hoverformat: window.SparkOps.clock.HOVER,
               title: { text: window.SparkOps.clock.axisTitle(data.traces.flatMap(function (t) { return t.x; })) } },
      yaxis: { title: "startup (min)", gridcolor: grid, rangemode: "tozero" },
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 10, y1: 10,
                 line: { color: "#8b98a5", width: 1, dash: "dot" } }],
      annotations: [{ xref: "paper", x: 1, y: 10, text: "default 10 min", showarrow: false,
                      xanchor: "right", yanchor: "bottom", font: { color: "#8b98a5", size: 11 } }],
    }, { displaylogo: false, responsive: true });
    box.on("plotly_click", function (event) {
      const id = event.points.length ? event.points[0].customdata : null;
      if (id) window.location.href = box.dataset.detailUrl.replace(/\/0\/$/, "/" + id + "/");
    });
  }

  document.querySelectorAll("[data-restart-url]").forEach(watch);
  chart();
})();
