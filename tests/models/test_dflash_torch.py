"""The PyTorch DFlash draft: config placements, file layout, and the cached inference path against the
masked training path (the same numbers, whichever way the context arrives)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lucebench.models.dflash_draft import default_target_layer_ids  # noqa: E402
from lucebench.models.dflash_torch import DFlashConfig, DFlashDraft, DraftCache  # noqa: E402
from lucebench.models.train.draft_train import block_batch  # noqa: E402


def _cfg(**kw) -> DFlashConfig:
    base = dict(hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                intermediate_size=56, vocab_size=97, num_target_layers=8, target_layer_ids=[1, 3, 5],
                mask_token_id=7, block_size=6, rope_theta=1e4)
    base.update(kw)
    return DFlashConfig(**base)


def _draft(seed: int = 0) -> DFlashDraft:
    torch.manual_seed(seed)
    d = DFlashDraft(_cfg())
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # norms away from 1, so a wrongly applied norm shows
    return d.eval()


def test_config_accepts_both_placements_and_the_default_layer_ids():
    cfg = _cfg().to_json()
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["mask_token_id"] == 7
    back = DFlashConfig.from_json(cfg)
    assert back == _cfg()
    top = {k: v for k, v in cfg.items() if k != "dflash_config"}
    top.update({"mask_token_id": 7, "target_layer_ids": [1, 3, 5], "block_size": 6})
    assert DFlashConfig.from_json(top) == _cfg()
    del top["target_layer_ids"]
    assert DFlashConfig.from_json(top).target_layer_ids == default_target_layer_ids(8, 2) == [1, 5]
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # the published 27B draft's choice


def test_save_and_load_keep_names_and_values(tmp_path):
    d = _draft()
    d.save(tmp_path, dtype=torch.float32)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight",
            "layers.0.mlp.down_proj.weight"} <= names
    e = DFlashDraft.load(tmp_path)
    for k, v in d.state_dict().items():
        assert torch.equal(v, e.state_dict()[k]), k


@pytest.mark.parametrize("t,anchors", [(23, 3), (17, 1)])
def test_cached_block_equals_the_masked_training_forward(t, anchors):
    d = _draft()
    h, bs = d.config.hidden_size, d.config.block_size
    gen = torch.Generator().manual_seed(1)
    seqs = torch.randint(8, 97, (2, t), generator=gen)
    feats = torch.randn(2, t, 3 * h, generator=gen)
    emb_table = torch.randn(97, h, generator=gen)
    bb = block_batch(seqs, prefix_len=4, block_size=bs, anchors=anchors, mask_id=7, gen=gen)
    with torch.no_grad():
        ctx = d.context_features(feats)
        masked = d(emb_table[bb["inputs"]], bb["pos"], ctx, torch.arange(t).expand(2, t), mask=bb["mask"])
        for b in range(2):
            for j in range(bb["labels"].shape[1]):
                a = int(bb["pos"][b, j * bs])
                # Inference: the context arrives in two pieces through the cache, then the block alone.
                cache = DraftCache(len(d.layers))
                cut = a // 2
                blk_in = emb_table[bb["inputs"][b, j * bs:(j + 1) * bs]][None]
                blk_pos = torch.arange(a, a + bs)[None]
                d(blk_in, blk_pos, ctx[b:b + 1, :cut], torch.arange(cut)[None], cache=cache)
                assert cache.length == cut  # the block's own K/V are not kept
                got = d(blk_in, blk_pos, ctx[b:b + 1, cut:a], torch.arange(cut, a)[None], cache=cache)
                torch.testing.assert_close(got[0], masked[b, j * bs:(j + 1) * bs], rtol=1e-5, atol=1e-5)


def test_block_batch_labels_and_mask():
    gen = torch.Generator().manual_seed(0)
    seqs = torch.arange(30).view(1, 30) + 100
    bb = block_batch(seqs, prefix_len=10, block_size=4, anchors=3, mask_id=7, gen=gen)
    pos = bb["pos"].view(3, 4)
    assert (pos[:, 0] >= 10).all() and (pos[:, -1] < 30).all()
    assert torch.equal(bb["labels"][0], pos + 100)
    assert (bb["inputs"].view(3, 4)[:, 1:] == 7).all() and torch.equal(bb["inputs"].view(3, 4)[:, 0], pos[:, 0] + 100)
    m = bb["mask"][0, 0]  # [12, 30 + 12]
    for j in range(3):
        a = int(pos[j, 0])
        rows = m[j * 4:(j + 1) * 4]
        assert rows[:, :a].all() and not rows[:, a:30].any()
        own = torch.zeros(12, dtype=torch.bool)
        own[j * 4:(j + 1) * 4] = True
        assert (rows[:, 30:] == own).all()
