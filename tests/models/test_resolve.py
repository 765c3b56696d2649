"""Resolving model specs (path, hub cache, synth cache) and the memoised file hashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.models import resolve as R
from lucebench.models.synth import PROVENANCE_FILE


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCEBENCH_CACHE", str(tmp_path / "lbcache"))
    return tmp_path / "lbcache"


def test_path_spec(synth_dir):
    m = R.resolve_model({"path": str(synth_dir("tiny"))})
    assert m.kind == "path" and m.path == synth_dir("tiny").resolve() and m.synthetic
    assert m.config()["model_type"] == "qwen3_5_text"


def test_missing_path_and_bad_specs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        R.resolve_model({"path": str(tmp_path / "nope")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        R.resolve_model({"path": str(tmp_path / "empty")})
    with pytest.raises(UserError, match="exactly one"):
        R.resolve_model({"path": "a", "hub": "b/c"})


def test_synth_spec_is_made_once_then_reused(cache):
    spec = {"synth": {"shape": "tiny", "seed": 3, "dtype": "fp32"}}
    first = R.resolve_model(spec)
    assert first.kind == "synth" and first.path.parent == cache / "models"
    prov = json.loads((first.path / PROVENANCE_FILE).read_text())
    assert (prov["shape"], prov["seed"], prov["dtype"]) == ("tiny", 3, "fp32")
    mtime = (first.path / "model.safetensors").stat().st_mtime_ns
    again = R.resolve_model(spec)
    assert again.path == first.path
    assert (again.path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rewritten
    other = R.resolve_model({"synth": {"shape": "tiny", "seed": 4, "dtype": "fp32"}})
    assert other.path != first.path
    assert not list((cache / "models").glob(".*tmp*"))  # no half-written folders left behind


def test_synth_cache_never_reuses_a_checkpoint_of_another_scale_rule(cache, monkeypatch):
    from lucebench.models import weights
    from lucebench.models.shapes import get_shape

    v1 = "lucebench/v1: fan-in normal for matrices, 1/hidden embeddings, norms neutral+N(0,0.1), mamba2 A/dt"
    assert weights.SCALE_RULE.startswith("lucebench/v2:")
    key = R.synth_cache_key(get_shape("tiny"), 0, "fp32", "text")
    with monkeypatch.context() as m:
        m.setattr(weights, "SCALE_RULE", v1)
        assert R.synth_cache_key(get_shape("tiny"), 0, "fp32", "text") != key
    # A folder at the current key whose provenance names another rule (copied in by hand) is rewritten.
    spec = {"synth": {"shape": "tiny", "seed": 0, "dtype": "fp32"}}
    first = R.resolve_model(spec)
    prov_file = first.path / PROVENANCE_FILE
    prov = json.loads(prov_file.read_text())
    assert prov["scale_rule"] == weights.SCALE_RULE
    prov_file.write_text(json.dumps({**prov, "scale_rule": v1}))
    (first.path / "model.safetensors").write_bytes(b"stale")
    again = R.resolve_model(spec)
    assert again.path == first.path
    assert json.loads(prov_file.read_text())["scale_rule"] == weights.SCALE_RULE
    assert (again.path / "model.safetensors").read_bytes() != b"stale"


def test_synth_spec_from_a_config_file(cache, tmp_path):
    from lucebench.models.shapes import get_shape

    cfg = tmp_path / "my.json"
    cfg.write_text(json.dumps(get_shape("tiny-odd").config))
    m = R.resolve_model({"synth": {"config": str(cfg), "seed": 0, "dtype": "fp32"}})
    assert json.loads((m.path / "config.json").read_text())["hidden_size"] == 72


def test_synth_gguf_is_the_file_with_its_tokenizer_beside_it(cache, tmp_path):
    """`synth: {format: gguf}`: the model is a GGUF file written once into the cache, its tokenizer.json beside it
    (the prompts' ids), the same file on the second resolve."""
    import gguf

    from lucebench.models.shapes import _qwen3_5

    cfg = tmp_path / "tiny-gguf.json"  # every row a whole number of 256-element blocks
    cfg.write_text(json.dumps(_qwen3_5(n_layers=4, hidden=256, intermediate=512, vocab=1088, heads=2, kv_heads=1,
                                       head_dim=128, lin_k_heads=2, lin_v_heads=4, lin_k_dim=64, lin_v_dim=64,
                                       tied=False, max_pos=4096, eos=1024, mrope=[11, 11, 10])))
    m = R.resolve_model({"synth": {"config": str(cfg), "seed": 2, "format": "gguf", "quant": "q8_0"}})
    assert m.synthetic and m.path.is_file() and m.path.name == "model-q8_0.gguf"
    assert (m.path.parent / "tokenizer.json").is_file()
    assert json.loads((m.path.parent / PROVENANCE_FILE).read_text())["quant"] == "q8_0"
    reader = gguf.GGUFReader(str(m.path))
    assert reader.fields["lucebench.synthetic"].parts[-1][0]
    mtime = m.path.stat().st_mtime_ns
    assert R.resolve_model({"synth": {"config": str(cfg), "seed": 2, "format": "gguf", "quant": "q8_0"}}).path == m.path
    assert m.path.stat().st_mtime_ns == mtime


def test_draft_for_a_synthetic_gguf_target(cache, tmp_path):
    """`synth: {draft_for: X}` where X is a synthetic GGUF (no config.json beside the file): the draft is sized from
    X's shape, gets a mask id its tokenizer leaves free, fits X, is found again under the same key, and is the same
    draft as for the same shape written in Hugging Face layout."""
    from lucebench.config.schema import Config
    from lucebench.models.dflash_draft import check_draft
    from lucebench.models.shapes import _qwen3_5
    from lucebench.runner.prepare import ModelCache

    # a vocabulary past the 2,048 BPE ids and 5 specials, so that the tokenizer leaves ids free for the mask
    shape = _qwen3_5(n_layers=8, hidden=256, intermediate=512, vocab=2176, heads=2, kv_heads=1, head_dim=128,
                     lin_k_heads=2, lin_v_heads=4, lin_k_dim=64, lin_v_dim=64, tied=False, max_pos=4096, eos=2048,
                     mrope=[11, 11, 10])
    cfg = tmp_path / "tiny-gguf.json"
    cfg.write_text(json.dumps(shape))
    config = Config.model_validate({"name": "t", "models": {
        "target": {"synth": {"config": str(cfg), "seed": 0, "format": "gguf", "quant": "q4_k_m"}},
        "draft": {"synth": {"draft_for": "target", "seed": 3, "dtype": "fp32"}},
        "hf-target": {"synth": {"config": str(cfg), "seed": 0, "dtype": "fp32"}},
        "hf-draft": {"synth": {"draft_for": "hf-target", "seed": 3, "dtype": "fp32"}}},
        "matrix": {"engine": ["ar"], "model": ["target"], "suite": ["tg8"]}})
    models = ModelCache(config)
    target, draft = models.get("target"), models.get("draft")
    assert target.path.is_file() and target.path.name == "model-q4_k_m.gguf"
    assert draft.path.is_dir() and draft.path.parent == cache / "models" and draft.info.synthetic
    assert draft.path.name.startswith(f"draft-{target.path.parent.name[:40]}-s3-fp32-")
    made = check_draft(draft.path, shape)  # hidden size, target depth and vocabulary of the shape
    assert made.num_target_layers == 8 and made.target_layer_ids == (1, 2, 3, 4, 5)
    tok = json.loads((target.path.parent / "tokenizer.json").read_text())
    known = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
    assert made.mask_token_id == max(known) + 1 == 2053
    provenance = json.loads((draft.path / PROVENANCE_FILE).read_text())
    assert provenance["target"]["config_from"] == "shape"
    # The same key on a later run: found, not rewritten.
    mtime = (draft.path / "model.safetensors").stat().st_mtime_ns
    again = ModelCache(config).get("draft")
    assert again.path == draft.path and (draft.path / "model.safetensors").stat().st_mtime_ns == mtime
    assert again.info.files == draft.info.files
    # Sizes, mask id and weights depend on the shape alone, not on the target's file format.
    hf_draft = models.get("hf-draft")
    assert hf_draft.path != draft.path
    assert (hf_draft.path / "config.json").read_text() == (draft.path / "config.json").read_text()
    assert hf_draft.info.files["model.safetensors"] == draft.info.files["model.safetensors"]
    # Another seed of the target's GGUF is another folder, hence another key.
    other = Config.model_validate({**config.model_dump(exclude_none=True), "models": {
        "target": {"synth": {"config": str(cfg), "seed": 1, "format": "gguf", "quant": "q4_k_m"}},
        "draft": {"synth": {"draft_for": "target", "seed": 3, "dtype": "fp32"}}}})
    assert ModelCache(other).get("draft").path != draft.path


def test_draft_for_a_gguf_file_that_is_not_synthetic_is_a_user_error(cache, tmp_path):
    """A GGUF given by path has no config to size a draft from: a config error before anything runs, and the
    resolver's own check for a target met some other way."""
    from lucebench.config.schema import Config

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="is a GGUF file, which has no config.json"):
        Config.model_validate({"name": "t", "models": {"m": {"path": str(tmp_path / "m.gguf")},
                                                       "d": {"synth": {"draft_for": "m"}}},
                               "matrix": {"engine": ["ar"], "model": ["m"], "suite": ["tg8"]}})
    with pytest.raises(UserError, match="or a synthetic GGUF"):
        R.resolve_draft_synth(tmp_path / "m.gguf")


