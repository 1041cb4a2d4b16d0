"""The shared data path: masks, packing, split, batches, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from accelbench.workers.data import (
    BATCH_KEYS,
    ChatTokenizer,
    DataConfig,
    DataError,
    Example,
    attention_allowed,
    build_rows,
    prepare_data,
    read_jsonl,
    reference_loss,
    split_held_out,
    tokenize_examples,
)
from accelbench.workers.testing import make_chat_dataset

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_completion_mode_trains_only_assistant_tokens(tiny_models: dict[str, Path], family: str) -> None:
    tok = ChatTokenizer.from_model_dir(tiny_models[family], family)
    ids, trained = tok.encode_chat(CONVERSATION)
    text = tok.tokenizer.decode(ids[trained].tolist(), skip_special_tokens=False)
    end_of_turn = "<|eot_id|>" if family == "llama" else "<end_of_turn>"
    assert text.startswith("2 plus 3 is 5.") and end_of_turn in text
    prompt = tok.tokenizer.decode(ids[~trained].tolist(), skip_special_tokens=False)
    assert "What is 2 plus 3?" in prompt and "Be brief." in prompt
    # The pieces together are the whole rendered conversation.
    assert tok.tokenizer.decode(ids.tolist(), skip_special_tokens=False) == tok.render(CONVERSATION)


def test_full_mode_trains_every_token(tiny_llama: Path) -> None:
    tok = ChatTokenizer.from_model_dir(tiny_llama)
    [ex] = tokenize_examples(tok, [CONVERSATION], "full")
    assert ex.trained.all()


def _example(n: int, first_trained: int = 0) -> Example:
    trained = np.arange(n) >= first_trained
    return Example(np.arange(10, 10 + n, dtype=np.int32), trained)


def test_packing_restarts_positions_and_masks_segment_ends() -> None:
    rows, stats = build_rows(
        [_example(5, 2), _example(4), _example(6)], seq_length=10, packing=True, pad_id=0
    )
    assert stats.rows == 2 and len(rows) == 2
    assert rows.segment_ids[0].tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 2, 0]
    assert rows.positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]
    # targets are the next token of the same segment; the last token of a segment predicts nothing
    assert rows.targets[0, :4].tolist() == [11, 12, 13, 14] and rows.targets[0, 4] == 0
    # example 1 trains tokens 2.. -> positions 1.. carry loss; segment ends and padding carry none
    assert rows.loss_mask[0].tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 0, 0]
    assert rows.segment_ids[1].tolist() == [1] * 6 + [0] * 4
    assert rows.input_ids.dtype == np.int32 and rows.loss_mask.dtype == np.float32


def test_padding_mode_one_example_per_row_and_truncation() -> None:
    rows, stats = build_rows([_example(3), _example(12)], seq_length=8, packing=False, pad_id=7)
    assert stats.rows == 2 and stats.truncated == 1
    assert rows.input_ids[0].tolist() == [10, 11, 12, 7, 7, 7, 7, 7]
    assert rows.loss_mask[1].sum() == 7  # 8 kept tokens, the last predicts nothing


def test_examples_without_trained_tokens_are_dropped() -> None:
    rows, stats = build_rows(
        [_example(4, first_trained=9), _example(4)], seq_length=8, packing=True, pad_id=0
    )
    assert stats.dropped == 1 and len(rows) == 1


def test_held_out_split_is_deterministic_and_disjoint() -> None:
    train, held = split_held_out(100, 0.1, seed=3)
    train2, held2 = split_held_out(100, 0.1, seed=3)
    assert np.array_equal(held, held2) and np.array_equal(train, train2)
    assert len(held) == 10 and not set(train) & set(held) and len(train) + len(held) == 100
    assert not np.array_equal(split_held_out(100, 0.1, seed=4)[1], held)
    assert len(split_held_out(3, 0.01, 0)[1]) == 1  # never empty when asked for
    assert len(split_held_out(5, 0.0, 0)[1]) == 0


def test_bad_jsonl_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt": "a", "completion": "b"})
    path.write_text(f"{good}\n\n{good}\n{{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:4: not JSON"):
        read_jsonl(path)
    path.write_text(f"{good}\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*no assistant"):
        read_jsonl(path)
    path.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: .*neither"):
        read_jsonl(path)


def test_prompt_completion_rows_are_detected(tmp_path: Path) -> None:
    path = make_chat_dataset(tmp_path / "pc.jsonl", n=3, format="promptCompletion")
    conversations = read_jsonl(path)
    assert [m["role"] for m in conversations[0]] == ["user", "assistant"]


def test_attention_rule() -> None:
    seg = np.array([[1, 1, 2, 2, 2, 0]])
    allowed = attention_allowed(seg)[0]
    assert allowed[1, 0] and not allowed[0, 1]  # causal
    assert not allowed[2, 1] and allowed[4, 2]  # no attention across segments
    assert not allowed[5, 4] and allowed[5, 5]  # padding sees only padding
    local = attention_allowed(seg, window=2)[0]
    assert local[4, 3] and not local[4, 2]


def _prepared(model_dir: Path, dataset: Path, **kwargs) -> object:
    config = DataConfig(seq_length=128, global_batch_size=4, seed=0, **kwargs)
    return prepare_data(model_dir, dataset, config, "llama")


def test_batches_are_deterministic_and_shard_by_rank(tiny_llama: Path, chat_dataset: Path) -> None:
    a = _prepared(tiny_llama, chat_dataset, micro_batch_size=1, max_steps=20)
    b = _prepared(tiny_llama, chat_dataset, micro_batch_size=1, max_steps=20)
    assert a.total_steps == 20
    whole = list(a.train_steps(0, 1))
    again = list(b.train_steps(0, 1))
    for x, y in zip(whole, again, strict=True):
        for k in BATCH_KEYS:
            assert np.array_equal(x.micro_batches[0][k], y.micro_batches[0][k])
    # two ranks: 2 rows each per step, micro-batch 1 -> 2 micro-batches per rank
    r0, r1 = list(a.train_steps(0, 2)), list(a.train_steps(1, 2))
    step = 17  # wraps past the end of the first epoch
    glued = np.concatenate([m["input_ids"] for m in r0[step].micro_batches + r1[step].micro_batches])
    assert np.array_equal(glued, np.concatenate([m["input_ids"] for m in whole[step].micro_batches]))
    assert r0[step].global_loss_tokens == whole[step].global_loss_tokens
    assert a.grad_accumulation(2) == 2 and a.grad_accumulation(1) == 4
    batch = whole[0].micro_batches[0]
    assert {k: v.dtype.name for k, v in batch.items()} == {
        "input_ids": "int32",
        "targets": "int32",
        "loss_mask": "float32",
        "positions": "int32",
        "segment_ids": "int32",
    }


def test_epochs_set_the_step_count_and_eval_batches_keep_their_shape(
    tiny_llama: Path, chat_dataset: Path
) -> None:
    data = _prepared(tiny_llama, chat_dataset, epochs=2.0, held_out_fraction=0.2)
    assert data.total_steps == len(data.train) * 2 // 4
    batches = list(data.eval_batches(0, 1, batch_size=3))
    assert all(b["input_ids"].shape == (3, 128) for b in batches)
    assert sum(b["loss_mask"].sum() for b in batches) == data.held_out.trained_tokens


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_gets_as_many_eval_batches_and_all_held_out_tokens_count_once(
    tiny_llama: Path, chat_dataset: Path, ranks: int
) -> None:
    """A sharded model (FSDP, ZeRO-3) gathers weights in every forward pass: a rank with fewer eval
    batches than the others would leave them waiting forever (found running fsdp on two chips)."""
    data = _prepared(tiny_llama, chat_dataset, held_out_fraction=0.2)
    assert len(data.held_out) % ranks  # uneven: some rank has a row fewer
    per_rank = [list(data.eval_batches(rank, ranks, batch_size=1)) for rank in range(ranks)]
    assert len({len(batches) for batches in per_rank}) == 1
    counted = sum(b["loss_mask"].sum() for batches in per_rank for b in batches)
    assert counted == data.held_out.trained_tokens
    assert all(b["input_ids"].shape == (1, 128) for batches in per_rank for b in batches)


def test_micro_batch_must_divide(tiny_llama: Path, chat_dataset: Path) -> None:
    data = _prepared(tiny_llama, chat_dataset, micro_batch_size=3)
    with pytest.raises(ValueError, match="not a multiple"):
        data.micro_batch_size(1)


def test_reference_loss_is_token_weighted() -> None:
    logits = np.zeros((2, 1, 2, 4), dtype=np.float32)
    logits[0, 0, 0, 1] = 10.0  # a near-certain correct prediction
    targets = np.array([[1, 0]], dtype=np.int32)
    first = {"targets": targets, "loss_mask": np.array([[1.0, 0.0]], dtype=np.float32)}
    second = {"targets": targets, "loss_mask": np.array([[1.0, 1.0]], dtype=np.float32)}
    # three tokens: one almost free, two at log(4); per-token mean, not mean of micro-batch means
    assert reference_loss(logits, [first, second]) == pytest.approx((0.0 + 2 * np.log(4)) / 3, abs=1e-3)


def test_one_sequence_per_row_tells_packed_data_apart(tiny_llama: Path, chat_dataset: Path) -> None:
    packed = _prepared(tiny_llama, chat_dataset, packing=True)
    assert int(packed.train.segment_ids.max()) > 1 and not packed.one_sequence_per_row
    padded = _prepared(tiny_llama, chat_dataset, packing=False)
    assert int(padded.train.segment_ids.max()) == 1 and padded.one_sequence_per_row
