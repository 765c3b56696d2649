from lucebench.matrix.pairing import ENGINE_AXES, hashable, kv_types, pairing_key


def test_pairing_key_ignores_engine_axes_only():
    ar = {"engine": "ar", "engine_type": "ar", "model": "m", "suite": "humaneval", "kv_k": "bf16", "kv_v": "bf16"}
    spec = {**ar, "engine": "dflash", "engine_type": "dflash", "budget": 22, "kv_k": "q8_0", "kv_v": "q8_0"}
    assert pairing_key(ar) == pairing_key(spec)
    assert pairing_key(ar) != pairing_key({**ar, "suite": "gsm8k"})
    assert pairing_key(ar) != pairing_key({**ar, "context": 4096})
    assert {"engine", "budget", "keep_ratio", "kv_k", "kv_v"} <= ENGINE_AXES


def test_pairing_key_takes_unhashable_params_in_any_order():
    a = {"model": "m", "extra": {"b": [1, 2], "a": 1}}
    b = {"extra": {"a": 1, "b": [1, 2]}, "model": "m"}
    assert pairing_key(a) == pairing_key(b)
    assert hash(pairing_key(a)) == hash(pairing_key(b))
    assert hashable([1, [2, 3]]) == (1, (2, 3))


def test_kv_types():
    assert kv_types({"kv_k": "q8_0", "kv_v": "bf16"}) == ("q8_0", "bf16")
    assert kv_types({}) == (None, None)
