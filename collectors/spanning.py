"""Engines that span nodes: which distributed engine a container belongs to, and which rank it is.

GB10 owners split one model over 2–4 Sparks linked by ConnectX-7: tensor or pipeline parallel
over vLLM's own multiprocessing executor or Ray, data parallel, or SGLang across nodes. Every
node runs a container for its part, and SparkOps stores one ``Engine`` row per container per
node. :func:`span_of` reads, from a container's parsed launch flags, its command line, its
environment and its labels, the engine the container is a part of (:attr:`Span.key`, the same on
every node: the rendezvous address and port, plus the model where the flags name it) and its
place in it: ``Engine.span_key`` and ``Engine.span`` (:meth:`Span.as_dict`). Nothing is asked of
the engine itself; pure and cheap.

What each engine's flags mean, from its own source:

* **vLLM 0.33.0** (the ``vllm-0.33.0.tar.gz`` source distribution on the Python package index;
  the flags exist from 0.11 on, ``tests/fixtures/vllm_releases``):

  - multi-node tensor/pipeline parallel with vLLM's own executor (``mp``):
    ``--nnodes``/``-n``, ``--node-rank``/``-r``, ``--master-addr``, ``--master-port``
    (vllm/engine/arg_utils.py:1175-1178; defaults 1, 0, 127.0.0.1 and 29501,
    vllm/config/parallel.py:317-326); every node but the head adds ``--headless``
    (docs/serving/parallelism_scaling.md:145-159). ``--nnodes`` above 1 needs the ``mp``
    executor, not Ray (vllm/config/parallel.py:1107-1113);
  - data parallel: ``--data-parallel-size``/``-dp``, ``--data-parallel-size-local``/``-dpl``,
    ``--data-parallel-start-rank``/``-dpr``, ``--data-parallel-rank``/``-dpn`` (external load
    balancing: every rank serves its own API), ``--data-parallel-address``/``-dpa`` (for ``mp``
    it defaults to ``--master-addr``) and ``--data-parallel-rpc-port``/``-dpp`` (default 29550)
    (vllm/engine/arg_utils.py:1240-1277, 2539-2562; vllm/config/parallel.py:159-161;
    docs/serving/data_parallel_deployment.md:42-60, 121-126);
  - ``--headless`` (vllm/entrypoints/common/cli_args.py:444) starts no API server
    (vllm/entrypoints/cli/serve.py:69-78, 150): a rank of ``--node-rank`` above 0 runs the
    headless multiproc executor that joins ``--master-addr:--master-port``, any other runs
    data-parallel engines that join ``--data-parallel-address:--data-parallel-rpc-port``
    (serve.py:181-243);
  - Ray: ``--distributed-executor-backend ray`` (arg_utils.py:1166) on the head, whose
    container, as vLLM's ``examples/ray_serving/run_cluster.sh`` starts it, runs ``ray start
    --block --head --node-ip-address=<head> --port=6379`` (``vllm serve`` is then run in it),
    and a container per worker node running ``ray start --block --address=<head>:6379`` from a
    vLLM image, with ``VLLM_HOST_IP`` in the environment of each. Ray's own documentation: the
    head's ``--port`` defaults to 6379. ``--tensor-parallel-size``/``-tp`` ×
    ``--pipeline-parallel-size``/``-pp`` GPUs (arg_utils.py:1170, 1208); a GB10 has one, so
    that many nodes.

* **SGLang 0.5.23** (the ``sglang-0.5.23`` wheel): ``--nnodes``, ``--node-rank``,
  ``--dist-init-addr`` (alias ``--nccl-init-addr``) and ``--tp-size`` (alias
  ``--tensor-parallel-size``) (sglang/srt/arg_groups/fields/parallel.py:32-51); a node of rank
  1 or more starts no HTTP server (sglang/srt/entrypoints/http_server.py:3163), only a
  stand-in answering ``/ping``, ``/health`` and ``/health_generate``
  (sglang/srt/entrypoints/engine.py:1234-1285), so the API SparkOps reads is the head's.

* **A label**, for setups none of these flags describe: ``sparkops.span=<name>`` with
  ``sparkops.span.rank=<n>`` (0 is the head), and ``sparkops.span.ranks=<n>`` where the admin
  wants a missing rank noticed. The label wins over the flags.

``rank`` is the first rank the container runs and ``ranks`` how many there are in all, in the
engine's own numbering (a node for tensor/pipeline parallel and SGLang, a data-parallel rank for
data parallel), ``local`` how many of them the container runs; either is None where nothing
says. A headless rank serves no API (:attr:`Span.serves_api`): it is not read over HTTP, and
it is not "down" for that.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collectors.docker_api import EngineContainer
from collectors.kinds.base import Launch
from collectors.redaction import mask_command

SPAN_LABEL = "sparkops.span"
RANK_LABEL = "sparkops.span.rank"
RANKS_LABEL = "sparkops.span.ranks"

HEAD, RANK = "head", "rank"
MP, RAY, SGLANG, LABEL = "mp", "ray", "sglang", "label"

# vllm/config/parallel.py:159-161, 317-326 (vLLM 0.33.0).
VLLM_MASTER_ADDR, VLLM_MASTER_PORT, VLLM_DP_RPC_PORT = "127.0.0.1", 29501, 29550
# Ray's documentation of `ray start --port`.
RAY_PORT = 6379
# Engine.span_key's column width.
KEY_LENGTH = 255


@dataclass(frozen=True)
class Span:
    """One container's place in an engine that spans nodes.

    ``key`` names the engine on every node ("" when the flags do not say where its parts meet:
    then no partner can be found, and ``basis`` says why). ``rendezvous`` is "addr:port" or None.
    """

    key: str
    role: str  # HEAD or RANK
    rank: int | None
    ranks: int | None
    local: int | None
    backend: str  # MP, RAY, SGLANG or LABEL
    rendezvous: str | None
    basis: str
    serves_api: bool

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "ranks": self.ranks, "local": self.local,
                "backend": self.backend, "rendezvous": self.rendezvous, "basis": self.basis,
                "serves_api": self.serves_api}


def span_of(kind: str, config: Mapping[str, Any] | None, command: Sequence[str],
            env: Mapping[str, str], labels: Mapping[str, str]) -> Span | None:
    """The span a container is part of, or None for an engine on one node.

    ``config`` is the launch settings its kind's reader parsed (``Engine.config``; None when
    they could not be read), ``command`` its command line (masked or not: only addresses,
    ports and counts are read from it).
    """
    if labels.get(SPAN_LABEL, "").strip():
        return _labelled(labels)
    flags = (config or {}).get("all_flags") or {}
    model = (config or {}).get("model")
    if kind == "vllm":
        return _vllm(flags, model, command, env)
    if kind == "sglang":
        return _sglang(flags, model)
    return None


def container_span(container: EngineContainer, launch: Launch | None) -> Span | None:
    """:func:`span_of` for a container as the container engine lists it."""
    return span_of(container.kind, launch.config if launch else None,
                   mask_command(container.command), container.env, container.labels)


def span_fields(container: EngineContainer, launch: Launch | None) -> tuple[str, dict[str, Any]]:
    """What ``Engine.span_key`` and ``Engine.span`` hold for the container: ("", {}) for an
    engine on one node."""
    span = container_span(container, launch)
    return ("", {}) if span is None else (span.key, span.as_dict())


def ray_node_without_serve(container: EngineContainer) -> str:
    """Why a container's vLLM flags are not in its command when it is a Ray node started as
    vLLM's ``examples/ray_serving/run_cluster.sh`` starts one (``ray start``, no ``vllm
    serve``): "" for any other container. A worker's engine flags are its head's; the head's
    ``vllm serve`` is run in it afterwards (``docker exec``), so no command shows them."""
    words = _words(mask_command(container.command))
    ray = _ray_start(words)
    if ray is None or any(os.path.basename(word) == "vllm" for word in words):
        return ""
    if ray.head:
        return ("a Ray head node (`ray start --head`): its `vllm serve` runs in it afterwards "
                "(docker exec), so its flags are in no container command; what its log and "
                "metrics say stands for them")
    return ("a Ray worker node (`ray start --address`): it runs no `vllm serve` of its own; "
            "the engine's flags are its head's")


def serves_http(container: EngineContainer, launch: Launch | None) -> bool:
    """Does the container serve its kind's HTTP API? Not a headless rank of a spanning engine."""
    span = container_span(container, launch)
    return span is None or span.serves_api


