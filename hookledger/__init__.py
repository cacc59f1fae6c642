"""hookledger: the composition root (command line, settings, service wiring)."""
