// How many key ranges split-KV attention cuts the cached keys into (attention.cu, attention_split: the
// flash prefill kernel over a range of key tiles per block, then a merge in fixed order). Plain C++, so the
// CPU unit tests check the rule.
#pragma once
#include <algorithm>

namespace lb::gpu {

// Key tiles (64 keys each) a range takes at least. A block of flash_attention_kernel walks a tile in ~5 us
// (27B, 23 rows, H100: 2 ranges of 32 tiles at 4K keys took 167 us, the single pass at 1K 103 us), so
// even short contexts gain from spreading the few blocks of a verify or a short chunk over the GPU; 4 tiles
// keeps a range's work well above the merge's.
constexpr int kSplitMinTiles = 4;

// blocks: the single pass's blocks (query tiles x KV heads); key_tiles: the key tiles before the rows;
// sms: the device's multiprocessors. 1 (one range) when the blocks already fill half the GPU or the
// context is short; else as many ranges as keep the blocks within one wave (splits x blocks <= sms), each of
// at least kSplitMinTiles tiles.
inline int kv_split_count(int blocks, int key_tiles, int sms) {
    if (blocks < 1 || sms < 1 || 2 * blocks > sms) return 1;
    return std::max(1, std::min(sms / blocks, key_tiles / kSplitMinTiles));
}

}  // namespace lb::gpu
