"""The shared data path: tokenization, loss masks, packing and batches, in numpy only.

Both frameworks consume the arrays built here, so they train on byte-identical batches. Everything
is deterministic given the files and the spec (seed included).

Batch contract (one micro-batch; every array is [B, T], B = micro-batch size, T = seq_length):

    input_ids    int32    token ids fed to the model (padding = the tokenizer's pad id)
    targets      int32    the id the model should predict at each position: input_ids[t+1] of the
                          same segment; 0 where nothing follows (last token of a segment, padding)
    loss_mask    float32  1 where the position carries loss: its target is a trained token
                          (completion mode: a token of an assistant turn, end-of-turn included;
                          full mode: any token); 0 on padding and on the last token of each segment
    positions    int32    position ids for the rotary embedding, restarting at 0 in each segment;
                          0 on padding
    segment_ids  int32    1, 2, ... for each packed example in the row; 0 = padding

Loss (the one formula, implemented identically by both frameworks):

    ce[b,t]   = logsumexp(logits[b,t,:]) - logits[b,t,targets[b,t]]     (in float32)
    step loss = sum over every micro-batch of the optimizer step, on every data-parallel rank, of
                ce·loss_mask, divided by the same sum of loss_mask (StepBatch.global_loss_tokens)

So a token weighs the same whichever micro-batch or rank it lands in; gradient accumulation and
data parallelism do not change the result. Each rank computes sum(ce·mask)/global_loss_tokens over its
micro-batches; summing that over ranks (an all-reduce SUM, or DDP's mean times the rank count) gives
the step loss. Trained tokens = sum(loss_mask). No logit soft-capping or label smoothing beyond what
the model's own forward does.

Attention rule (packed rows must not attend across examples): query i may attend key j iff

    j <= i  and  segment_ids[i] == segment_ids[j]      (and i - j < window on sliding-window layers)

Padding is always at the end of a row, so padding tokens attend only to padding and no real token
ever sees one. A row holding a single segment (plus trailing padding) therefore needs nothing beyond
plain causal attention; `attention_allowed` spells the rule out as a boolean [B, T, T] array.

Chat rendering: the chat template is `chat_template` from the model dir's tokenizer_config.json,
rendered with jinja2; without one, a built-in template for the family (Gemma turns or Llama 3
headers). The conversation is rendered prefix by prefix so each assistant turn is a separate piece of
text, and every piece is tokenized on its own (no special tokens added: the template writes them).
prompt/completion rows become one user turn and one assistant turn, through the same template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..api.payload import WorkerPlan
from . import InvalidConfigError

BATCH_KEYS = ("input_ids", "targets", "loss_mask", "positions", "segment_ids")
Batch = dict[str, np.ndarray]


class DataError(InvalidConfigError):
    """The dataset or tokenizer cannot be used; the message names the file and line."""


# --------------------------------------------------------------------------------------------------
# Chat templates and the tokenizer


GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

LLAMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def builtin_template(family: str) -> str:
    """The fallback chat template when the model dir has none: Gemma turns for gemma*, else Llama 3."""
    return GEMMA_TEMPLATE if family.startswith("gemma") else LLAMA_TEMPLATE


@dataclass
class ChatTokenizer:
    """A `tokenizers.Tokenizer` plus the chat template and special tokens of a model dir."""

    tokenizer: Any  # tokenizers.Tokenizer
    template: str
    bos_token: str
    eos_token: str
    pad_id: int
    template_source: str  # "tokenizer_config.json" or "builtin:<family>"
    _compiled: Any = field(default=None, repr=False)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, family: str = "llama") -> ChatTokenizer:
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise DataError(f"{path} is missing: the model dir needs a fast tokenizer (tokenizer.json)")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises its own exception type
            raise DataError(f"cannot load {path}: {exc}") from None
        config = _read_json(model_dir / "tokenizer_config.json") or {}
        template = config.get("chat_template")
        if isinstance(template, list):  # the list form: [{"name": "default", "template": ...}, ...]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        source = "tokenizer_config.json"
        if not template:
            template, source = builtin_template(family), f"builtin:{family}"
        bos = _token_text(config.get("bos_token")) or ""
        eos = _token_text(config.get("eos_token")) or ""
        pad = _token_text(config.get("pad_token"))
        pad_id = tokenizer.token_to_id(pad) if pad else None
        if pad_id is None:
            pad_id = tokenizer.token_to_id(eos) if eos else None
        return cls(tokenizer, template, bos, eos, int(pad_id or 0), source)

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
        if self._compiled is None:
            import jinja2

            env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False, undefined=jinja2.StrictUndefined)

            def raise_exception(message: str) -> None:  # HF templates call this on bad input
                raise DataError(message)

            env.globals["raise_exception"] = raise_exception
            self._compiled = env.from_string(self.template)
        return self._compiled.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else []

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, trained): trained[k] is True for tokens of assistant turns (their end-of-turn too)."""
        ids: list[int] = []
        trained: list[bool] = []
        done = ""
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                # The prompt for this turn (header included) is untrained; the turn itself is trained.
                prompt = self.render(messages[:i], add_generation_prompt=True)
                self._extend(ids, trained, _suffix(prompt, done, i), False)
                full = self.render(messages[: i + 1])
                self._extend(ids, trained, _suffix(full, prompt, i), True)
                done = full
        tail = self.render(messages)
        self._extend(ids, trained, _suffix(tail, done, len(messages)), False)
        return np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool)

    def _extend(self, ids: list[int], trained: list[bool], text: str, flag: bool) -> None:
        piece = self.encode_text(text)
        ids.extend(piece)
        trained.extend([flag] * len(piece))


