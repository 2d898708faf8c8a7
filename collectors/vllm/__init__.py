"""What SparkOps knows about vLLM: launch flags, startup logs, /metrics, config findings."""
