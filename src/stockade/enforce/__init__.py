"""Kernel enforcement mechanisms: Landlock, seccomp and the inner launcher."""
