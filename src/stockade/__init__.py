"""stockade: a sandbox and egress-control runtime for code that AI agents run."""
