"""The bandwidth roofline of an engine: how fast one stream *could* decode, and how fast it does.

Decode is bandwidth-bound: every generated token reads every active weight once, so one stream
cannot decode faster than

    ceiling (tok/s) = node memory bandwidth (bytes/s) ÷ bytes read per token
    bytes read per token = active parameters × bytes per parameter

(GB10: 273 GB/s; Nemotron-3-Super-120B-A12B in NVFP4 reads 12e9 × 0.5625 B = 6.75 GB per token,
a ceiling of ≈ 40 tok/s). KV-cache reads are *not* in the ceiling: they grow with the context
(2 × layers × KV heads × head size × KV bytes per token of context) and are reported beside it,
so the ceiling is the short-context upper bound.

Inputs, each with where it came from (an unknown one is ``None`` with what to set, never 0):

* **Active parameters**: the container label ``sparkops.active-params`` (an admin's setting,
  e.g. ``12e9`` or ``12B``); else the model's ``config.json`` (see
  :func:`~dashboard.roofline.params.active_params_from_config` for the formula), which the
  node's collector reads inside the container and stores on the engine
  (:mod:`collectors.modelconfig`); else the model's name (``…-120B-A12B`` → 12e9 active,
  ``…-26B-A4B`` → 4e9, a dense ``…-8B`` → 8e9).
* **Bytes per parameter**: the label ``sparkops.bytes-per-param``; else ``--quantization``; else
  the config's ``quantization_config``; else the name (NVFP4, FP8, AWQ …); else the config's
  dtype. NVFP4 stores 4-bit values plus one FP8 scale per 16 values: 0.5 + 1/16 = 0.5625 B.

**Measured single-stream decode**: the engine's decode tok/s at collections where exactly one
request ran, both at that collection and at the one before it (the rate covers the interval
between them), ignoring intervals without decoding; the median of the most recent ones.

Modules: :mod:`~dashboard.roofline.params` (pure: parameter counts and widths from labels,
flags, config.json and names), :mod:`~dashboard.roofline.measure` (database reads: the measured
decode, neighbours, memory pressure) and :mod:`~dashboard.roofline.figure` (the page's figure,
its verdict, explanations and texts). Nothing here touches the file system or ``/proc``.
"""
