"""One emulator process from start to exit: listen, start the engine, serve, shut down.

Exit status: 0 after SIGTERM/SIGINT (also during start-up), 1 when the engine fails to start or
the port cannot be bound (as vLLM), 2 for a refused command line (handled in `cli`). Memory is
freed on every path; the kernel would reclaim it anyway, but freeing first makes the host's
MemAvailable recover before the process disappears, as a clean vLLM shutdown does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from . import messages
from .cli import EmulatorConfig
from .engine import Engine, EngineSettings
from .loadgen import LoadGenerator
from .logs import VllmLog
from .memory import TransientBuffer
from .metrics import EngineMetrics, cache_config_labels
from .planning import KvPlan
from .server import EmulatorHTTPServer, ServerState
from .sleepmode import SleepMode, dev_mode
from .startup import Interrupted, Resources, Startup, StartupFailed, report_failure
from .stats import StatsLogger

JOIN_SECONDS = 5.0


def _install_stop_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _start_thread(name: str, target: Callable[[threading.Event], None], stop: threading.Event):
    thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
    thread.start()
    return thread


def _build_engine(config: EmulatorConfig, plan: KvPlan, buffer: TransientBuffer) -> Engine:
    labels = cache_config_labels(
        config.style,
        block_size=config.block_size,
        user_specified_block_size=config.user_specified_block_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        cache_dtype=config.kv_cache_dtype,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        num_gpu_blocks=plan.num_gpu_blocks,
        enable_prefix_caching=config.enable_prefix_caching,
        kv_cache_size_tokens=plan.tokens,
        kv_cache_max_concurrency=plan.max_concurrency,
    )
    metrics = EngineMetrics(
        config.style,
        model_name=config.model_name,
        max_model_len=plan.max_model_len,
        cache_config=labels,
        num_speculative_tokens=config.speculative.num_speculative_tokens
        if config.speculative else None,
    )
    settings = EngineSettings(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        num_gpu_blocks=plan.num_gpu_blocks,
        max_model_len=plan.max_model_len,
        prefill_tps=config.prefill_tps,
        decode_tps=config.decode_tps,
        activation_bytes_per_token=config.activation_bytes_per_token,
        prefix_hit_rate=config.prefix_hit_rate if config.enable_prefix_caching else 0.0,
        num_speculative_tokens=config.speculative.num_speculative_tokens
        if config.speculative else 0,
        spec_acceptance=config.spec_acceptance,
    )
    return Engine(settings, metrics, buffer)


def _announce_ready(log: VllmLog, config: EmulatorConfig, plan: KvPlan, url: str) -> None:
    """The API server's lines once the engine is up (`Starting vLLM server on …`, the
    routes), ending in uvicorn's startup."""
    if not config.style.modern:
        log.api(*messages.cache_config_info_logged(plan.num_gpu_blocks))
    log.api(*messages.supported_tasks(config.style))
    log.api(*messages.starting_server(config.style, url))
    for line in messages.route_lines(dev_mode()):
        log.api(*line)
    log.uvicorn(f"Started server process [{log.pid}]")
    log.uvicorn("Waiting for application startup.")
    log.uvicorn("Application startup complete.")


def _announce_shutdown(log: VllmLog) -> None:
    log.uvicorn("Shutting down")
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.api("launcher.py:101", "Shutting down FastAPI HTTP server.")


def _close(server: EmulatorHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def run(config: EmulatorConfig) -> int:
    """Run the emulator until a stop signal; return the process exit status. A headless rank
    (``--headless``) serves nothing: `headless`."""
    if config.rank.headless:
        from .headless import run_headless

        return run_headless(config)
    log = VllmLog(config.style, sys.stdout, os.getpid())
    stop = threading.Event()
    state = ServerState(config=config, log=log, stopping=stop)
    host = config.host or "0.0.0.0"
    try:
        server = EmulatorHTTPServer((host, config.port), state)
    except OSError as exc:
        log.api("launcher.py:84", f"OSError: [Errno {exc.errno}] {exc.strerror}", "ERROR")
        return 1
    _install_stop_signals(stop)
    server_thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    server_thread.start()
    resources = Resources()
    buffer = TransientBuffer()
    try:
        startup = Startup(config, log, stop, resources)
        startup.announce()
        plan = startup.run()
    except StartupFailed as failure:
        report_failure(log, failure)
        resources.free_all()
        _close(server)
        return 1
    except Interrupted:
        _announce_shutdown(log)
        resources.free_all()
        _close(server)
        return 0

    engine = _build_engine(config, plan, buffer)
    state.engine = engine
    state.metrics = engine.metrics
    state.max_model_len = plan.max_model_len
    state.sleep_mode = SleepMode(enabled=config.enable_sleep_mode, engine=engine,
                                 metrics=engine.metrics, resources=resources, log=log)
    threads = [_start_thread("engine", engine.run, stop)]
    stats = StatsLogger(
        engine,
        log,
        interval=config.stats_interval,
        enabled=not config.disable_log_stats,
        prefix_caching=config.enable_prefix_caching,
    )
    threads.append(_start_thread("stats", stats.run, stop))
    _announce_ready(log, config, plan, f"http://{host}:{server.server_address[1]}")
    state.ready = True
    if config.load is not None:
        threads.append(_start_thread("load", LoadGenerator(config.load, engine, log).run, stop))

    while not stop.wait(0.5):
        pass

    _announce_shutdown(log)
    engine.abort_all()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    _close(server)
    buffer.release()
    resources.free_all()
    return 0
