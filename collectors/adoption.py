"""Whose memory is whose inside a model router's container: the router's, and each model's.

A router (llama-swap) runs every model it starts as a child process in its own container, so
the container's cgroup figure holds the router and all its models together. Counting that
figure for the router *and* for each model would count it several times in the ledger, so each
engine is given the memory of its own processes instead: a model's process is found in the
container's process tree (``collectors.procfs.process_tree``) by its command line, which is the
model's ``cmd`` as llama-swap runs it (shell words; a wrapper script that ``exec``s the engine
keeps the arguments), with every process below it; the router holds the rest of the tree.

A model whose process cannot be found gets None with the reason, never 0; a model that is not
running holds 0 (it has no process). Resident memory (``VmRSS``) is what is counted: on unified
memory a CUDA allocation is resident host memory, and the GPU's own per-process figure, where
NVML has one, is given to the same engine by PID.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collectors.procfs import TreeProcess, process_tree


@dataclass(frozen=True)
class ModelProcess:
    """What to look for: a running model's name and its command's words."""

    name: str
    words: tuple[str, ...]


@dataclass
class Holdings:
    """Resident bytes by holder: the router's own processes and each model's (None: not
    determined, with the reason in ``reasons``); the PIDs behind each figure."""

    router_bytes: int | None
    model_bytes: dict[str, int | None] = field(default_factory=dict)
    pids: dict[str, set[int]] = field(default_factory=dict)  # model name or "" (router)
    reasons: dict[str, str] = field(default_factory=dict)


def runs_command(command: Sequence[str], words: Sequence[str]) -> bool:
    """Does a process's command line run ``words``? Equal, or ending with the same arguments
    (a wrapper ``exec``ing the engine under another program name keeps them), with at least
    one argument to compare."""
    if not words or not command:
        return False
    if tuple(command) == tuple(words):
        return True
    arguments = tuple(words[1:])
    return bool(arguments) and tuple(command[-len(arguments):]) == arguments


def attribute(container_pid: int | None, models: Iterable[ModelProcess],
              proc_root: Path = Path("/proc")) -> Holdings:
    """Split the container's processes between its router and its running ``models``."""
    models = list(models)
    if not container_pid:
        reason = "the container's processes are not visible from here (no PID)"
        return Holdings(router_bytes=None, model_bytes={m.name: None for m in models},
                        reasons={m.name: reason for m in models} | {"": reason})
    tree = process_tree(container_pid, proc_root)
    if not tree:
        reason = f"the container's first process (PID {container_pid}) is not in /proc"
        return Holdings(router_bytes=None, model_bytes={m.name: None for m in models},
                        reasons={m.name: reason for m in models} | {"": reason})
    children: dict[int, list[int]] = {}
    for process in tree.values():
        children.setdefault(process.ppid, []).append(process.pid)
    holdings = Holdings(router_bytes=None)
    claimed: set[int] = set()
    for model in models:
        top = _topmost_match(tree, model.words, claimed)
        if top is None:
            holdings.model_bytes[model.name] = None
            holdings.reasons[model.name] = (
                "no process running its cmd was found in the router's container")
            continue
        pids = _subtree(top, children)
        claimed |= pids
        holdings.pids[model.name] = pids
        holdings.model_bytes[model.name] = _resident(tree[pid] for pid in pids)
        if holdings.model_bytes[model.name] is None:
            holdings.reasons[model.name] = "its process reports no resident memory (VmRSS)"
    router_pids = set(tree) - claimed
    holdings.pids[""] = router_pids
    holdings.router_bytes = _resident(tree[pid] for pid in router_pids)
    return holdings


def _topmost_match(tree: dict[int, TreeProcess], words: Sequence[str],
                   claimed: set[int]) -> int | None:
    matches = {pid for pid, p in tree.items() if pid not in claimed and runs_command(p.command,
                                                                                      words)}
    for pid in sorted(matches):
        if tree[pid].ppid not in matches:
            return pid
    return None


def _subtree(top: int, children: dict[int, list[int]]) -> set[int]:
    found, stack = set(), [top]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    return found


def _resident(processes: Iterable[TreeProcess]) -> int | None:
    # A zombie or kernel thread has no VmRSS: it holds nothing of its own.
    values = [p.rss_bytes for p in processes if p.rss_bytes is not None]
    return sum(values) if values else None
