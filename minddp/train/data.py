"""Sentence-pair data for the train command, and each rank's shard of every global batch.

The task is the blog's, GLUE MRPC: "is sentence 2 a paraphrase of sentence 1?" (columns
``sentence1``, ``sentence2``, ``label``), from ``glue/mrpc`` (the hub, when it can be reached), a
local path in the same schema, or ``synthetic`` (the offline default, :func:`synthetic_pairs`).
:func:`prepare_data`, once before any rank starts, (1) loads the pairs, (2) gets a tokenizer (the
model's own, or a word-level one built on the spot) and (3) tokenizes each pair as
``[BOS] sentence1 [SEP] sentence2 [SEP]``. :class:`ShardSampler` gives each rank its shard with the
semantics of torch's ``DistributedSampler(drop_last=True)``, so each global batch is split into
disjoint per-rank shards whose union is what ``single`` sees; :func:`step_batches` yields a rank's
micro-batches of every step. ``docs/ladder.md`` (*What every stage trains*) says how each source
loads and how the shards are cut.

Example::

    >>> data = prepare_data("synthetic", model="tiny-llama", seed=314, max_seq_len=64)
    >>> batches = step_batches(data.train, batch_size=8, grad_accum=3, num_replicas=2, rank=0, seed=314)
    >>> micro_batches = next(batches)      # this rank's 3 micro-batches of the first step
    >>> len(micro_batches), sorted(micro_batches[0]), len(micro_batches[0]["labels"])
    (3, ['attention_mask', 'input_ids', 'labels'], 8)
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from minddp.train.hub import hub_reachable, is_local_path
from minddp.train.models import OFFLINE_PRESETS

OFFLINE_DATASET = "synthetic"
HUB_DATASETS = {"glue/mrpc": ("nyu-mll/glue", "mrpc")}
COLUMNS = ("sentence1", "sentence2", "label")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]", "[SEP]")


class DataError(ValueError):
    """The data set cannot be used as asked (message says why and what to do)."""


@dataclass
class Encoded:
    """A tokenized split: one list of token ids per example, and its label."""

    input_ids: list[list[int]]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class PreparedData:
    """What a rank needs: tokenized splits and the two tokenizer facts a model needs."""

    train: Encoded
    eval: Encoded
    pad_token_id: int
    vocab_size: int
    source: str  # what was actually loaded, e.g. "synthetic" after an offline fallback


# -- step 1: the pairs --------------------------------------------------------------------------

_PEOPLE = [
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "mallory",
    "niaj",
    "olivia",
    "peggy",
    "rupert",
    "sybil",
    "trent",
    "victor",
    "wendy",
    "zoe",
]
_VERBS = [
    ("bought", "purchased"),
    ("sold", "traded away"),
    ("found", "discovered"),
    ("fixed", "repaired"),
    ("painted", "coloured"),
    ("lost", "misplaced"),
    ("built", "constructed"),
    ("borrowed", "took on loan"),
    ("cleaned", "washed"),
    ("moved", "relocated"),
]
_THINGS = [
    ("car", "automobile"),
    ("sofa", "couch"),
    ("boat", "vessel"),
    ("house", "home"),
    ("bicycle", "bike"),
    ("picture", "photo"),
    ("present", "gift"),
    ("jacket", "coat"),
    ("shop", "store"),
    ("film", "movie"),
    ("road", "street"),
    ("phone", "telephone"),
]
_PLACES = ["paris", "london", "berlin", "madrid", "rome", "oslo", "vienna", "lisbon", "dublin", "prague"]
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def synthetic_pairs(seed: int, n_train: int = 4000, n_eval: int = 500) -> dict[str, list[tuple]]:
    """A paraphrase task generated from ``seed``: ``{"train": [...], "validation": [...]}``.

    Sentence 1 says who did what to which thing, where and when. A paraphrase
    (label 1) says the same with synonyms and/or another word order; a
    non-paraphrase (label 0) is built the same way but changes one or two of
    the facts (the person, the thing, the place, the day). Surface overlap
    alone does not decide the label; comparing the facts does, which a small
    transformer learns within a few hundred steps.
    """
    rng = random.Random(seed)

    def say(person, verb, thing, place, day, variant):
        verb_w, thing_w = verb[variant[0]], thing[variant[1]]
        core = f"{person} {verb_w} the {thing_w} in {place}"
        return f"on {day} , {core} ." if variant[2] else f"{core} on {day} ."

    def pair():
        facts = [rng.choice(_PEOPLE), rng.choice(_VERBS), rng.choice(_THINGS), rng.choice(_PLACES), rng.choice(_DAYS)]
        first = say(*facts, variant=(0, 0, 0))
        label = rng.random() < 0.5
        other = list(facts)
        if not label:
            pools = {0: _PEOPLE, 2: _THINGS, 3: _PLACES, 4: _DAYS}
            for slot in rng.sample(sorted(pools), k=rng.choice((2, 3))):
                other[slot] = rng.choice([x for x in pools[slot] if x != facts[slot]])
        variant = (rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5)
        return first, say(*other, variant=variant), int(label)

    pairs = [pair() for _ in range(n_train + n_eval)]
    return {"train": pairs[:n_train], "validation": pairs[n_train:]}


def check_dataset_name(name: str) -> None:
    """Refuse, before anything runs, a ``--dataset`` that is neither known nor an existing path."""
    if name == OFFLINE_DATASET or name in HUB_DATASETS:
        return
    if is_local_path(name):
        if not os.path.exists(os.path.expanduser(name)):
            raise DataError(
                f"--dataset {name!r}: no such file or folder; give an existing data set path "
                f"or one of: {OFFLINE_DATASET}, {', '.join(HUB_DATASETS)}"
            )
        return
    raise DataError(
        f"unknown --dataset {name!r}: choose {OFFLINE_DATASET}, {', '.join(HUB_DATASETS)}, "
        "or a local path to a data set with columns sentence1, sentence2, label"
    )


def load_pairs(name: str, seed: int, say=print) -> tuple[dict[str, list[tuple]], str]:
    """Step 1: ``({"train": pairs, "validation": pairs}, source actually used)``."""
    if name == OFFLINE_DATASET:
        return synthetic_pairs(seed), OFFLINE_DATASET
    if name in HUB_DATASETS:
        if not hub_reachable():
            say(
                f"dataset {name}: the Hugging Face hub cannot be reached; using the offline default "
                f"'{OFFLINE_DATASET}' instead"
            )
            return synthetic_pairs(seed), OFFLINE_DATASET
        import datasets

        return _pairs_from(datasets.load_dataset(*HUB_DATASETS[name]), name, seed), name
    return _pairs_from(_load_local(name), name, seed), name


#: A single data file is read by the ``datasets`` builder for its kind.
FILE_KINDS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _load_local(path: str):
    """A ``save_to_disk`` folder, a folder of split files, or one csv/json/parquet file (then all of it is train)."""
    import datasets

    path = os.path.expanduser(path)
    bars = not datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # the one line below is the whole story: no bars, no log around it
    verbosity = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    try:
        if os.path.isfile(path):
            kind = FILE_KINDS.get(os.path.splitext(path)[1].lower())
            if kind is None:
                raise DataError(
                    f"--dataset {path!r} is a file of a kind minddp cannot read; give a "
                    f"{'/'.join(FILE_KINDS)} file or a folder"
                )
            options = {"delimiter": "\t"} if path.lower().endswith(".tsv") else {}
            return datasets.load_dataset(kind, data_files={"train": path}, **options)
        if os.path.exists(os.path.join(path, "dataset_dict.json")) or os.path.exists(
            os.path.join(path, "dataset_info.json")
        ):
            return datasets.load_from_disk(path)
        # A folder's files as data: never a loading script in it (datasets before 4.0 ran one; from 4.0 it cannot)
        return datasets.load_dataset(path, trust_remote_code=False)
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types; the user needs one line, with the real cause
        cause = _root_cause(exc)
        if isinstance(cause, UnicodeDecodeError):
            raise DataError(
                f"--dataset {path!r} is not UTF-8 text ({cause.encoding} cannot decode byte "
                f"0x{cause.object[cause.start]:02x} at position {cause.start}); save it as UTF-8"
            ) from None
        text = str(cause).splitlines()[0] if str(cause) else ""
        raise DataError(
            f"--dataset {path!r} could not be loaded by datasets ({type(cause).__name__}: {text}); "
            "give a save_to_disk folder, a folder of train/validation csv, json or parquet files, "
            "or one such file"
        ) from None
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _root_cause(exc: BaseException) -> BaseException:
    """The first exception in ``exc``'s chain that says more than "an error occurred" (datasets wraps them)."""
    chain = [exc]
    while (chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    return next((e for e in chain if type(e).__name__ != "DatasetGenerationError"), exc)


def _pairs_from(ds, name: str, seed: int) -> dict[str, list[tuple]]:
    """Rows of a ``datasets`` object in the MRPC schema -> pairs; find or make a held-out split."""
    import datasets

    splits = {"train": ds} if isinstance(ds, datasets.Dataset) else dict(ds)
    if "train" not in splits:
        raise DataError(
            f"--dataset {name!r} has no 'train' split (it has {', '.join(splits)}); name the training files train.*"
        )
    missing = [c for c in COLUMNS if c not in splits["train"].column_names]
    if missing:
        raise DataError(
            f"--dataset {name!r} lacks column(s) {', '.join(missing)}: the MRPC schema is sentence1, sentence2, label"
        )

    def rows(split):
        return [(a, b, int(y)) for a, b, y in zip(split["sentence1"], split["sentence2"], split["label"])]

    train = rows(splits["train"])
    held = next((s for s in ("validation", "test") if s in splits), None)
    if held is not None and all(y in (0, 1) for *_, y in rows(splits[held])):
        return {"train": train, "validation": rows(splits[held])}
    # No labelled held-out split (GLUE's test labels are -1): hold out 10% of train.
    random.Random(seed).shuffle(train)
    cut = max(1, len(train) // 10)
    return {"train": train[cut:], "validation": train[:cut]}


# -- steps 2 and 3: tokenizer and encoding ------------------------------------------------------


def word_tokenizer(sentences: list[str], max_vocab: int = 16000):
    """A word-level tokenizer built from ``sentences``: the most frequent words, ties by spelling.

    Built from our own counts (not a trainer) so that every process, under
    any hash seed, gets the same ids.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    counts = Counter(w for s in sentences for w, _ in pre.pre_tokenize_str(s.lower()))
    words = sorted(counts, key=lambda w: (-counts[w], w))[: max_vocab - len(SPECIAL_TOKENS)]
    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [SEP]",
        pair="[BOS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, vocab[t]) for t in ("[BOS]", "[SEP]")],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", sep_token="[SEP]"
    )


def model_tokenizer(model: str, pairs: dict[str, list[tuple]]):
    """Step 2: the model's own tokenizer, or a word-level one for the offline model."""
    if model in OFFLINE_PRESETS:
        return word_tokenizer([s for a, b, _ in pairs["train"] for s in (a, b)])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.expanduser(model))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # Llama tokenizers have no pad token; the mask hides it
    return tok


def encode(tokenizer, pairs: list[tuple], max_seq_len: int) -> Encoded:
    """Step 3: token ids of ``sentence1 [SEP] sentence2``, truncated to ``max_seq_len``."""
    out = tokenizer([a for a, _, _ in pairs], [b for _, b, _ in pairs], truncation=True, max_length=max_seq_len)
    return Encoded(list(out["input_ids"]), [y for *_, y in pairs])


def prepare_data(dataset: str, model: str, seed: int, max_seq_len: int, say=print) -> PreparedData:
    """Steps 1-3: load, tokenize; what every rank of every stage trains on."""
    pairs, source = load_pairs(dataset, seed, say=say)
    tokenizer = model_tokenizer(model, pairs)
    return PreparedData(
        encode(tokenizer, pairs["train"], max_seq_len),
        encode(tokenizer, pairs["validation"], max_seq_len),
        pad_token_id=int(tokenizer.pad_token_id),
        vocab_size=len(tokenizer),
        source=source,
    )


# -- sharding and batching ----------------------------------------------------------------------


class ShardSampler(torch.utils.data.Sampler):
    """This rank's indices of one epoch: ``DistributedSampler`` semantics with ``drop_last=True``.

    1. shuffle ``range(n)`` with a generator seeded by ``seed + epoch``
       (the same permutation on every rank);
    2. cut the tail so that whole global batches of ``batch_size * num_replicas``
       remain (every rank takes the same number of steps; nothing is padded);
    3. take every ``num_replicas``-th index from offset ``rank``.

    Consecutive ``batch_size`` indices of this rank and the same positions of
    the other ranks together make one global batch, disjoint across ranks.

    Example::

        >>> s = ShardSampler(10, batch_size=2, num_replicas=2, rank=1, seed=0)
        >>> s.set_epoch(1); list(s)          # 4 indices: 2 global batches of 4, 2 dropped
        [6, 2, 8, 3]
    """

    def __init__(
        self, n: int, batch_size: int, num_replicas: int = 1, rank: int = 0, seed: int = 0, shuffle: bool = True
    ):
        self.n, self.batch_size, self.num_replicas, self.rank = n, batch_size, num_replicas, rank
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        """Call at the start of every epoch, as with ``DistributedSampler``: reshuffles."""
        self.epoch = epoch

    def __len__(self) -> int:
        return (self.n // (self.batch_size * self.num_replicas)) * self.batch_size

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:  # step 1
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        keep = (self.n // (self.batch_size * self.num_replicas)) * self.batch_size * self.num_replicas
        return iter(order[:keep][self.rank :: self.num_replicas])  # steps 2-3


def collate(examples: list[tuple[list[int], int]], pad_token_id: int, multiple_of: int = 8) -> dict:
    """Right-pad to the batch's longest sequence, rounded up to ``multiple_of``; add the mask."""
    longest = max(len(ids) for ids, _ in examples)
    width = -(-longest // multiple_of) * multiple_of
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, _) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "labels": torch.tensor([y for _, y in examples], dtype=torch.long),
    }


def step_batches(
    data: Encoded,
    batch_size: int,
    grad_accum: int,
    num_replicas: int,
    rank: int,
    seed: int,
    pad_token_id: int = 0,
    start_step: int = 0,
) -> Iterator[list[dict]]:
    """Endless: this rank's ``grad_accum`` micro-batches for each optimizer step, epoch after epoch.

    ``start_step`` skips that many steps without building them: a run resumed
    from a checkpoint sees exactly the batches the uninterrupted run would.
    """
    sampler = ShardSampler(len(data), batch_size, num_replicas, rank, seed)
    if len(sampler) < batch_size:
        raise DataError(
            f"the training split has {len(data)} examples, fewer than one global batch of "
            f"{batch_size * num_replicas}; lower --batch-size or use more data"
        )
    epoch, pending, step = 0, [], 0
    while True:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for start in range(0, len(order), batch_size):
            pending.append(order[start : start + batch_size])
            if len(pending) == grad_accum:
                if step >= start_step:
                    yield [collate([(data.input_ids[i], data.labels[i]) for i in idx], pad_token_id) for idx in pending]
                step += 1
                pending = []
        epoch += 1


def eval_batches(data: Encoded, batch_size: int, num_replicas: int, rank: int, pad_token_id: int = 0) -> Iterator[dict]:
    """This rank's disjoint share of the held-out split, every example counted once, unshuffled."""
    idx = list(range(rank, len(data), num_replicas))
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        yield collate([(data.input_ids[i], data.labels[i]) for i in chunk], pad_token_id)


@torch.no_grad()
def held_out(
    model: nn.Module,
    data: Encoded,
    replicas: int,
    rank: int,
    device: torch.device,
    pad_token_id: int,
    batch_size: int = 64,
) -> dict:
    """Loss (mean cross-entropy) and accuracy on the held-out split, and how many examples they are over.

    Each rank scores a disjoint share with the weights it holds; the sums are added across ranks.
    """
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, cross-entropy, examples
    for batch in eval_batches(data, batch_size, replicas, rank, pad_token_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(logits.double(), batch["labels"], reduction="sum")
        correct = (logits.argmax(-1) == batch["labels"]).sum()
        sums += torch.stack([correct.double(), loss, torch.tensor(len(batch["labels"]), device=device).double()])
    if replicas > 1:
        dist.all_reduce(sums)
    model.train()
    return {"loss": float(sums[1] / sums[2]), "accuracy": float(sums[0] / sums[2]), "examples": int(sums[2])}
