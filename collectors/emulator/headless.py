"""A headless rank: one node's part of an engine spread over nodes, which serves nothing.

``vllm serve … --headless`` starts no API server (vllm/entrypoints/cli/serve.py:69-78 of
0.33.0): a node of ``--node-rank`` above 0 runs the workers of its share of the model and joins
its head at ``--master-addr:--master-port`` for torch.distributed; any other headless node runs
data-parallel engines that join ``--data-parallel-address:--data-parallel-rpc-port``
(serve.py:181-243). Here the rank logs that launch line, then its workers' start-up lines
(``(Worker_TP1 pid=N)``: weights, profiling, the KV pool, CUDA graphs) while it really reserves
what its flags say, and then holds it, serving no port at all, until it is stopped. It does not
connect to its head: when the head stops, the rank keeps running and keeps its memory, as an
orphaned rank does on a GB10 (the same holds for a real rank until its collectives time out).

Exit status as the full emulator's: 0 after SIGTERM/SIGINT, 1 when its start fails.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

from . import messages
from .cli import EmulatorConfig, RankSpec
from .logs import VllmLog
from .startup import Interrupted, Resources, Startup, StartupFailed, report_failure


def worker_name(rank: RankSpec) -> str:
    """The first worker's process name on this node (vllm/v1/executor/multiproc_executor.py:
    1214-1229 of 0.33.0: ``Worker`` + ``_PP<n>`` + ``_TP<n>``, each only when that size is
    above 1), its global rank being the node's first: node rank × GPUs per node."""
    tp, pp = rank.tensor_parallel_size, rank.pipeline_parallel_size
    per_node = max((tp * pp) // max(rank.nnodes, 1), 1)
    first = rank.node_rank * per_node
    name = "Worker"
    if pp > 1:
        name += f"_PP{first // tp}"
    if tp > 1:
        name += f"_TP{first % tp}"
    return name


def run_headless(config: EmulatorConfig) -> int:
    """Run the rank until a stop signal; return the process exit status."""
    rank = config.rank
    log = VllmLog(config.style, sys.stdout, os.getpid(), core_process=worker_name(rank))
    data_parallel = not (rank.nnodes > 1 and rank.node_rank > 0)
    if not data_parallel:
        log.main(*messages.headless_executor(config.version,
                                             f"{rank.master_addr}:{rank.master_port}"))
    else:
        address = rank.data_parallel_address or rank.master_addr
        log.main(*messages.headless_data_parallel(rank.data_parallel_size_local or 1,
                                                  f"tcp://{address}:{rank.data_parallel_rpc_port}"))
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    resources = Resources()
    try:
        Startup(config, log, stop, resources).run()
    except StartupFailed as failure:
        report_failure(log, failure)
        resources.free_all()
        return 1
    except Interrupted:
        resources.free_all()
        return 0
    while not stop.wait(0.5):
        pass
    if data_parallel:  # the multi-node executor's path logs nothing more (serve.py:231-233)
        log.main("serve.py:266", "Shutting down.")
    resources.free_all()
    return 0
