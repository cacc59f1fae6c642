"""A local stand-in for the provider: reference API, signed deliveries, faulty scenarios."""
