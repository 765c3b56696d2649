"""The pinned llama.cpp version: one place, so a result names exactly what was measured.

llama.cpp itself is not vendored in this repository. Its source comes from the PyPI sdist of
llama-cpp-python, which ships the full llama.cpp tree as a git submodule checkout
(``vendor/llama.cpp``) at a fixed commit; the sdist's sha256 is checked after download so that the
same bytes are built everywhere.
"""

from __future__ import annotations

#: The llama.cpp commit inside the pinned sdist (from ``.git/modules/vendor/llama.cpp/HEAD``).
LLAMACPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
#: Short form, as llama.cpp's own build info prints it.
LLAMACPP_COMMIT_SHORT = LLAMACPP_COMMIT[:7]
#: The upstream git repository, used only where the network allows and no sdist can be had.
LLAMACPP_GIT_URL = "https://github.com/ggml-org/llama.cpp"

#: The PyPI distribution that carries the pinned llama.cpp source.
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILENAME = "llama_cpp_python-0.3.36.tar.gz"
#: sha256 of the sdist file as published on PyPI; a mismatch means different source and is refused.
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
