"""Engines and baselines behind one subprocess interface (docs/protocol.md).

registry: engine types -> command lines; protocol: the protocol's Python side (messages, parser, stdout
isolation, reply check); build: the bundled engines' CMake builds; cmake: what those share with the llama.cpp
build (arch, compiler id, lock, logged steps); detect: backend and GPU architecture of this machine.
"""