# --- the label -------------------------------------------------------------------------------


def _labelled(labels: Mapping[str, str]) -> Span:
    name = labels[SPAN_LABEL].strip()
    rank, rank_note = _label_number(labels, RANK_LABEL)
    ranks, ranks_note = _label_number(labels, RANKS_LABEL)
    said = [f"label {SPAN_LABEL}={name}"]
    said += [f"{label}={labels[label].strip()}" for label in (RANK_LABEL, RANKS_LABEL)
             if labels.get(label, "").strip()]
    basis = ", ".join(said) + "".join(note for note in (rank_note, ranks_note) if note)
    return Span(key=_key(f"label|{name}"), role=HEAD if rank == 0 else RANK, rank=rank,
                ranks=ranks, local=1 if rank is not None else None, backend=LABEL,
                rendezvous=None, basis=basis, serves_api=rank in (None, 0))


def _label_number(labels: Mapping[str, str], label: str) -> tuple[int | None, str]:
    text = labels.get(label, "").strip()
    if not text:
        return None, ""
    if text.isdigit():
        return int(text), ""
    return None, f" ({label} is not a whole number: {text!r}; ignored)"


# --- vLLM --------------------------------------------------------------------------------------


def _vllm(flags: Mapping[str, Any], model: str | None, command: Sequence[str],
          env: Mapping[str, str]) -> Span | None:
    ray = _ray_start(command)
    if ray is not None:
        return _ray_node(ray, flags, env)
    nnodes, node_rank = _int(flags, "nnodes"), _int(flags, "node-rank")
    headless = flags.get("headless") is True
    if nnodes is not None and nnodes > 1:
        return _vllm_nodes(flags, model, nnodes, node_rank or 0, headless)
    if flags.get("distributed-executor-backend") == "ray" and _world(flags) > 1:
        return _ray_head(flags, env, None)
    return _vllm_data_parallel(flags, model, env, headless)


