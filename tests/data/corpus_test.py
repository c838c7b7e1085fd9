# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The stdlib corpus: selection and split rules, byte-identical rebuilds, and maxtext's grain pipeline training on it."""

import hashlib
import json

import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from MaxText.compare.metrics import read_jsonl
from MaxText.data import corpus


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """The real corpus from this interpreter's stdlib, built once for the module."""
  out = tmp_path_factory.mktemp("corpus")
  return out, corpus.build_corpus(out)


def _fake_stdlib(root):
  files = {
      "a.py": "print('a')\n",
      "pkg/__init__.py": "",  # empty: skipped
      "pkg/mod.py": "x = 1\r\ny = 2\r\n",  # CRLF: normalized
      "pkg/long.py": "".join(f"line_{i} = {i}\n" for i in range(400)),
      "test/test_a.py": "assert False\n",  # excluded dirs
      "pkg/tests/t.py": "assert False\n",
      "site-packages/third.py": "import x\n",
      "__pycache__/a.cpython-313.py": "junk\n",
      "notes.txt": "not python\n",
      "bad_bytes.py": None,
  }
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
      path.write_bytes(b"s = '\xff\xfe'\n")
    else:
      path.write_bytes(text.encode())
  return root


def test_selection_excludes_tests_and_site_packages(tmp_path):
  root = _fake_stdlib(tmp_path / "lib")
  assert corpus.list_source_files(root) == ["a.py", "bad_bytes.py", "pkg/__init__.py", "pkg/long.py", "pkg/mod.py"]


def test_rows_text_normalization_and_long_file_pieces(tmp_path):
  root = _fake_stdlib(tmp_path / "lib")
  docs = corpus.collect_documents(root, eval_fraction=0.5, max_doc_chars=1000)
  rows = {d.path: d.text for split in docs.values() for d in split}
  assert "pkg/__init__.py" not in rows
  assert rows["pkg/mod.py"] == "x = 1\ny = 2\n"
  assert rows["bad_bytes.py"] == "s = '\ufffd\ufffd'\n"
  pieces = sorted((p for p in rows if p.startswith("pkg/long.py")), key=lambda p: int(p.partition("#")[2] or 0))
  assert len(pieces) > 1 and all(len(rows[p]) <= 1000 for p in pieces)
  assert "".join(rows[p] for p in pieces) == (root / "pkg/long.py").read_text()
  assert all(rows[p].endswith("\n") for p in pieces)  # cut at line ends


def test_split_is_a_pure_function_of_the_path():
  assert corpus.assign_split("json/decoder.py", 0.05) is corpus.assign_split("json/decoder.py", 0.05)
  paths = [f"pkg{i}/m.py" for i in range(2000)]
  share = sum(corpus.assign_split(p, 0.05) is corpus.Split.EVAL for p in paths) / len(paths)
  assert 0.03 < share < 0.07
  # Raising the fraction only moves files into eval, never out of it.
  small = [p for p in paths if corpus.assign_split(p, 0.05) is corpus.Split.EVAL]
  assert all(corpus.assign_split(p, 0.2) is corpus.Split.EVAL for p in small)


def test_split_long_text_cuts_a_giant_line():
  assert corpus.split_long_text("a" * 25 + "\nb\n", 10) == ["a" * 10, "a" * 10, "a" * 5 + "\nb\n"]
  assert corpus.split_long_text("a" * 25 + "\nbbbbb\n", 10) == ["a" * 10, "a" * 10, "a" * 5 + "\n", "bbbbb\n"]
  with pytest.raises(ValueError, match="max_doc_chars"):
    corpus.split_long_text("x", 0)


def test_bad_arguments_raise_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="not a directory"):
    corpus.list_source_files(tmp_path / "nope")
  with pytest.raises(ValueError, match="no \\*.py files"):
    corpus.list_source_files(tmp_path)
  with pytest.raises(ValueError, match="eval_fraction"):
    corpus.collect_documents(_fake_stdlib(tmp_path / "lib"), eval_fraction=1.5, max_doc_chars=100)


def test_rebuild_is_byte_identical(built, tmp_path):
  first, manifest = built
  corpus.main([str(tmp_path)])
  for name in ("train.parquet", "eval.parquet", corpus.TOKENIZER_NAME, corpus.MANIFEST_NAME):
    assert (first / name).read_bytes() == (tmp_path / name).read_bytes(), name
  for split in ("train", "eval"):
    assert hashlib.sha256((first / f"{split}.parquet").read_bytes()).hexdigest() == manifest["splits"][split]["sha256"]
  assert hashlib.sha256((first / corpus.TOKENIZER_NAME).read_bytes()).hexdigest() == manifest["tokenizer"]["sha256"]


