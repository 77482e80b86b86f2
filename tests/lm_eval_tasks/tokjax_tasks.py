"""Loader of the offline test tasks (each task's JSONL file beside this module, as its test split) and
their functions of a document."""

import json
import os

import datasets


def load(data_file, **unused):
  """{'test': the rows of data_file (a JSONL file in this folder)}; lm-eval passes the task's
  metadata as further keyword arguments."""
  del unused
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), data_file)) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return datasets.DatasetDict({'test': datasets.Dataset.from_list(rows)})


def answer_text(doc):
  """The text of the correct choice. A function, not a template: lm-eval reads a template that
  renders digits as an index."""
  return doc['choices'][doc['answer']]
