"""Which hosts are this machine's own: where a secret may travel in the clear."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost`` or an IP address on the loopback network: ``127.0.0.2`` is, a name
    that merely starts with ``127.`` (``127.example.com``, ``127.0.0.1.nip.io``) is not.
    Pure."""
    host = host.lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
