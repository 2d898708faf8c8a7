// One clock for every page (loaded from base.html, before the pages' own scripts):
//  * The browser's time zone goes into the cookie sparkops_tz, from which the server renders
//    times (dashboard/zone.py). When the cookie was missing or named another zone, the page is
//    loaded once more, so that the first page a browser sees is in its zone too.
//  * SparkOps.clock.format(iso) writes a moment as "2026-12-01 22:09:16 KST": date and 24-hour
//    time in the viewer's zone, then the zone's abbreviation (from the server's zone database,
//    <html data-zone-labels>) or its UTC offset. It is the format of the templates' |when filter.
//  * SparkOps.clock.element(iso) builds that <time>; SparkOps.clock.axis(iso) is the wall-clock
//    string Plotly draws (iso: an ISO 8601 time, or milliseconds since the epoch, as the
//    charts' series send their x); SparkOps.clock.axisTitle() labels a chart's time axis.
//  * SparkOps.times.refresh(root): <time data-relative> shows "3 min ago", the exact time as
//    its tooltip.
(function () {
  "use strict";
  const SparkOps = (window.SparkOps = window.SparkOps || {});
  const COOKIE = "sparkops_tz";
  const zone = (function () {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { return ""; }
  })();

  function cookie(name) {
    const found = document.cookie.split("; ").find(function (c) { return c.startsWith(name + "="); });
    return found ? found.slice(name.length + 1) : null;
  }

  if (/^[A-Za-z0-9_+\-]+(\/[A-Za-z0-9_+\-]+)*$/.test(zone) && cookie(COOKIE) !== zone) {
    document.cookie = COOKIE + "=" + zone + "; path=/; max-age=31536000; SameSite=Lax" +
      (location.protocol === "https:" ? "; Secure" : "");
    // Only a page rendered in another zone is loaded again; a zone the server does not know
    // falls back to its default, and the cookie now matching stops a second reload.
    const rendered = document.documentElement.dataset.zone;
    if (rendered && rendered !== zone && cookie(COOKIE) === zone) location.replace(location.href);
  }

  function labels() {
    try { return JSON.parse(document.documentElement.dataset.zoneLabels || "{}"); } catch (e) { return {}; }
  }
  const LABELS = document.documentElement.dataset.zone === zone ? labels() : {};

  function pad(n, width) { return String(n).padStart(width || 2, "0"); }

  function offsetText(minutes) {
    if (!minutes) return "UTC";
    const abs = Math.abs(minutes);
    return "UTC" + (minutes > 0 ? "+" : "-") + pad(Math.floor(abs / 60)) + ":" + pad(abs % 60);
  }

  // The label of the viewer's zone at a moment: its abbreviation, else its offset.
  function zoneLabel(date) {
    const minutes = -(date || new Date()).getTimezoneOffset();
    return LABELS[String(minutes)] || offsetText(minutes);
  }

  function wallClock(d) {
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function parse(iso) {
    if (iso === null || iso === undefined || iso === "") return null;
    const d = iso instanceof Date ? iso : new Date(iso);
    return isNaN(d) ? null : d;
  }

  function format(iso) {
    const d = parse(iso);
    return d ? wallClock(d) + " " + zoneLabel(d) : "—";
  }

  function element(iso, relative) {
    const d = parse(iso);
    if (!d) return document.createTextNode("—");
    const el = document.createElement("time");
    el.setAttribute("datetime", d.toISOString().replace(/\.\d{3}Z$/, "Z"));
    el.title = zone;
    el.textContent = format(d);
    if (relative) el.setAttribute("data-relative", "");
    return el;
  }

  // Plotly draws date strings as wall-clock times and drops any zone offset (and numbers as UTC),
  // so times from the server (ISO 8601 or epoch milliseconds) are turned into the viewer's
  // wall-clock time before drawing.
  function axis(iso) {
    if (iso === null || iso === undefined) return iso;
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    return wallClock(d) + "." + pad(d.getMilliseconds(), 3);
  }

  // "time (KST)", or with both labels where a range crosses a change of offset.
  function axisTitle(isoList) {
    const seen = [];
    (isoList || [new Date()]).forEach(function (iso) {
      const d = parse(iso);
      const label = zoneLabel(d || new Date());
      if (seen.indexOf(label) < 0) seen.push(label);
    });
    return "time (" + seen.join(" / ") + ")";
  }

  // <time datetime="…" data-relative> shows "3 min ago", with the exact time as its tooltip.
  function relative(date, now) {
    const seconds = Math.round((now - date) / 1000);
    const future = seconds < 0;
    const abs = Math.abs(seconds);
    let text;
    if (abs < 45) return future ? "in a few seconds" : "just now";
    if (abs < 90) text = "1 min";
    else if (abs < 45 * 60) text = Math.round(abs / 60) + " min";
    else if (abs < 90 * 60) text = "1 h";
    else if (abs < 24 * 3600) text = Math.round(abs / 3600) + " h";
    else if (abs < 7 * 86400) text = Math.round(abs / 86400) + " d";
    else return format(date);
    return future ? "in " + text : text + " ago";
  }

  function refreshTimes(root) {
    const now = Date.now();
    (root || document).querySelectorAll("time[datetime][data-relative]").forEach(function (el) {
      const when = parse(el.getAttribute("datetime"));
      if (!when) return;
      el.textContent = relative(when, now);
      el.title = format(when);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { refreshTimes(document); });
  setInterval(function () { if (!document.hidden) refreshTimes(document); }, 30000);

  SparkOps.times = { refresh: refreshTimes, relative: relative, axis: axis };
  SparkOps.clock = { HOVER: "%Y-%m-%d %H:%M:%S", zone: zone, format: format, element: element, axis: axis,
                     axisTitle: axisTitle, zoneLabel: zoneLabel };
})();
