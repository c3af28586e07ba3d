"""The record nodes from Python: parse_json, tokenize (checked against the sentencepiece module as the
reference), pack and padded_batch as dicts of numpy arrays, skip counts, exact resume of a packing
pipeline through state_dict, and the same elements as the tool."""
import json
import pickle
import subprocess

import numpy as np
import pytest
import sentencepiece

import dpipe
from conftest import tool_elements

WORDS = "the of data loader model token pack row shard rank worker epoch resume snapshot batch".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    text = d / "corpus.txt"
    text.write_text("".join(" ".join(WORDS[(i * k + k * k) % len(WORDS)] for k in range(3 + i % 17)) + "\n"
                            for i in range(1500)))
    subprocess.run(["spm_train", f"--input={text}", f"--model_prefix={d / 'm'}", "--vocab_size=40",
                    "--minloglevel=2"], check=True, capture_output=True, timeout=120)
    docs = d / "docs.jsonl"
    with open(docs, "w") as f:
        for i in range(300):
            if i % 50 == 7:
                f.write("{broken\n")
            else:
                f.write(json.dumps({"doc": i, "text": " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1 + i % 23))})
                        + "\n")
    return {"model": str(d / "m.model"), "docs": str(docs)}


def docs_pipeline(corpus):
    return (dpipe.lines([corpus["docs"]], shuffle_shards=False)
            | dpipe.parse_json({"doc": "int64", "text": "string"}, on_error="skip")
            | dpipe.tokenize(corpus["model"], bos=True, eos=True))


def test_tokenize_gives_the_reference_ids_with_bos_and_eos(corpus):
    ref = sentencepiece.SentencePieceProcessor(model_file=corpus["model"])
    got = list(dpipe.Loader(docs_pipeline(corpus)))
    assert len(got) == 300 - 6  # six broken lines skipped
    for row in got:
        assert isinstance(row["tokens"], np.ndarray) and row["tokens"].dtype == np.int64
        want = [ref.bos_id()] + ref.encode(row["text"]) + [ref.eos_id()]
        assert row["tokens"].tolist() == want, row["text"]


def test_skipped_lines_are_counted_per_node_and_kept_in_the_state(corpus):
    loader = dpipe.Loader(docs_pipeline(corpus))
    it = iter(loader)
    for _ in range(100):
        next(it)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest = dpipe.Loader(docs_pipeline(corpus))
    rest.load_state_dict(state)
    assert len(list(rest)) == 300 - 6 - 100
    [(key, count)] = rest.skipped().items()
    assert key.startswith("parse_json@") and count == 6, rest.skipped()


def test_pack_rows_hold_every_token_once_and_resume_exactly(corpus):
    p = docs_pipeline(corpus) | dpipe.pack(32) | dpipe.padded_batch(4)
    want = list(dpipe.Loader(p))
    batch = want[0]
    assert batch["tokens"].shape == (4, 32) and batch["segment_ids"].shape == (4, 32)
    assert batch["lengths"].tolist() == [32, 32, 32, 32]
    tokens = np.concatenate([b["tokens"][b["segment_ids"] > 0] for b in want])
    reference = np.concatenate([d["tokens"] for d in dpipe.Loader(docs_pipeline(corpus))])
    assert tokens.tolist() == reference.tolist()
    for at in (1, 5, len(want) // 2):
        loader = dpipe.Loader(p)
        it = iter(loader)
        head = [next(it) for _ in range(at)]
        state = loader.state_dict()
        resumed = dpipe.Loader(p)
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert all(np.array_equal(g[k], w[k]) for k in ("tokens", "segment_ids", "positions", "lengths"))
            assert g["doc"] == w["doc"]


def test_records_match_the_tool(corpus):
    p = docs_pipeline(corpus) | dpipe.pack(16, mode="first_fit", buffer=3)
    spec = {"seed": 0, "pipeline": [
        {"op": "lines", "files": [corpus["docs"]], "shuffle_shards": False},
        {"op": "parse_json", "fields": {"doc": "int64", "text": "string"}, "on_error": "skip"},
        {"op": "tokenize", "model": corpus["model"], "bos": True, "eos": True},
        {"op": "pack", "seq_len": 16, "mode": "first_fit", "buffer": 3}]}
    want = tool_elements(spec)
    got = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items()} for row in dpipe.Loader(p)]
    assert got == want


def test_bad_parameters_are_refused_naming_them(corpus, tmp_path):
    with pytest.raises(dpipe.ConfigError, match="known: int64"):
        dpipe.Loader(dpipe.lines([corpus["docs"]]) | dpipe.parse_json({"doc": "integer"}))
    with pytest.raises(dpipe.ConfigError, match="cannot open the model file"):
        dpipe.Loader(docs_pipeline(corpus) | dpipe.tokenize(str(tmp_path / "missing.model")))
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(dpipe.ConfigError, match="is not a SentencePiece model"):
        dpipe.Loader(docs_pipeline(corpus) | dpipe.tokenize(str(bad)))
    with pytest.raises(dpipe.ConfigError, match="seq_len must be positive"):
        dpipe.Loader(docs_pipeline(corpus) | dpipe.pack(0))


def test_callables_work_on_one_field_of_a_record(corpus):
    records = docs_pipeline(corpus)
    p = (records
         | dpipe.map(len, field="text", into="chars")
         | dpipe.filter(lambda t: len(t) > 10, field="tokens")
         | dpipe.flat_map(lambda text: text.split()[:2], field="text", into="word"))
    got = list(dpipe.Loader(p))
    want = []
    for r in dpipe.Loader(records):
        if len(r["tokens"]) > 10:
            for w in r["text"].split()[:2]:
                want.append((r["doc"], len(r["text"]), w))
    assert [(g["doc"], g["chars"], g["word"]) for g in got] == want
    assert all(isinstance(g["tokens"], np.ndarray) for g in got)  # the other fields pass through
    with pytest.raises(TypeError, match="unexpected keyword argument 'into'"):
        dpipe.filter(len, field="text", into="x")
    with pytest.raises(TypeError, match="into= needs field="):
        dpipe.map(len, into="x")


def test_builtin_functions_work_on_one_field_through_the_spec(corpus):
    records = docs_pipeline(corpus)
    p = (records | dpipe.map("affine", mul=2, add=1, field="doc", into="odd")
         | dpipe.filter("mod_eq", mod=3, eq=0, field="doc")
         | dpipe.flat_map("range", field="doc", into="k") | dpipe.filter("mod_eq", mod=50, eq=49, field="k"))
    assert next(n for n in p.spec()["pipeline"] if n["op"] == "map") == {"op": "map", "fn": "affine", "mul": 2, "add": 1, "field": "doc", "into": "odd"}
    got = [(r["doc"], r["odd"], r["k"]) for r in dpipe.Loader(p)]
    want = [(r["doc"], 2 * r["doc"] + 1, k) for r in dpipe.Loader(records) if r["doc"] % 3 == 0
            for k in range(r["doc"]) if k % 50 == 49]
    assert got == want and len(want) > 10
    with pytest.raises(dpipe.ConfigError, match="field= reads a field of records"):
        dpipe.Loader(dpipe.range(0, 3) | dpipe.map("affine", field="x"))
    with pytest.raises(dpipe.NodeError, match="field 'text' holds a string, the function takes an integer"):
        list(dpipe.Loader(records | dpipe.map("affine", field="text")))


def test_a_callable_on_another_field_is_another_pipeline(corpus):
    a = docs_pipeline(corpus) | dpipe.map(len, field="text", into="n")
    b = docs_pipeline(corpus) | dpipe.map(len, field="tokens", into="n")
    loader = dpipe.Loader(a)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = dpipe.Loader(b)
    with pytest.raises(dpipe.SnapshotError):
        other.load_state_dict(state)
