"""Drift between nodes that should be alike: versions and settings side by side, differences
marked, and the engines spanning nodes whose ranks disagree.

Two GB10s serving the same model at different speeds are rarely the model's fault: a kernel,
driver or CUDA release apart, another ``vm.min_free_kbytes``, a link at half its rate, an NCCL
variable set on one rank only. The table puts, per node, what its worker read at registration
(``Node.facts``: the kernel, OS, driver, CUDA, firmware, VM settings, SparkOps' release), its
interconnect ports (state and rate), and for each engine its image, its version where its kind
reports one, and the collective-communication environment of its container (``NCCL_*``,
``UCX_*``, ``GLOO_*``, ``CUDA_VISIBLE_DEVICES``; values as ``collectors.redaction`` masked
them).

A row *differs* when two nodes hold different known values. An unknown is not a difference
("unknown — why" is shown, and compared with nothing), nor is a masked secret, nor an engine a
node does not run; a host name is expected to differ and is never marked. A variable set on one
rank and not on another is a difference ("not set" is known), and so is a port one node lacks.

:func:`drift_findings` says it in a sentence for an engine that spans nodes (its rows share
``Engine.span_key``): "<engine> spans a and b, whose drivers differ: 580.95 vs 580.82".

Plain functions over ``Node`` rows and their present engines (``node.engines.all()``: prefetch
them, ``present=True``, and neither function queries). Cost: linear in nodes × rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from collectors.enginecard import engine_card
from collectors.models import Engine, Node
from collectors.redaction import MASK
from sparkops.units import UNKNOWN

# The facts each node's worker reads at registration (collectors.registration), in the order
# an admin compares them, with their labels.
FACT_ROWS: tuple[tuple[str, str], ...] = (
    ("hostname", "Host name"),
    ("kernel", "Kernel"),
    ("os", "OS"),
    ("dgx_os", "DGX OS"),
    ("driver", "NVIDIA driver"),
    ("cuda", "CUDA"),
    ("firmware", "Firmware"),
    ("swappiness", "vm.swappiness"),
    ("min_free_kbytes", "vm.min_free_kbytes"),
    ("overcommit_memory", "vm.overcommit_memory"),
    ("watermark_scale_factor", "vm.watermark_scale_factor"),
    ("transparent_hugepage", "Transparent huge pages"),
    ("sparkops_version", "SparkOps release"),
)
EXPECTED_TO_DIFFER = frozenset({"hostname"})
# The facts whose disagreement between an engine's ranks is a finding, with their plural.
SPAN_FACTS: tuple[tuple[str, str], ...] = (
    ("kernel", "kernels"), ("driver", "drivers"), ("cuda", "CUDA versions"))
COLLECTIVE_PREFIXES = ("NCCL_", "UCX_", "GLOO_")
COLLECTIVE_NAMES = frozenset({"CUDA_VISIBLE_DEVICES"})

NOT_REGISTERED = "this node's worker has not registered it"
NOT_SET = "not set"
NOT_HERE = "not on this node"


@dataclass(frozen=True)
class Cell:
    """One node's value in a row: ``text`` for people, ``value`` what is compared (None: not
    compared — unknown, masked, or nothing of the kind on that node)."""

    text: str
    value: str | None
    unknown: bool = False


@dataclass(frozen=True)
class DriftRow:
    """One thing compared across nodes: ``cells`` in the nodes' order; ``differs`` when two
    known values disagree (never for a row ``expected_to_differ``)."""

    group: str
    label: str
    cells: tuple[Cell, ...]
    key: str
    expected_to_differ: bool = False

    @property
    def differs(self) -> bool:
        if self.expected_to_differ:
            return False
        return len({cell.value for cell in self.cells if cell.value is not None}) > 1

    @property
    def verdict(self) -> str:
        """The row in a word: "differs", "same", "per node" (expected to differ) or "not
        compared" (fewer than two known values)."""
        if self.expected_to_differ:
            return "per node"
        if self.differs:
            return "differs"
        known = sum(1 for cell in self.cells if cell.value is not None)
        return "same" if known >= 2 else "not compared"