def _world(flags: Mapping[str, Any]) -> int:
    """GPUs one model replica runs on: tensor × pipeline parallel."""
    return (_int(flags, "tensor-parallel-size") or 1) * (_int(flags, "pipeline-parallel-size") or 1)


def _vllm_nodes(flags: Mapping[str, Any], model: str | None, nnodes: int, node_rank: int,
                headless: bool) -> Span:
    """``--nnodes N --node-rank R --master-addr A --master-port P``: vLLM's own executor."""
    address = str(flags.get("master-addr") or VLLM_MASTER_ADDR)
    port = _int(flags, "master-port") or VLLM_MASTER_PORT
    rendezvous = f"{address}:{port}"
    said = [f"--nnodes {nnodes}", f"--node-rank {node_rank}",
            f"--master-addr {address}" if flags.get("master-addr")
            else f"--master-addr unset ({VLLM_MASTER_ADDR}, vLLM's default)",
            f"--master-port {port}" if flags.get("master-port")
            else f"--master-port unset ({VLLM_MASTER_PORT}, vLLM's default)"]
    if headless:
        said.append("--headless: no API server on this node")
    return Span(key=_key(f"vllm-mp|{rendezvous}|{_model(model)}"),
                role=HEAD if node_rank == 0 and not headless else RANK, rank=node_rank,
                ranks=nnodes, local=1, backend=MP, rendezvous=rendezvous,
                basis=", ".join(said), serves_api=not headless)


