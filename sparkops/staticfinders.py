"""Serve plotly.js from the installed ``plotly`` package as ``vendor/plotly.min.js``."""

from __future__ import annotations

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_STATIC_PATH = "vendor/plotly.min.js"
_PACKAGE_DATA = Path(plotly.__file__).resolve().parent / "package_data"


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs):
        if not (_PACKAGE_DATA / "plotly.min.js").is_file():
            from django.core.checks import Error

            return [Error(f"plotly.min.js is missing from {_PACKAGE_DATA}; reinstall plotly",
                          id="sparkops.E001")]
        return []

    def find(self, path: str, find_all: bool = False, **kwargs):
        if path != PLOTLY_STATIC_PATH:
            return [] if find_all else None
        match = str(_PACKAGE_DATA / "plotly.min.js")
        return [match] if find_all else match

    def list(self, ignore_patterns):
        storage = FileSystemStorage(location=str(_PACKAGE_DATA))
        storage.prefix = "vendor"
        yield "plotly.min.js", storage