def test_pydantic_model_source_is_accepted(cache):
    from lucebench.config.schema import ModelSource

    m = R.resolve_model(ModelSource.model_validate({"synth": {"shape": "tiny", "dtype": "fp32"}}))
    assert m.synthetic


def _fake_hub_cache(root: Path, repo: str, files: dict[str, str]) -> str:
    """The huggingface_hub cache layout: blobs by hash, snapshots/<commit>/ symlinks, refs/main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for name, text in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(text.encode()).hexdigest()
        blob.write_text(text)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return commit


def _resolve_in_subprocess(hf_home: Path, repo: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1"}
    code = ("from lucebench.models.resolve import resolve_model\n"
            "from lucebench.errors import UserError\n"
            "try:\n"
            f"    m = resolve_model({{'hub': {repo!r}}})\n"
            "    print(m.path); print(m.revision)\n"
            "except UserError as e:\n"
            "    print('USERERROR', e)\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_hub_spec_found_offline_in_the_hf_cache(tmp_path):
    hub = tmp_path / "hf" / "hub"
    commit = _fake_hub_cache(hub, "Qwen/Qwen3.5-0.8B", {"config.json": '{"model_type": "qwen3_5"}',
                                                        "tokenizer.json": "{}"})
    proc = _resolve_in_subprocess(tmp_path / "hf", "Qwen/Qwen3.5-0.8B")
    assert proc.returncode == 0, proc.stderr
    path, rev = proc.stdout.split()
    assert Path(path) == hub / "models--Qwen--Qwen3.5-0.8B" / "snapshots" / commit
    assert rev == commit
    # Hashes follow the snapshot's symlinks into blobs/.
    hashes = R.hash_model_files(Path(path), memo_path=tmp_path / "memo.json")
    assert hashes["config.json"] == hashlib.sha256(b'{"model_type": "qwen3_5"}').hexdigest()


def test_hub_spec_missing_names_the_fetch_command(tmp_path):
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    proc = _resolve_in_subprocess(tmp_path / "hf", "Qwen/Qwen3.5-27B")
    assert proc.returncode == 0, proc.stderr
    assert "USERERROR" in proc.stdout and "Qwen/Qwen3.5-27B" in proc.stdout
    assert "lucebench models fetch Qwen/Qwen3.5-27B" in proc.stdout


def test_hashes_are_memoised_by_size_and_mtime(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "w.bin").write_bytes(b"x" * 1000)
    (model / ".cache").mkdir()
    (model / ".cache" / "junk").write_text("ignored")
    memo = tmp_path / "memo.json"
    first = R.hash_model_files(model, memo_path=memo)
    assert first == {"config.json": hashlib.sha256(b"{}").hexdigest(),
                     "w.bin": hashlib.sha256(b"x" * 1000).hexdigest()}
    # Poison the memo: an unchanged file (same size and mtime) is served from it, not rehashed.
    data = json.loads(memo.read_text())
    data[str((model / "w.bin").resolve())]["sha256"] = "from-memo"
    memo.write_text(json.dumps(data))
    assert R.hash_model_files(model, memo_path=memo)["w.bin"] == "from-memo"
    # A changed file is hashed again.
    (model / "w.bin").write_bytes(b"y" * 1001)
    assert R.hash_model_files(model, memo_path=memo)["w.bin"] == hashlib.sha256(b"y" * 1001).hexdigest()
    # A single model file (e.g. a GGUF) hashes to one entry.
    assert list(R.hash_model_files(model / "w.bin", memo_path=memo)) == ["w.bin"]


def test_fetch_offline_is_one_clear_error(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "lucebench", "models", "fetch", "Qwen/Qwen3.5-0.8B"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "cannot download Qwen/Qwen3.5-0.8B" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr


def test_hub_file_and_tokenizer_found_offline_in_the_hf_cache(tmp_path):
    """A published GGUF is one file of a hub repository (`file:`); its prompts are tokenised by another
    repository's tokenizer.json (`tokenizer:`), whose hash is recorded beside the weights'."""
    hub = tmp_path / "hf" / "hub"
    commit = _fake_hub_cache(hub, "unsloth/Qwen3.5-27B-GGUF", {"Qwen3.5-27B-Q4_K_M.gguf": "GGUF...",
                                                               "Qwen3.5-27B-Q8_0.gguf": "other"})
    _fake_hub_cache(hub, "Qwen/Qwen3.5-27B", {"tokenizer.json": '{"tok": 1}', "config.json": "{}"})
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    code = textwrap.dedent("""\
        from lucebench.config.schema import Config
        from lucebench.errors import UserError
        from lucebench.runner.prepare import ModelCache
        config = Config.model_validate({"name": "t", "models": {
            "t": {"hub": "unsloth/Qwen3.5-27B-GGUF", "file": "Qwen3.5-27B-Q4_K_M.gguf", "tokenizer": "Qwen/Qwen3.5-27B"},
            "gone": {"hub": "unsloth/Qwen3.5-27B-GGUF", "file": "Qwen3.5-27B-BF16.gguf"},
            "notok": {"hub": "unsloth/Qwen3.5-27B-GGUF", "file": "Qwen3.5-27B-Q8_0.gguf", "tokenizer": "Qwen/Nope"}},
            "matrix": {"engine": ["ar"], "model": ["t"], "suite": ["tg8"]}})
        m = ModelCache(config).get("t")
        print(m.path); print(m.tokenizer_dir); print(sorted(m.info.files))
        for name in ("gone", "notok"):
            try:
                ModelCache(config).get(name)
            except UserError as e:
                print("USERERROR", e.message, "|", e.hint)
        """)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    snap = hub / "models--unsloth--Qwen3.5-27B-GGUF" / "snapshots" / commit
    assert Path(lines[0]) == snap / "Qwen3.5-27B-Q4_K_M.gguf"  # the snapshot's link keeps the .gguf name
    assert Path(lines[1]).parent.parent.name == "models--Qwen--Qwen3.5-27B"
    assert lines[2] == "['Qwen3.5-27B-Q4_K_M.gguf', 'tokenizer/tokenizer.json']"
    assert ("USERERROR Qwen3.5-27B-BF16.gguf of unsloth/Qwen3.5-27B-GGUF is not in the Hugging Face cache | download "
            "it with `lucebench models fetch unsloth/Qwen3.5-27B-GGUF --include Qwen3.5-27B-BF16.gguf`") in lines
    assert any(line.startswith("USERERROR tokenizer Qwen/Nope is not in the Hugging Face cache")
               and "lucebench models fetch Qwen/Nope --include 'tokenizer*'" in line for line in lines)


@pytest.mark.parametrize(("source", "message"), [
    ({"path": "/m", "file": "x.gguf"}, "'file' names a file of a hub repository"),
    ({"synth": {"shape": "tiny"}, "tokenizer": "Qwen/Qwen3.5-0.8B"}, "has its own tokenizer"),
])
def test_file_and_tokenizer_keys_are_checked(source, message):
    from pydantic import ValidationError

    from lucebench.config.schema import ModelSource

    with pytest.raises(ValidationError, match=message):
        ModelSource.model_validate(source)