@dataclass(frozen=True)
class Finding:
    """An engine spanning ``nodes`` whose ranks disagree on ``what``: ``values`` per node."""

    engine: str
    span_key: str
    nodes: tuple[str, ...]
    what: str
    values: tuple[str, ...]
    text: str


def is_collective(name: str) -> bool:
    """Is ``name`` an environment variable of collective communication (NCCL and its
    transports) or the GPUs a rank sees?"""
    return name.startswith(COLLECTIVE_PREFIXES) or name in COLLECTIVE_NAMES


# --- the table --------------------------------------------------------------------------------


def drift_table(nodes: Sequence[Node]) -> list[DriftRow]:
    """Every row, in the order of the page: the node's facts, its ports, its engines."""
    return [*_fact_rows(nodes), *_port_rows(nodes), *_engine_rows(nodes)]


def fact_cell(node: Node, key: str) -> Cell:
    """``node``'s fact ``key``: its value, or "unknown — why" (not compared)."""
    item = ((node.facts or {}).get("items") or {}).get(key)
    if not item:
        return _unknown(NOT_REGISTERED)
    if item.get("value") is None:
        return _unknown(str(item.get("unknown") or "not read"))
    return Cell(str(item["value"]), str(item["value"]))


def _fact_rows(nodes: Sequence[Node]) -> list[DriftRow]:
    return [DriftRow("Node", label, tuple(fact_cell(node, key) for node in nodes),
                     key=f"fact:{key}", expected_to_differ=key in EXPECTED_TO_DIFFER)
            for key, label in FACT_ROWS]


def _port_rows(nodes: Sequence[Node]) -> list[DriftRow]:
    """Two rows a port (its state, its rate): a link down is a difference even where its rate
    is unknown for it."""
    ports = [_ports(node) for node in nodes]
    names = sorted({name for found in ports if found is not None for name in found})
    rows = []
    for name in names:
        for part, label in (("state", "state"), ("rate", "rate")):
            cells = tuple(_port_cell(found, name, part) for found in ports)
            rows.append(DriftRow("Interconnect", f"{name} {label}", cells,
                                 key=f"port:{name}:{part}"))
    return rows


def _ports(node: Node) -> dict[str, dict[str, Any]] | None:
    """The node's ports by name; None when its worker never read them."""
    facts = node.facts or {}
    if "interconnect" not in facts:
        return None
    return {str(port.get("name")): port for port in facts["interconnect"] or []
            if isinstance(port, dict) and port.get("name")}


def _port_cell(ports: dict[str, dict[str, Any]] | None, name: str, part: str) -> Cell:
    if ports is None:
        return _unknown(NOT_REGISTERED)
    port = ports.get(name)
    if port is None:
        return Cell("no such port", "absent")
    why = str(port.get("unknown") or "not reported")
    if part == "state":
        state = port.get("state")
        return Cell(str(state), str(state)) if state else _unknown(why)
    rate = port.get("rate_gbps")
    if rate is None:
        return _unknown(why)
    text = port.get("rate_text") or f"{rate:g} Gb/s"
    return Cell(str(text), f"{float(rate):g}")


def _engine_rows(nodes: Sequence[Node]) -> list[DriftRow]:
    """Per engine name: its image, version and collective environment on each node."""
    engines = [{engine.name: engine for engine in node.engines.all()} for node in nodes]
    rows = []
    for name in sorted({name for found in engines for name in found}):
        here = [found.get(name) for found in engines]
        rows.append(DriftRow("Engines", f"{name} image",
                             tuple(_engine_cell(e, _image_cell) for e in here),
                             key=f"engine:{name}:image"))
        rows.append(DriftRow("Engines", f"{name} version",
                             tuple(_engine_cell(e, engine_version) for e in here),
                             key=f"engine:{name}:version"))
        variables = sorted({key for e in here if e is not None for key in (e.env or {})
                            if is_collective(key)})
        for variable in variables:
            rows.append(DriftRow(
                "Engines", f"{name} {variable}",
                tuple(_engine_cell(e, lambda engine, v=variable: env_cell(engine, v))
                      for e in here),
                key=f"engine:{name}:env:{variable}"))
    return rows


