// How many key ranges split-KV attention cuts the cached keys into (attention.cu, attention_split: the
// flash prefill kernel over a range of key tiles per block, then a merge in fixed order). Plain C++, so the
// CPU unit tests check the rule.
#pragma once
#include <algorithm>

namespace lb::gpu {

// Key tiles (64 keys each) a range takes at least: below 2 x 32 tiles (4032 keys or fewer) the single pass
// stays, so short contexts run the kernels they ran before (the threshold is not yet tuned on a GPU:
// scripts/device/check_longctx_gpu.sh measures 1K and 64K).
constexpr int kSplitMinTiles = 32;

// blocks: the single pass's blocks (query tiles x KV heads); key_tiles: the key tiles before the rows;
// sms: the device's multiprocessors. 1 (the single pass) when the blocks already fill half the GPU or the
// context is short; else as many ranges as keep the blocks within one wave (splits x blocks <= sms), each of
// at least kSplitMinTiles tiles.
inline int kv_split_count(int blocks, int key_tiles, int sms) {
    if (blocks < 1 || sms < 1 || 2 * blocks > sms) return 1;
    return std::max(1, std::min(sms / blocks, key_tiles / kSplitMinTiles));
}

}  // namespace lb::gpu
