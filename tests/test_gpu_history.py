"""GPU history: every NVML read stored per GPU and figure, rolled up and pruned with the other
series, and drawn as the timeline's GPU panels, with "not supported" and "no driver" in words.

NVML is the stand-in of tests/nvml (pynvml's own exceptions and structs); everything behind the
seam is the real code: the collector's reader, the history rows, retention, the chart JSON and
the overview page.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pynvml
import pytest
from django.utils import timezone

from collectors.gpus import record_gpu_report
from collectors.models import GpuMetric, GpuRollup, GpuSample, Node
from collectors.nvml import GpuReport, read_gpus
from collectors.retention import floor_to, prune_node, rollup_node
from dashboard.downsample import epoch_ms, from_epoch_ms
from dashboard.series import chart_bucket_seconds
from tests.nvml.stand_in import NOT_SUPPORTED, Fail, StandInNvml, gb10, h100

TIMELINE = "/api/nodes/spark-a/timeline.json"
UNKNOWN_ERROR = Fail(pynvml.NVML_ERROR_UNKNOWN)
GPU_PANELS = ["gpu_utilization_gpu_pct", "gpu_temperature_c", "gpu_power_w", "gpu_sm_clock_mhz"]


@pytest.fixture
def now() -> datetime:
    return timezone.now().replace(microsecond=0)


def _read(node: Node, nvml: StandInNvml, at: datetime) -> None:
    """One collection's GPU read, as the engine collection task makes it."""
    record_gpu_report(node, read_gpus(nvml, host_memory_bytes=node.mem_total_bytes), at)


def _reads(node: Node, first: datetime, count: int, every: int = 5, **device) -> list[datetime]:
    moments = [first + timedelta(seconds=every * i) for i in range(count)]
    for i, at in enumerate(moments):
        _read(node, StandInNvml([gb10(**{"utilization": (10 + i % 50, 0), **device})]), at)
    return moments


def _timeline(client, range_key: str = "1h") -> dict:
    response = client.get(TIMELINE, {"range": range_key})
    assert response.status_code == 200
    return response.json()


def _series(data: dict, key: str) -> dict:
    return next(s for s in data["series"] if s["key"] == key)


def _panel(data: dict, key: str) -> dict:
    return next(p for p in data["panels"] if p["key"] == key)


# --- collection ------------------------------------------------------------------------------

def test_each_read_stores_every_figure_of_every_gpu(node, now):
    _read(node, StandInNvml([gb10()]), now)

    rows = {row.metric: row for row in GpuSample.objects.filter(node=node)}
    assert {metric: row.value for metric, row in rows.items()} == {
        GpuMetric.UTILIZATION: 37.0, GpuMetric.TEMPERATURE: 54.0, GpuMetric.POWER: 11.17,
        GpuMetric.SM_CLOCK: 2405.0,
    }
    assert {row.device_uuid for row in rows.values()} == {
        "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5"}
    assert {row.at for row in rows.values()} == {now}
    assert {row.note for row in rows.values()} == {""}


def test_a_report_read_from_a_real_h200_stores_its_figures(node, now):
    # Captured by tests/nvml/capture_fixture.py with nvidia-ml-py on an H200 (driver 580.159.04).
    real = json.loads((Path(__file__).parent / "fixtures/nvml/h200_real.json").read_text())

    record_gpu_report(node, GpuReport.from_dict(real), now)

    assert dict(GpuSample.objects.values_list("metric", "value")) == {
        GpuMetric.UTILIZATION: 3.0, GpuMetric.TEMPERATURE: 36.0, GpuMetric.POWER: 80.847,
        GpuMetric.SM_CLOCK: 1980.0,
    }


