"""How sure a number is: standard errors of evaluation results and of paired comparisons.

`ratio_and_se` gives bits-per-byte pooled over bytes with its error (documents as the sampling
unit); `paired_difference` compares two models on the same scoring units, with the window-paired
error and the clustered one (the windows of one document, or of one of the corpus's independent
units such as a play, are correlated: `tokjax.data.corpora.document_clusters`); `judge` is the
rule every table uses (`RULE`): a t-test of the difference against its clustered and seed errors
combined in quadrature, Holm-adjusted over the comparisons of one table (`holm`,
`judge_family`). `tokjax.evaluator` produces the per-unit numbers these read.
"""

import math

import numpy as np

SE_LABEL = '+- s.e. (ratio estimator over documents)'


def ratio_and_se(ce, nbytes) -> tuple[float, float]:
  """Bits-per-byte pooled over bytes and its standard error (ratio estimator, documents as units).

  Args:
    ce: float[D], each document's summed cross-entropy in nats.
    nbytes: float[D], each document's scored bytes; documents with none are left out.

  Returns:
    (bpb, se) with R = sum(ce) / sum(nbytes), bpb = R / ln 2 and
    se = sqrt(D / (D - 1) * sum_d (ce_d - R * nbytes_d)^2) / sum(nbytes) / ln 2 (NaN for D < 2).
  """
  ce, nbytes = np.asarray(ce, np.float64), np.asarray(nbytes, np.float64)
  keep = nbytes > 0
  ce, nbytes = ce[keep], nbytes[keep]
  d, total = len(ce), nbytes.sum()
  if d == 0:
    return float('nan'), float('nan')
  r = ce.sum() / total
  se = math.sqrt(d / (d - 1) * np.sum((ce - r * nbytes) ** 2)) / total if d > 1 else math.nan
  return float(r / math.log(2)), float(se / math.log(2))


def share_and_se(num, den) -> tuple[float, float]:
  """sum(num) / sum(den) over documents and its ratio-estimator standard error (documents as
  units; `ratio_and_se`, whose bits-per-byte scaling by 1 / ln 2 is undone here)."""
  r, se = ratio_and_se(num, den)
  return r * math.log(2), se * math.log(2)


def paired_share_difference(num_a, den_a, num_b, den_b) -> tuple[float, float]:
  """R_a - R_b of two shares over the same documents (R = sum(num) / sum(den)) and its standard
  error: the ratio estimator's linearisation z_d = (num_a - R_a den_a) / sum(den_a) - (the same of
  b), se = sqrt(D / (D - 1) sum_d z_d^2). Documents where either den is 0 still count (z_d from the
  other side); NaN when a side has no denominator at all."""
  num_a, den_a, num_b, den_b = (np.asarray(x, np.float64) for x in (num_a, den_a, num_b, den_b))
  if den_a.sum() == 0 or den_b.sum() == 0:  # A side without ends has no share to compare.
    return math.nan, math.nan
  ra, rb = num_a.sum() / den_a.sum(), num_b.sum() / den_b.sum()
  z = (num_a - ra * den_a) / den_a.sum() - (num_b - rb * den_b) / den_b.sum()
  d = len(z)
  return float(ra - rb), float(math.sqrt(d / (d - 1) * np.sum(z**2))) if d > 1 else math.nan


def document_ids(docs) -> np.ndarray:
  """int32[len(packed stream)]: the document each position of `pipeline.pack_documents(docs)` is in."""
  return np.repeat(np.arange(len(docs), dtype=np.int32), [len(d) + 1 for d in docs])


