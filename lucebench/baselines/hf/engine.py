"""The HF baseline's model side: load with transformers, greedy prefill + step-by-step decode, timing.

Decoding is a manual loop, not ``generate()``: one forward over the whole prompt (its last logits give
the first token), then one forward per token with the model's cache. For Qwen3.5 the cache is a
``DynamicCache(config=...)`` holding the DeltaNet conv/recurrent states of linear layers and the K/V of
full-attention layers; the model creates it on the prefill call and it is passed back on every step.
With ``--compile`` the decode step runs through ``torch.compile`` over a ``StaticCache`` (CUDA graphs
via mode ``reduce-overhead`` on GPU).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lucebench.engines.protocol import GenerateRequest, ReadyMessage, RequestError, ResultMessage, ready_message

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LoadError(Exception):
    """The model cannot be loaded: answered with one ``load`` error line and a non-zero exit."""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(name: str) -> bool:
    """True when `import name` would find the package (False when hidden by --kernels torch)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def optional_kernels() -> dict[str, Any]:
    """Whether the fast kernels transformers uses for Qwen3.5's DeltaNet are importable (speed depends on it)."""
    fla = _importable("fla")
    conv = _importable("causal_conv1d")
    return {"fla": fla, "fla_version": _version("flash-linear-attention") if fla else None,
            "causal_conv1d": conv, "causal_conv1d_version": _version("causal-conv1d") if conv else None}


@dataclass
class _Timer:
    """Phase boundaries: CUDA events on GPU, perf_counter on CPU; monotonic stamps after synchronisation."""

    device: torch.device

    def mark(self) -> tuple[int, Any]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return time.monotonic_ns(), ev
        return time.monotonic_ns(), time.perf_counter()

    def elapsed_ms(self, a: Any, b: Any) -> float:
        if self.device.type == "cuda":
            b.synchronize()
            return float(a.elapsed_time(b))
        return (b - a) * 1e3


