"""Demo mode: emulated engines in real containers replay the seeds' GB10 story while SparkOps
runs. It sits above both halves (collectors and dashboard): :mod:`sparkops.demo.node` runs the
engines, :mod:`sparkops.demo.story` tells the acts, :mod:`sparkops.demo.stack` starts and stops
the stack around them; ``manage.py demo`` (``bin/sparkops demo``) is the command."""