def _suffix(text: str, prefix: str, index: int) -> str:
    if not text.startswith(prefix):
        raise DataError(
            f"the chat template is not prefix-stable at message {index}: rendering more messages changed "
            "the text before them, so assistant tokens cannot be located"
        )
    return text[len(prefix) :]


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialized form
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path} is not JSON: {exc}") from None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------------------------------
# JSONL rows -> conversations

ROLES = ("system", "user", "assistant")


def row_to_messages(row: Any, fmt: str, where: str) -> list[dict[str, str]]:
    """One JSONL row -> chat messages. `fmt`: auto | chat | promptCompletion."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = "chat" if "messages" in row else "promptCompletion" if "prompt" in row else ""
        if not fmt:
            raise DataError(f"{where}: row has neither `messages` nor `prompt`/`completion`")
    if fmt == "chat":
        messages = row.get("messages")
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: `messages` must be a non-empty list")
        out = []
        for k, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(
                    f"{where}: message {k} needs role in {'/'.join(ROLES)} and string content, got {m!r:.120}"
                )
            out.append({"role": m["role"], "content": m["content"]})
        if not any(m["role"] == "assistant" for m in out):
            raise DataError(f"{where}: the conversation has no assistant message to train on")
        return out
    prompt, completion = row.get("prompt"), row.get("completion")
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise DataError(f"{where}: `prompt` and `completion` must both be strings")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def jsonl_rows(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """(where, row) for each non-blank line of a JSONL file; `where` is "path:line" for errors."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {what} {path}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{where}: not JSON ({exc})") from None
        yield where, row


def read_jsonl(path: str | Path, fmt: str = "auto", max_samples: int | None = None) -> list[list[dict]]:
    """Conversations from a JSONL file; blank lines are skipped; errors name the line."""
    path = Path(path)
    conversations: list[list[dict]] = []
    for where, row in jsonl_rows(path, "dataset"):
        conversations.append(row_to_messages(row, fmt, where))
        if max_samples is not None and len(conversations) >= max_samples:
            break
    if not conversations:
        raise DataError(f"dataset {path} has no rows")
    return conversations


# --------------------------------------------------------------------------------------------------
# Examples -> fixed-length rows


@dataclass(frozen=True)
class Example:
    ids: np.ndarray  # int32 [L]
    trained: np.ndarray  # bool [L]: the token is a target that carries loss


def tokenize_examples(
    tokenizer: ChatTokenizer, conversations: Sequence[list[dict]], loss_on: str
) -> list[Example]:
    """loss_on: "completion" trains assistant tokens only, "full" every token."""
    examples = []
    for messages in conversations:
        ids, trained = tokenizer.encode_chat(messages)
        if loss_on == "full":
            trained = np.ones_like(trained)
        examples.append(Example(ids, trained))
    return examples


