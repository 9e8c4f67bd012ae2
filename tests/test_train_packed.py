"""Packed training (data.pack): chapters as documents, pieces packed into each step, no attention across a boundary.

- the chapter splitter on a small text with the headings of data/austen.txt and lines that look alike;
- every packed step: T = batch_size * seq_len tokens, each segment one contiguous run of one document,
  targets the next byte except IGNORE at a document's end; the sampler resumes exactly;
- the model on a packed step equals the model on each segment alone;
- a few packed training steps lower the loss; configs and the combinations that are errors.
"""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training import loop
from kernel_dispatch.training.data import (IGNORE, ByteCorpus, PackedSampler, PackedTokens, chapter_starts,
                                           cut_documents, pack_pieces, packed_eval_batches)
from kernel_dispatch.training.model import LazyLM

SMALL = {
    "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "n_streams": 4, "max_bias_length": 32},
    "data": {"seq_len": 32, "pack": True},
    "train": {"batch_size": 2, "max_steps": 8, "eval_interval": 100, "eval_batches": 1, "warmup_steps": 2,
              "lr": 1e-2, "device": "cpu", "progress": False, "plot": False},
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def packed_config(tmp_path, **train):
    overrides = [("train.out_dir", str(tmp_path))] + [(f"train.{k}", v) for k, v in train.items()]
    return tcfg.from_mapping(tcfg.apply_overrides(SMALL, overrides), "test config")


TEXT = (b"PRIDE AND PREJUDICE\n\nBy Jane Austen\n\n\n\nChapter 1\n\nIt is a truth universally acknowledged.\n"
        b"Chapter and verse were quoted.\nchapters 3 follow\n\n\nChapter 2\n\nMr. Bennet was among the earliest.\n"
        b"SENSE AND SENSIBILITY\n\nCHAPTER XII\n\nThe family of Dashwood.\nCHAPTER 13.\nEnd.\n")


def test_chapter_headings_start_documents():
    starts = chapter_starts(TEXT).tolist()
    assert starts[0] == 0
    assert [TEXT[s:].split(b"\n", 1)[0] for s in starts[1:]] == [b"Chapter 1", b"Chapter 2", b"CHAPTER XII",
                                                                 b"CHAPTER 13."]


def test_the_bundled_novels_have_166_chapters():
    corpus = ByteCorpus("data/austen.txt", 0.05, 64)
    # 61 + 50 + 24 + 31 chapter headings and the title page before the first: 167 documents in all
    assert len(corpus.train_docs) + len(corpus.val_docs) - 1 == 167
    assert corpus.val_docs[0] == 0 and (corpus.train_docs.diff() > 0).all() and (corpus.val_docs.diff() > 0).all()


def _segments(inputs: PackedTokens):
    cu = inputs.cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:]))


def _is_run_of_one_document(data, doc_starts, tokens, targets) -> bool:
    """Some run data[p:p+n] inside one document gives these tokens, and these targets: the next bytes,
    but IGNORE for the last one if the run ends its document."""
    n = len(tokens)
    ends = torch.cat([doc_starts[1:], torch.tensor([len(data)])])
    for p in range(len(data) - n + 1):
        if not torch.equal(data[p:p + n].long(), tokens):
            continue
        doc = int((doc_starts <= p).sum()) - 1
        end = int(ends[doc])
        if p + n > end:
            continue
        expected = data[p + 1:p + n + 1].long().clone()
        if p + n == end:
            expected = torch.cat([expected[:n - 1], torch.tensor([IGNORE])])
        if torch.equal(targets, expected):
            return True
    return False


def test_packed_steps_hold_whole_runs_of_one_document_each():
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    docs = chapter_starts(TEXT)
    sampler = PackedSampler(data, docs, seq_len=16, batch_size=2, seed=3)
    ignored = 0
    for _ in range(12):  # past an epoch: the text holds ~12 steps of 32 tokens
        inputs, targets = sampler.next_batch()
        ignored += int((targets == IGNORE).sum())
        assert inputs.tokens.shape == targets.shape == (32,) and inputs.cu_seqlens.dtype == torch.int32
        lengths = inputs.cu_seqlens.diff()
        assert inputs.max_seqlen == int(lengths.max()) <= 16 and int(lengths.min()) >= 1
        for s, e in _segments(inputs):
            assert _is_run_of_one_document(data, docs, inputs.tokens[s:e], targets[s:e]), (s, e)
    assert sampler.epoch >= 1 and ignored >= 5


