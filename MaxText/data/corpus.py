# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A deterministic local training corpus built from the Python standard library's source files.

Why this corpus: CPU runs need real text (synthetic tokens make every precision's loss curve look the same),
the machines have no network, and every Python installation carries ~11 MB of human-written source code. The
same interpreter always yields byte-identical files, so two people comparing precisions train on the same data.

What is built, in OUT_DIR:
  train.parquet, eval.parquet  one string column "text" (and "path", for traceability), read by maxtext's grain
                               pipeline (`dataset_type=grain grain_file_type=parquet`), which tokenizes on the fly
  tokenizer.model              a 1024-piece SentencePiece BPE trained on the train split (MaxText/data/tokenizer.py):
                               a small vocabulary keeps a CPU-sized model's FLOPs in its MLPs, not its output layer
  corpus.json                  the manifest: source, split rule, document counts, sha256 of each file

Rules (all deterministic, none depends on time, locale or file-system order):
  * files: every `*.py` under the running interpreter's stdlib dir, paths sorted, skipping any directory named
    in `EXCLUDED_DIR_NAMES` (tests, site-packages, caches);
  * text: UTF-8 with invalid bytes replaced, CRLF/CR normalized to LF; files longer than `max_doc_chars` are cut
    into pieces at line boundaries. Short pieces are what shuffles the data: maxtext chunks a row into consecutive
    training sequences after its row shuffle (a 100-row window), so a 32k-character row fed one file for ~20 steps
    and the training loss swung with the files; 2048 characters are ~6 sequences of 128 tokens;
  * split: a file goes to eval when the first 8 bytes of sha256(relative path) / 2**64 < `eval_fraction`, so the
    split never changes when files are added elsewhere, and all pieces of one file land in the same split;
  * row order: by sha256(relative path, piece index), which mixes packages (sorted order would feed a run all of
    asyncio first, and grain's parquet shuffle buffer is only 100 rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from MaxText.data import tokenizer

#: Version of the on-disk layout and of the rules above; bump it when either changes.
CORPUS_FORMAT_VERSION = 2  # 2: the corpus' own tokenizer, 2048-character rows

#: Directory names skipped anywhere under the stdlib dir: test suites are huge, repetitive and full of
#: deliberately broken code; site-packages holds third-party code that differs between installations.
EXCLUDED_DIR_NAMES = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

#: The corpus' own tokenizer (built with it, MaxText/data/tokenizer.py), passed to maxtext as an absolute path.
TOKENIZER_NAME = tokenizer.MODEL_NAME
TOKENIZER_TYPE = tokenizer.TOKENIZER_TYPE
#: A model's `vocab_size` for this tokenizer (the number of pieces it may have).
TOKENIZER_VOCAB_SIZE = tokenizer.VOCAB_SIZE

TEXT_COLUMN = "text"
PATH_COLUMN = "path"
MANIFEST_NAME = "corpus.json"
DEFAULT_EVAL_FRACTION = 0.05
#: Longest row, in characters: ~830 tokens of the corpus tokenizer (2.5 characters per token), ~6 sequences of 128.
DEFAULT_MAX_DOC_CHARS = 2048


class Split(str, enum.Enum):
  """The two splits; the value is the parquet file's stem."""

  TRAIN = "train"
  EVAL = "eval"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Document:
  """One row of the corpus: a whole source file or one piece of a long one."""

  path: str  # relative posix path under the stdlib dir, with "#<piece>" appended for pieces after the first
  text: str
  order_key: bytes  # sha256 of (path, piece); rows are written sorted by it


def stdlib_dir() -> Path:
  """The running interpreter's standard-library directory (for a venv: the base interpreter's)."""
  return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(root: Path) -> list[str]:
  """Relative posix paths of the `*.py` files under `root`, sorted, without excluded directories.

  Raises:
    ValueError: `root` is not a directory or holds no Python files.
  """
  if not root.is_dir():
    raise ValueError(f"stdlib dir {str(root)!r} is not a directory; pass --stdlib-dir pointing at e.g. {stdlib_dir()}")
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIR_NAMES)
    rel_dir = Path(dirpath).relative_to(root)
    found.extend((rel_dir / name).as_posix() for name in filenames if name.endswith(".py"))
  if not found:
    raise ValueError(f"no *.py files under {str(root)!r}: is it a Python standard-library directory?")
  return sorted(found)


def assign_split(rel_path: str, eval_fraction: float) -> Split:
  """The split of one file: a pure function of its relative path, so adding files never moves others."""
  digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
  bucket = int.from_bytes(digest[:8], "big") / 2.0**64
  return Split.EVAL if bucket < eval_fraction else Split.TRAIN


def read_source(path: Path) -> str:
  """A file's text: UTF-8 with invalid bytes replaced and line endings normalized, independent of the locale."""
  text = path.read_bytes().decode("utf-8", errors="replace")
  return text.replace("\r\n", "\n").replace("\r", "\n")


def split_long_text(text: str, max_chars: int) -> list[str]:
  """Cuts `text` into pieces of at most `max_chars` characters, at line ends where a line allows it.

  Concatenating the pieces gives back `text` exactly; a single line longer than `max_chars` is cut mid-line.
  """
  if max_chars <= 0:
    raise ValueError(f"max_doc_chars must be positive, got {max_chars}")
  pieces, current, size = [], [], 0
  for line in text.splitlines(keepends=True):
    while len(line) > max_chars:  # a pathological single line: hard cut
      if current:
        pieces.append("".join(current))
        current, size = [], 0
      pieces.append(line[:max_chars])
      line = line[max_chars:]
    if size + len(line) > max_chars and current:
      pieces.append("".join(current))
      current, size = [], 0
    current.append(line)
    size += len(line)
  if current:
    pieces.append("".join(current))
  return pieces


def collect_documents(
    root: Path, *, eval_fraction: float, max_doc_chars: int
) -> dict[Split, list[Document]]:
  """Reads, splits and orders every document; the result depends only on the files' contents and paths."""
  if not 0.0 < eval_fraction < 1.0:
    raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}; the default is {DEFAULT_EVAL_FRACTION}")
  splits: dict[Split, list[Document]] = {Split.TRAIN: [], Split.EVAL: []}
  for rel_path in list_source_files(root):
    text = read_source(root / rel_path)
    if not text.strip():
      continue  # empty __init__.py files carry no text and would only add BOS/EOS pairs
    split = assign_split(rel_path, eval_fraction)
    for piece_index, piece in enumerate(split_long_text(text, max_doc_chars)):
      name = rel_path if piece_index == 0 else f"{rel_path}#{piece_index}"
      key = hashlib.sha256(f"{rel_path}\0{piece_index}".encode("utf-8")).digest()
      splits[split].append(Document(path=name, text=piece, order_key=key))
  for docs in splits.values():
    docs.sort(key=lambda d: d.order_key)
  if not splits[Split.EVAL] or not splits[Split.TRAIN]:
    raise ValueError(f"eval_fraction={eval_fraction} left a split empty; use a value such as {DEFAULT_EVAL_FRACTION}")
  return splits


