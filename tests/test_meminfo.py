from pathlib import Path

import pytest

from collectors.meminfo import parse_meminfo, parse_pressure
from collectors.procfs import Procfs, ProcfsError

FIXTURES = Path(__file__).parent / "fixtures" / "procfs"
KIB = 1024


def test_real_gb10_meminfo_parses_every_field_in_bytes():
    info = parse_meminfo((FIXTURES / "meminfo-gb10").read_text())

    assert info.unknown == {}
    assert info.get("MemTotal") == 127600468 * KIB  # 121.69 GiB, as vLLM prints on GB10
    assert info.get("MemAvailable") == 58112044 * KIB
    assert info.get("MemFree") == 21203720 * KIB
    assert info.get("CmaFree") == 0  # present and really zero: a value, not unknown
    assert info.page_cache_reclaimable() == (36811144 - 120336 + 402316 + 912712) * KIB
    assert info.swap_used() == 0


def test_missing_field_is_unknown_with_reason_never_zero():
    text = "\n".join(
        line for line in (FIXTURES / "meminfo-gb10").read_text().splitlines()
        if not line.startswith("MemAvailable")
    )
    info = parse_meminfo(text)

    assert info.mem_available is None
    assert info.unknown["MemAvailable"] == "missing from /proc/meminfo"
    assert info.get("MemFree") == 21203720 * KIB


def test_garbage_values_are_unknown_with_the_bad_value_quoted():
    info = parse_meminfo(
        "MemTotal: 1000 kB\nMemFree: lots kB\nMemAvailable: 12 MB\nCached: -5 kB\n\x00\x01junk\n"
    )

    assert info.get("MemTotal") == 1000 * KIB
    assert info.unknown["MemFree"] == "unreadable value 'lots'"
    assert info.unknown["MemAvailable"] == "unexpected unit 'MB'"
    assert info.unknown["Cached"] == "unreadable value '-5'"
    assert info.page_cache_reclaimable() is None
    assert "Cached: unreadable value '-5'" in info.derived_unknown_reason("Cached", "Shmem")


def test_empty_meminfo_makes_every_required_field_unknown():
    info = parse_meminfo("")

    assert info.values == {}
    assert set(info.unknown) >= {"MemTotal", "MemAvailable", "SwapFree"}
    assert "CmaFree" not in info.unknown  # optional: absent on kernels without CMA


def test_first_occurrence_of_a_duplicated_field_wins():
    info = parse_meminfo("MemFree: 10 kB\nMemFree: 99 kB\n")

    assert info.get("MemFree") == 10 * KIB


def test_pressure_parses_some_and_full():
    pressure = parse_pressure((FIXTURES / "pressure-memory").read_text())

    assert pressure is not None
    assert pressure.some_avg10 == 1.25
    assert pressure.full_avg10 == 0.5


@pytest.mark.parametrize("text", [None, "", "garbage\n"])
def test_pressure_absent_or_garbled_is_none(text):
    assert parse_pressure(text) is None


def test_procfs_errors_say_what_went_wrong(tmp_path):
    missing = Procfs(tmp_path / "nowhere")
    with pytest.raises(ProcfsError, match="does not exist"):
        missing.meminfo()

    (tmp_path / "meminfo").mkdir()  # unreadable as a file, even for root
    with pytest.raises(ProcfsError, match="meminfo"):
        Procfs(tmp_path).meminfo()

    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "meminfo").write_bytes(b"MemTotal:\xff\xfe kB")
    with pytest.raises(ProcfsError, match="not text"):
        Procfs(binary).meminfo()


def test_real_proc_is_readable_here():
    info = parse_meminfo(Procfs().meminfo())

    assert info.get("MemTotal") and info.get("MemTotal") > 0
    assert info.mem_available is not None
