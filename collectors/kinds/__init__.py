"""Engine kinds: one reader per kind of inference server (vLLM, llama.cpp's llama-server,
Ollama, SGLang, TensorRT-LLM's trtllm-serve), chosen by what discovery found.

``discovery`` says which kind a container runs; ``base`` what every reader provides and the
shapes it hands on; ``registry`` holds the readers by kind; ``vllm``, ``llamacpp``, ``ollama``,
``sglang`` and ``trtllm`` are the readers; ``http`` and ``prometheus`` are what they share to
read endpoints and Prometheus text.
"""
