"""Runnable tideflow examples.

Each example is a workflow definition (``examples/*.yaml``) plus, where it needs
them, a module of step functions that its ``python`` steps name as
``function: "examples.<module>:<function>"``. Run them from the repository root,
e.g. ``tideflow run examples/etl.yaml``; ``tests/acceptance/test_examples.py``
runs every one of them through the embedded runtime.

All step functions are local and deterministic: no network, no clock reads that
change the result, no randomness. Where an example needs a failure (a flaky
payment gateway, a carrier that rejects an address) the run input asks for it.
"""
