"""Work parity: a fingerprint of what engines are asked to do, so different workloads are never compared."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from lucebench.suites.base import PreparedWorkload


def workload_identity(w: PreparedWorkload) -> str:
    """`sha256:<hex>` over every prompt's token ids (in order), n_gen, the stop policy (and EOS ids when
    stopping naturally, since they decide where generation ends) and the depth.

    Names, versions and dataset revisions are deliberately left out: two workloads with the same ids and
    the same generation rule are the same work, whatever they are called.
    """
    h = hashlib.sha256()
    head = {"n_gen": w.n_gen, "stop": w.stop, "depth": w.depth,
            "eos_ids": sorted(w.eos_ids) if not w.ignore_eos else None, "n_prompts": len(w.prompts)}
    h.update(json.dumps(head, sort_keys=True).encode())
    for p in w.prompts:
        ids = np.asarray(p.token_ids, dtype="<i8")  # fixed width and byte order: same hash everywhere
        h.update(len(p.token_ids).to_bytes(8, "little"))
        h.update(ids.tobytes())
    return "sha256:" + h.hexdigest()
