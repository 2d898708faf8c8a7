"""Alert rules, their lifecycle (pending → firing → resolved), and silences."""
