"""The egress layer: the proxy that is the sandbox's only way out."""
