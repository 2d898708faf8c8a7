from django.utils import timezone

from collectors.gpus import record_gpu_report
from collectors.models import Event
from collectors.nvml import GpuReport, read_gpus
from tests.nvml.stand_in import Fail, StandInNvml, gb10


def _lost_report() -> GpuReport:
    """A GB10 whose temperature read says the GPU is lost, through the real pynvml errors."""
    return read_gpus(StandInNvml([gb10(temperature_c=Fail(15))]))  # 15: NVML_ERROR_GPU_IS_LOST


def test_a_lost_gpu_is_one_critical_event_not_one_per_read(node):
    record_gpu_report(node, _lost_report(), timezone.now())
    record_gpu_report(node, _lost_report(), timezone.now())

    events = Event.objects.filter(node=node, kind="gpu-lost")
    assert events.count() == 1
    assert events.get().severity == "critical"
    node.refresh_from_db()
    assert node.gpu["events"][0]["kind"] == "gpu-lost"


def test_nvml_error_is_recorded_once(node):
    broken = GpuReport(state="error", reason="NVML library and driver versions differ")
    record_gpu_report(node, broken, timezone.now())
    record_gpu_report(node, broken, timezone.now())

    assert Event.objects.filter(node=node, kind="nvml-error").count() == 1
