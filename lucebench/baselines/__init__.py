"""Baseline engines (PyTorch HF, llama.cpp), each wrapped to speak the engine protocol (docs/protocol.md)."""
