"""Receiving the provider's deliveries over HTTP: verify, read, append, answer."""
