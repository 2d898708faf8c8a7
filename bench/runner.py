"""Run every benchmark and write the results file (``bench/run`` calls this).

Each phase runs as a child process with a Django configuration of its own (the live SparkOps'
database, a cost database, the SQLite and PostgreSQL datasets) and hands back JSON; the runner
owns the shared servers (the private Podman service and PostgreSQL) and writes RESULTS.md from
whatever the phases returned. A phase that fails is reported as failed, with its error, and the
others still run.

Phases: ``live`` (1. footprint and 3. alert latency, on one running world), ``cost``
(2. collection cost), ``sqlite`` and ``postgresql`` (4. chart latency and 5. storage), ``fleet``
(6. the centre of a fleet, in a database of its own on the same PostgreSQL), ``dip`` (7. the
dip capture's recall and cost, ``bench/dip_recall.py``, before the fleet). The database
phases write their datasets (untimed) while ``live`` runs, and are timed after ``cost``;
``--sequential`` keeps everything one after the other. ``fleet`` runs last, alone: its figures
are the centre's CPU time and latency.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import machine, report
from bench.profiles import PROFILES, Profile
from bench.services import PODMAN_STORAGE_ENV, PROJECT, podman_service
from sparkops.testing.postgres import postgres_server

BENCH = PROJECT / "bench"
PHASES = ("live", "cost", "sqlite", "postgresql", "dip", "fleet")


def _phase_argv(phase: str, profile: Profile, workdir: Path, out: Path,
                meminfo: str) -> list[str]:
    common = ["--profile", profile.name, "--workdir", str(workdir / phase), "--json", str(out)]
    if phase == "live":
        return [sys.executable, "-m", "bench.live", *common, "--meminfo", meminfo]
    return [sys.executable, "-m", "bench.collection_cost", *common]


def _chart_argv(backend: str, step: str, profile: Profile, workdir: Path, out: Path,
                database_url: str) -> list[str]:
    argv = [sys.executable, "-m", "bench.chart_latency", "--profile", profile.name,
            "--workdir", str(workdir / backend), "--json", str(out), "--backend", backend,
            "--step", step, "--database-url", database_url]
    if step == "measure":
        argv += ["--generated", str(workdir / f"{backend}-generated.json")]
    return argv


def _dip_argv(profile: Profile, out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.dip_recall", "--trials", str(profile.dip_trials),
            "--still-seconds", f"{profile.dip_still_s:g}", "--json", str(out)]


def _fleet_argv(profile: Profile, workdir: Path, out: Path, database_url: str) -> list[str]:
    return [sys.executable, "-m", "bench.fleet", "--profile", profile.name,
            "--workdir", str(workdir / "fleet"), "--json", str(out),
            "--database-url", database_url]


def run_phase(label: str, argv: list[str], env: dict[str, str], workdir: Path, out: Path,
              fresh: Path | None = None) -> dict:
    """Run one phase; its JSON, or why it failed. Its stderr is kept in ``<label>.log``.
    ``fresh``: a directory emptied first."""
    if fresh is not None:
        shutil.rmtree(fresh, ignore_errors=True)
    out.unlink(missing_ok=True)
    log = workdir / f"{label}.log"
    print(f"== {label}", flush=True)
    began, load_before = time.monotonic(), os.getloadavg()
    with log.open("w") as stderr:
        code = subprocess.run(argv, env=env, cwd=PROJECT, stderr=stderr).returncode
    entry: dict = {"seconds": round(time.monotonic() - began, 1),
                   "loadavg": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}
    if code == 0 and out.exists():
        entry.update(ok=True, data=json.loads(out.read_text()))
    else:
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        entry.update(ok=False, error=f"exit status {code}: " + " | ".join(tail))
        print(f"   {label} FAILED ({log}):\n   " + "\n   ".join(tail), flush=True)
    print(f"   {label} took {entry['seconds']:.0f} s", flush=True)
    return entry


class Generation(threading.Thread):
    """Step 1 of the database phases (writing the datasets), one backend after the other.

    Nothing in it is timed, so by default it runs while the live phase waits for its footprint
    window and alerts (it takes one of the cores and some disk bandwidth meanwhile); the
    timed step 2 runs later on its own.
    """

    def __init__(self, backends: list[str], profile: Profile, workdir: Path,
                 env: dict[str, str], database_url: str) -> None:
        super().__init__(daemon=True)
        self.backends, self.profile, self.workdir = backends, profile, workdir
        self.env, self.database_url = env, database_url
        self.entries: dict[str, dict] = {}

    def run(self) -> None:
        for backend in self.backends:
            out = self.workdir / f"{backend}-generated.json"
            self.entries[backend] = run_phase(
                f"{backend}-generate",
                _chart_argv(backend, "generate", self.profile, self.workdir, out,
                            self.database_url),
                self.env, self.workdir, out, fresh=self.workdir / backend)


def database_phase(backend: str, generated: dict, profile: Profile, workdir: Path,
                   env: dict[str, str], database_url: str) -> dict:
    """Step 2 (timed) after step 1; one entry for the report, both steps' times in it."""
    if not generated.get("ok"):
        return generated
    out = workdir / f"{backend}.json"
    entry = run_phase(backend, _chart_argv(backend, "measure", profile, workdir, out,
                                           database_url), env, workdir, out)
    entry["generate_seconds"] = generated["seconds"]
    entry["loadavg_generate"] = generated["loadavg"]
    return entry


