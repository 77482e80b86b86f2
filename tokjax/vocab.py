"""The byte vocabulary shared by the data pipeline and the models.

Token ids 0..255 are the raw bytes; documents are `bytes`, never decoded, so non-UTF-8 input is data
rather than an error. It lives outside tokjax.data so that the models depend on these three numbers
only, never on the data pipeline.
"""

PAD_ID = 256
BOS_ID = 257
VOCAB_SIZE = 258
