"""Fixtures for the suites tests: a tiny trained byte-level BPE model folder and small dataset copies."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the patient scribe counts every word.",
    "Question: Janet has 3 apples and buys 5 more. How many apples does she have?\nAnswer: 8",
    "def add(a, b):\n    return a + b\n",
    "Problem: What is $\\frac{1}{2} + \\frac{1}{3}$?\nSolution: Put your final answer in \\boxed{}.\n",
    "The secret passcode for Lisbon is 1234567. What is the secret passcode for Osaka?",
    "The river town woke slowly, as it did every morning, with bakers lighting ovens before the sun was up.",
] * 20


def make_model_dir(folder: Path, *, bos: bool = False) -> Path:
    """Train a ~300-token byte-level BPE tokenizer and write tokenizer.json + tokenizer_config.json (ChatML)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": "<s>" if bos else None,
              "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id("<|endoftext|>")]}))
    return folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder with a trained tokenizer and a ChatML chat template."""
    return make_model_dir(tmp_path_factory.mktemp("model"))


def humaneval_rows(n: int) -> list[dict]:
    """Small HumanEval-shaped rows whose canonical solutions pass their tests."""
    rows = []
    for i in range(n):
        rows.append({
            "task_id": f"HumanEval/{i}",
            "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n",
            "canonical_solution": f"    return x + {i}\n",
            "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n    assert candidate(-{i}) == 0\n",
            "entry_point": f"f{i}",
        })
    return rows


def gsm8k_rows(n: int) -> list[dict]:
    """Small GSM8K-shaped rows (gold after ####)."""
    return [{"question": f"Tom has {i} apples and buys {i + 2} more. How many apples does he have?",
             "answer": f"He has {i} + {i + 2} = {2 * i + 2} apples.\n#### {2 * i + 2:,}"} for i in range(n)]


def math500_rows(n: int) -> list[dict]:
    """Small MATH-500-shaped rows."""
    return [{"problem": f"Compute $\\frac{{{i}}}{{{i + 1}}} + 0$.", "solution": "Trivial.",
             "answer": f"\\frac{{{i}}}{{{i + 1}}}", "subject": "Algebra", "level": 1} for i in range(n)]


def write_data_dir(folder: Path, *, n_he: int = 12, n_gsm: int = 30, n_math: int = 20) -> Path:
    """A LUCEBENCH_DATA_DIR layout like ../shared/datasets, with small generated rows."""
    (folder / "humaneval").mkdir(parents=True, exist_ok=True)
    (folder / "gsm8k").mkdir(exist_ok=True)
    (folder / "math500").mkdir(exist_ok=True)
    with gzip.open(folder / "humaneval" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in humaneval_rows(n_he))
    (folder / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(n_gsm)))
    (folder / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math500_rows(n_math)))
    return folder


def write_suite(folder: Path, base: str, **changes: object) -> Path:
    """A copy of the repository's suites/<base>.yaml with top-level or dotted keys changed, as <name>.yaml."""
    import yaml

    from lucebench.suites.registry import repo_root

    data = yaml.safe_load((repo_root() / "suites" / f"{base}.yaml").read_text())
    for dotted, value in changes.items():
        parts = dotted.split("__")
        node = data
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def populate_hf_cache(cache_dir: Path, hub_id: str, config: str | None, split: str, rows: list[dict],
                      revision: str) -> Path:
    """Write a `datasets` cache entry exactly as load_dataset leaves it after a hub download
    (<cache>/<ns>___<name>/<config>/0.0.0/<commit sha>/<name>-<split>.arrow + dataset_info.json),
    so `load_dataset(hub_id, config, split=...)` in offline mode serves these rows."""
    import datasets
    from datasets.naming import camelcase_to_snakecase, filenames_for_dataset_split

    ns, name = hub_id.split("/")
    folder = cache_dir / f"{ns}___{camelcase_to_snakecase(name)}" / (config or "default") / "0.0.0" / revision
    folder.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset.from_list(rows)
    arrow = Path(filenames_for_dataset_split(str(folder), camelcase_to_snakecase(name), split, "arrow")[0])
    from datasets.arrow_writer import ArrowWriter

    with ArrowWriter(path=str(arrow), features=ds.features) as writer:
        writer.write_table(ds.data.table)
        n, nbytes = writer.finalize()
    info = datasets.DatasetInfo(features=ds.features, config_name=config or "default",
                                dataset_name=camelcase_to_snakecase(name), version="0.0.0",
                                splits=datasets.SplitDict.from_split_dict(
                                    [{"name": split, "num_bytes": nbytes, "num_examples": n,
                                      "dataset_name": camelcase_to_snakecase(name)}]))
    info.write_to_directory(str(folder))
    return folder


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test may download: the hub is offline and its cache is an empty folder unless a test fills one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("empty-hf-cache")))
    monkeypatch.delenv("LUCEBENCH_DATASET_SOURCE", raising=False)
    monkeypatch.delenv("LUCEBENCH_SUITES_DIR", raising=False)
    monkeypatch.delenv("LUCEBENCH_DATA_DIR", raising=False)


@pytest.fixture()
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Small generated local copies, selected through LUCEBENCH_DATA_DIR."""
    folder = write_data_dir(tmp_path / "data")
    monkeypatch.setenv("LUCEBENCH_DATA_DIR", str(folder))
    return folder


@pytest.fixture()
def small_suites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Suite files like the repository's, with row counts matching the small fixtures (via LUCEBENCH_SUITES_DIR)."""
    folder = tmp_path / "suites"
    write_suite(folder, "humaneval", dataset__rows=12)
    write_suite(folder, "gsm8k", dataset__rows=30)
    write_suite(folder, "math500", dataset__rows=20)
    monkeypatch.setenv("LUCEBENCH_SUITES_DIR", str(folder))
    return folder


@pytest.fixture()
def helpers() -> object:
    """The module's helper functions, for tests (importlib import mode cannot import conftest by name)."""
    import types

    return types.SimpleNamespace(write_suite=write_suite, write_data_dir=write_data_dir, make_model_dir=make_model_dir,
                                 populate_hf_cache=populate_hf_cache, humaneval_rows=humaneval_rows,
                                 gsm8k_rows=gsm8k_rows, math500_rows=math500_rows, shared=SHARED)
