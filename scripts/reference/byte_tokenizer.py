"""Saves a byte-level tokenizer of 256 tokens (one per byte, no merges, no special tokens)
into model directories whose vocabulary is 256, so that `sous serve` can serve the tiny
models of tests/fixtures/architectures/ (tiny_architectures.py makes them). Built with
the `tokenizers` library and written by transformers' `save_pretrained`, as a real model
folder's tokenizer is. Not used by CI:

    /work/venv-ref/bin/python scripts/reference/byte_tokenizer.py tests/fixtures/architectures/*/

Pinned: transformers==5.17.0 and the tokenizers it installs (scripts/reference/requirements.txt
lists the other reference tools).
"""

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def byte_level():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # The 256 byte symbols in byte order, as GPT-2's bytes_to_unicode maps them.
    symbols = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {s: i for i, s in enumerate(symbols)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_of(symbol):
    # GPT-2's mapping: printable bytes map to themselves, the rest to 256 + n in order.
    code = ord(symbol)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    rest = [b for b in range(256) if b not in printable]
    return rest[code - 256]


def main():
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level())
    assert len(tokenizer) == 256, len(tokenizer)
    for out in sys.argv[1:]:
        tokenizer.save_pretrained(out)
        print(f"{out}: byte-level tokenizer of {len(tokenizer)} tokens")


if __name__ == "__main__":
    main()