def test_manifest_and_contents(built):
  out, manifest = built
  assert json.loads((out / corpus.MANIFEST_NAME).read_text()) == manifest
  train = pq.read_table(out / "train.parquet")
  evals = pq.read_table(out / "eval.parquet")
  assert train.column_names == [corpus.TEXT_COLUMN, corpus.PATH_COLUMN]
  assert train.num_rows == manifest["splits"]["train"]["rows"] and evals.num_rows == manifest["splits"]["eval"]["rows"]
  assert manifest["splits"]["train"]["characters"] > 5_000_000  # ~11 MB of stdlib source
  train_files = {p.split("#")[0] for p in train.column("path").to_pylist()}
  eval_files = {p.split("#")[0] for p in evals.column("path").to_pylist()}
  assert not train_files & eval_files
  assert not any("/test/" in f"/{p}" or p.startswith("test/") for p in train_files | eval_files)
  assert "json/decoder.py" in train_files | eval_files


def test_tokenizer_is_the_corpus_own_and_round_trips_every_eval_row(built):
  """The 1024-piece tokenizer fills its vocabulary, never needs an unknown piece (byte fallback) and gives back
  every eval row exactly (no normalization, whitespace kept: indentation is Python's syntax)."""
  out, manifest = built
  sp = spm.SentencePieceProcessor(model_file=str(out / corpus.TOKENIZER_NAME))
  assert sp.get_piece_size() == corpus.TOKENIZER_VOCAB_SIZE == manifest["tokenizer"]["pieces"] == 1024
  assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)  # llama2's layout
  rows = pq.read_table(out / "eval.parquet").column("text").to_pylist()
  encoded = [sp.encode(text) for text in rows]
  assert all(ids and sp.unk_id() not in ids for ids in encoded)
  assert [sp.decode(ids) for ids in encoded] == rows
  chars_per_token = sum(map(len, rows)) / sum(map(len, encoded))
  assert 2.0 < chars_per_token < 3.0  # 2.47 measured: a 2048-character row is ~6 sequences of 128 tokens


def test_rows_are_short_enough_to_shuffle(built):
  """maxtext chunks a row into consecutive training sequences after its row shuffle: long rows fed one file to many
  steps in a row (the quickstart's training loss swung with a period of ~50 steps at 32768 characters)."""
  out, manifest = built
  assert manifest["max_doc_chars"] == corpus.DEFAULT_MAX_DOC_CHARS == 2048
  lengths = [len(t) for t in pq.read_table(out / "train.parquet").column("text").to_pylist()]
  assert max(lengths) <= 2048 and len(lengths) > 5000


@pytest.mark.slow
def test_maxtext_grain_pipeline_trains_on_it(built, run_train, tmp_path):
  """A 3-step run of the tiny model through maxtext's grain parquet pipeline with the shipped tokenizer."""
  out, _ = built
  metrics = tmp_path / "corpus" / "metrics.jsonl"  # <base_output_directory>/<run_name>/: the layout compare reads
  metrics.parent.mkdir()  # maxtext appends to metrics_file but does not create its folder
  result = run_train(
      [
          "run_name=corpus",
          f"base_output_directory={tmp_path}",
          "steps=3",
          f"metrics_file={metrics}",
          *corpus.corpus_overrides(out),
      ]
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Tokenizer path: {out / corpus.TOKENIZER_NAME}" in result.stderr
  run = read_jsonl(metrics)
  assert list(run.steps) == [0, 1, 2]
  assert all(5.5 < loss < 8.5 for loss in run.loss)  # ~ln(1024) = 6.9 at random init on real tokens


def test_cli_overrides_only_and_bad_arguments(tmp_path, capsys):
  assert corpus.main([str(tmp_path / "c"), "--overrides-only", "--stdlib-dir", str(_fake_stdlib(tmp_path / "lib")),
                      "--eval-fraction", "0.5"]) == 0
  line = capsys.readouterr().out.strip()
  assert line.split() == corpus.corpus_overrides(tmp_path / "c")
  assert f"grain_train_files={tmp_path / 'c' / 'train.parquet'}" in line and "vocab_size=1024" in line
  assert corpus.main([str(tmp_path / "d"), "--eval-fraction", "2"]) == 2
  assert "eval_fraction" in capsys.readouterr().err and not (tmp_path / "d").exists()
