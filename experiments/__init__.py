"""One-off studies, outside the installed package: each module is a `python -m experiments.NAME` script run from
the repository's root, with a usage docstring, writing its JSON into results/. What a user runs is
`specdecode bench`; these measured one question each (a design choice, a training recipe, a drafter's tuning)."""
