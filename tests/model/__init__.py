"""Tests of the boundary model (pure: no sandbox, no I/O)."""