def unit_ids(docs, unit_bytes: int = 0) -> tuple[np.ndarray, int]:
  """(int32[len(packed stream)], number of units): the scoring unit of each stream position.

  With unit_bytes = 0 a unit is a document (`document_ids`). With unit_bytes = W > 0 each document's
  positions 0..len (BOS first) are cut into consecutive windows of W, so a document of n bytes has
  ceil((n + 1) / W) units; a unit never spans two documents, and a target byte belongs to the unit of
  its own position, so the units' CE sums to the documents'.
  """
  if not unit_bytes:
    return document_ids(docs), len(docs)
  lengths, per_doc = _units_per_document(docs, unit_bytes)
  first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
  offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  return (np.repeat(first, lengths) + offset // unit_bytes).astype(np.int32), int(per_doc.sum())


def _units_per_document(docs, unit_bytes: int) -> tuple[np.ndarray, np.ndarray]:
  """(int64[D] stream positions of each document, BOS included; int64[D] its windows of
  unit_bytes)."""
  lengths = np.array([len(d) + 1 for d in docs], np.int64)
  return lengths, -(-lengths // unit_bytes)


def unit_documents(docs, unit_bytes: int = 0) -> np.ndarray:
  """int32[U]: the document of each unit of `unit_ids(docs, unit_bytes)`, to sum units into
  documents (a unit never spans two)."""
  if not unit_bytes:
    return np.arange(len(docs), dtype=np.int32)
  _, per_doc = _units_per_document(docs, unit_bytes)
  return np.repeat(np.arange(len(docs), dtype=np.int32), per_doc)


def paired_difference(ce_a, ce_b, nbytes, clusters=None) -> dict:
  """Model a minus model b in bits-per-byte on the same units, with its paired standard errors.

  Args:
    ce_a, ce_b: float[U], each unit's summed cross-entropy in nats under a and under b.
    nbytes: float[U], each unit's scored bytes (the same for both); units with none are left out.
    clusters: optional int[U], the cluster of each unit: its document (`unit_documents`) or the
      independent unit that document comes from (`tokjax.data.corpora.document_clusters`).

  Returns:
    {'diff': bpb(a) - bpb(b) (pooled over bytes), 'se': its standard error by the ratio estimator on
    the per-unit differences ce_a - ce_b (`ratio_and_se`), 'a_better': the share of units on which
    a has the lower cross-entropy, 'b_better': the same for b, 'units': U}; with clusters also
    'clustered_se', the same estimator on the differences summed per cluster, and 'clusters' (how
    many carry bytes).
    Because both models are scored on the same units, the variation between units that both share
    cancels: se is usually far below either model's own bpb_se. The windows of one cluster share
    its topic, style and length, so their differences are correlated and se, which treats them as
    independent, is too small by about sqrt(1 + (m - 1) rho) for m windows of correlation rho:
    clustered_se is the error to judge a difference by (`judge`).
  """
  ce_a, ce_b = np.asarray(ce_a, np.float64), np.asarray(ce_b, np.float64)
  nbytes = np.asarray(nbytes, np.float64)
  if not ce_a.shape == ce_b.shape == nbytes.shape:
    raise ValueError(f'unit counts differ: {ce_a.shape}, {ce_b.shape}, {nbytes.shape}')
  keep = nbytes > 0
  diff, se = ratio_and_se(ce_a[keep] - ce_b[keep], nbytes[keep])
  units = int(keep.sum())
  out = {
      'diff': diff,
      'se': se,
      'a_better': float(np.mean(ce_a[keep] < ce_b[keep])) if units else math.nan,
      'b_better': float(np.mean(ce_b[keep] < ce_a[keep])) if units else math.nan,
      'units': units,
  }
  if clusters is not None:
    clusters = np.asarray(clusters, np.int64)
    if clusters.shape != nbytes.shape:
      raise ValueError(f'{clusters.shape} cluster ids for {nbytes.shape} units')
    per_cluster = lambda x: np.bincount(clusters, weights=x)
    cluster_bytes = per_cluster(nbytes)
    out['clustered_se'] = ratio_and_se(per_cluster(ce_a - ce_b), cluster_bytes)[1]
    out['clusters'] = int(np.sum(cluster_bytes > 0))
  return out


LEVEL = 0.05  # A difference is found when its Holm-adjusted two-sided p is below this.
FAMILY = (
    'the comparisons of one table with its reference at one (corpus, budget, seq_len) cell, one '
    "per method or variant (a row at another lr stands in for its method's row); out of domain, "
    'each cross corpus its own family'
)
RULE = (
    "found when the two-sided p of |d| / sqrt(clustered s.e.^2 + seed s.e.^2) under Student's t "
    '(df by Welch-Satterthwaite from clusters - 1 and seeds - 1), Holm-adjusted over its family '
    f'({FAMILY}), is below 0.05; with one seed the clustered s.e. alone (df = clusters - 1), and a '
    'difference whose adjusted p is below 0.05 reads "one seed"'
)


def holm(p_values) -> list:
  """Holm's step-down adjustment of a family of p-values, in their order.

  The i-th smallest of the m p-values that exist becomes max over j <= i of (m - j + 1) p_(j),
  capped at 1: never below its raw p, and in the raw p's order. A comparison without a p (None or
  NaN: a difference with no error to judge it by) is no test, so it is left out of the family (m
  counts the others) and keeps what it had.
  """
  p_values = list(p_values)
  present = [i for i, p in enumerate(p_values) if p is not None and not math.isnan(p)]
  out = list(p_values)
  running = 0.0
  for rank, i in enumerate(sorted(present, key=lambda i: p_values[i])):
    running = max(running, min(1.0, (len(present) - rank) * float(p_values[i])))
    out[i] = running
  return out


def judge_family(judged, family: str) -> list[dict]:
  """`judge` results of one family (`FAMILY`) judged by their Holm-adjusted p: each gets 'p_holm'
  (`holm` of the family's 'p'), 'family' (its name) and 'family_size' (how many carry a p), and a
  'verdict' of 'not found' where the adjusted p is not below LEVEL ('found' or 'one seed' stay:
  the raw p is no larger than the adjusted one)."""
  judged = list(judged)
  adjusted = holm([j['p'] for j in judged])
  size = sum(p is not None and not math.isnan(p) for p in adjusted)
  out = []
  for j, p in zip(judged, adjusted):
    verdict = j['verdict'] if p < LEVEL else 'not found'  # NaN < LEVEL is False.
    out.append(j | {'p_holm': p, 'family': family, 'family_size': size, 'verdict': verdict})
  return out


def welch_df(parts) -> float:
  """Welch-Satterthwaite degrees of freedom of sqrt(sum se^2). parts: (se, df) pairs; a part with
  se 0 adds nothing, one with df = inf nothing to the denominator."""
  num = sum(se**2 for se, _ in parts) ** 2
  den = sum(se**4 / df for se, df in parts if se > 0 and math.isfinite(df))
  return num / den if den > 0 else math.inf


def judge(
    diff: float,
    clustered_se: float,
    clusters: int,
    seed_se: float | None = None,
    seeds: int = 1,
) -> dict:
  """The rule every table judges a paired difference by (`RULE`).

  Args:
    diff: the paired difference (`paired_difference`'s 'diff', averaged over seeds).
    clustered_se: its error over the corpus's independent units (`paired_difference`).
    clusters: how many of those units carry it (their error has clusters - 1 df).
    seed_se: the standard error of the per-seed differences; None with one seed.
    seeds: how many seeds those differences come from (seed_se has seeds - 1 df).

  Returns:
    {'combined_se': sqrt(clustered_se^2 + seed_se^2) (clustered_se alone with one seed), 'df': its
    Welch-Satterthwaite degrees of freedom, 't': |diff| / combined_se, 'p': the two-sided p of t
    under Student's t with df, 'verdict': 'found' when p < LEVEL with two seeds or more, 'one seed'
    when p < LEVEL with one, else 'not found' (inside the error, or an error is NaN)}: the verdict
    of one comparison alone; a table of several judges them by `judge_family`.
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top  (a dependency of jax)

  parts = [(clustered_se, clusters - 1)]
  if seed_se is not None:
    parts.append((seed_se, seeds - 1))
  combined = math.sqrt(sum(se**2 for se, _ in parts))
  out = {'combined_se': combined, 'df': math.nan, 't': math.nan, 'p': math.nan}
  if math.isnan(combined) or (combined == diff == 0) or min(df for _, df in parts) < 1:
    return out | {'verdict': 'not found'}
  df = welch_df(parts)
  t = abs(diff) / combined if combined > 0 else math.inf  # No spread at all: an exact difference.
  p = float(2 * stats.t.sf(t, df))
  found = p < LEVEL
  verdict = ('one seed' if seed_se is None else 'found') if found else 'not found'
  return out | {'df': float(df), 't': float(t), 'p': p, 'verdict': verdict}


def margin(judged: dict) -> float:
  """t(1 - LEVEL / 2, df) x combined s.e. of a `judge` result: the difference is beyond it when its
  raw p is below LEVEL, before any Holm adjustment (0 where the rule had no error to judge by)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  (a dependency of jax)

  if math.isnan(judged['df']):
    return 0.0
  return float(stats.t.ppf(1 - LEVEL / 2, judged['df']) * judged['combined_se'])


def format_p(p: float) -> str:
  """p with the fewest significant digits (2 or more) that keep it on its side of LEVEL, so a
  printed p never reads as a different verdict ('-' for NaN)."""
  if math.isnan(p):
    return '-'
  for digits in range(2, 8):
    text = f'{p:.{digits}g}'
    if (float(text) < LEVEL) == (p < LEVEL):
      return text
  return text


def format_bpb(bpb: float, se: float, digits: int = 4) -> str:
  """'1.2345 +- 0.0123 s.e. (ratio estimator over documents)'; without a standard error (fewer than
  two documents) '1.2345 (one document: no s.e.)'."""
  if math.isnan(se):
    return f'{bpb:.{digits}f} (one document: no s.e.)'
  return f'{bpb:.{digits}f} +- {se:.{digits}f} s.e. (ratio estimator over documents)'
