"""Models to train: any Hugging Face sequence classifier, or a tiny offline Llama.

The train command fine-tunes a *sequence classifier*: a decoder-only language model whose last
non-padding token feeds a small classification head. ``--model`` takes an offline preset
(:data:`OFFLINE_PRESETS`: ``tiny-llama``, the offline default, about 80 k parameters; ``small-llama``,
about 5 M, where compute dominates a CPU step; ``medium-llama``; ``deep-llama``, 32 narrow layers with
SmolLM2's 291 gradient tensors; ``smollm2-360m``, the blog's
architecture with random weights), built with a seeded random init and no download; or a Hugging
Face model id or local directory (``AutoModelForSequenceClassification.from_pretrained``).
:func:`build_model` (1) seeds torch's generator, so every process builds the very same weights,
(2) builds the preset's config or loads the weights, (3) tells the model its padding id, which
its pooling needs, and (4) casts it to the requested dtype. ``docs/ladder.md`` (*What every stage
trains*) says more.

Example::

    >>> model = build_model("tiny-llama", vocab_size=400, pad_token_id=0, seed=314)
    >>> ids = torch.randint(1, 400, (2, 8))                        # 2 sequences of 8 tokens
    >>> loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])).loss
    >>> loss.shape, loss.requires_grad
    (torch.Size([]), True)
"""

from __future__ import annotations

import os

import torch
from torch import nn

from minddp.train.hub import hub_reachable, is_local_path

#: The offline default: a Llama with the shape of SmolLM2, scaled down to CPU size.
TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)

#: Offline presets by name: Llama configs with a seeded random init (no download).
OFFLINE_PRESETS = {
    "tiny-llama": TINY_LLAMA,
    "small-llama": dict(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=7,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    "medium-llama": dict(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=9,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # SmolLM2-360M's 32 layers at CPU size: its count of gradient tensors (291: 32 × 9, the embedding, the final
    # norm, the classifier), each small, for the bucket lesson (notebooks/03_build_up.py): many messages per sync.
    "deep-llama": dict(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # The blog's model, SmolLM2-360M, built from its configuration with random weights (no download): for
    # GPU benchmarks and traces where compute dominates. Its own 49152-token vocabulary is kept (the offline
    # tokenizer's ids are a subset), so the parameter count is the real model's.
    "smollm2-360m": dict(
        vocab_size=49152,
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}

OFFLINE_MODEL = "tiny-llama"
#: The blog's model, documented as the GPU preset (``--model ... --dtype bf16``).
GPU_PRESET = "HuggingFaceTB/SmolLM2-360M-Instruct"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_model(
    name: str, vocab_size: int, pad_token_id: int, seed: int, dtype: str = "fp32", num_labels: int = 2
) -> nn.Module:
    """Return a sequence classifier (``model(input_ids, attention_mask, labels).loss``)."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)  # step 1
    if name in OFFLINE_PRESETS:  # step 2
        preset = {"vocab_size": vocab_size, **OFFLINE_PRESETS[name]}  # a preset may keep its own vocabulary
        if preset["vocab_size"] < vocab_size:
            raise ValueError(
                f"model {name!r} has a vocabulary of {preset['vocab_size']} tokens, fewer than the "
                f"data's {vocab_size}; use another --model"
            )
        config = LlamaConfig(num_labels=num_labels, pad_token_id=pad_token_id, **preset)
        model = LlamaForSequenceClassification(config)
    else:
        path = os.path.expanduser(name)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels, dtype=DTYPES[dtype])
    model.config.pad_token_id = pad_token_id  # step 3
    return model.to(DTYPES[dtype])  # step 4


def resolve_model(name: str, say=print) -> str:
    """The model to build: ``name``, or the offline default when a hub id cannot be had.

    A hub id already in the local cache is used as is; otherwise, when the hub
    cannot be reached (a short connection attempt, never a hang), say so in
    one line and use :data:`OFFLINE_MODEL`.
    """
    if name in OFFLINE_PRESETS or is_local_path(name):
        return name
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name, local_files_only=True)
        return name
    except OSError:
        pass
    if not hub_reachable():
        say(
            f"model {name}: not in the local cache and the Hugging Face hub cannot be reached; using the "
            f"offline default '{OFFLINE_MODEL}' instead"
        )
        return OFFLINE_MODEL
    return name


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