def _engine_cell(engine: Engine | None, cell_of: Callable[[Engine], Cell]) -> Cell:
    return Cell(NOT_HERE, None) if engine is None else cell_of(engine)


def _image_cell(engine: Engine) -> Cell:
    if not engine.image:
        return _unknown("the container engine gave no image")
    return Cell(engine.image, engine.image)


def engine_version(engine: Engine) -> Cell:
    """The engine's version as its kind's reader stored it (``collectors.enginecard``)."""
    card = engine_card(engine)
    if not card["version"]:
        return _unknown(f"{card['kind_title']} has not reported its version")
    return Cell(str(card["version"]), str(card["version"]))



def env_cell(engine: Engine, variable: str) -> Cell:
    """One environment variable of the engine's container: its value, "not set" (compared:
    set on one rank and not another is a difference), unknown when the environment was never
    read, and a masked secret shown masked and not compared."""
    env = engine.env or {}
    if not env:
        return _unknown("its container's environment has not been read")
    if variable not in env:
        return Cell(NOT_SET, NOT_SET)
    value = str(env[variable])
    if MASK in value:
        return Cell(f"{value} (masked: not compared)", None)
    return Cell(value, value)


def _unknown(why: str) -> Cell:
    return Cell(f"{UNKNOWN} — {why}", None, unknown=True)


# --- engines spanning nodes -------------------------------------------------------------------


def drift_findings(nodes: Iterable[Node]) -> list[Finding]:
    """For each engine spanning two or more of ``nodes`` (rows sharing ``span_key``), one
    finding per kernel, driver, CUDA release or collective environment variable its ranks'
    nodes disagree on (known values only), in span and then row order."""
    spans: dict[str, list[tuple[Node, Engine]]] = {}
    for node in nodes:
        for engine in node.engines.all():
            if engine.span_key:
                spans.setdefault(engine.span_key, []).append((node, engine))
    findings = []
    for key in sorted(spans):
        ranks = sorted(spans[key], key=lambda rank: rank[0].name)
        if len({node.pk for node, _ in ranks}) < 2:
            continue
        name = " / ".join(sorted({engine.name for _, engine in ranks}))
        for fact, plural in SPAN_FACTS:
            cells = [(node, fact_cell(node, fact)) for node, _ in ranks]
            findings += _finding(name, key, plural, cells)
        variables = sorted({v for _, engine in ranks for v in (engine.env or {})
                            if is_collective(v)})
        for variable in variables:
            cells = [(node, env_cell(engine, variable)) for node, engine in ranks]
            findings += _finding(name, key, f"{variable} settings", cells)
    return findings


def _finding(engine: str, span_key: str, what: str,
             cells: list[tuple[Node, Cell]]) -> list[Finding]:
    known = [(node, cell) for node, cell in cells if cell.value is not None]
    values = list(dict.fromkeys(cell.value for _, cell in known))
    if len(values) < 2:
        return []
    names = tuple(node.name for node, _ in cells)
    if len(known) == 2:
        told = " vs ".join(cell.text for _, cell in known)
    else:
        told = " vs ".join(
            f"{value} ({', '.join(n.name for n, c in known if c.value == value)})"
            for value in values)
    text = f"{engine} spans {_and(names)}, whose {what} differ: {told}"
    return [Finding(engine, span_key, names, what,
                    tuple(cell.text for _, cell in cells), text)]


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
