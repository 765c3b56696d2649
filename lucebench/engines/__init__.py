"""Engines and baselines behind one subprocess interface (docs/protocol.md)."""
