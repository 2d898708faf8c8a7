"""A vLLM engine emulator for SparkOps' tests and demo mode.

`python3 -m collectors.emulator serve MODEL [vLLM flags] [--emulator-* flags]` behaves like
`vllm serve` on the wire — log lines, `/health`, `/v1/models`, `/version`, `/metrics` with the
metric names and labels of a chosen vLLM release, OpenAI completions — and really reserves memory
(MiB where vLLM has GiB), so host headroom moves when it starts, serves a prefill or stops.

Standard library only, Python 3.11+: containers run it with the system python3. Nothing here may
import Django or anything outside this package.

Modules: `cli` (flags), `styles` (what differs per vLLM release), `units`, `memory` (real
reservations), `planning` (KV sizing), `messages` and `logs` (log text and prefixes),
`startup` (phases and failures), `engine` (scheduler), `exposition` and `metrics` (Prometheus),
`openai_api` and `server` (HTTP), `stats`, `loadgen`, `app` (process lifecycle).
"""
