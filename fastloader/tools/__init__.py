"""fastloader's tools: what a person runs around the loader, not the loader.

The command line (cli.py: ``python -m fastloader bench | doctor | tune |
make-sample | pack``) and what its commands are made of: the benchmark harness
(harness.py, shared with benchmarks/), ``bench`` (cli_bench.py), ``tune``
(cli_tune.py and the tuning/ package behind ``fastloader.tune``), ``doctor``
(doctor.py, doctor_dataset.py), ``pack`` (pack.py, pack_lmdb.py), the sample
folder (sample.py), the progress line (progress.py) and byte sizes as options
take them (sizes.py).

The rule: the library (the other modules of fastloader/) never imports
tools/.  The exceptions are fastloader/__init__.py, whose public names that
live here (``fastloader.tune``) are imported on first use, and
fastloader/__main__.py, which only calls cli.main.  Tools import the library
freely.  tests/test_package_layout.py checks this.
"""