@dataclass(frozen=True)
class Rows:
    """N fixed-length rows, each array [N, T] as in the batch contract."""

    input_ids: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def take(self, index: np.ndarray | Sequence[int]) -> Batch:
        index = np.asarray(index, dtype=np.int64)
        return {k: getattr(self, k)[index] for k in BATCH_KEYS}

    @property
    def trained_tokens(self) -> int:
        return int(self.loss_mask.sum())


@dataclass(frozen=True)
class PackStats:
    examples: int
    truncated: int  # examples cut to seq_length
    dropped: int  # examples with nothing left to train on (after truncation)
    rows: int


def build_rows(
    examples: Sequence[Example], seq_length: int, packing: bool, pad_id: int
) -> tuple[Rows, PackStats]:
    """Truncate each example to `seq_length`, then pack greedily in order (an example never spans two
    rows: one that does not fit starts a new row) or put one example per row, right-padded."""
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    truncated = dropped = 0
    for ex in examples:
        ids, trained = ex.ids[:seq_length], ex.trained[:seq_length]
        truncated += int(len(ex.ids) > seq_length)
        # Position t predicts token t+1, so only tokens after the first can carry loss.
        if len(ids) < 2 or not trained[1:].any():
            dropped += 1
            continue
        kept.append((ids, trained))
    layout: list[list[int]] = []  # example indices per row
    fill = seq_length  # forces a new row for the first example
    for k, (ids, _) in enumerate(kept):
        if not packing or fill + len(ids) > seq_length:
            layout.append([])
            fill = 0
        layout[-1].append(k)
        fill += len(ids)
    n = len(layout)
    shape = (n, seq_length)
    rows = Rows(
        input_ids=np.full(shape, pad_id, dtype=np.int32),
        targets=np.zeros(shape, dtype=np.int32),
        loss_mask=np.zeros(shape, dtype=np.float32),
        positions=np.zeros(shape, dtype=np.int32),
        segment_ids=np.zeros(shape, dtype=np.int32),
    )
    for r, members in enumerate(layout):
        offset = 0
        for segment, k in enumerate(members, start=1):
            ids, trained = kept[k]
            end = offset + len(ids)
            rows.input_ids[r, offset:end] = ids
            rows.targets[r, offset : end - 1] = ids[1:]
            rows.loss_mask[r, offset : end - 1] = trained[1:]
            rows.positions[r, offset:end] = np.arange(len(ids), dtype=np.int32)
            rows.segment_ids[r, offset:end] = segment
            offset = end
    return rows, PackStats(len(examples), truncated, dropped, n)


def split_held_out(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held_out) example indices, each sorted. Deterministic in (n, fraction, seed); at least
    one held-out example whenever fraction > 0 and there are two or more examples."""
    count = min(max(round(n * fraction), 1), n - 1) if fraction > 0 and n >= 2 else 0
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[count:]), np.sort(order[:count])


def attention_allowed(segment_ids: np.ndarray, window: int | None = None) -> np.ndarray:
    """The attention rule as a boolean [B, T, T] array (query, key); see the module docstring."""
    t = segment_ids.shape[-1]
    q = np.arange(t)[:, None]
    k = np.arange(t)[None, :]
    allowed = (k <= q)[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])
    if window is not None:
        allowed &= (q - k < window)[None]
    return allowed


def reference_loss(logits: np.ndarray, batches: Sequence[Batch]) -> float:
    """The step loss in numpy, for tests: logits [n_micro, B, T, V] matching `batches`."""
    total = tokens = 0.0
    for lg, b in zip(logits, batches, strict=True):
        lg = lg.astype(np.float64)
        peak = lg.max(-1, keepdims=True)
        lse = np.log(np.exp(lg - peak).sum(-1)) + peak[..., 0]
        picked = np.take_along_axis(lg, b["targets"][..., None].astype(np.int64), -1)[..., 0]
        total += float(((lse - picked) * b["loss_mask"]).sum())
        tokens += float(b["loss_mask"].sum())
    return total / max(tokens, 1.0)


# --------------------------------------------------------------------------------------------------
# Steps and batches


@dataclass(frozen=True)
class DataConfig:
    """The spec's data knobs, framework-free (tests build it directly)."""

    seq_length: int
    global_batch_size: int
    micro_batch_size: int | None = None  # per rank per forward; None = the whole per-rank batch
    loss_on: str = "completion"
    packing: bool = True
    seed: int = 0
    held_out_fraction: float = 0.05
    max_samples: int | None = None
    epochs: float | None = None  # neither epochs nor max_steps: one epoch
    max_steps: int | None = None
    format: str = "auto"
    # A micro batch that came from the planner's memory estimate is a hint: when it does not divide
    # the per-rank batch the largest divisor below it is used. One the user set must divide.
    micro_batch_is_hint: bool = False


