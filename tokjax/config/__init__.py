"""The configuration, in one place: what a run's ConfigDict holds and how it is checked.

defaults.py    every field with its default and a comment (`base_config`); configs/ start here.
presets.py     the paper's model sizes and two-stage layouts built on the defaults.
files.py       loading configs/NAME.py[:VARIANT] and setting fields from the command line.
validation.py  one check of a whole config before any work (`validate`): one line per bad field.
saved.py       a config saved by an earlier version read in this version's fields (`upgrade`).
"""
