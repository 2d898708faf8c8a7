"""Planned restarts: windows, plans, the runbook that carries them out, and the restart ledger."""