@dataclass(frozen=True)
class StepBatch:
    """One optimizer step as one data-parallel rank sees it."""

    step: int  # 1-based
    micro_batches: list[Batch]  # this rank's share, each [micro_batch_size, T]
    global_loss_tokens: float  # sum(loss_mask) over the whole global batch (all ranks)
    global_sequences: int


@dataclass
class PreparedData:
    """Tokenized, masked and packed train/held-out rows plus the step plan."""

    config: DataConfig
    train: Rows
    held_out: Rows
    total_steps: int
    train_stats: PackStats
    held_out_stats: PackStats
    tokenizer_source: str = ""
    vocab_size: int = 0

    @property
    def one_sequence_per_row(self) -> bool:
        """True when no row (train or held-out) packs two examples: plain causal attention suffices."""
        return all(int(r.segment_ids.max(initial=0)) <= 1 for r in (self.train, self.held_out))

    def micro_batch_size(self, dp_size: int) -> int:
        per_rank = self.per_rank_batch(dp_size)
        micro = min(self.config.micro_batch_size or per_rank, per_rank)
        if self.config.micro_batch_is_hint:
            micro = max(d for d in range(1, micro + 1) if per_rank % d == 0)
        if per_rank % micro:
            raise InvalidConfigError(
                f"per-rank batch {per_rank} (global {self.config.global_batch_size} / {dp_size} ranks) is "
                f"not a multiple of micro batch {micro}"
            )
        return micro

    def per_rank_batch(self, dp_size: int) -> int:
        g = self.config.global_batch_size
        if g % dp_size:
            raise InvalidConfigError(f"globalBatchSize {g} does not split over {dp_size} data-parallel ranks")
        return g // dp_size

    def grad_accumulation(self, dp_size: int) -> int:
        return self.per_rank_batch(dp_size) // self.micro_batch_size(dp_size)

    def step_rows(self, step: int) -> np.ndarray:
        """Row indices of the global batch of `step` (1-based): the rows in a per-epoch shuffled
        order, epochs laid end to end, so a dataset smaller than a batch simply wraps around."""
        g, n = self.config.global_batch_size, len(self.train)
        start = (step - 1) * g
        out = np.empty(g, dtype=np.int64)
        for k in range(g):
            epoch, within = divmod(start + k, n)
            out[k] = self._epoch_order(epoch)[within]
        return out

    def _epoch_order(self, epoch: int) -> np.ndarray:
        cache = self.__dict__.setdefault("_orders", {})
        if epoch not in cache:
            cache.clear()  # only ever need the one or two epochs a step straddles
            cache[epoch] = np.random.default_rng([self.config.seed, epoch]).permutation(len(self.train))
        return cache[epoch]

    def global_step_batch(self, step: int) -> Batch:
        return self.train.take(self.step_rows(step))

    def train_steps(self, dp_rank: int = 0, dp_size: int = 1, start_step: int = 1) -> Iterator[StepBatch]:
        """This rank's StepBatch for every step: rank r takes the r-th contiguous slice of the
        global batch, cut into micro-batches in order."""
        micro = self.micro_batch_size(dp_size)
        per_rank = self.per_rank_batch(dp_size)
        for step in range(start_step, self.total_steps + 1):
            index = self.step_rows(step)
            mine = index[dp_rank * per_rank : (dp_rank + 1) * per_rank]
            yield StepBatch(
                step=step,
                micro_batches=[self.train.take(mine[i : i + micro]) for i in range(0, per_rank, micro)],
                global_loss_tokens=float(self.train.loss_mask[index].sum()),
                global_sequences=len(index),
            )

    def eval_batches(self, dp_rank: int = 0, dp_size: int = 1, batch_size: int = 1) -> Iterator[Batch]:
        """Held-out rows for this rank (rows r, r+dp, ...), in fixed-size batches; the last batch is
        filled with all-padding rows (loss_mask 0) so shapes never change (no JAX recompiles).
        Every rank gets the same number of batches (a rank with fewer rows gets an all-padding one):
        a sharded model (FSDP, ZeRO-3) gathers its weights in every forward pass, so a rank that
        stopped early would leave the others waiting forever.
        Eval loss = sum of sum(ce·mask) over all ranks / sum of sum(mask)."""
        mine = np.arange(dp_rank, len(self.held_out), dp_size)
        per_rank = -(-len(self.held_out) // dp_size)
        for i in range(0, per_rank, batch_size):
            rows = mine[i : i + batch_size]
            # A rank out of rows pads from row 0: its shapes and an in-vocabulary id, never its loss.
            like = self.held_out.take(rows if len(rows) else np.arange(1))
            batch = {k: v[: len(rows)] for k, v in like.items()}
            short = batch_size - len(rows)
            if short:
                batch = {k: np.concatenate([v, _padding_rows(like[k], short, k)]) for k, v in batch.items()}
            yield batch


def _padding_rows(like: np.ndarray, count: int, key: str) -> np.ndarray:
    # input_ids of filler rows repeat the first id of the batch (a real, in-vocabulary id); they
    # carry no loss and form their own segment 0, so their content cannot matter.
    fill = like[0, 0] if key == "input_ids" else 0
    return np.full((count, like.shape[1]), fill, dtype=like.dtype)


def count_steps(rows: int, global_batch: int, epochs: float | None, max_steps: int | None) -> int:
    if max_steps is not None:
        return max_steps
    return max(1, int(rows * (epochs if epochs is not None else 1.0)) // global_batch)


def prepare_data(
    model_dir: str | Path,
    dataset: str | Path,
    config: DataConfig,
    family: str = "llama",
) -> PreparedData:
    """Read, tokenize, split, mask and pack once; the result drives both frameworks."""
    tokenizer = ChatTokenizer.from_model_dir(model_dir, family)
    conversations = read_jsonl(dataset, config.format, config.max_samples)
    train_idx, held_idx = split_held_out(len(conversations), config.held_out_fraction, config.seed)
    examples = tokenize_examples(tokenizer, conversations, config.loss_on)
    # Shuffle before packing so rows mix examples; the held-out order does not matter.
    order = train_idx[np.random.default_rng(config.seed + 1).permutation(len(train_idx))]
    train, train_stats = build_rows(
        [examples[i] for i in order], config.seq_length, config.packing, tokenizer.pad_id
    )
    held, held_stats = build_rows(
        [examples[i] for i in held_idx], config.seq_length, config.packing, tokenizer.pad_id
    )
    if len(train) == 0:
        raise DataError(
            f"dataset {dataset}: no training example has a token to train on after masking "
            f"(loss on {config.loss_on}, seq {config.seq_length})"
        )
    return PreparedData(
        config=config,
        train=train,
        held_out=held,
        total_steps=count_steps(len(train), config.global_batch_size, config.epochs, config.max_steps),
        train_stats=train_stats,
        held_out_stats=held_stats,
        tokenizer_source=tokenizer.template_source,
        vocab_size=int(tokenizer.tokenizer.get_vocab_size()),
    )


def data_config_from_spec(
    spec: Any, plan: WorkerPlan | None = None, max_steps: int | None = None
) -> DataConfig:
    """FinetuneJobSpec (+ the plan's micro batch, + a CLI step override) -> DataConfig."""
    t, d = spec.training, spec.dataset
    micro = t.micro_batch_size or (plan.micro_batch_size if plan is not None else None)
    steps = max_steps if max_steps is not None else t.max_steps
    return DataConfig(
        seq_length=t.seq_length,
        global_batch_size=t.global_batch_size,
        micro_batch_size=micro,
        loss_on=str(t.loss_on),
        packing=t.packing,
        seed=t.seed,
        held_out_fraction=d.held_out_fraction,
        max_samples=d.max_samples,
        epochs=None if steps is not None else t.epochs,
        max_steps=steps,
        format=str(d.format),
        micro_batch_is_hint=t.micro_batch_size is None and micro is not None,
    )
