"""The plain reading of Prometheus text gives what prometheus_client's parser gives, or hands
the text to it: the same samples, names and values, and the same refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors import promtext

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = sorted([*FIXTURES.glob("vllm_metrics/*.txt"), FIXTURES / "sglang/metrics.txt",
                      FIXTURES / "trtllm/prometheus.txt", FIXTURES / "llamacpp/metrics.txt"])


class Every:
    """Every sample name is wanted."""

    def __contains__(self, name: object) -> bool:
        return True


def library(text: str) -> list[tuple[str, dict[str, str], float]] | str:
    """What the library reads (its ValueError's message when it refuses the text)."""
    try:
        return [(sample.name, sample.labels, float(sample.value))
                for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError as error:
        return f"ValueError: {error}"


def ours(text: str) -> list[tuple[str, dict[str, str], float]] | str:
    try:
        return promtext.samples(text, Every())
    except ValueError as error:
        return f"ValueError: {error}"


def comparable(result):
    if isinstance(result, str):
        return result
    return [(name, labels, "nan" if math.isnan(value) else value)
            for name, labels, value in result]


@pytest.fixture
def no_library(monkeypatch):
    """The library refuses every text: what parses now was read by the plain reading."""
    def refuse(text):
        raise AssertionError("handed to the library")
    monkeypatch.setattr(promtext, "text_string_to_metric_families", refuse)


@pytest.mark.parametrize("path", EXPOSITIONS, ids=lambda path: path.parent.name + "/" + path.name)
def test_every_engine_exposition_reads_as_the_library_reads_it(path):
    text = path.read_text()
    expected = library(text)
    assert not isinstance(expected, str) and expected
    assert comparable(ours(text)) == comparable(expected)


@pytest.mark.parametrize("path", EXPOSITIONS, ids=lambda path: path.parent.name + "/" + path.name)
def test_engine_expositions_take_the_plain_reading(path, no_library):
    assert promtext.samples(path.read_text(), Every())


def test_only_the_wanted_names_come_back():
    text = "# TYPE a gauge\na 1\n# TYPE b gauge\nb{x=\"1\"} 2\n"
    assert promtext.samples(text, {"b"}) == [("b", {"x": "1"}, 2.0)]


CASES = {
    "counter without _total": "# HELP c_requests Requests.\n# TYPE c_requests counter\n"
                              "c_requests 3\nc_requests_created 1.7e9\n",
    "counter with _total": "# TYPE r_total counter\nr_total{a=\"1\"} 3\nr_created 5\n",
    "histogram": "# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
                 "h_count 2\nh_sum 0.7\n",
    "summary": "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_count 2\ns_sum 3\n",
    "sample of another family": "# TYPE g gauge\ng 1\nother 2\ng 3\n",
    "help then type of another": "# HELP a A.\n# TYPE b counter\nb 1\na 2\n",
    "special values": "a +Inf\nb -Inf\nc NaN\nd 1e-3\ne 007\n",
    "timestamp": "a 1 1700000000000\nb{x=\"y\"} 2 -5\n",
    "empty labels": "a{} 1\n",
    "trailing comma": "a{x=\"1\",} 1\n",
    "other comments": "# just words\n#\n# HELP\na 1\n",
    "blank lines": "\n\na 1\n\n",
    "label value with braces and commas": "a{x=\"{1,2}\",y=\"=\"} 1\n",
    "escaped quote": "a{x=\"say \\\"hi\\\"\"} 1\n",
    "escaped backslash": "a{x=\"C:\\\\\"} 1\n",
    "blank after a comma": "a{x=\"1\", y=\"2\"} 1\n",
    "blanks around the value": "a   1  \n",
    "help with an escape": "# HELP a Line\\nbreak.\na 1\n",
    "quoted name in a comment": "# HELP \"a\" A.\na 1\n",
    "duplicate label": "a{x=\"1\",x=\"2\"} 1\n",
    "name in the labels": "{__name__=\"a\"} 1\n",
    "underscore in the value": "a 1_000\n",
    "hex value": "a 0x10\n",
    "not a number": "a one\n",
    "bad type": "# TYPE a speedometer\na 1\n",
    "type without a type": "# TYPE a\na 1\n",
    "bad family name": "# TYPE 1a gauge\n",
    "bad sample name": "1a 1\n",
    "no value": "a\n",
    "extra field": "a 1 2 3\n",
    "exemplar": "a_total 1 # {trace=\"x\"} 1\n",
    "html": "<html><body>Not found</body></html>\n",
}


@pytest.mark.parametrize("text", CASES.values(), ids=CASES.keys())
def test_each_form_reads_or_is_refused_as_the_library_does(text):
    assert comparable(ours(text)) == comparable(library(text))


def test_a_counter_declared_without_total_names_its_sample_with_it(no_library):
    samples = promtext.samples(CASES["counter without _total"], Every())
    assert [name for name, _, _ in samples] == ["c_requests_total", "c_requests_created"]
