"""RESULTS.md from the phases' JSON: the headline table, then one section per benchmark.

Every figure is shown as median (min–max, n); every target says plainly whether it was met. A
phase that failed or did not run leaves its section with the reason instead of figures.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.stats import Summary

CHART_TARGET_MS = 150
CHART_POINTS = 2000
FOOTPRINT_TARGET_MIB = 200
CPU_TARGET_RATIO = 2.0  # CPU while monitoring: at most twice the trio's
ALERT_TARGET_S = 15
ALERT_BEFORE_S = 13.6  # the median recorded before the one-process stack (multi-process)
CYCLE_TARGET_MS = 20
WALL_BUDGET_S = 2.5  # "well within" the 5 s interval: half of it
LINEAR_EXPONENT = 1.15  # log-log slope accepted as near-linear
STORAGE_TARGET_MIB = 200
FLEET_VIEW_TARGET_MS = 300
CENTRAL_CPU_TARGET = 25  # % of one core


def _s(data: dict | None) -> Summary | None:
    return Summary.from_dict(data) if data else None


def fmt(data: dict | None, unit: str = "", digits: int = 1, scale: float = 1.0) -> str:
    """"12.3 ms (10.1–15.0, n=7)"; "—" when not measured."""
    summary = _s(data)
    if summary is None:
        return "—"
    space = " " if unit and unit != "%" else ""
    median = f"{summary.median * scale:.{digits}f}{space}{unit}"
    if summary.n == 1:
        return f"{median} (n=1)"
    return (f"{median} ({summary.min * scale:.{digits}f}–{summary.max * scale:.{digits}f}, "
            f"n={summary.n})")


def verdict(met: bool | None) -> str:
    return "—" if met is None else ("**met**" if met else "**missed**")


def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.{digits}f}×"


def _median(data: dict | None) -> float | None:
    return data["median"] if data else None


def _phase(results: dict, name: str) -> tuple[dict | None, str | None]:
    """(data, why missing) of a phase."""
    entry = results["phases"].get(name)
    if entry is None:
        return None, "not run in this invocation (see `--only`)"
    if not entry.get("ok"):
        return None, f"the phase failed: {entry.get('error', 'no detail')}"
    return entry["data"], None


# --- headline -------------------------------------------------------------------------------


def headline(results: dict) -> list[str]:
    live, _ = _phase(results, "live")
    cost, _ = _phase(results, "cost")
    lines = ["## Headline", "",
             "| Figure | SparkOps | Prometheus stack | Side by side | Target | |",
             "|---|---|---|---|---|---|"]
    if live:
        stacks = live["footprint"]["stacks"]
        sp, pr = stacks["sparkops"], stacks["prometheus"]
        rss_sp, rss_pr = _median(sp["rss_mib"]), _median(pr["rss_mib"])
        one_sp, one_pr = _median(sp.get("distinct_mib")), _median(pr.get("distinct_mib"))
        lines.append(
            f"| Memory, RSS sum after {live['minutes']:g} min, {live['engines']} engines | "
            f"{rss_sp:.0f} MiB | {rss_pr:.0f} MiB | SparkOps = {ratio(rss_sp, rss_pr)} | "
            f"≤ {FOOTPRINT_TARGET_MIB} MiB and ≤ the trio | "
            f"{verdict(footprint_met(rss_sp, rss_pr))} |")
        if one_sp is not None and one_pr is not None:
            lines.append(
                f"| Memory, distinct resident pages (shared pages once) | {one_sp:.0f} MiB | "
                f"{one_pr:.0f} MiB | SparkOps = {ratio(one_sp, one_pr)} | (same) | "
                f"{verdict(footprint_met(one_sp, one_pr))} |")
        cpu_sp, cpu_pr = _median(sp["cpu_percent"]), _median(pr["cpu_percent"])
        if cpu_sp is not None and cpu_pr is not None:
            lines.append(f"| CPU while monitoring (% of one core) | {cpu_sp:.1f} % | "
                         f"{cpu_pr:.1f} % | SparkOps = {ratio(cpu_sp, cpu_pr)} | "
                         f"≤ {CPU_TARGET_RATIO:g}× the trio | "
                         f"{verdict(cpu_met(cpu_sp, cpu_pr))} |")
        alerts = live["alerts"]
        lat_sp = _median(alerts["sparkops"]["latency"])
        lat_5 = _median(alerts["prom_5s"]["latency"])
        lat_def = _median(alerts["prom_default"]["latency"])
        lines.append(
            f"| Alert latency, allocation → webhook (median) | "
            f"{_num(lat_sp, 's')} | {_num(lat_def, 's')} at default timings; "
            f"{_num(lat_5, 's')} at 5 s | Prometheus slower by {ratio(lat_def, lat_sp)} "
            f"(defaults), {ratio(lat_5, lat_sp)} (5 s) | ≤ {ALERT_TARGET_S} s | "
            f"{verdict(None if lat_sp is None else lat_sp <= ALERT_TARGET_S)} |")
    if cost:
        sizes = cost["sizes"]
        if "4" in sizes:
            at4 = _median(sizes["4"]["cycle_cpu"])
            lines.append(f"| Collection CPU per cycle, 4 engines | {at4:.0f} ms | — | — | "
                         f"≤ {CYCLE_TARGET_MS} ms | {verdict(at4 <= CYCLE_TARGET_MS)} |")
        if "64" in sizes:
            wall = _median(sizes["64"]["cycle_wall"]) / 1000
            cpu = _median(sizes["64"]["cycle_cpu"]) / 1000
            lines.append(f"| Collection cycle, 64 engines (wall / CPU) | {wall:.2f} s / "
                         f"{cpu:.2f} s | — | — | well within 5 s (≤ {WALL_BUDGET_S} s) | "
                         f"{verdict(max(wall, cpu) <= WALL_BUDGET_S)} |")
        exponent = cost.get("growth_exponent")
        if exponent is not None:
            lines.append(f"| Growth with engines (log-log slope) | {exponent:.2f} | — | — | "
                         f"near-linear (≤ {LINEAR_EXPONENT}) | "
                         f"{verdict(exponent <= LINEAR_EXPONENT)} |")
    for backend in ("sqlite", "postgresql"):
        data, _ = _phase(results, backend)
        if not data:
            continue
        worst_label, worst = max(data["chart"].items(), key=lambda item: item[1]["p95"])
        lines.append(f"| Chart JSON, worst p95 on {_db(backend)} ({worst_label}) | "
                     f"{worst['p95']:.0f} ms | — | — | ≤ {CHART_TARGET_MS} ms, every endpoint | "
                     f"{verdict(chart_met(data['chart']))} |")
        stored = data["storage"]
        total = storage_30d(stored)
        how = "measured" if stored["days"] >= 29.99 else "extrapolated"
        lines.append(f"| Storage for 30 days on {_db(backend)} ({how}) | "
                     f"{total:.0f} MiB | — | — | ≤ {STORAGE_TARGET_MIB} MiB | "
                     f"{verdict(total <= STORAGE_TARGET_MIB)} |")
    dip, _ = _phase(results, "dip")
    if dip:
        paced, former = dip["summary"]["paced"], dip["summary"]["every-period"]
        lines.append(f"| Dip capture: recall of a real 1 GiB dip held 0.5 s | "
                     f"{paced['caught']}/{paced['trials']} | — | former way (a read every "
                     f"0.1 s) {former['caught']}/{former['trials']} | 100 % | "
                     f"{verdict(paced['caught'] == paced['trials'])} |")
        lines.append(f"| Dip capture: CPU per minute of still memory on /proc | "
                     f"{paced['cpu_ms_per_minute']:.0f} ms | — | former way "
                     f"{former['cpu_ms_per_minute']:.0f} ms "
                     f"({ratio(former['cpu_ms_per_minute'], paced['cpu_ms_per_minute'])}) | — | |")
    fleet, _ = _phase(results, "fleet")
    if fleet:
        size = f"{fleet['nodes']} nodes × {fleet['engines_per_node']} engines"
        p95 = (fleet["latency"]["fleet"] or {}).get("p95")
        cpu = fleet["stacks"]["centre"]["cpu_percent_window"]
        lines.append(f"| Fleet view p95 (`{fleet['fleet_path']}`), {size} | {_num(p95, 'ms')} | "
                     f"— | — | ≤ {FLEET_VIEW_TARGET_MS} ms | {verdict(fleet_view_met(fleet))} |")
        lines.append(f"| Central CPU, {size} (% of one core) | {cpu:.1f} % | — | — | "
                     f"≤ {CENTRAL_CPU_TARGET} % | {verdict(cpu <= CENTRAL_CPU_TARGET)} |")
    return lines + [""]


def fleet_view_met(fleet: dict) -> bool | None:
    """p95 within the target, with every request answered."""
    latency = fleet["latency"]["fleet"]
    if not latency.get("n"):
        return None
    return latency["p95"] <= FLEET_VIEW_TARGET_MS and not latency["errors"]


def storage_30d(stored: dict) -> float:
    """MiB for 30 days: measured when the dataset spans them, else extrapolated from the day
    medians (or, without older days, from the bytes per row)."""
    if stored["days"] >= 29.99:
        return stored["total_mib"]
    return stored.get("extrapolated_30d_mib", stored["retention_estimates"]["current_30d_mib"])


def cpu_met(sparkops: float | None, trio: float | None) -> bool | None:
    if sparkops is None or trio is None:
        return None
    return sparkops <= CPU_TARGET_RATIO * trio


def footprint_met(sparkops: float | None, trio: float | None) -> bool | None:
    if sparkops is None or trio is None:
        return None
    return sparkops <= FOOTPRINT_TARGET_MIB and sparkops <= trio


def chart_met(chart: dict) -> bool:
    return all(row["p95"] <= CHART_TARGET_MS and row["points"] <= CHART_POINTS
               for row in chart.values())


def _num(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:.1f} {unit}"


def _db(backend: str) -> str:
    return {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[backend]


# --- sections -------------------------------------------------------------------------------


def machine_section(results: dict) -> list[str]:
    m = results["machine"]
    rows = [
        ("CPU", f"{m['cpu']}, {m['cores']} cores"), ("RAM", f"{m['ram_gib']} GiB"),
        ("Kernel / OS", f"{m['kernel']} / {m['os']}"),
        ("Python / Django / Celery (kombu) / gunicorn",
         f"{m['python']} / {m['django']} / {m['celery']} ({m['kombu']}) / {m['gunicorn']}"),
        ("SQLite / PostgreSQL / psycopg", f"{m['sqlite']} / {m['postgresql']} / {m['psycopg']}"),
        ("Prometheus", m.get("prometheus", "—")),
        ("node_exporter", m.get("prometheus-node-exporter", "—")),
        ("Alertmanager", m.get("prometheus-alertmanager", "—")),
        ("Podman", m["podman"]), ("SparkOps commit", m["commit"]),
    ]
    lines = ["## Machine and versions", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "Phases (wall time; 1-minute load average before → after — the machine may be "
              "shared with other work, which the load shows):", ""]
    for name, entry in results["phases"].items():
        state = "ok" if entry.get("ok") else "FAILED"
        when = "after `cost`" if results.get("sequential") else "while `live` ran"
        generated = (f" (+ {entry['generate_seconds'] / 60:.1f} min writing its dataset {when}, "
                     f"untimed; load {entry['loadavg_generate'][0]} → "
                     f"{entry['loadavg_generate'][1]})" if "generate_seconds" in entry else "")
        lines.append(f"- `{name}`: {entry['seconds'] / 60:.1f} min, load {entry['loadavg'][0]} → "
                     f"{entry['loadavg'][1]}{generated}, {state}")
    return lines + [""]


def footprint_section(results: dict) -> list[str]:
    lines = ["## 1. Footprint", ""]
    live, missing = _phase(results, "live")
    if not live:
        return lines + [f"Not measured: {missing}", ""]
    fp = live["footprint"]
    profile = results["profile"]
    lines += [
        f"Both stacks monitor the same {live['engines']} emulated engines (one Podman container "
        f"each) and this node at a 5 s interval, in the same run. SparkOps runs as "
        f"`bin/sparkops start` runs it (`manage.py runstack`: one process, the Celery worker "
        f"with 8 threads and beat as a thread inside it, and the web server, waitress with 4 "
        f"threads, in a thread of the same process; SQLite and the embedded file-system "
        f"broker, so no broker process), "
        f"with one overview tab open (headroom and engine cards every 5 s, the "
        f"1 h chart every 15 s) and the alert trials of §3 firing and resolving meanwhile. The "
        f"trio is Prometheus (scrape and evaluation every 5 s, the comparable rules of §3), "
        f"node_exporter (default collectors) and Alertmanager. Readings: "
        f"{fp['samples']} of every process of each stack, every "
        f"{profile['footprint_sample_every_s']:g} s, the last one {live['minutes']:g} min after "
        f"both were up.", "",
        "| Stack | RSS sum | PSS sum | Distinct resident pages | USS sum | CPU (% of one core) "
        "| First → last reading (RSS sum; distinct) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (("sparkops", "SparkOps"), ("prometheus", "Prometheus trio")):
        stack = fp["stacks"][name]
        lines.append(
            f"| {label} | {fmt(stack['rss_mib'], 'MiB', 0)} | {fmt(stack['pss_mib'], 'MiB', 0)} | "
            f"{fmt(stack.get('distinct_mib'), 'MiB', 0)} | {fmt(stack['uss_mib'], 'MiB', 0)} | "
            f"{fmt(stack['cpu_percent'], '%', 1)} | "
            f"{stack['first_rss_mib']:.0f} → {stack['last_rss_mib']:.0f} MiB; "
            f"{stack.get('first_distinct_mib') or 0:.0f} → "
            f"{stack.get('last_distinct_mib') or 0:.0f} MiB |")
    sp, pr = fp["stacks"]["sparkops"], fp["stacks"]["prometheus"]
    rss_sp, rss_pr = _median(sp["rss_mib"]), _median(pr["rss_mib"])
    one_sp, one_pr = _median(sp.get("distinct_mib")), _median(pr.get("distinct_mib"))
    cpu_sp, cpu_pr = _median(sp["cpu_percent"]), _median(pr["cpu_percent"])
    lines += [
        "",
        "RSS sum counts a page shared by several processes once per process (gunicorn's and "
        "Celery's forked children share much of their parent); PSS splits shared pages among "
        "their sharers, also with processes outside the stack; distinct resident pages count "
        "every physical page of the stack once (`/proc/<pid>/pagemap`).",
        "",
        f"SparkOps takes {ratio(rss_sp, rss_pr)} the trio's RSS sum and "
        f"{ratio(one_sp, one_pr)} its distinct resident pages. Target ≤ {FOOTPRINT_TARGET_MIB} "
        f"MiB and no more than the trio: {verdict(footprint_met(rss_sp, rss_pr))} by RSS sum, "
        f"{verdict(footprint_met(one_sp, one_pr))} by distinct pages.",
        "",
        f"CPU while monitoring: SparkOps {ratio(cpu_sp, cpu_pr)} the trio's. Target ≤ "
        f"{CPU_TARGET_RATIO:g}× the trio's: {verdict(cpu_met(cpu_sp, cpu_pr))}.",
        "",
        "By process, at the last reading (RSS / PSS, MiB):",
        "",
        "| Stack | Process | RSS | PSS |",
        "|---|---|---|---|",
    ]
    for name, label in (("sparkops", "SparkOps"), ("prometheus", "Prometheus trio")):
        for process in fp["stacks"][name]["processes"]:
            lines.append(f"| {label} | {process['role']} | {process['rss_mib']:.0f} | "
                         f"{process['pss_mib']:.0f} |")
    shape = live.get("observed_shape", {})
    tab = live.get("overview_tab", {})
    lines += ["", f"Meanwhile SparkOps stored {shape.get('collections_ok')} collections in the "
              f"last 3 minutes ({shape.get('collections_failed')} failed), "
              f"{shape.get('host_samples_per_collection')} host samples per collection and "
              f"{shape.get('engine_samples_per_engine_cycle')} engine samples per engine and "
              f"collection; the overview tab made {tab.get('requests')} requests "
              f"({tab.get('errors')} errors).", ""]
    return lines


def cost_section(results: dict) -> list[str]:
    lines = ["## 2. Collection cost", ""]
    cost, missing = _phase(results, "cost")
    if not cost:
        return lines + [f"Not measured: {missing}", ""]
    window = cost["host_window"]
    lines += [
        "CPU time of this process (`time.process_time()`, every thread, plus reaped children) "
        "per part of one collection cycle, called in-process on the real code against real "
        "containers (one emulated engine each, under light load) through the private Podman "
        "service's Docker API. *Engines* is the `collect_engines` task body (NVML, Docker "
        "list/inspect/stats, `/metrics` scrapes in parallel, rates, rows); *with log re-read* "
        "is a cycle in which every startup log is parsed again (once a minute per engine); "
        "*ledger* is `update_ledger` on the node's row as the host collection task reads it; "
        "*alerts* is the `evaluate_alerts` task body (the node's row, every rule, the alerts "
        "moved; no channels). *Cycle* = engines "
        f"+ (log re-read − engines) / {cost['cycles_per_log_refresh']} + ledger + alerts. "
        "Wall times are for engines + ledger + alerts.",
        "",
        "| Engines | Cycle CPU | Engines | … with log re-read | Ledger | Alerts | "
        "Engine collection wall | Cycle wall | CPU per engine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for count, size in sorted(cost["sizes"].items(), key=lambda item: int(item[0])):
        per_engine = _median(size["cycle_cpu"]) / int(count)
        lines.append(
            f"| {count} | {fmt(size['cycle_cpu'], 'ms')} | {fmt(size['engines'], 'ms')} | "
            f"{fmt(size['engines_logs'], 'ms')} | {fmt(size['ledger'], 'ms')} | "
            f"{fmt(size['alerts'], 'ms')} | {fmt(size['engines_wall'], 'ms', 0)} | "
            f"{fmt(size['cycle_wall'], 'ms', 0)} | {per_engine:.1f} ms |")
    lines += [
        "",
        f"Host-memory window (the interval watched at 0.1 s, then stored; independent of the "
        f"engine count): {fmt(window['cpu'], 'ms')} CPU over {fmt(window['wall'], 's', 2, 0.001)}"
        " wall — the wall time is the interval by design.",
        "",
    ]
    sizes = cost["sizes"]
    exponent = cost.get("growth_exponent")
    if "4" in sizes:
        at4 = _median(sizes["4"]["cycle_cpu"])
        lines.append(f"- ≤ {CYCLE_TARGET_MS} ms CPU per cycle at 4 engines: "
                     f"{verdict(at4 <= CYCLE_TARGET_MS)} ({at4:.0f} ms; with the host window "
                     f"{at4 + _median(window['cpu']):.0f} ms).")
    if "64" in sizes:
        wall = _median(sizes["64"]["cycle_wall"]) / 1000
        cpu = _median(sizes["64"]["cycle_cpu"]) / 1000
        lines.append(f"- 64 engines well within the 5 s interval (≤ {WALL_BUDGET_S} s wall and "
                     f"CPU): {verdict(max(wall, cpu) <= WALL_BUDGET_S)} ({wall:.2f} s wall, "
                     f"{cpu:.2f} s CPU).")
    if exponent is not None:
        lines.append(f"- Near-linear growth (log-log slope of cycle CPU from the smallest size "
                     f"above 1 to the largest ≤ {LINEAR_EXPONENT}): "
                     f"{verdict(exponent <= LINEAR_EXPONENT)} (slope {exponent:.2f}).")
    return lines + [""]


def alert_section(results: dict) -> list[str]:
    lines = ["## 3. Alert latency", ""]
    live, missing = _phase(results, "live")
    if not live:
        return lines + [f"Not measured: {missing}", ""]
    alerts = live["alerts"]
    half = live["allocation_gib"] / 2
    lines += [
        f"A plain process (the neighbour) maps and touches {live['allocation_gib']:g} GiB. "
        f"Before each trial the threshold T is set {half:g} GiB below the MemAvailable of the "
        "moment — for SparkOps through the `prefill-squeeze` margin (headroom − margin < engine "
        "1's prefill need exactly when MemAvailable < T; `for` and hysteresis stay the "
        "defaults), for Prometheus as `node_memory_MemAvailable_bytes < T` with the same "
        "`for: 10s`. t0 is the moment MemAvailable really fell below T (read every 5 ms during "
        "the allocation); the latency is the webhook's arrival at a loopback receiver − t0. "
        "*Fired*: when the alert went from pending to firing (SparkOps: `fired_at`; Prometheus: "
        "the `startsAt` it sends, which is its firing time) − t0; what follows is delivery "
        "(SparkOps' outbox, Alertmanager's group_wait). A stack's answer is not counted when it "
        "fired on something before t0 or when MemAvailable rose back above T before its "
        "webhook (other work on the machine handing memory back); such trials are repeated.",
        "",
        _meminfo_note(live.get("meminfo", "real")),
        "",
        "| Stack | Timings | Latency | Fired | Not counted |",
        "|---|---|---|---|---|",
        f"| SparkOps (`runstack`) | its defaults: 5 s interval, `prefill-squeeze` for 10 s, "
        f"notifications delivered as they are queued | "
        f"{fmt(alerts['sparkops']['latency'], 's')} | "
        f"{fmt(alerts['sparkops']['fired'], 's')} | {alerts['sparkops']['missing']} |",
        f"| Prometheus + Alertmanager, documented defaults "
        f"({live['prometheus_default_instances']} independent servers) | scrape 1 m, "
        f"evaluation 1 m, `for: 10s`; group_wait 30 s | "
        f"{fmt(alerts['prom_default']['latency'], 's')} | "
        f"{fmt(alerts['prom_default']['fired'], 's')} | {alerts['prom_default']['missing']} |",
        f"| Prometheus + Alertmanager at SparkOps' interval (the §1 trio) | scrape 5 s, "
        f"evaluation 5 s, `for: 10s`; group_wait 30 s | "
        f"{fmt(alerts['prom_5s']['latency'], 's')} | {fmt(alerts['prom_5s']['fired'], 's')} | "
        f"{alerts['prom_5s']['missing']} |",
        "",
        f"SparkOps first saw the condition (its alert's `started_at`, pending) "
        f"{fmt(alerts['sparkops']['detected'], 's')} after t0. Target ≤ {ALERT_TARGET_S} s for "
        f"SparkOps (median): "
        f"{verdict(_le(_median(alerts['sparkops']['latency']), ALERT_TARGET_S))}; no worse "
        f"than the {ALERT_BEFORE_S:g} s median recorded before the stack became one process: "
        f"{verdict(_le(_median(alerts['sparkops']['latency']), ALERT_BEFORE_S))}. The latency "
        f"moves by up to an interval with where in its collection window the allocation "
        f"lands, so a median of 5 trials moves by a second or so from run to run.",
        "",
    ]
    if alerts.get("stopped"):
        lines += [f"The trials stopped early: {alerts['stopped']}.", ""]
    lines += [
        "Trials (seconds after t0; the default-timing servers are waited for only in the first "
        "trials):",
        "",
        "| Trial | Allocation took | SparkOps | Prometheus 5 s | Prometheus defaults | Notes |",
        "|---|---|---|---|---|---|",
    ]
    for trial in alerts["trials"]:
        defaults = ", ".join(_plain(t["latency"]) for t in trial["prom_default"]) or "—"
        lines.append(f"| {trial['index']} | {trial['allocation_seconds']:.1f} s | "
                     f"{_plain(trial['sparkops']['latency'])} | "
                     f"{_plain(trial['prom_5s']['latency'])} | {defaults} | "
                     f"{'; '.join(trial['notes'])} |")
    return lines + [""]


def _meminfo_note(mode: str) -> str:
    if mode == "isolated":
        return ("Host memory as the monitors saw it: the **isolated view** (`--meminfo "
                "isolated`, the default; `bench/meminfo_view.py`). SparkOps (through "
                "`SPARKOPS_PROCFS`) and node_exporter (`--path.procfs`) read a `/proc` whose "
                "`meminfo` is the real one rewritten every 10 ms with MemFree and MemAvailable "
                "moving only by the neighbour's resident memory, so other work on a shared "
                "machine cannot cross or uncross the threshold; the allocation itself is real.")
    return ("Host memory as the monitors saw it: the machine's own `/proc/meminfo` "
            "(`--meminfo real`).")


def _plain(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _le(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def chart_section(results: dict) -> list[str]:
    lines = ["## 4. Chart latency", ""]
    data = {b: _phase(results, b) for b in ("sqlite", "postgresql")}
    available = {b: d for b, (d, _) in data.items() if d}
    if not available:
        return lines + [f"Not measured: {data['sqlite'][1]}", ""]
    profile = results["profile"]
    lines += [
        f"Server time (Django's test client: middleware, session, the view, JSON) of each JSON "
        f"endpoint over {profile['chart_days']:g} days of one node with 4 engines at 5 s (see "
        f"§5 for what is stored). p95 over {profile['chart_requests']} requests after one "
        f"warm-up, or as many as fit in {profile['chart_budget_s']:g} s once "
        f"{profile['chart_min_requests']} are done; *worst*: the slowest of them; *first*: the "
        f"first of them, when the chart has kept no settled roll-up rows of that range yet "
        f"(`dashboard.settled`: what a range costs when it is opened; the warm-up is the "
        f"endpoint's shortest range). *Points*: the longest series returned (limit "
        f"{CHART_POINTS}).",
        "",
        "| Endpoint | " + " | ".join(f"{_db(b)} p95 | {_db(b)} worst | {_db(b)} first | "
                                     f"{_db(b)} median (min–max, n)"
                                     for b in available) + " | Points |",
        "|---|" + "---|---|---|---|" * len(available) + "---|",
    ]
    first = next(iter(available.values()))
    for label in first["chart"]:
        cells = []
        points = 0
        for backend_data in available.values():
            row = backend_data["chart"][label]
            mark = "" if row["p95"] <= CHART_TARGET_MS else " ✗"
            first_ms = row.get("first")
            cells += [f"{row['p95']:.0f} ms{mark}", f"{row['max']:.0f} ms",
                      "—" if first_ms is None else f"{first_ms:.0f} ms", fmt(row, "ms", 0)]
            points = max(points, row["points"])
        lines.append(f"| `{label}` | " + " | ".join(cells) + f" | {points} |")
    lines.append("")
    for backend, backend_data in available.items():
        slow = [label for label, row in backend_data["chart"].items()
                if row["p95"] > CHART_TARGET_MS]
        lines.append(f"- {_db(backend)}: p95 ≤ {CHART_TARGET_MS} ms with ≤ {CHART_POINTS} points "
                     f"per series: {verdict(chart_met(backend_data['chart']))}"
                     + (f" — over the target: {', '.join(f'`{s}`' for s in slow)}." if slow
                        else "."))
    for backend, (_, why) in data.items():
        if why:
            lines.append(f"- {_db(backend)}: not measured: {why}")
    return lines + [""]


def _pruned_note(available: dict[str, dict]) -> str:
    removed = {b: sum((s.get("pruned_by_retention") or {}).values())
               for b, s in available.items()}
    if not any(removed.values()):
        return "and removed nothing: the dataset is what retention keeps"
    return ("and removed " + ", ".join(f"{n} rows on {_db(b)}" for b, n in removed.items())
            + " the dataset held beyond retention (the totals below are after it)")


def _days(available: dict[str, dict], key: str) -> str:
    days = next(iter(available.values())).get(key)
    if days is None:
        return "?"
    return f"{days:g} day" + ("" if days == 1 else "s")


# The dataset's tables by role (``bench.dataset.Tables.roles``), for results without them.
STORAGE_TABLES = {"collection": "collectors_collection", "host_reading": "collectors_hostreading",
                  "rollup": "collectors_rollup", "engine_reading": "collectors_enginereading",
                  "engine_rollup": "collectors_enginerollup"}


def _table(stored: dict, role: str) -> dict:
    """The measured sizes of the table that plays ``role`` (empty when not measured)."""
    name = (stored.get("roles") or STORAGE_TABLES).get(role, STORAGE_TABLES[role])
    return stored["tables"].get(name) or {}


def _figures(available: dict[str, dict], role: str, default: int) -> int:
    """Figures a generated reading of ``role`` holds."""
    return _table(next(iter(available.values())), role).get("figures_per_row", default)


def storage_section(results: dict) -> list[str]:
    lines = ["## 5. Storage", ""]
    data = {b: _phase(results, b) for b in ("sqlite", "postgresql")}
    available = {b: d["storage"] for b, (d, _) in data.items() if d}
    if not available:
        return lines + [f"Not measured: {data['sqlite'][1]}", ""]
    lines += [
        "The dataset of §4, written one day at a time and measured after each day (SQLite: the "
        "file, write-ahead log folded in; PostgreSQL: `pg_total_relation_size` of the five "
        "tables written — collections, host readings, host roll-ups, engine readings, engine "
        "roll-ups: rows, indexes, TOAST and maps — after VACUUM ANALYZE at the end). Each "
        "day holds what the retention tiers keep at its age: a *raw day* (the last "
        f"{_days(available, 'raw_days')}) per 5 s a collection row, one host reading row "
        f"({_figures(available, 'host_reading', 21)} figures in columns) and one engine reading "
        f"row per engine ({_figures(available, 'engine_reading', 12)} figures), plus every "
        "roll-up tier; a *minute day* (up to "
        f"{_days(available, 'minute_days')} back) the minute, ten-minute and hourly roll-ups "
        "(min/mean/max/count of each host and engine metric); an *older day* the ten-minute "
        "and hourly roll-ups. The project's own `prune_node` then ran over the result "
        + _pruned_note(available) + ".",
        "",
        "| | " + " | ".join(_db(b) for b in available) + " |",
        "|---|" + "---|" * len(available),
    ]

    def row(label: str, cell: Callable[[dict], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(s) for s in available.values()) + " |")

    row("Raw day (MiB per node per day)", lambda s: fmt(s.get("raw_day_mib"), "MiB"))
    row("Minute day (MiB per node per day)", lambda s: fmt(s.get("minute_day_mib"), "MiB"))
    row("Older day (MiB per node per day)", lambda s: fmt(s.get("older_day_mib"), "MiB"))
    row("Measured total", lambda s: f"{s['total_mib']:.0f} MiB for {s['days']:g} days")
    row("30 days extrapolated (from the medians of each kind of day)",
        lambda s: _num(s.get("extrapolated_30d_mib"), "MiB"))
    for role, label in (("host_reading", "host reading"), ("engine_reading", "engine reading"),
                        ("rollup", "host roll-up"), ("engine_rollup", "engine roll-up"),
                        ("collection", "collection")):
        row(f"Bytes per {label} row (table + indexes)",
            lambda s, r=role: _num(_table(s, r).get("bytes_per_row"), "B"))
    for role, label, held in (("host_reading", "host", 21), ("engine_reading", "engine", 12)):
        row(f"Bytes per {label} figure ({label} reading row / the "
            f"{_figures(available, role, held)} figures it holds; formerly a row each)",
            lambda s, r=role: _num(_table(s, r).get("bytes_per_figure"), "B"))
    row("Estimate, 30 days keeping raw rows 7 days (the earlier default)",
        lambda s: f"{s['retention_estimates']['seven_days_raw_30d_mib']:.0f} MiB")
    row("Estimate, 30 days keeping raw rows 12 hours",
        lambda s: f"{s['retention_estimates']['half_day_raw_30d_mib']:.0f} MiB")
    lines.append("")
    for backend, stored in available.items():
        measured = stored["days"] >= 29.99
        total = storage_30d(stored)
        lines.append(f"- {_db(backend)}: ≤ {STORAGE_TARGET_MIB} MiB for 30 days: "
                     f"{verdict(total <= STORAGE_TARGET_MIB)} ({total:.0f} MiB, "
                     f"{'measured' if measured else 'extrapolated'}).")
    return lines + [""]


def _latency(row: dict) -> str:
    """"45 / 80 / 120 ms (n=60)" — p50 / p95 / worst; errors named."""
    if not row.get("n"):
        return f"— (no answer: {'; '.join(row.get('failures') or ['no request'])})"
    errors = f"; {row['errors']} failed: {'; '.join(row['failures'])}" if row["errors"] else ""
    return (f"{row['median']:.0f} / {row['p95']:.0f} / {row['max']:.0f} ms "
            f"(n={row['n']}{errors})")


def _cpu(stack: dict, every: float) -> str:
    spread = _s(stack["cpu_percent"])
    if spread is None:
        return f"{stack['cpu_percent_window']:.1f} %"
    return (f"{stack['cpu_percent_window']:.1f} % (per {every:g} s: {spread.min:.1f}–"
            f"{spread.max:.1f} %, n={spread.n})")


def _rate(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _in_process_row(fleet: dict) -> list[str]:
    own = fleet.get("fleet_in_process")
    if not own:
        return []
    return [f"| … the view's own time after the window (in-process test client, no HTTP; the "
            f"nodes still writing): median / worst; database queries | {own['median']:.0f} / "
            f"{own['max']:.0f} ms (n={own['n']}); {own['queries']} queries | — | |"]


def dip_section(results: dict) -> list[str]:
    lines = ["## 7. Dip capture", ""]
    dip, missing = _phase(results, "dip")
    if not dip:
        return lines + [f"Not measured: {missing}", ""]
    viewed = dip.get("still_view") is not None
    source = ("the isolated view of §3 (MemAvailable moved by the allocation alone; the "
              "allocation and its timing are real)" if dip["meminfo"] == "isolated"
              else "the real /proc/meminfo")
    lines += [
        f"`bench/dip_recall.py`: per trial one host window ({dip['interval']:g} s interval, "
        f"{dip['period']:g} s period) while a child process touches every page of "
        f"{dip['size'] / 2**20:.0f} MiB at a random moment, holds it {dip['hold']:g} s and frees "
        f"it; the two ways of watching take turns. A dip is caught when the window's minimum "
        f"was read during the hold and shows at least 90 % of the depth made (the allocator's "
        f"own MemAvailable before it allocated). The dips are read through {source}"
        f"; the still-memory CPU is the watcher thread's over back-to-back windows, on the real "
        f"/proc{' and on the view' if viewed else ''}. `paced` (the default) reads every "
        f"0.25 s while memory is still and every 0.1 s for a second after a fall of 64 MiB or "
        f"more, most reads of the MemAvailable line alone; `every-period` is the former way, a "
        f"full read every 0.1 s. Seed {dip['seed']}.", "",
        "| Way | Recall | Depth made / seen (lowest seen) | Reads per window (dip; still "
        "/proc) | CPU per minute, still /proc" + ("; still view" if viewed else "") + " |",
        "|---|---|---|---|---|",
    ]
    for method, row in dip["summary"].items():
        seen = "—" if row["depth_seen_mib"] is None else \
            f"{row['depth_seen_mib']:.0f} ({row['depth_seen_min_mib']:.0f})"
        view = f"; {row['cpu_ms_per_minute_view']:.0f} ms" if viewed else ""
        lines.append(f"| `{method}` | {row['caught']}/{row['trials']} ({row['recall']:.0%}) | "
                     f"{row['depth_made_mib']:.0f} / {seen} MiB | "
                     f"{row['reads_per_window_dip']:.0f}; {row['reads_per_window']:.0f} | "
                     f"{row['cpu_ms_per_minute']:.0f} ms{view} |")
    return lines + [""]


def fleet_section(results: dict) -> list[str]:
    lines = ["## 6. Fleet", ""]
    fleet, missing = _phase(results, "fleet")
    if not fleet:
        return lines + [f"Not measured: {missing}", ""]
    profile = results["profile"]
    every = profile["fleet_sample_every_s"]
    nodes, engines = fleet["nodes"], fleet["engines_per_node"]
    stacks, database, seen = fleet["stacks"], fleet["database"], fleet["observed"]
    niceness = (f" at the lowest CPU priority (`nice {fleet['node_niceness']}`: in a fleet its "
                f"work runs on its own host, so here it takes the time the centre and the "
                f"database leave)" if fleet.get("node_niceness") else "")
    window = fleet["window_s"]
    window_text = f"{window:.0f} s" if window < 120 else f"{window / 60:.1f} min"
    lines += [
        f"The centre of a fleet of {nodes} nodes with {engines} engines each, all writing into "
        f"one PostgreSQL: SparkOps as `bin/sparkops start` runs it (`runstack`: web, the Celery "
        f"worker with beat in it) on PostgreSQL and a private Redis as broker. Its beat "
        f"schedules every node's collections on the node's own queue (`SPARKOPS_BEAT_NODES` "
        f"names the {nodes} nodes; the centre collects no host itself), its worker evaluates "
        f"each node's alerts after every collection, sweeps the outbox, rolls up and prunes; "
        f"one signed-in tab stays open on the fleet view (every {fleet['interval_s']:g} s) and "
        f"asks for a chart every {fleet['chart_every']} polls. Each node is a process of its "
        f"own on this machine{niceness}, configured as its node (name, data directory, the "
        f"central database and broker): the project's node agent (`bin/sparkops agent`: "
        f"`manage.py runagent`, its supervisor and one Celery worker of the node's queue). It "
        f"runs the real collection code: a collection every {fleet['interval_s']:g} s with its "
        f"host samples, each engine's samples and "
        f"row, the ledger on the node's row, the flight recorder and the kernel log, and a "
        f"heartbeat. Its host is a `/proc` of its own (this machine's entries, with a GB10's "
        f"MemTotal and a MemAvailable per node in `meminfo`); its engines are {engines} "
        f"emulated vLLM engines in real containers that every node discovers as its own, so "
        f"the centre receives {nodes} × {engines} engines' rows. Readings of every process and "
        f"of the database every {every:g} s over {window_text}, after every node "
        f"collected and {fleet['warmup_s']:g} s more. CPU: CPU time between the first and the "
        f"last reading over the wall time, as a share of one core.",
        "",
    ]
    centre, pg, redis, workers = (stacks[n] for n in ("centre", "postgresql", "redis", "nodes"))
    cpu = centre["cpu_percent_window"]
    lines += [
        "| Figure | Value | Target | |",
        "|---|---|---|---|",
        f"| Fleet view (`{fleet['fleet_path']}`, signed in): p50 / p95 / worst | "
        f"{_latency(fleet['latency']['fleet'])} | p95 ≤ {FLEET_VIEW_TARGET_MS} ms | "
        f"{verdict(fleet_view_met(fleet))} |",
        *_in_process_row(fleet),
        f"| Chart (`{fleet['chart_path']}`): p50 / p95 / worst | "
        f"{_latency(fleet['latency']['chart'])} | — | |",
        f"| Central CPU (web, worker with beat; % of one core) | {_cpu(centre, every)} | "
        f"≤ {CENTRAL_CPU_TARGET} % | {verdict(cpu <= CENTRAL_CPU_TARGET)} |",
        f"| Central memory: RSS sum; distinct resident pages | "
        f"{fmt(centre['rss_mib'], 'MiB', 0)}; {fmt(centre['distinct_mib'], 'MiB', 0)} | — | |",
        f"| PostgreSQL, all its processes: CPU; RSS sum | {_cpu(pg, every)}; "
        f"{fmt(pg['rss_mib'], 'MiB', 0)} | — | |",
        f"| Redis: CPU; RSS | {_cpu(redis, every)}; {fmt(redis['rss_mib'], 'MiB', 0)} | — | |",
        f"| The {nodes} nodes' processes (on their own hosts in a fleet): CPU; RSS sum | "
        f"{_cpu(workers, every)}; {fmt(workers['rss_mib'], 'MiB', 0)} | — | |",
        f"| Database rows written per second: inserted / updated / deleted | "
        f"{_rate(database['inserted_per_s'])} / {_rate(database['updated_per_s'])} / "
        f"{_rate(database['deleted_per_s'])} rows/s ({_rate(database['commits_per_s'])} "
        f"commits/s) | — | |",
        f"| Database bytes per second: WAL written; tables and indexes grew | "
        f"{database['wal_bytes_per_s'] / 1024:,.0f} KiB/s; "
        f"{database['table_bytes_per_s'] / 1024:,.0f} KiB/s "
        f"({database['table_bytes_per_s'] * 86400 / 2**30:.1f} GiB a day) | — | |",
        f"| Connections to the database (the readings' own left out) | "
        f"{fmt(database['connections'], '', 0)} | — | |",
        "",
        "Rows by table (per second, from `pg_stat_user_tables`; the busiest):",
        "",
        "| Table | Inserted | Updated | Deleted |",
        "|---|---|---|---|",
    ]
    for row in database["tables"][:8]:
        lines.append(f"| `{row['table']}` | {_rate(row['inserted_per_s'])} | "
                     f"{_rate(row['updated_per_s'])} | {_rate(row['deleted_per_s'])} |")
    per_minute = _s(seen["collections_per_node_minute"])
    lines += [
        "",
        f"During the window the nodes stored {seen['collections_ok']} collections "
        f"({seen['collections_failed']} failed): "
        + (f"{per_minute.median:.1f} per node and minute ({per_minute.min:.1f}–"
           f"{per_minute.max:.1f}) against {seen['collections_expected_per_minute']:g} "
           f"scheduled" if per_minute else "none per node")
        + f", {seen['host_samples_per_collection']} host samples per collection and "
        f"{seen['engine_samples_per_engine_cycle']} samples per engine and collection; "
        f"{seen['nodes_beating']} of {nodes} nodes had beaten within two heartbeat intervals "
        f"of its end. The database holds {seen['node_rows']} node rows, the centre's own among "
        f"them, for which {seen.get('centre_collections', 0)} collections were stored (the "
        f"centre watches no host of its own). Rows per second of the whole database count "
        f"its catalogs too (autovacuum's table statistics are rows); the table list is "
        f"SparkOps' tables only.",
        "",
        "The centre by process, at the last reading (RSS / PSS, MiB):",
        "",
        "| Process | RSS | PSS |",
        "|---|---|---|",
    ]
    lines += [f"| {p['role']} | {p['rss_mib']:.0f} | {p['pss_mib']:.0f} |"
              for p in centre["by_process"]]
    lines += [
        "",
        f"- Fleet view p95 ≤ {FLEET_VIEW_TARGET_MS} ms with {nodes} nodes × {engines} engines: "
        f"{verdict(fleet_view_met(fleet))}.",
        f"- Central CPU ≤ {CENTRAL_CPU_TARGET} % of one core: "
        f"{verdict(cpu <= CENTRAL_CPU_TARGET)} ({cpu:.1f} %).",
    ]
    return lines + [""]


def render(results: dict) -> str:
    profile = results["profile"]["name"]
    intro = [
        "# SparkOps benchmark results",
        "",
        f"Written by `bench/run{'' if profile == 'full' else ' --' + profile}` "
        f"({profile} profile) on {results['started']}; the run took "
        f"{results['total_seconds'] / 60:.1f} minutes. How each figure is measured, and what "
        f"it would take to meet the targets that are missed: `bench/README.md`. Figures are "
        f"medians with (min–max, n); MiB = 2²⁰ bytes, and the MB targets are read as MiB.",
        "",
    ]
    if profile != "full":
        intro += [f"> **{profile} profile**: smaller than the issue's figures (see "
                  "`bench/profiles.py`); not for quoting.", ""]
    sections = [intro, headline(results), machine_section(results), footprint_section(results),
                cost_section(results), alert_section(results), chart_section(results),
                storage_section(results), fleet_section(results), dip_section(results)]
    return "\n".join(line for section in sections for line in section).rstrip() + "\n"
