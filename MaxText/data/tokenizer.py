# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A small SentencePiece tokenizer trained on the local corpus, so that CPU-sized models spend their FLOPs on MLPs.

Why not maxtext's shipped tokenizers: the smallest has 32000 pieces, and a model narrow enough to train on a 2-core
CPU then spends most of its FLOPs in the output projection (2 x emb x 32000 per token), where NVFP4 never runs: the
quickstart's MLP GEMMs carried ~8% of its training FLOPs, too little for a precision comparison to resolve anything.
With 1024 pieces the output projection of a width-128 model costs less than one MLP.

Deterministic: BPE on the train split's non-blank lines in corpus order, one thread, no sampling or shuffling, so
the same corpus gives the same model bytes (its sha256 goes into the corpus manifest). The settings suit source
code: no normalization (identity), whitespace kept as is and whitespace-only pieces allowed (indentation becomes
one piece), digits split, and byte fallback, so any text encodes without an unknown token. Piece ids follow the
llama2 tokenizer's layout (unk 0, bos 1, eos 2, no pad id), which maxtext's pipeline already handles.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

#: Pieces in the trained model, and the `vocab_size` a model needs for it (256 byte pieces and 3 specials included).
VOCAB_SIZE = 1024
MODEL_NAME = "tokenizer.model"
TOKENIZER_TYPE = "sentencepiece"

#: SentencePieceTrainer options; recorded in the corpus manifest, so a change shows up there (and in its version).
TRAINER_OPTIONS = {
    "vocab_size": VOCAB_SIZE,
    "model_type": "bpe",
    "character_coverage": 1.0,
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "allow_whitespace_only_pieces": True,
    "split_digits": True,
    "max_sentencepiece_length": 16,
    "num_threads": 1,
    "input_sentence_size": 0,
    "shuffle_input_sentence": False,
    "hard_vocab_limit": False,  # a small corpus (tests) may not fill VOCAB_SIZE; the model's vocab_size is an upper bound
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
    "minloglevel": 2,
}


def _lines(texts: Iterable[str]) -> Iterator[str]:
  """The training sentences: every non-blank line (SentencePiece trains on sentences, not on documents)."""
  for text in texts:
    yield from (line for line in text.split("\n") if line.strip())


def train(texts: Iterable[str], path: Path) -> int:
  """Trains the tokenizer on `texts`, writes it to `path` and returns its number of pieces.

  Raises:
    ValueError: the texts hold no non-blank line to train on.
  """
  model = io.BytesIO()
  lines = list(_lines(texts))
  if not lines:
    raise ValueError("no text to train the tokenizer on: the corpus' train split is empty or blank")
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, **TRAINER_OPTIONS)
  path.write_bytes(model.getvalue())
  return spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