def write_parquet(docs: Sequence[Document], path: Path) -> None:
  """Writes the rows with fixed writer settings, so equal rows give equal bytes (no timestamps in parquet)."""
  table = pa.table(
      {
          TEXT_COLUMN: pa.array([d.text for d in docs], pa.string()),
          PATH_COLUMN: pa.array([d.path for d in docs], pa.string()),
      }
  )
  pq.write_table(table, path, compression="zstd", compression_level=3, row_group_size=1024, write_statistics=False)


def _sha256_file(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def build_corpus(
    out_dir: str | os.PathLike,
    *,
    root: Path | None = None,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS,
) -> dict:
  """Builds the corpus into `out_dir` (created if missing, files overwritten) and returns the manifest.

  Args:
    out_dir: directory to write train.parquet, eval.parquet and corpus.json into.
    root: the source directory; default: the running interpreter's stdlib dir.
    eval_fraction: expected fraction of files that go to eval (by hash of the relative path).
    max_doc_chars: longest row, in characters; longer files are cut at line boundaries.

  Returns:
    The manifest also written to corpus.json.
  """
  root = Path(root) if root is not None else stdlib_dir()
  splits = collect_documents(root, eval_fraction=eval_fraction, max_doc_chars=max_doc_chars)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  files = {}
  pieces = tokenizer.train((d.text for d in splits[Split.TRAIN]), out / TOKENIZER_NAME)
  for split, docs in splits.items():
    path = out / f"{split.value}.parquet"
    write_parquet(docs, path)
    files[split.value] = {
        "file": path.name,
        "rows": len(docs),
        "source_files": len({d.path.split("#")[0] for d in docs}),
        "characters": sum(len(d.text) for d in docs),
        "sha256": _sha256_file(path),
    }
  manifest = {
      "format_version": CORPUS_FORMAT_VERSION,
      "source": "python-stdlib",
      "python_version": ".".join(map(str, sys.version_info[:3])),
      "stdlib_dir": str(root),
      "excluded_dir_names": sorted(EXCLUDED_DIR_NAMES),
      "eval_fraction": eval_fraction,
      "max_doc_chars": max_doc_chars,
      "columns": [TEXT_COLUMN, PATH_COLUMN],
      "splits": files,
      "tokenizer": {
          "file": TOKENIZER_NAME,
          "type": TOKENIZER_TYPE,
          "pieces": pieces,
          "vocab_size": TOKENIZER_VOCAB_SIZE,
          "trainer_options": tokenizer.TRAINER_OPTIONS,
          "sentencepiece_version": tokenizer.spm.__version__,
          "sha256": _sha256_file(out / TOKENIZER_NAME),
      },
  }
  (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
  return manifest


def corpus_overrides(corpus_dir: str | os.PathLike) -> list[str]:
  """The maxtext `key=value` overrides that point a run at a built corpus (absolute paths, any working dir).

  The text column is maxtext's default (`train_data_columns: ['text']`), so it is not repeated here (a `[...]`
  argument would also be a glob pattern in an unquoted shell expansion). `use_truncation=false` makes maxtext chunk
  each row into max_target_length pieces instead of dropping all but the first; `packing` (on by default) then fills
  each sequence. `grain_worker_count=0` reads in the training process, which on a 2-core CPU is faster than a worker
  subprocess.
  """
  out = Path(corpus_dir).resolve()
  return [
      "dataset_type=grain",
      "grain_file_type=parquet",
      f"grain_train_files={out / 'train.parquet'}",
      f"grain_eval_files={out / 'eval.parquet'}",
      f"tokenizer_path={out / TOKENIZER_NAME}",
      f"tokenizer_type={TOKENIZER_TYPE}",
      f"vocab_size={TOKENIZER_VOCAB_SIZE}",
      "use_truncation=false",
      "grain_worker_count=0",
      "grain_worker_count_eval=0",
  ]


def _parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m MaxText.data.corpus",
      description="Build the deterministic Python-stdlib corpus (train/eval parquet) for CPU training runs.",
  )
  parser.add_argument("out_dir", help="directory to write train.parquet, eval.parquet and corpus.json into")
  parser.add_argument("--stdlib-dir", type=Path, default=None, help=f"source dir (default: {stdlib_dir()})")
  parser.add_argument("--eval-fraction", type=float, default=DEFAULT_EVAL_FRACTION, help="fraction of files for eval")
  parser.add_argument("--max-doc-chars", type=int, default=DEFAULT_MAX_DOC_CHARS, help="longest row, in characters")
  parser.add_argument(
      "--overrides-only",
      action="store_true",
      help="print only the maxtext key=value overrides (one line), e.g. for OV=$(python -m MaxText.data.corpus DIR ...)",
  )
  return parser.parse_args(None if argv is None else list(argv))


def main(argv: Iterable[str] | None = None) -> int:
  """CLI: build the corpus, print its summary and the maxtext overrides that use it; exit 2 on bad arguments."""
  args = _parse_args(argv)
  try:
    manifest = build_corpus(
        args.out_dir, root=args.stdlib_dir, eval_fraction=args.eval_fraction, max_doc_chars=args.max_doc_chars
    )
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.overrides_only:
    print(" ".join(corpus_overrides(args.out_dir)))
    return 0
  for name, info in manifest["splits"].items():
    print(
        f"{name}: {info['rows']} rows from {info['source_files']} files, {info['characters']} chars, "
        f"sha256 {info['sha256']}"
    )
  print("maxtext overrides for this corpus:")
  print(" ".join(corpus_overrides(args.out_dir)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
