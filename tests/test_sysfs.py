"""The /sys seam's ports: ConnectX-7 layouts from fixture trees (tests/fixtures/sysfs/README.md)
and this machine's own /sys/class/net, read for real."""

from __future__ import annotations

import os
from pathlib import Path

from collectors.sysfs import Sysfs, SysfsError, interconnect, read_ports
from tests.conftest import FIXTURES

SPARK = Sysfs(FIXTURES / "sysfs" / "dgx-spark")
INFINIBAND = Sysfs(FIXTURES / "sysfs" / "infiniband")
PORT_KEYS = {"name", "kind", "driver", "state", "rate_gbps", "rate_text", "mtu", "link_layer",
             "unknown"}


def _by_name(sysfs: Sysfs) -> dict[str, dict]:
    return {port["name"]: port for port in interconnect(sysfs)}


def test_a_dgx_spark_lists_its_connectx_ports_and_leaves_out_loopback_and_bridges():
    ports = _by_name(SPARK)

    assert set(ports) == {"enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP7s7",
                          "rocep1s0f0/1", "rocep1s0f1/1", "roceP2p1s0f0/1"}
    assert all(set(port) == PORT_KEYS for port in ports.values())
    assert ports["enp1s0f0np0"] == {
        "name": "enp1s0f0np0", "kind": "net", "driver": "mlx5_core", "state": "up",
        "rate_gbps": 200.0, "rate_text": "200000 Mb/s", "mtu": 9000, "link_layer": "Ethernet",
        "unknown": ""}
    assert ports["enP7s7"]["driver"] == "r8169" and ports["enP7s7"]["rate_gbps"] == 10.0


def test_a_roce_port_reads_its_state_rate_and_link_layer():
    port = _by_name(SPARK)["rocep1s0f0/1"]

    assert port["kind"] == "infiniband" and port["driver"] == "mlx5_core"
    assert port["state"] == "ACTIVE, LinkUp"
    assert port["rate_gbps"] == 200.0 and port["rate_text"] == "200 Gb/sec (4X HDR)"
    assert port["link_layer"] == "Ethernet"
    assert port["mtu"] is None and "MTU" in port["unknown"]


def test_a_port_that_is_down_has_no_rate_and_says_why():
    ports = _by_name(SPARK)
    interface, rdma = ports["enp1s0f1np1"], ports["rocep1s0f1/1"]

    # The kernel's EINVAL for the speed of an interface that is not running (README).
    assert interface["state"] == "down" and interface["rate_gbps"] is None
    assert interface["rate_text"] is None
    assert "the link is down" in interface["unknown"]
    assert interface["mtu"] == 1500
    # The device still gives a rate for the down port; it is no link's.
    assert rdma["state"] == "DOWN, Disabled"
    assert rdma["rate_gbps"] is None and rdma["rate_text"] == "40 Gb/sec (4X QDR)"
    assert "the port is DOWN" in rdma["unknown"]


def test_infiniband_mode_keeps_ipoib_interfaces_even_without_a_device_link():
    ports = _by_name(INFINIBAND)

    assert set(ports) == {"ibp1s0f0", "ibp1s0f0.8001", "mlx5_0/1"}
    assert ports["ibp1s0f0"]["link_layer"] == "InfiniBand" and ports["ibp1s0f0"]["mtu"] == 2044
    assert ports["ibp1s0f0.8001"]["driver"] is None
    assert "no device/driver link" in ports["ibp1s0f0.8001"]["unknown"]
    assert ports["mlx5_0/1"]["rate_gbps"] == 200.0
    assert ports["mlx5_0/1"]["rate_text"] == "200 Gb/sec (2X NDR)"
    assert ports["mlx5_0/1"]["link_layer"] == "InfiniBand"


def test_half_rates_and_unreadable_files_are_read_as_the_kernel_writes_them(tmp_path):
    port = tmp_path / "class/infiniband/mlx5_9/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("2.5 Gb/sec (1X SDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (tmp_path / "class/net/enx1").mkdir(parents=True)
    (tmp_path / "class/net/enx1/device").mkdir()
    (tmp_path / "class/net/enx1/operstate").write_text("up\n")
    (tmp_path / "class/net/enx1/speed").write_text("fast\n")

    ports = _by_name(Sysfs(tmp_path))

    assert ports["mlx5_9/1"]["rate_gbps"] == 2.5
    assert "no device/driver link" in ports["mlx5_9/1"]["unknown"]
    interface = ports["enx1"]
    assert interface["rate_gbps"] is None and "'fast' is not a number" in interface["unknown"]
    assert interface["mtu"] is None and "mtu does not exist" in interface["unknown"]
    assert interface["driver"] is None and "no driver bound" in interface["unknown"]


def test_a_read_that_fails_says_which_file_and_why():
    try:
        SPARK.read_line("class/net/enp1s0f1np1/speed")
    except SysfsError as error:
        assert "enp1s0f1np1/speed" in str(error)
        assert error.errno is not None
    else:
        raise AssertionError("the speed of a stopped interface must not read")


def test_this_machines_own_interfaces_are_read_without_crashing():
    """The real /sys: every interface with a device (or of InfiniBand type) is listed, with
    each figure read or its reason."""
    real = Sysfs(Path("/sys"))
    expected = {name for name in os.listdir("/sys/class/net")
                if name != "lo" and (os.path.lexists(f"/sys/class/net/{name}/device")
                                     or Path(f"/sys/class/net/{name}/type").read_text().strip()
                                     == "32")}

    ports = read_ports(real)
    interfaces = {port.name for port in ports if port.kind == "net"}

    assert interfaces == expected
    for port in ports:
        if port.kind == "net":
            assert port.mtu == int(Path(f"/sys/class/net/{port.name}/mtu").read_text())
            assert port.state == Path(f"/sys/class/net/{port.name}/operstate").read_text().strip()
        assert port.rate_gbps is not None or "rate" in port.unknown
        assert port.driver is not None or "driver" in port.unknown
    infiniband = {port.name for port in ports if port.kind == "infiniband"}
    assert infiniband == {f"{device}/{number}"
                          for device in (os.listdir("/sys/class/infiniband")
                                         if os.path.isdir("/sys/class/infiniband") else [])
                          for number in os.listdir(f"/sys/class/infiniband/{device}/ports")}
