"""vLLM as an engine kind: today's readers in ``collectors.vllm``, unchanged, behind the
:class:`~collectors.kinds.base.KindReader` interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collectors.kinds.base import Launch, LaunchError, Reading
from collectors.kinds.discovery import runs
from collectors.vllm.findings import MountCheck, check_config
from collectors.vllm.flags import DEFAULT_PORT, FlagError, parse_command_line
from collectors.vllm.logs import StartupLog, StartupLogParser
from collectors.vllm.scrape import scrape


class VllmReader:
    kind = "vllm"
    title = "vLLM"
    endpoints = "/metrics"
    default_port = DEFAULT_PORT
    health_path = "/health"
    never_reported: Mapping[str, str] = {}

    def matches(self, words: Sequence[str]) -> bool:
        return runs(self.kind, words)

    def parse_launch(self, command: list[str], env: Mapping[str, str]) -> Launch:
        try:
            config = parse_command_line(command)
        except FlagError as error:
            raise LaunchError(str(error)) from None
        return Launch(model=config.model, port=config.port, config=config.as_dict(),
                      native=config)

    def new_log_parser(self) -> StartupLogParser:
        return StartupLogParser()

    def startup_from_dict(self, data: Mapping[str, Any]) -> StartupLog:
        return StartupLog.from_dict(dict(data))

    def findings(self, launch: Launch | None, startup: StartupLog | None,
                 mounts: list[MountCheck]) -> list[dict[str, str]]:
        if launch is None:
            return []
        return [f.as_dict() for f in check_config(launch.native, log=startup, mounts=mounts)]

    def read(self, base_url: str, *, deadline: float) -> Reading:
        return Reading(snapshot=scrape(f"{base_url}/metrics", deadline=deadline))
