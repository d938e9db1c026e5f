"""Tests of the probe: real runs of the scenarios, the reports, and explain."""