def _vllm_data_parallel(flags: Mapping[str, Any], model: str | None, env: Mapping[str, str],
                        headless: bool) -> Span | None:
    """Data parallel across containers: a headless part, ranks started elsewhere (a start rank,
    fewer local ranks than in all) or an external load balancer's rank (its own API)."""
    size = _int(flags, "data-parallel-size") or 1
    local = _int(flags, "data-parallel-size-local")
    start = _int(flags, "data-parallel-start-rank")
    external = _int(flags, "data-parallel-rank")
    spans = headless or external is not None or (start or 0) > 0 \
        or (local is not None and local < size)
    if size <= 1 or not spans:
        return None
    if flags.get("data-parallel-backend") == "ray":
        return _ray_head(flags, env, None, data_parallel=True)
    address = str(flags.get("data-parallel-address") or flags.get("master-addr")
                  or VLLM_MASTER_ADDR)
    port = _int(flags, "data-parallel-rpc-port") or VLLM_DP_RPC_PORT
    rendezvous = f"{address}:{port}"
    said = [f"--data-parallel-size {size}",
            f"--data-parallel-address {address}" if flags.get("data-parallel-address")
            else f"--data-parallel-address unset ({address})",
            f"--data-parallel-rpc-port {port}" if flags.get("data-parallel-rpc-port")
            else f"--data-parallel-rpc-port unset ({VLLM_DP_RPC_PORT}, vLLM's default)"]
    if external is not None:
        first, count = external, 1
        said.append(f"--data-parallel-rank {external}: its own API (external load balancing)")
    else:
        first = start or 0
        count = local if local is not None else size
        said.append(f"--data-parallel-size-local {count}" if local is not None
                    else f"--data-parallel-size-local unset ({size})")
        if start is not None:
            said.append(f"--data-parallel-start-rank {start}")
        said.append(_rank_range(first, count, size))
    if headless:
        said.append("--headless: no API server in this container")
    return Span(key=_key(f"vllm-dp|{rendezvous}|{_model(model)}"),
                role=HEAD if first == 0 and not headless else RANK, rank=first, ranks=size,
                local=count, backend=MP, rendezvous=rendezvous, basis=", ".join(said),
                serves_api=not headless)


def _rank_range(first: int, count: int, size: int) -> str:
    if count == 0:
        return f"no data-parallel rank here (API server only) of {size}"
    if count == 1:
        return f"data-parallel rank {first} of {size}"
    return f"data-parallel ranks {first}–{first + count - 1} of {size}"


# --- Ray ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RayStart:
    head: bool
    address: str | None  # a worker's --address (host:port)
    port: int | None  # a head's --port
    node_ip: str | None


def _ray_start(command: Sequence[str]) -> _RayStart | None:
    """``ray start …`` in the command line (also inside ``sh -c "…"``), its flags read."""
    words = _words(command)
    for index, word in enumerate(words):
        if os.path.basename(word) == "ray" and words[index + 1:index + 2] == ["start"]:
            flags = _long_flags(words[index + 2:])
            port = flags.get("port")
            return _RayStart(head=flags.get("head") is True,
                             address=flags.get("address") if isinstance(flags.get("address"),
                                                                         str) else None,
                             port=int(port) if isinstance(port, str) and port.isdigit() else None,
                             node_ip=flags.get("node-ip-address")
                             if isinstance(flags.get("node-ip-address"), str) else None)
    return None


def _ray_node(ray: _RayStart, flags: Mapping[str, Any], env: Mapping[str, str]) -> Span:
    if ray.head:
        return _ray_head(flags, env, ray)
    rendezvous = ray.address
    basis = f"ray start --address={rendezvous}: a Ray worker node of the vLLM engine whose " \
            f"head runs Ray at {rendezvous}" if rendezvous else \
        "ray start without --address: a Ray worker whose head is not named in its command"
    return Span(key=_key(f"ray|{rendezvous}") if rendezvous else "", role=RANK, rank=None,
                ranks=None, local=1, backend=RAY, rendezvous=rendezvous,
                basis=basis + "; Ray workers serve no API", serves_api=False)


