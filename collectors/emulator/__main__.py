"""Entry point: `python3 -m collectors.emulator serve MODEL [flags]` (see `cli`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .app import run
from .cli import USAGE, CliError, parse_or_exit
from .knobs import engine_of


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line (exit 2 if refused) and run the emulator; return its exit status.

    ``--emulator-engine`` picks the engine it speaks: vLLM (the default, `cli` and `app`),
    llama.cpp's llama-server (`llamacpp`), Ollama (`ollama`), SGLang (`sglang`) or
    TensorRT-LLM's trtllm-serve (`trtllm`); or the model router llama-swap (`llamaswap`), which
    starts the others as child processes.
    """
    try:
        engine, args = engine_of(sys.argv[1:] if argv is None else argv)
    except CliError as error:
        sys.stderr.write(f"{USAGE}\nerror: {error}\n")
        return 2
    if engine == "llamacpp":
        from . import llamacpp

        return llamacpp.main(args)
    if engine == "ollama":
        from . import ollama

        return ollama.main(args)
    if engine == "sglang":
        from . import sglang

        return sglang.main(args)
    if engine == "llamaswap":
        from . import llamaswap

        return llamaswap.main(args)
    if engine == "trtllm":
        from . import trtllm

        return trtllm.main(args)
    return run(parse_or_exit(args))


if __name__ == "__main__":
    sys.exit(main())