class HFEngine:
    """A loaded transformers causal LM serving greedy generate requests."""

    def __init__(self, model_dir: Path, *, device: str, dtype: str, compile: bool = False, attn: str | None = None):
        self.model_dir = Path(model_dir)
        self.dtype_name = dtype
        self.attn = attn
        if not (self.model_dir / "config.json").is_file():
            raise LoadError(f"{self.model_dir}: no config.json (not a Hugging Face checkpoint folder)")
        if dtype not in TORCH_DTYPES:
            raise LoadError(f"unknown dtype {dtype!r} (fp32, bf16 or fp16)")
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise LoadError(f"bad device {device!r}: {exc}") from None
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise LoadError(f"device {device} requested but torch {torch.__version__} sees no CUDA GPU")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            if self.device.index >= torch.cuda.device_count():
                raise LoadError(f"device {device}: only {torch.cuda.device_count()} GPU(s) visible")
            torch.cuda.set_device(self.device)
        elif self.device.type != "cpu":
            raise LoadError(f"device {device!r}: use cpu, cuda or cuda:N")

        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {"dtype": TORCH_DTYPES[dtype]}
        if attn is not None:
            kwargs["attn_implementation"] = attn
        try:
            model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), **kwargs)
        except (OSError, ValueError, KeyError) as exc:
            raise LoadError(f"transformers cannot load {self.model_dir}: {exc}") from None
        self.model = model.to(self.device).eval()
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        self.max_ctx = int(getattr(self.config, "max_position_embeddings", 0) or 0) or 1 << 30
        params = list(self.model.parameters())  # tied parameters appear once
        self.n_params = sum(p.numel() for p in params)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in params)
        emb = self.model.get_input_embeddings().weight
        tied = self.model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
        # A decode step reads every weight once, except an untied input embedding (one row of it).
        self.decode_weight_bytes = self.weight_bytes - (
            0 if tied else emb.numel() * emb.element_size() - emb.shape[1] * emb.element_size())
        self.timer = _Timer(self.device)
        self.compile_status: dict[str, Any] = {"requested": compile, "enabled": False}
        self._compiled_step: Any = None
        self._static_caches: dict[int, Any] = {}
        if compile:
            self._setup_compile()

    # ------------------------------------------------------------------------------------------ facts
    def ready_message(self) -> ReadyMessage:
        """The protocol's ``ready`` line."""
        import transformers

        cfg = self.config
        model = {
            "arch": getattr(cfg, "model_type", None), "n_layers": getattr(cfg, "num_hidden_layers", None),
            "hidden_size": getattr(cfg, "hidden_size", None), "vocab_size": self.vocab_size,
            "dtype": self.dtype_name, "n_params": self.n_params, "weight_bytes": self.weight_bytes,
            "class": type(self.model).__name__, "path": str(self.model_dir),
        }
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            device = {"name": props.name, "index": self.device.index, "memory_bytes": int(props.total_memory)}
        else:
            device = {"name": "cpu", "index": None, "memory_bytes": _host_memory_bytes(),
                      "threads": torch.get_num_threads()}
        build = {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
            "dtype": self.dtype_name, "attn": getattr(cfg, "_attn_implementation", self.attn),
            "compile": self.compile_status, **optional_kernels(),
            "python": sys.version.split()[0],
        }
        return ready_message(engine={"name": "hf", "version": transformers.__version__, "backend": self.device.type,
                                     "build": build},
                             model=model, device=device, limits={"max_ctx": self.max_ctx})

    # ------------------------------------------------------------------------------------------ compile
    def _setup_compile(self) -> None:
        """Compile the decode step over a StaticCache and prove it on a short warm-up; record why not if it fails."""
        backend = os.environ.get("LUCEBENCH_HF_COMPILE_BACKEND", "inductor")
        mode = "reduce-overhead" if (self.device.type == "cuda" and backend == "inductor") else None
        try:
            self._compiled_step = torch.compile(self.model.forward, backend=backend, mode=mode, fullgraph=False)
            self.compile_status.update({"backend": backend, "mode": mode, "cache": "StaticCache",
                                        "cuda_graphs": mode == "reduce-overhead"})
            warm = GenerateRequest(id="compile-warmup", prompt_ids=[1, 2, 3, 4], n_gen=4)
            self._run(warm, compiled=True)
            self.compile_status["enabled"] = True
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot compile this model here"
            self._compiled_step = None
            self.compile_status.update({"enabled": False, "reason": f"{type(exc).__name__}: {exc}"[:500]})

    def _static_cache(self, tokens: int) -> Any:
        from transformers import StaticCache

        # Power-of-two capacity buckets, one cache each, reset and reused: the compiled step sees the same
        # static buffers every request (a fresh cache would re-trigger compilation).
        cap = 256
        while cap < tokens:
            cap *= 2
        cap = min(cap, self.max_ctx)
        cache = self._static_caches.get(cap)
        if cache is None:
            cache = self._static_caches[cap] = StaticCache(config=self.config, max_cache_len=cap)
        else:
            cache.reset()
        return cache

    # ------------------------------------------------------------------------------------------ generate
    def generate(self, req: GenerateRequest) -> ResultMessage:
        """Serve one generate request; raises RequestError for context overflow, unsupported, oom."""
        if len(req.prompt_ids) + req.n_gen > self.max_ctx:
            raise RequestError("context_overflow", f"prompt {len(req.prompt_ids)} + n_gen {req.n_gen} exceeds "
                               f"max_ctx {self.max_ctx} (max_position_embeddings)", req.id)
        if self.compile_status["requested"] and not self.compile_status["enabled"]:
            raise RequestError("unsupported", "--compile was requested but cannot work for this model here: "
                               + str(self.compile_status.get("reason")), req.id)
        try:
            return self._run(req, compiled=self._compiled_step is not None)
        except torch.OutOfMemoryError as exc:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise RequestError("oom", f"out of device memory: {str(exc).splitlines()[0]}", req.id) from None

    @torch.inference_mode()
    def _run(self, req: GenerateRequest, *, compiled: bool) -> ResultMessage:
        dev = self.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=dev)
        eos = set(req.eos_ids)
        cache = self._static_cache(len(req.prompt_ids) + req.n_gen) if compiled else None
        step_fn = self._compiled_step if compiled else self.model.forward

        t_pre0, m_pre0 = self.timer.mark()
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        # argmax returns the first maximal index: the protocol's "lowest index on ties".
        tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        t_pre1, m_pre1 = self.timer.mark()

        tokens = [tok]
        stop = "length"
        first = int(tok.item())
        if not req.ignore_eos and first in eos:
            stop = "eos"
        steps = 0
        if stop != "eos":
            for _ in range(req.n_gen - 1):
                out = step_fn(input_ids=tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                if compiled:
                    tok = tok.clone()  # CUDA-graph outputs are overwritten by the next replay
                tokens.append(tok)
                steps += 1
                # Only look at the token on the host when EOS can stop us: no per-step sync otherwise.
                if not req.ignore_eos and int(tok.item()) in eos:
                    stop = "eos"
                    break
        t_dec1, m_dec1 = self.timer.mark()

        output_ids = [int(x) for x in torch.cat(tokens, dim=1)[0].tolist()]
        prefill_ms = self.timer.elapsed_ms(m_pre0, m_pre1)
        decode_ms = self.timer.elapsed_ms(m_pre1, m_dec1) if steps else 0.0
        if not steps:
            t_dec1 = t_pre1
        result: ResultMessage = {
            "type": "result", "id": req.id, "output_ids": output_ids, "n_prompt": len(req.prompt_ids),
            "n_gen": len(output_ids), "stop": stop,
            "timing": {"prefill_ms": prefill_ms, "decode_ms": decode_ms,
                       "t_prefill_start_ns": t_pre0, "t_prefill_end_ns": t_pre1,
                       "t_decode_start_ns": t_pre1, "t_decode_end_ns": t_dec1},
            "decode_steps": steps,
            "bytes_per_token": self.bytes_per_token(cache, len(req.prompt_ids), len(output_ids)),
            "peak_mem_bytes": _peak_memory(dev),
        }
        return result

    def bytes_per_token(self, cache: Any, n_prompt: int, n_gen: int) -> int:
        """Bytes one decode step moves at this request's mean decode context (docs/models.md).

        decode weight bytes + 2 x recurrent/conv state bytes (read and written) + KV bytes per token x
        (mean context + 1 written), mean context = n_prompt + n_gen / 2.
        """
        state_bytes, kv_bytes, kv_tokens = _cache_bytes(cache)
        kv_per_token = kv_bytes / kv_tokens if kv_tokens else 0.0
        mean_ctx = n_prompt + n_gen / 2
        return int(self.decode_weight_bytes + 2 * state_bytes + kv_per_token * (mean_ctx + 1))


def _cache_bytes(cache: Any) -> tuple[int, int, int]:
    """(linear-attention state bytes, K/V bytes in use, tokens held) of a transformers cache."""
    state = kv = 0
    tokens = 0
    for layer in getattr(cache, "layers", []):
        for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
            if isinstance(states, dict):
                state += sum(t.numel() * t.element_size() for t in states.values() if isinstance(t, torch.Tensor))
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel():
            n = int(layer.get_seq_length())
            cap = keys.shape[-2]
            # A static layer is allocated to capacity; count only the filled part.
            kv += (keys.numel() * keys.element_size() + values.numel() * values.element_size()) * n // max(cap, 1)
            tokens = max(tokens, n)
    return state, kv, tokens


def _peak_memory(dev: torch.device) -> int:
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    # On CPU the device memory is host memory: the process's peak resident set (Linux reports KiB).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