def test_a_figure_nvml_does_not_give_is_a_row_without_a_value_and_with_the_reason(node, now):
    _read(node, StandInNvml([gb10(temperature_c=NOT_SUPPORTED, power_mw=UNKNOWN_ERROR),
                             h100(1)]), now)

    rows = {(r.device_index, r.metric): (r.value, r.note) for r in GpuSample.objects.all()}
    assert rows[0, GpuMetric.TEMPERATURE] == (None, "not supported")
    assert rows[0, GpuMetric.POWER] == (None, "NVML error: Unknown Error")
    assert rows[0, GpuMetric.UTILIZATION] == (37.0, "")
    assert rows[1, GpuMetric.POWER] == (512.345, "")
    assert len(rows) == 8  # four figures for each of the two GPUs


def test_a_lost_gpu_and_a_machine_without_driver_store_no_figures(node, now):
    _read(node, StandInNvml([gb10(temperature_c=Fail(pynvml.NVML_ERROR_GPU_IS_LOST))]), now)
    lost = dict(GpuSample.objects.values_list("metric", "note"))
    assert lost[GpuMetric.TEMPERATURE] == "NVML error: GPU is lost"
    assert lost[GpuMetric.SM_CLOCK] == "not read: the GPU was lost"
    assert not GpuSample.objects.filter(value__isnull=False).exclude(
        metric=GpuMetric.UTILIZATION).exists()  # read before the loss

    GpuSample.objects.all().delete()
    _read(node, StandInNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), now)
    assert not GpuSample.objects.exists()


# --- retention -------------------------------------------------------------------------------

def test_gpu_figures_roll_up_per_gpu_and_skip_unknowns(node, now):
    start = (now - timedelta(hours=1)).replace(second=0)
    _read(node, StandInNvml([gb10(temperature_c=50), h100(1)]), start + timedelta(seconds=5))
    _read(node, StandInNvml([gb10(temperature_c=UNKNOWN_ERROR), h100(1)]),
          start + timedelta(seconds=10))
    _read(node, StandInNvml([gb10(temperature_c=70), h100(1)]), start + timedelta(seconds=15))

    rollup_node(node, now)

    minute = GpuRollup.objects.get(node=node, device_index=0, metric=GpuMetric.TEMPERATURE,
                                   resolution=60)
    assert (minute.start, minute.min, minute.mean, minute.max, minute.count) == (
        start, 50.0, 60.0, 70.0, 2)
    assert GpuRollup.objects.get(device_index=1, metric=GpuMetric.POWER, resolution=60).count \
        == 3
    assert GpuRollup.objects.filter(resolution=600, device_index=0,
                                    metric=GpuMetric.TEMPERATURE).get().min == 50.0


def test_prune_drops_gpu_figures_past_the_raw_horizon_and_roll_ups_past_their_tier(node, now):
    _read(node, StandInNvml([gb10()]), now - timedelta(days=8))
    _read(node, StandInNvml([gb10()]), now - timedelta(days=6))
    GpuRollup.objects.bulk_create([
        GpuRollup(node=node, device_index=0, metric=GpuMetric.POWER, resolution=resolution,
                  start=now - timedelta(days=days), min=1, max=1, mean=1, count=1)
        for resolution, days in [(60, 1), (60, 3), (600, 30), (600, 40), (3600, 89), (3600, 91)]
    ])
    node.rolled_up_until = now - timedelta(minutes=1)
    node.save()

    result = prune_node(node, now, raw_days=7, rollup_days=90)

    assert set(GpuSample.objects.values_list("at", flat=True)) == {now - timedelta(days=6)}
    assert result.samples == 4 and result.rollups == 3
    kept = {(r.resolution, round((now - r.start) / timedelta(days=1)))
            for r in GpuRollup.objects.all()}
    assert kept == {(60, 1), (600, 30), (3600, 89)}


# --- the chart -------------------------------------------------------------------------------