def test_cut_documents_respects_the_documents_and_the_limit():
    docs = torch.tensor([0, 10, 11, 40])
    pieces = cut_documents(docs, 45, seq_len=8, offset=3)
    assert list(zip(pieces.start.tolist(), pieces.end.tolist())) == [
        (0, 3), (3, 10), (10, 11), (11, 14), (14, 22), (22, 30), (30, 38), (38, 40), (40, 43), (43, 45)]
    assert pieces.last.tolist() == [False, True, True, False, False, False, False, True, False, True]
    inputs, targets, nxt = pack_pieces(torch.arange(45, dtype=torch.uint8), pieces, 1, 12)
    assert inputs.cu_seqlens.tolist() == [0, 7, 8, 11, 12] and nxt == 5  # the fourth piece cut to 1 token
    assert targets.tolist() == [4, 5, 6, 7, 8, 9, IGNORE, IGNORE, 12, 13, 14, 15]


def test_sampler_resumes_exactly():
    corpus = ByteCorpus("data/austen.txt", 0.05, 32)
    a = PackedSampler(corpus.train, corpus.train_docs, 32, 4, seed=5)
    for _ in range(3):
        a.next_batch()
    b = PackedSampler(corpus.train, corpus.train_docs, 32, 4, seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(2):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa.tokens, xb.tokens) and torch.equal(xa.cu_seqlens, xb.cu_seqlens)
        assert torch.equal(ya, yb)


def test_model_on_a_packed_step_equals_each_segment_alone():
    registry.set_yaml_backend("golden", "test")
    torch.manual_seed(0)
    cfg = packed_config("unused")
    model = LazyLM(cfg.model)
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    inputs, _ = PackedSampler(data, chapter_starts(TEXT), 16, 3, seed=1).next_batch()
    with torch.no_grad():
        packed = model(inputs)
        alone = torch.cat([model(inputs.tokens[None, s:e])[0] for s, e in _segments(inputs)])
    assert packed.shape == (48, 256)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)  # fp32: GEMMs of other shapes round apart


def test_a_few_packed_steps_lower_the_loss(tmp_path):
    registry.set_yaml_backend("golden", "test")
    result = loop.train(packed_config(tmp_path))
    s = result.summary
    assert s["pack"] is True and s["steps"] == 8
    assert s["backends"][0].startswith("lazy_attention_varlen -> golden"), s["backends"]
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.3, s
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in result.history["train"])


def test_packed_eval_batches_are_full_steps():
    corpus = ByteCorpus("data/austen.txt", 0.05, 64)
    batches = packed_eval_batches(corpus.val, corpus.val_docs, 64, 4, 5, rank=1, world=2)
    assert len(batches) == 2  # batches 1 and 3 of 5
    for inputs, targets in batches:
        assert inputs.tokens.shape == targets.shape == (256,) and int(inputs.cu_seqlens[-1]) == 256


def test_configs():
    packed = tcfg.load_run_config("configs/tiny-packed.yaml")
    tiny = tcfg.load_run_config("configs/tiny.yaml")
    assert packed.data.pack and not tiny.data.pack
    assert packed.model == tiny.model and packed.data.seq_len == tiny.data.seq_len


@pytest.mark.parametrize("section,values,message", [
    ("train", {"cuda_graph": True, "device": "cuda"}, "data.pack: cannot be combined with train.cuda_graph"),
    ("train", {"mhc_recompute": True, "compile": True}, "train.mhc_recompute: cannot be combined with train.compile"),
    ("train", {"mhc_recompute_block": -1}, "train.mhc_recompute_block: expected >= 0"),
])
def test_config_errors(section, values, message, tmp_path):
    with pytest.raises(kd.ConfigError, match=message.replace(".", r"\.")):
        packed_config(tmp_path, **values)
