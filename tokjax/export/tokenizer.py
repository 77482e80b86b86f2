"""The byte tokenizer of an export: ids are bytes 0..255, PAD 256, BOS 257 (tokjax.vocab).

A `tokenizers` tokenizer.json that `AutoTokenizer.from_pretrained(DIR)` loads without remote code:
byte-level pre-tokenization (GPT-2's printable stand-in for each byte, no splitting), a BPE model
without merges whose vocabulary maps each byte's stand-in to the byte's value, and a post-processor
that puts BOS before a text as training does (`add_special_tokens=False` leaves it out).
"""

from tokjax.vocab import BOS_ID, PAD_ID

BOS, PAD = '<bos>', '<pad>'


def byte_chars() -> list[str]:
  """GPT-2's bytes_to_unicode: the printable character that stands for each byte 0..255."""
  printable = (
      list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  )
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return [chars[b] for b in range(256)]


def build():
  """A transformers PreTrainedTokenizerFast of the byte vocabulary."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top

  vocab = {c: b for b, c in enumerate(byte_chars())}
  vocab.update({PAD: PAD_ID, BOS: BOS_ID})
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.add_special_tokens(
      [tokenizers.AddedToken(PAD, special=True), tokenizers.AddedToken(BOS, special=True)]
  )
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single=f'{BOS} $A', pair=f'{BOS} $A $B', special_tokens=[(BOS, BOS_ID)]
  )
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, pad_token=PAD)


def save(folder: str, seq_len: int) -> None:
  tok = build()
  tok.model_max_length = seq_len
  tok.save_pretrained(folder)
