"""Engine kinds: one reader per kind of inference server (vLLM, llama.cpp's llama-server,
Ollama), chosen by what discovery found.

``discovery`` says which kind a container runs; ``base`` what every reader provides and the
shapes it hands on; ``registry`` holds the readers by kind; ``vllm``, ``llamacpp`` and
``ollama`` are the readers.
"""
