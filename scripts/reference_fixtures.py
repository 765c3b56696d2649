"""Copy trained reference models into tests/fixtures/reference-models and record what the CI tests check.

    python scripts/reference_fixtures.py MODELS_DIR [--datasets ../shared/datasets]

MODELS_DIR is the output of `lucebench models train` (target/, draft/, drafter/, train_report.json,
corpus_manifest.json), or the folder that scripts/device/train_reference.sh filled ($OUT/tr, holding
reference-models.tar.gz.part-*), whose pieces are then joined and unpacked first. `reference_al.json` is copied
when the models folder has one (the device script measures it; it records its device). Writes, next to the
copied models, `reference_outputs.json`:
  * sha256 of every model file;
  * transformers (float32, CPU) greedy continuations of the target and the drafter, 16 tokens, on two prompts
    (the prompt text is stored, so the tests need no dataset);
  * the reference DFlash loop on two HumanEval prompts (48 tokens): its tokens, tokens per round and AL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lucebench.models.dflash_reference import (  # noqa: E402
    FeatureTarget,
    eval_prompts,
    greedy_reference,
    load_pair,
    load_target,
    speculative_greedy,
)

FIXTURES = ROOT / "tests" / "fixtures" / "reference-models"
MODEL_FILES = {
    "target": ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"],
    "draft": ["config.json", "model.safetensors"],
    "drafter": ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"],
}
GREEDY_TOKENS = 16
LOOP_TOKENS = 48


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", type=Path)
    ap.add_argument("--datasets", type=Path, default=ROOT.parent / "shared" / "datasets")
    ap.add_argument("--dest", type=Path, default=FIXTURES, help="where the fixtures go (default: %(default)s)")
    args = ap.parse_args()
    dest = args.dest
    torch.set_num_threads(1)
    parts = sorted(args.models.glob("reference-models.tar.gz.part-*"))
    if parts and not (args.models / "target").is_dir():
        import io
        import tarfile
        import tempfile

        unpacked = Path(tempfile.mkdtemp(prefix="reference-models-"))
        with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts)), mode="r:gz") as tar:
            tar.extractall(unpacked, filter="data")
        args.models = unpacked / "reference-models"
        print(f"unpacked {len(parts)} pieces into {args.models}")
    from tokenizers import Tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    hashes: dict[str, str] = {}
    for sub, names in MODEL_FILES.items():
        (dest / sub).mkdir(exist_ok=True)
        for name in names:
            shutil.copyfile(args.models / sub / name, dest / sub / name)
            hashes[f"{sub}/{name}"] = sha256(dest / sub / name)
    for name in ("train_report.json", "corpus_manifest.json"):
        shutil.copyfile(args.models / name, dest / name)
    if (args.models / "reference_al.json").is_file():
        shutil.copyfile(args.models / "reference_al.json", dest / "reference_al.json")

    prompts = eval_prompts(args.datasets, "humaneval", 2)
    greedy: dict[str, list] = {}
    for sub in ("target", "drafter"):
        tok = Tokenizer.from_file(str(dest / sub / "tokenizer.json"))
        model = FeatureTarget(load_target(dest / sub), [])
        greedy[sub] = []
        for text in prompts[:2]:
            ids = tok.encode(text, add_special_tokens=False).ids
            greedy[sub].append({"prompt_ids": ids, "tokens": greedy_reference(model, ids, GREEDY_TOKENS, set())})

    target, draft = load_pair(dest / "target", dest / "draft")
    tok = Tokenizer.from_file(str(dest / "target" / "tokenizer.json"))
    loop = []
    for text in prompts[:2]:
        ids = tok.encode(text, add_special_tokens=False).ids
        spec = speculative_greedy(target, draft, ids, LOOP_TOKENS, {0})
        loop.append({"prompt": text, "tokens": spec.tokens, "committed_per_round": spec.committed_per_round,
                     "al": spec.acceptance_length})
    record = {"sha256": hashes, "greedy_tokens": GREEDY_TOKENS, "prompts": prompts[:2], "greedy": greedy,
              "loop_tokens": LOOP_TOKENS, "stop_ids": [0], "loop": loop}
    (dest / "reference_outputs.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"loop_al": [x["al"] for x in loop]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
