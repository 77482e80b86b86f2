"""Analysis tools: measurements of trained or fresh models that are not part of training itself
(estimators.py: bias and variance of boundary-gradient estimators)."""