def test_gpu_lines_start_at_the_first_read_and_break_where_no_figure_was_read(admin_client,
                                                                            node, now):
    first = now - timedelta(minutes=40)
    early = _reads(node, first, 24)  # two minutes of reads
    later = _reads(node, now - timedelta(minutes=20), 24)  # then none for 18 minutes
    failed = later[10]
    GpuSample.objects.filter(at=failed, metric=GpuMetric.UTILIZATION).update(
        value=None, note="NVML error: Unknown Error")

    data = _timeline(admin_client)

    assert [p["key"] for p in data["panels"]][-4:] == GPU_PANELS
    assert data["gpu"]["shown"] is True
    line = _series(data, "gpu0:utilization_gpu_pct")
    assert line["panel"] == "gpu_utilization_gpu_pct" and line["unit"] == "%"
    assert line["label"] == "NVIDIA GB10 (GPU 0) utilisation" and line["device"] == 0
    points = list(zip(line["x"], line["y"], strict=True))
    assert points[0] == (epoch_ms(first), 10.0)  # nothing drawn before the first read
    pause = [y for x, y in points if epoch_ms(early[-1]) < x < epoch_ms(later[0])]
    assert pause == [None]  # the 18 minutes without reads are a gap, not a straight line
    assert (epoch_ms(failed), None) in points  # so is the read that gave no figure
    known = [y for y in line["y"] if y is not None]
    assert len(known) == 24 + 23 and min(known) == 10.0
    assert data["gpu"]["failures"] == [{"text": "NVIDIA GB10 (GPU 0) utilisation",
                                        "at": failed.isoformat(),
                                        "note": "NVML error: Unknown Error"}]
    temperature = _series(data, "gpu0:temperature_c")
    assert temperature["unit"] == "°C" and set(temperature["y"]) - {None} == {54.0}


def test_long_ranges_read_gpu_roll_ups_and_keep_the_peak(admin_client, node, now):
    first = now - timedelta(hours=4)
    moments = [first + timedelta(minutes=i) for i in range(180)]
    for i, at in enumerate(moments):
        _read(node, StandInNvml([gb10(temperature_c=91 if i == 77 else 55)]), at)
    rollup_node(node, now)

    data = _timeline(admin_client, "7d")

    assert data["source"] == "10 min"
    temperature = _series(data, "gpu0:temperature_c")
    assert max(y for y in temperature["y"] if y is not None) == 91.0  # the peak survives
    # Over 7 days a point is a chart bucket (about 30 minutes) of ten-minute roll-ups, placed at
    # its start: the first point is the bucket that holds the first read, none lies before it.
    bucket = int(chart_bucket_seconds(timedelta(days=7), 2000 // 2))
    shown = sorted(from_epoch_ms(x) for x in temperature["x"])
    assert shown[0] == floor_to(floor_to(first, 600), bucket)


def test_a_figure_the_gpu_cannot_report_draws_no_line_and_says_so(admin_client, node, now):
    _reads(node, now - timedelta(minutes=5), 12, temperature_c=NOT_SUPPORTED)

    data = _timeline(admin_client)

    assert set(_series(data, "gpu0:temperature_c")["y"]) == {None}
    words = "temperature: not supported by NVIDIA GB10 (GPU 0)"
    assert _panel(data, "gpu_temperature_c")["empty"] == words
    assert words in data["gpu"]["notes"]
    assert data["gpu"]["failures"] == []  # not supported is the GPU's nature, not a failure
    page = admin_client.get("/nodes/spark-a/").content.decode()
    assert "temperature not supported" in page  # the current-value line
    assert words in page
    assert "54 °C" not in page and " 0 °C" not in page


def test_a_lost_gpu_is_one_note_and_its_missing_figures_are_failures_in_range(admin_client,
                                                                              node, now):
    _reads(node, now - timedelta(minutes=5), 6)
    _read(node, StandInNvml([gb10(temperature_c=Fail(pynvml.NVML_ERROR_GPU_IS_LOST))]), now)

    data = _timeline(admin_client)

    lost = "NVIDIA GB10 (GPU 0) is lost: it fell off the bus and needs a reset or a reboot"
    assert data["gpu"]["notes"] == [lost]
    assert _panel(data, "gpu_sm_clock_mhz")["empty"] == lost
    assert {(f["text"], f["note"]) for f in data["gpu"]["failures"]} == {
        ("NVIDIA GB10 (GPU 0) temperature", "NVML error: GPU is lost"),
        ("NVIDIA GB10 (GPU 0) power draw", "not read: the GPU was lost"),
        ("NVIDIA GB10 (GPU 0) SM clock", "not read: the GPU was lost"),
    }
    assert _series(data, "gpu0:sm_clock_mhz")["y"][-1] is None  # the line ends in a gap


def test_without_a_driver_the_page_says_so_instead_of_drawing_empty_gpu_panels(admin_client,
                                                                               node, now):
    _read(node, StandInNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), now)

    data = _timeline(admin_client)

    assert not [p for p in data["panels"] if p["key"].startswith("gpu_")]
    assert data["gpu"] == {"shown": False, "failures": [],
                           "notes": ["GPU: no NVIDIA driver: libnvidia-ml.so.1 not found"]}
    page = admin_client.get("/nodes/spark-a/").content.decode()
    assert "GPU: no NVIDIA driver: libnvidia-ml.so.1 not found" in page


def test_history_stays_drawn_when_the_driver_goes_and_the_note_says_so(admin_client, node, now):
    _reads(node, now - timedelta(minutes=10), 6)
    _read(node, StandInNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), now)

    data = _timeline(admin_client)

    assert [p["key"] for p in data["panels"]][-4:] == GPU_PANELS
    assert data["gpu"]["notes"] == [
        "GPU: no NVIDIA driver: libnvidia-ml.so.1 not found — the GPU panels show what was "
        "read before."]
    assert _series(data, "gpu0:sm_clock_mhz")["label"] == "GPU 0 SM clock"  # name unknown now


