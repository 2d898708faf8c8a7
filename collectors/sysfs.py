"""The one seam to the kernel's /sys, besides the memory cgroup files ``procfs.py`` reads: the
node's network and InfiniBand ports (its ConnectX-7), and the few firmware and memory-manager
files a node's registration records (``collectors.registration``).

Every read goes through :class:`Sysfs`, whose root is configurable (``SPARKOPS_SYSFS``, default
``/sys``) so tests can point it at fixture trees, as node_exporter's ``--path.sysfs`` does.
Nothing here needs privileges: the files read are world-readable (0444) on every kernel.

**Ports** (:func:`read_ports`). What NCCL and the engines' tensor/pipeline parallelism across
two GB10s depend on is that the ConnectX ports are up, at the rate expected, with the MTU
expected, on the driver expected. Two views of the same hardware are read:

* ``class/net/<if>/`` (``net/core/net-sysfs.c``): ``operstate`` (one of ``unknown``,
  ``notpresent``, ``down``, ``lowerlayerdown``, ``testing``, ``dormant``, ``up``), ``speed`` in
  Mb/s (``%d``; the read fails with EINVAL while the interface is not running, and gives ``-1``,
  SPEED_UNKNOWN, where the driver knows no speed), ``mtu`` and ``type`` (the ARPHRD number:
  1 Ethernet, 32 InfiniBand), and ``device/driver``, a link whose name is the driver's
  (``mlx5_core`` for a ConnectX). ``lo`` and virtual interfaces (bridges, veths, tunnels: no
  ``device`` link) are left out, except IPoIB ones (type 32), which stand for an IB port.
* ``class/infiniband/<dev>/ports/<n>/`` (``drivers/infiniband/core/sysfs.c``): ``state``
  (``"4: ACTIVE"``), ``phys_state`` (``"5: LinkUp"``), ``rate`` (``"200 Gb/sec (2X NDR)"``:
  ``%d%s Gb/sec (%dX%s)``, the ``%s`` being ``.5`` or nothing) and ``link_layer``
  (``InfiniBand``, ``Ethernet`` for RoCE, ``Unknown``). These files are answered by a query to
  the device; a query that fails fails the read, and the figure is then unknown with why.

A port whose link is down has no rate, whatever figure its file still gives (a ConnectX port
that is down commonly reports ``40 Gb/sec (4X QDR)``): ``rate_gbps`` is then None, and
``rate_text`` keeps the file's words.

Each port is a :class:`Port`; a figure that could not be read is None, and ``unknown`` says why
(never a 0, never a guess). Cost: about six small reads per port, well under a millisecond on a
DGX Spark's handful of ports.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

# ARPHRD numbers of class/net/<if>/type (include/uapi/linux/if_arp.h).
ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
LINK_LAYERS = {ARPHRD_ETHER: "Ethernet", ARPHRD_INFINIBAND: "InfiniBand"}
# operstate values of a link that carries nothing (RFC 2863's, as the kernel writes them).
LINK_DOWN_STATES = {"down", "lowerlayerdown", "notpresent"}
# Logical states of an IB port whose link is up (ib_port_state: ARMED, ACTIVE, ACTIVE_DEFER).
IB_LINK_STATES = {"ARMED", "ACTIVE", "ACTIVE_DEFER"}
# "200 Gb/sec (2X NDR)", "2.5 Gb/sec (1X SDR)": rate_show's format.
_IB_RATE = re.compile(r"^(?P<gbps>\d+(?:\.5)?) Gb/sec\b")
# "4: ACTIVE", "5: LinkUp": a number, a colon and the name.
_NUMBERED = re.compile(r"^\d+:\s*(?P<name>.+)$")


class SysfsError(Exception):
    """A /sys file could not be read (missing, unreadable, or the kernel's query failed)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.errno = code


@dataclass(frozen=True)
class Sysfs:
    root: Path = Path("/sys")

    def path(self, relative: str) -> Path:
        return self.root / relative

    def read_line(self, relative: str) -> str:
        """``<root>/<relative>`` read whole and stripped; :class:`SysfsError` with the reason
        (and the errno, where the kernel gave one) when it cannot be read."""
        path = self.path(relative)
        try:
            return path.read_bytes().decode("utf-8", "replace").strip()
        except FileNotFoundError:
            raise SysfsError(f"{path} does not exist", errno.ENOENT) from None
        except PermissionError:
            raise SysfsError(f"{path} is not readable (permission denied)", errno.EACCES) \
                from None
        except OSError as error:
            raise SysfsError(f"{path}: {error.strerror or error}", error.errno) from None

    def link_name(self, relative: str) -> str | None:
        """The last part of the target of the link ``<root>/<relative>``; None when it is not
        a link."""
        try:
            return os.path.basename(os.readlink(self.path(relative)))
        except OSError:
            return None

    def has(self, relative: str) -> bool:
        """Whether ``<root>/<relative>`` exists (a link counts even if it dangles)."""
        return os.path.lexists(self.path(relative))

    def names(self, relative: str) -> list[str]:
        """The entries of the folder ``<root>/<relative>``, sorted; empty when it is absent."""
        try:
            return sorted(os.listdir(self.path(relative)))
        except OSError:
            return []


def local_sysfs() -> Sysfs:
    """This node's /sys (``SPARKOPS_SYSFS``)."""
    from django.conf import settings

    return Sysfs(Path(settings.SPARKOPS_SYSFS))


@dataclass(frozen=True)
class Port:
    """One network or InfiniBand port as the kernel reports it.

    ``name`` is the interface (``enp1s0f0np0``) or ``<device>/<port>`` (``rocep1s0f0/1``);
    ``kind`` is ``"net"`` or ``"infiniband"``; ``state`` the operstate, or for an IB port its
    logical and physical states (``"ACTIVE, LinkUp"``); ``rate_gbps`` the link's rate in Gb/s
    as the kernel gives it and ``rate_text`` the file's own words (``"200000 Mb/s"``,
    ``"200 Gb/sec (2X NDR)"``); ``mtu`` in bytes (an IB port's files give none: its IPoIB or
    RoCE interface has it). ``link_layer`` is ``Ethernet``, ``InfiniBand`` (or ``Unknown``) where
    known. ``unknown`` says why each missing figure is missing ("" when none is).
    """

    name: str
    kind: str
    driver: str | None
    state: str | None
    rate_gbps: float | None
    rate_text: str | None
    mtu: int | None
    link_layer: str | None
    unknown: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def read_ports(sysfs: Sysfs) -> list[Port]:
    """Every physical network port and every InfiniBand port, interfaces first, each sorted
    by name. Never raises: an unreadable figure is None with its reason."""
    return net_ports(sysfs) + infiniband_ports(sysfs)


def interconnect(sysfs: Sysfs) -> list[dict[str, object]]:
    """:func:`read_ports` as JSON-ready dicts (what ``Node.facts["interconnect"]`` holds)."""
    return [port.as_dict() for port in read_ports(sysfs)]


def net_ports(sysfs: Sysfs) -> list[Port]:
    ports = []
    for name in sysfs.names("class/net"):
        base = f"class/net/{name}"
        kind = _int_or_none(sysfs, f"{base}/type")
        if name == "lo" or kind == ARPHRD_LOOPBACK:
            continue
        if not sysfs.has(f"{base}/device") and kind != ARPHRD_INFINIBAND:
            continue  # a bridge, veth, bond or tunnel: no hardware of its own
        ports.append(_net_port(sysfs, name, base, kind))
    return ports


def _net_port(sysfs: Sysfs, name: str, base: str, kind: int | None) -> Port:
    missing: list[str] = []
    state = _line_or_none(sysfs, f"{base}/operstate", "state", missing)
    rate_gbps, rate_text = _net_speed(sysfs, f"{base}/speed", state, missing)
    mtu_text = _line_or_none(sysfs, f"{base}/mtu", "MTU", missing)
    mtu = int(mtu_text) if mtu_text and mtu_text.isdigit() else None
    if mtu_text is not None and mtu is None:
        missing.append(f"MTU: {mtu_text[:20]!r} is not a number")
    driver = sysfs.link_name(f"{base}/device/driver")
    if driver is None:
        missing.append("driver: no device/driver link (a virtual interface)"
                       if not sysfs.has(f"{base}/device") else
                       "driver: the device has no driver bound")
    link_layer = LINK_LAYERS.get(kind) if kind is not None else None
    return Port(name=name, kind="net", driver=driver, state=state, rate_gbps=rate_gbps,
                rate_text=rate_text, mtu=mtu, link_layer=link_layer, unknown="; ".join(missing))


def _net_speed(sysfs: Sysfs, relative: str, state: str | None,
               missing: list[str]) -> tuple[float | None, str | None]:
    try:
        text = sysfs.read_line(relative)
    except SysfsError as error:
        if state in LINK_DOWN_STATES:
            missing.append(f"rate: the link is {state} (the kernel gives no speed then)")
        elif error.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            missing.append("rate: the driver reports no speed for this interface "
                           f"({os.strerror(error.errno)})")
        else:
            missing.append(f"rate: {error}")
        return None, None
    try:
        megabits = int(text)
    except ValueError:
        missing.append(f"rate: {text[:20]!r} is not a number of Mb/s")
        return None, text
    if megabits < 0:  # SPEED_UNKNOWN
        missing.append("rate: the driver knows no link speed (SPEED_UNKNOWN, -1)")
        return None, text
    if state in LINK_DOWN_STATES:
        missing.append(f"rate: the link is {state} ({megabits} Mb/s is no link's rate)")
        return None, f"{megabits} Mb/s"
    return megabits / 1000, f"{megabits} Mb/s"


def infiniband_ports(sysfs: Sysfs) -> list[Port]:
    ports = []
    for device in sysfs.names("class/infiniband"):
        driver = sysfs.link_name(f"class/infiniband/{device}/device/driver")
        for number in sysfs.names(f"class/infiniband/{device}/ports"):
            ports.append(_ib_port(sysfs, device, number, driver))
    return ports


def _ib_port(sysfs: Sysfs, device: str, number: str, driver: str | None) -> Port:
    base = f"class/infiniband/{device}/ports/{number}"
    missing: list[str] = []
    logical = _numbered(_line_or_none(sysfs, f"{base}/state", "state", missing))
    physical = _numbered(_line_or_none(sysfs, f"{base}/phys_state", "physical state",
                                       missing))
    state = ", ".join(part for part in (logical, physical) if part) or None
    rate_text = _line_or_none(sysfs, f"{base}/rate", "rate", missing)
    rate_gbps = None
    if rate_text is not None:
        match = _IB_RATE.match(rate_text)
        if match is None:
            missing.append(f"rate: {rate_text[:40]!r} is not in the kernel's format")
        elif logical not in IB_LINK_STATES:
            # The device still answers a width and speed, but they are no link's.
            missing.append(f"rate: the port is {logical or 'in an unknown state'}")
        else:
            rate_gbps = float(match.group("gbps"))
    link_layer = _line_or_none(sysfs, f"{base}/link_layer", "link layer", missing)
    if driver is None:
        missing.append("driver: no device/driver link")
    missing.append("MTU: the port's files give none (its network interface has it)")
    return Port(name=f"{device}/{number}", kind="infiniband", driver=driver, state=state,
                rate_gbps=rate_gbps, rate_text=rate_text, mtu=None, link_layer=link_layer,
                unknown="; ".join(missing))


def _line_or_none(sysfs: Sysfs, relative: str, what: str, missing: list[str]) -> str | None:
    try:
        return sysfs.read_line(relative)
    except SysfsError as error:
        missing.append(f"{what}: {error}")
        return None


def _int_or_none(sysfs: Sysfs, relative: str) -> int | None:
    try:
        return int(sysfs.read_line(relative))
    except (SysfsError, ValueError):
        return None


def _numbered(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; other text as it is."""
    if text is None:
        return None
    match = _NUMBERED.match(text)
    return match.group("name").strip() if match else text
