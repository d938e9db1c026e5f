"""Tests of the kernel enforcement layer: Landlock, seccomp and the inner launcher."""
