// Overview: live headroom figures, the firing alerts + ledger + engine cards fragment, and the
// one timeline (static/js/timeline.js).
// Polls small endpoints; polls slow down while the tab is hidden or the server errors, and resume
// at once when the tab is shown again.
(function () {
  "use strict";
  const root = document.getElementById("overview");
  if (!root) return;
  const headroomUrl = root.dataset.headroomUrl;
  const timelineUrl = root.dataset.timelineUrl;
  const interval = Math.max(parseFloat(root.dataset.interval) || 5, 2) * 1000;
  const HIDDEN_MAX = 5 * 60 * 1000;
  const times = window.SparkOps.times;
  const timelineState = window.SparkOps.timeline.state();
  let range = root.dataset.range;
  let timers = {};
  let delays = { headroom: interval, chart: 3 * interval, engines: interval };

  function text(el, value) { if (el) el.textContent = value; }

  function renderCollectedAt(at) {
    const el = document.getElementById("collected-at");
    if (!el) return;
    if (!at) { text(el, "never"); return; }
    el.replaceChildren(window.SparkOps.clock.element(at, true));
    times.refresh(el);
  }

  function renderHeadroom(data) {
    renderCollectedAt(data.collected_at);
    if (data.mem_total_gib !== null) text(document.getElementById("mem-total"), data.mem_total_gib + " GiB (MemTotal)");
    const status = document.getElementById("status");
    let message = "";
    if (data.last_ok === false) message = "Last collection failed: " + data.error;
    else if (data.stale) message = "No recent collection: is the SparkOps worker running on " + data.node + "?";
    status.textContent = message;
    status.className = message ? "banner warn" : "banner hidden";
    for (const fig of data.figures) {
      const box = document.querySelector('.figure[data-key="' + fig.key + '"]');
      if (!box) continue;
      const value = box.querySelector(".value");
      const help = box.querySelector(".help");
      if (fig.value === null) {
        value.innerHTML = "";
        const span = document.createElement("span");
        span.className = "unknown";
        span.title = fig.unknown_reason || "";
        span.textContent = fig.display;  // "unknown", or what stands in for a number ("no swap")
        value.appendChild(span);
        text(help, fig.unknown_reason || "");
      } else {
        text(value, fig.display);
        text(help, fig.help);
      }
    }
  }

  function renderChart(data) {
    window.SparkOps.timeline.render("timeline", data, timelineState);
    const note = document.getElementById("chart-note");
    const failures = data.failures || [];
    let message = "Source: " + (data.source === "raw" ? "raw samples"
      : data.source + " roll-ups (minimum and maximum of each bucket), then finer data up to now") + ".";
    if (failures.length) {
      const last = failures[failures.length - 1];
      message += " " + failures.length + " failed collection(s) in range (gaps); latest at " +
        window.SparkOps.clock.format(last.at) + ": " + last.error;
    }
    note.textContent = message;
    renderGpuNote(data.gpu);
  }

  // What the GPU panels cannot draw, and why; without a GPU, why there are no GPU panels.
  function renderGpuNote(gpu) {
    const el = document.getElementById("gpu-note");
    if (!el || !gpu) return;
    const lines = (gpu.notes || []).slice();
    (gpu.failures || []).forEach(function (f) {
      lines.push(f.text + ": latest read without a figure in this range at " +
                 window.SparkOps.clock.format(f.at) + " — " + f.note);
    });
    el.textContent = lines.join(" · ");
    el.classList.toggle("hidden", !lines.length);
  }

  function schedule(name, fn) {
    clearTimeout(timers[name]);
    const base = name === "chart" ? 3 * interval : interval;
    let delay = delays[name];
    if (document.hidden) delay = Math.min(Math.max(delay * 2, base * 4), HIDDEN_MAX);
    delays[name] = delay;
    timers[name] = setTimeout(fn, delay);
  }

  function poll(name, url, render) {
    const run = function () {
      fetch(url(), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) {
          if (r.redirected || r.status === 401 || r.status === 403) { location.reload(); throw new Error("logged out"); }
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (data) {
          render(data);
          if (!document.hidden) delays[name] = name === "chart" ? 3 * interval : interval;
        })
        .catch(function () { delays[name] = Math.min(delays[name] * 2, HIDDEN_MAX); })
        .finally(function () { schedule(name, run); });
    };
    return run;
  }

  const headroom = poll("headroom", function () { return headroomUrl; }, renderHeadroom);
  const enginesUrl = root.dataset.enginesUrl;
  const engines = function () {
    // The cards are rendered by the server (one template for first paint and refresh).
    fetch(enginesUrl, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok || r.redirected) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        const cards = document.getElementById("engine-cards");
        cards.innerHTML = html;
        if (window.SparkOps.ledgerBar) window.SparkOps.ledgerBar.layout(cards);
        // The firing alerts lead the page, above the figures: the fragment's copy replaces them.
        const fresh = cards.querySelector("#firing-alerts");
        const shown = root.querySelector("#firing-alerts:not(#engine-cards *)");
        if (fresh && shown) shown.replaceWith(fresh);
        times.refresh(cards);
        if (!document.hidden) delays.engines = interval;
      })
      .catch(function () { delays.engines = Math.min(delays.engines * 2, HIDDEN_MAX); })
      .finally(function () { schedule("engines", engines); });
  };
  const chart = poll("chart", function () { return timelineUrl + "?range=" + encodeURIComponent(range); }, renderChart);

  document.querySelectorAll(".ranges button").forEach(function (button) {
    button.addEventListener("click", function () {
      range = button.dataset.range;
      timelineState.userRange = null;  // a new range shows all of it, in every panel
      document.querySelectorAll(".ranges button").forEach(function (b) {
        b.classList.toggle("active", b === button);
        b.setAttribute("aria-pressed", b === button ? "true" : "false");
      });
      history.replaceState(null, "", "?range=" + encodeURIComponent(range));
      chart();
    });
  });

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) return;
    delays = { headroom: interval, chart: 3 * interval, engines: interval };
    headroom();
    chart();
    engines();
  });

  headroom();
  chart();
  schedule("engines", engines);
})();