def _ray_head(flags: Mapping[str, Any], env: Mapping[str, str], ray: _RayStart | None, *,
              data_parallel: bool = False) -> Span:
    """The head of a Ray cluster that vLLM runs on: ``ray start --head`` in its command and/or
    ``vllm serve … --distributed-executor-backend ray``."""
    port = (ray.port if ray else None) or RAY_PORT
    address = (ray.node_ip if ray else None) or env.get("VLLM_HOST_IP") or None
    said = []
    if ray is not None:
        said.append(f"ray start --head --port={port}" if ray.port
                    else f"ray start --head (port {RAY_PORT}, Ray's default)")
        said.append(f"--node-ip-address={ray.node_ip}" if ray.node_ip
                    else f"VLLM_HOST_IP={address}" if address else "")
    elif "RAY_ADDRESS" in env and ":" in env["RAY_ADDRESS"]:
        host, _, ray_port = env["RAY_ADDRESS"].rpartition(":")
        if ray_port.isdigit():
            address, port = host, int(ray_port)
            said.append(f"RAY_ADDRESS={env['RAY_ADDRESS']}")
    world = _world(flags)
    if data_parallel:
        said.append("--data-parallel-backend ray")
        ranks = None
    elif flags.get("distributed-executor-backend") == "ray":
        said.append(f"--distributed-executor-backend ray with {world} GPU(s) "
                    "(--tensor-parallel-size × --pipeline-parallel-size), one per GB10 node")
        ranks = world
    else:
        said.append("the vllm serve that runs on this Ray head is not in the container's "
                    "command (started in it later): how many nodes it spans is not known")
        ranks = None
    rendezvous = f"{address}:{port}" if address else None
    if rendezvous is None:
        said.append("the head's address is in neither --node-ip-address nor VLLM_HOST_IP: its "
                    f"workers cannot be matched (label it {SPAN_LABEL}=<name>)")
    return Span(key=_key(f"ray|{rendezvous}") if rendezvous else "", role=HEAD, rank=0,
                ranks=ranks, local=1, backend=RAY, rendezvous=rendezvous,
                basis=", ".join(part for part in said if part), serves_api=True)


# --- SGLang ------------------------------------------------------------------------------------


def _sglang(flags: Mapping[str, Any], model: str | None) -> Span | None:
    nnodes = _int(flags, "nnodes")
    if nnodes is None or nnodes <= 1:
        return None
    node_rank = _int(flags, "node-rank") or 0
    address = flags.get("dist-init-addr") or flags.get("nccl-init-addr")
    rendezvous = str(address) if isinstance(address, str) else None
    said = [f"--nnodes {nnodes}", f"--node-rank {node_rank}",
            f"--dist-init-addr {rendezvous}" if rendezvous else
            "no --dist-init-addr: the nodes cannot be matched "
            f"(label them {SPAN_LABEL}=<name>)"]
    if tp := _int(flags, "tp-size") or _int(flags, "tensor-parallel-size"):
        said.append(f"--tp-size {tp}")
    if node_rank > 0:
        said.append("a node of rank 1 or more serves only a stand-in /health, not the API")
    return Span(key=_key(f"sglang|{rendezvous}|{_model(model)}") if rendezvous else "",
                role=HEAD if node_rank == 0 else RANK, rank=node_rank, ranks=nnodes, local=1,
                backend=SGLANG, rendezvous=rendezvous, basis=", ".join(said),
                serves_api=node_rank == 0)


# --- helpers -----------------------------------------------------------------------------------


def _int(flags: Mapping[str, Any], name: str) -> int | None:
    value = flags.get(name)
    if isinstance(value, bool) or value is None:
        return None
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def _model(model: str | None) -> str:
    return (model or "?").rstrip("/")


def _key(text: str) -> str:
    """``text`` as a span key, within the column; a longer one keeps its start and a digest."""
    if len(text) <= KEY_LENGTH:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[:KEY_LENGTH - 17]}#{digest}"


_OPERATORS = "();<>|&\n"


def _words(command: Sequence[str]) -> list[str]:
    """The words of a command line, a shell script's (``sh -c "…"``) split as the shell would."""
    words: list[str] = []
    for word in command:
        if any(space in word for space in " \t\n"):
            lexer = shlex.shlex(word, posix=True, punctuation_chars=_OPERATORS)
            lexer.whitespace_split = True
            try:
                words += list(lexer)
            except ValueError:
                words += word.split()
        else:
            words.append(word)
    return words


def _long_flags(words: Sequence[str]) -> dict[str, str | bool]:
    """``--name value``, ``--name=value`` and bare switches, up to a shell operator."""
    found: dict[str, str | bool] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word and all(ch in _OPERATORS for ch in word):
            break
        if not word.startswith("--"):
            continue
        name, has_value, value = word[2:].partition("=")
        if has_value:
            found[name] = value
        elif index < len(words) and not words[index].startswith("-") \
                and not all(ch in _OPERATORS for ch in words[index]):
            found[name] = words[index]
            index += 1
        else:
            found[name] = True
    return found