def _stop_on_signal(signum: int, _frame: object) -> None:
    # Unwinds like Ctrl-C: the running phase is killed and every server is stopped and removed.
    raise SystemExit(f"stopped by signal {signum}")


def main() -> None:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    parser = argparse.ArgumentParser(
        prog="bench/run", description="SparkOps benchmarks, side by side with Prometheus.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="1-minute footprint and fewer default-timing waits (a few minutes)")
    size.add_argument("--smoke", action="store_true",
                      help="a tiny run that exercises every benchmark (about 2 min)")
    parser.add_argument("--results", type=Path,
                        help="where to write the results (default bench/RESULTS.md for a full "
                             "run, bench/out/RESULTS-<profile>.md otherwise)")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default bench/out/...)")
    parser.add_argument("--only", help=f"comma-separated phases to run ({', '.join(PHASES)})")
    parser.add_argument("--sequential", action="store_true",
                        help="write the datasets of §4–5 after the live phase instead of while "
                             "it runs (cleaner live figures, about 5 minutes longer)")
    parser.add_argument("--meminfo", choices=("isolated", "real"), default="isolated",
                        help="host memory as the monitors see it in the alert benchmark: "
                             "'isolated' moves only with the benchmark's own allocation (for a "
                             "shared machine; see bench/meminfo_view.py), 'real' is the "
                             "machine's /proc/meminfo")
    parser.add_argument("--keep", action="store_true",
                        help="keep the generated databases (about 500 MB) in the work directory")
    args = parser.parse_args()
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    workdir = (args.workdir or BENCH / "out" / profile.name).resolve()
    results_path = args.results or (BENCH / "RESULTS.md" if profile.name == "full"
                                    else BENCH / "out" / f"RESULTS-{profile.name}.md")
    phases = [p.strip() for p in args.only.split(",")] if args.only else list(PHASES)
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    workdir.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()
    results: dict = {"profile": profile.as_dict(), "machine": machine.describe(),
                     "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "sequential": args.sequential, "phases": {}}
    print(f"SparkOps benchmarks ({profile.name}) on {results['machine']['cpu']}, "
          f"{results['machine']['cores']} cores; scratch in {workdir}", flush=True)
    with (podman_service() as (podman, docker_host),
          postgres_server("sparkops-bench-pg-") as database_url):
        env = {**os.environ, PODMAN_STORAGE_ENV: str(podman.storage),
               "SPARKOPS_DOCKER_HOST": docker_host, "PYTHONUNBUFFERED": "1"}
        generation = Generation([b for b in ("sqlite", "postgresql") if b in phases], profile,
                                workdir, env, database_url)
        if not args.sequential:
            generation.start()
        for phase in ("live", "cost"):
            if phase not in phases:
                continue
            if phase == "cost" and generation.is_alive():
                generation.join()  # the cost phase is timed: nothing else of ours may run
            out = workdir / f"{phase}.json"
            results["phases"][phase] = run_phase(
                phase, _phase_argv(phase, profile, workdir, out, args.meminfo), env, workdir,
                out, fresh=workdir / phase)
        if args.sequential:
            generation.run()
        elif generation.is_alive():
            generation.join()
        for backend, generated in generation.entries.items():
            results["phases"][backend] = database_phase(backend, generated, profile, workdir,
                                                        env, database_url)
        if "dip" in phases:
            out = workdir / "dip.json"
            results["phases"]["dip"] = run_phase("dip", _dip_argv(profile, out), env, workdir,
                                                 out)
        if "fleet" in phases:
            out = workdir / "fleet.json"
            argv = _fleet_argv(profile, workdir, out, database_url)
            results["phases"]["fleet"] = run_phase("fleet", argv, env, workdir, out,
                                                   fresh=workdir / "fleet")
    results["total_seconds"] = round(time.monotonic() - began, 1)
    if not args.keep:
        for phase in ("sqlite", "postgresql"):
            shutil.rmtree(workdir / phase, ignore_errors=True)
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(report.render(results))
    print(f"Done in {results['total_seconds'] / 60:.1f} min; wrote {results_path}")
    if not all(entry.get("ok") for entry in results["phases"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