# --- the page in a real browser ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_overview_draws_the_gpu_panels_on_the_shared_time_axis(live_server, page,
                                                                    django_user_model, settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    node = Node.objects.create(name="spark-a", mem_total_bytes=121 * 1024**3)
    now = timezone.now().replace(microsecond=0)
    _reads(node, now - timedelta(minutes=10), 60, every=10, power_mw=NOT_SUPPORTED)
    django_user_model.objects.create_superuser("admin", "", "a-long-test-password")

    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/nodes/spark-a/")
    page.wait_for_function("document.getElementById('timeline')?.data?.some("
                           "t => t.meta === 'gpu0:sm_clock_mhz')", timeout=15_000)

    clock = page.evaluate("document.getElementById('timeline').data"
                          ".find(t => t.meta === 'gpu0:sm_clock_mhz').y.filter(v => v !== null)")
    assert set(clock) == {2405}
    titles = page.evaluate("document.getElementById('timeline')._fullLayout.annotations"
                           ".map(a => a.text)")
    assert "<b>GPU temperature</b>" in titles
    assert "power draw: not supported by NVIDIA GB10 (GPU 0)" in titles  # the empty panel
    assert "power draw: not supported by NVIDIA GB10 (GPU 0)" in page.inner_text("#gpu-note")
    # The GPU panels (axes 7 to 10, after the six others) follow the shared time axis.
    ranges = page.evaluate("""() => { const l = document.getElementById('timeline')._fullLayout;
        return Object.fromEntries(Object.keys(l).filter(k => /^xaxis\\d*$/.test(k))
            .map(k => [k, l[k].range.map(v => Math.round(l[k].r2l(v)))])); }""")
    assert {"xaxis7", "xaxis8", "xaxis9", "xaxis10"} <= set(ranges)
    assert all(r == ranges["xaxis"] for r in ranges.values())
    height = page.evaluate("document.getElementById('timeline').getBoundingClientRect().height")
    assert height > 940  # taller than the stylesheet's figure, to make room for them
