"""Policy: the versioned schema, loading, validation, host patterns and decisions.

This package does no I/O beyond reading policy files and imports nothing else of stockade.
"""
