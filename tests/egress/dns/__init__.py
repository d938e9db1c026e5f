"""Tests of stockade's resolver inside the sandbox (stockade.egress.dns)."""
