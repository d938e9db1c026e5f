"""Enforcement mechanisms: one module per kernel or process-level layer."""
